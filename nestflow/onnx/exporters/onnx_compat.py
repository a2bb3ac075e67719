"""ONNX mappers of nestflow.ops.onnx_compat: the onnx_* ops the importer makes for ONNX operators
that nestflow's Fluid-style ops do not cover (operands known only at run time, ONNX's indexing
rules, math NumPy has and Fluid lacks), exported back to those operators so that an imported
model exports again.

Most map one to one. Where an opset lacks the operator or an input, the mapper composes it:
onnx_trilu at opset 13 (no Trilu: a Range mask and Where), onnx_cumprod at every opset 13-21
(CumProd only exists from opset 26: a Scan multiplying along the axis, which must be known at
export), onnx_mod of floats without `fmod` (ONNX's Mod needs fmod=1 for floats: fmod, then
the divisor added where the signs differ, as Python's %), the shifts of signed integers
(BitShift takes unsigned ones only: arithmetic shifts through uint64), onnx_one_hot whose
Values ONNX runtimes do not take (an Equal against a Range). Options an opset lacks are
AttrErrors naming the opset they need: the bitwise ops need 18, the scatters' add/mul 16 and
max/min 18, Resize's antialias/axes/keep_aspect_ratio_policy 18 and half_pixel_symmetric 19.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from nestflow.errors import AttrError, ShapeError
from nestflow.onnx.exporters.control_flow import _graph_input, _subgraph
from nestflow.onnx.exporters.graph import Emitter, OpContext, Value, exports


def _ints(ctx: OpContext, slot: str) -> str | None:
    """The slot's integer tensor as an int64 vector (None when the slot is empty)."""
    if not ctx.has_input(slot):
        return None
    values = ctx.reshape(ctx.input(slot), [-1])
    return values if ctx.in_var(slot).dtype == "int64" else ctx.cast(values, "int64")


def _known(ctx: OpContext, slot: str) -> list[int] | None:
    """The values of an integer input held by a parameter or a constant, else None."""
    value = ctx.model.initializer_value(ctx.input(slot)) if ctx.has_input(slot) else None
    return None if value is None else [int(v) for v in value.reshape(-1)]


@exports("onnx_erf")
def onnx_erf(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Erf", [ctx.input("X")]))


@exports("onnx_log_softmax")
def onnx_log_softmax(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("LogSoftmax", [ctx.input("X")], axis=ctx.attrs["axis"]))


@exports("onnx_reshape")
def onnx_reshape(ctx: OpContext) -> None:
    allowzero = ctx.attrs["allowzero"]
    if allowzero and ctx.opset < 14:
        raise AttrError(f"Reshape's allowzero needs ONNX opset >= 14, not {ctx.opset}")
    inputs = [ctx.input("X"), _ints(ctx, "Shape")]
    ctx.set_output("Out", ctx.node("Reshape", inputs, allowzero=1 if allowzero else None))


@exports("onnx_constant_of_shape")
def onnx_constant_of_shape(ctx: OpContext) -> None:
    value = numpy_helper.from_array(np.asarray([ctx.attrs["value"]], ctx.attrs["dtype"]))
    ctx.set_output("Out", ctx.node("ConstantOfShape", [_ints(ctx, "Input")], value=value))


@exports("onnx_unsqueeze")
def onnx_unsqueeze(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Unsqueeze", [ctx.input("X"), _ints(ctx, "Axes")]))


@exports("onnx_squeeze")
def onnx_squeeze(ctx: OpContext) -> None:
    axes = _ints(ctx, "Axes")
    inputs = [ctx.input("X")] + ([axes] if axes is not None else [])
    ctx.set_output("Out", ctx.node("Squeeze", inputs))


@exports("onnx_tile")
def onnx_tile(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Tile", [ctx.input("X"), _ints(ctx, "Repeats")]))


@exports("onnx_slice")
def onnx_slice(ctx: OpContext) -> None:
    inputs = [ctx.input("Input"), _ints(ctx, "Starts"), _ints(ctx, "Ends")]
    axes, steps = _ints(ctx, "Axes"), _ints(ctx, "Steps")
    if steps is not None:
        if axes is None:  # Slice's default axes: 0, 1, ... one per start
            count = ctx.node("Shape", [inputs[1]])
            axes = ctx.node(
                "Range", [ctx.scalar(0, "int64"), ctx.to_scalar(count), ctx.scalar(1, "int64")]
            )
        inputs += [axes, steps]
    elif axes is not None:
        inputs.append(axes)
    ctx.set_output("Out", ctx.node("Slice", inputs))


@exports("onnx_gather")
def onnx_gather(ctx: OpContext) -> None:
    inputs = [ctx.input("X"), ctx.input("Index")]
    ctx.set_output("Out", ctx.node("Gather", inputs, axis=ctx.attrs["axis"]))


@exports("onnx_split")
def onnx_split(ctx: OpContext) -> None:
    x, axis, num = ctx.input("X"), ctx.attrs["axis"], ctx.attrs["num"]
    sizes = _ints(ctx, "Split")
    if sizes is None and ctx.opset < 18:
        # parts of ceil(dim / num), the last one smaller: Split-18's rule, made explicit
        dim = ctx.to_scalar(ctx.dim(x, axis % ctx.in_var("X").ndim))
        count = ctx.scalar(num, "int64")
        one = ctx.scalar(1, "int64")
        part = ctx.node("Div", [ctx.node("Sub", [ctx.node("Add", [dim, count]), one]), count])
        starts = ctx.node("Mul", [ctx.node("Range", [ctx.scalar(0, "int64"), count, one]), part])
        rest = ctx.node("Max", [ctx.node("Sub", [dim, starts]), ctx.scalar(0, "int64")])
        sizes = ctx.node("Min", [rest, part])
    for i, part in enumerate(ctx.split(x, axis, sizes, num)):
        ctx.set_output("Out", part, i)


@exports("onnx_pad")
def onnx_pad(ctx: OpContext) -> None:
    mode = ctx.attrs["mode"]
    if mode == "wrap" and ctx.opset < 19:
        raise AttrError(f"Pad's wrap mode needs ONNX opset >= 19, not {ctx.opset}")
    x, pads = ctx.input("X"), _ints(ctx, "Pads")
    value = ctx.to_scalar(ctx.input("Value")) if ctx.has_input("Value") else ""
    axes = _ints(ctx, "Axes")
    if axes is not None and ctx.opset < 18:
        pads = _full_pads(ctx, pads, axes, ctx.in_var("X").ndim)
        axes = None
    inputs = [x, pads, value] + ([axes] if axes is not None else [])
    ctx.set_output("Out", ctx.node("Pad", inputs, mode=mode))


def _full_pads(ctx: OpContext, pads: str, axes: str, rank: int) -> str:
    """Pads for the listed axes spread over every axis (zeros elsewhere): Pad's axes input
    only exists from opset 18."""
    rank_c = ctx.scalar(rank, "int64")
    axes = ctx.node("Mod", [ctx.node("Add", [axes, rank_c]), rank_c])  # negative from the end
    where = ctx.node("Concat", [axes, ctx.node("Add", [axes, rank_c])], axis=0)
    zeros = ctx.const(np.zeros(2 * rank, np.int64))
    return ctx.node("ScatterElements", [zeros, where, pads], axis=0)


_REDUCE = {
    "sum": "ReduceSum",
    "mean": "ReduceMean",
    "max": "ReduceMax",
    "min": "ReduceMin",
    "prod": "ReduceProd",
}


@exports("onnx_reduce")
def onnx_reduce(ctx: OpContext) -> None:
    a = ctx.attrs
    op_type = _REDUCE[a["kind"]]
    keep, noop = int(a["keepdims"]), int(a["noop_with_empty_axes"])
    x = ctx.input("X")
    if op_type == "ReduceMean" and not noop:
        # sum / count: NaN over no elements, as nestflow's reduce_mean
        axes = _known(ctx, "Axes") if ctx.has_input("Axes") else []
        if axes is not None:
            dtype = ctx.in_var("X").dtype
            ctx.set_output("Out", ctx.mean(x, axes or None, bool(keep), dtype))
            return
    if op_type == "ReduceSum" or ctx.opset >= 18:
        axes = _ints(ctx, "Axes")
        inputs = [x] + ([axes] if axes is not None else [])
        ctx.set_output("Out", ctx.node(op_type, inputs, keepdims=keep, noop_with_empty_axes=noop))
        return
    axes = _known(ctx, "Axes") if ctx.has_input("Axes") else []
    if axes is None:
        raise AttrError(
            f"{op_type} over axes computed at run time needs ONNX opset >= 18, not {ctx.opset}"
        )
    if not axes and noop:
        ctx.set_output("Out", ctx.node("Identity", [x]))
        return
    ctx.set_output("Out", ctx.reduce(op_type, x, axes or None, bool(keep)))


def _needs(ctx: OpContext, opset: int, what: str) -> None:
    if ctx.opset < opset:
        raise AttrError(f"{what} needs ONNX opset >= {opset}, not {ctx.opset}")


def _int64(ctx: OpContext, slot: str) -> str:
    """The slot's integer input as int64 (its shape kept)."""
    x = ctx.input(slot)
    return x if ctx.in_var(slot).dtype == "int64" else ctx.cast(x, "int64")


# ---- element-wise math ----

_UNARY = {
    f"onnx_{name.lower()}": name
    for name in ("Floor Ceil Round Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh".split())
}
_UNARY["onnx_isnan"] = "IsNaN"


@exports(*_UNARY)
def onnx_unary(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node(_UNARY[ctx.op.type], [ctx.input("X")]))


@exports("onnx_isinf")
def onnx_isinf(ctx: OpContext) -> None:
    a = ctx.attrs
    out = ctx.node(
        "IsInf",
        [ctx.input("X")],
        detect_positive=int(a["detect_positive"]),
        detect_negative=int(a["detect_negative"]),
    )
    ctx.set_output("Out", out)


@exports("onnx_mod")
def onnx_mod(ctx: OpContext) -> None:
    x, y = ctx.input("X"), ctx.input("Y")
    dtype = ctx.in_var("X").dtype
    if ctx.attrs["fmod"] or np.dtype(dtype).kind != "f":
        ctx.set_output("Out", ctx.node("Mod", [x, y], fmod=int(ctx.attrs["fmod"])))
        return
    # ONNX's Mod takes floats with fmod=1 only: C's fmod has X's sign; Python's % (NumPy's
    # mod) adds Y to a non-zero remainder whose sign differs from Y's.
    rest = ctx.node("Mod", [x, y], fmod=1)
    zero = ctx.scalar(0, dtype)
    differ = ctx.node("Xor", [ctx.node("Less", [rest, zero]), ctx.node("Less", [y, zero])])
    shift = ctx.node("And", [differ, ctx.node("Not", [ctx.node("Equal", [rest, zero])])])
    ctx.set_output("Out", ctx.node("Where", [shift, ctx.node("Add", [rest, y]), rest]))


# ---- integer bit operations ----

_BITWISE = {
    "onnx_bitwise_and": "BitwiseAnd",
    "onnx_bitwise_or": "BitwiseOr",
    "onnx_bitwise_xor": "BitwiseXor",
}


@exports(*_BITWISE)
def onnx_bitwise(ctx: OpContext) -> None:
    op_type = _BITWISE[ctx.op.type]
    _needs(ctx, 18, op_type)
    ctx.set_output("Out", ctx.node(op_type, [ctx.input("X"), ctx.input("Y")]))


@exports("onnx_bitwise_not")
def onnx_bitwise_not(ctx: OpContext) -> None:
    _needs(ctx, 18, "BitwiseNot")
    ctx.set_output("Out", ctx.node("BitwiseNot", [ctx.input("X")]))


@exports("onnx_shift_left", "onnx_shift_right")
def onnx_shift(ctx: OpContext) -> None:
    """BitShift, which takes unsigned integers only: X's bits shifted as uint64 and cut back
    to X's width (the same bits for a left shift); a signed X shifted right is sign-extended
    (NumPy's arithmetic shift) as ~((~X) >> Y) where X < 0."""
    x, dtype = ctx.input("X"), ctx.in_var("X").dtype
    y = ctx.input("Y") if ctx.in_var("Y").dtype == "uint64" else ctx.cast(ctx.input("Y"), "uint64")
    left = ctx.op.type == "onnx_shift_left"
    direction = "LEFT" if left else "RIGHT"
    if left or np.dtype(dtype).kind == "u":
        wide = x if dtype == "uint64" else ctx.cast(x, "uint64")
        out = ctx.node("BitShift", [wide, y], direction=direction)
        ctx.set_output("Out", out if dtype == "uint64" else ctx.cast(out, dtype))
        return
    wide = x if dtype == "int64" else ctx.cast(x, "int64")
    minus_one = ctx.scalar(-1, "int64")
    negative = ctx.node("Less", [wide, ctx.scalar(0, "int64")])
    magnitude = ctx.node("Where", [negative, ctx.node("Sub", [minus_one, wide]), wide])
    shifted = ctx.node("BitShift", [ctx.cast(magnitude, "uint64"), y], direction=direction)
    shifted = ctx.cast(shifted, "int64")
    out = ctx.node("Where", [negative, ctx.node("Sub", [minus_one, shifted]), shifted])
    ctx.set_output("Out", out if dtype == "int64" else ctx.cast(out, dtype))


# ---- triangles, running sums and products ----


@exports("onnx_trilu")
def onnx_trilu(ctx: OpContext) -> None:
    x, upper = ctx.input("X"), ctx.attrs["upper"]
    k = ctx.to_scalar(_int64(ctx, "K")) if ctx.has_input("K") else None
    if ctx.opset >= 14:
        inputs = [x] + ([k] if k is not None else [])
        ctx.set_output("Out", ctx.node("Trilu", inputs, upper=int(upper)))
        return
    # no Trilu before opset 14: keep where column - row >= k (upper) or <= k (lower)
    rank = ctx.in_var("X").ndim
    zero, one = ctx.scalar(0, "int64"), ctx.scalar(1, "int64")
    rows = ctx.node("Range", [zero, ctx.to_scalar(ctx.dim(x, rank - 2)), one])
    cols = ctx.node("Range", [zero, ctx.to_scalar(ctx.dim(x, rank - 1)), one])
    offset = ctx.node("Sub", [cols, ctx.unsqueeze(rows, [1])])  # [rows, cols]
    k = zero if k is None else k
    keep = ctx.node("GreaterOrEqual" if upper else "LessOrEqual", [offset, k])
    fill = ctx.scalar(0, ctx.in_var("X").dtype)
    ctx.set_output("Out", ctx.node("Where", [keep, x, fill]))


@exports("onnx_cumsum")
def onnx_cumsum(ctx: OpContext) -> None:
    a = ctx.attrs
    inputs = [ctx.input("X"), ctx.to_scalar(ctx.input("Axis"))]
    out = ctx.node("CumSum", inputs, exclusive=int(a["exclusive"]), reverse=int(a["reverse"]))
    ctx.set_output("Out", out)


@exports("onnx_cumprod")
def onnx_cumprod(ctx: OpContext) -> None:
    """A Scan along the axis carrying the running product (ONNX's CumProd is opset 26)."""
    var, x = ctx.in_var("X"), ctx.input("X")
    known = _known(ctx, "Axis")
    if known is None:
        raise ctx.unsupported(
            "its Axis is computed at run time; ONNX has no CumProd before opset 26 and the Scan "
            "it is exported as needs the axis when the model is built"
        )
    if not -var.ndim <= known[0] < var.ndim:
        raise ShapeError(f"onnx_cumprod: axis {known[0]} is out of range for rank {var.ndim}")
    axis = known[0] % var.ndim
    # onnxruntime's Scan dies (SIGFPE) on an X without elements, whose products are X itself
    empty = _subgraph(ctx, "empty")
    _output(empty, empty.node("Identity", [x]), var.dtype)
    scan = _subgraph(ctx, "cumprod")
    kept = [i for i in range(var.ndim) if i != axis]
    ones = scan.fill(scan.node("Gather", [scan.shape(x), scan.ints(kept)]), 1, var.dtype)
    body = _subgraph(scan, "step")
    state = _graph_input(body, "product", var.dtype)
    step = _graph_input(body, "step", var.dtype)
    product = body.node("Mul", [state, step])
    _output(body, product, var.dtype)
    _output(body, body.node("Identity", [state if ctx.attrs["exclusive"] else product]), var.dtype)
    direction = [1] if ctx.attrs["reverse"] else None
    _, out = scan.node(
        "Scan",
        [ones, x],
        outputs=2,
        body=body.graph.to_proto(),
        num_scan_inputs=1,
        scan_input_axes=[axis],
        scan_output_axes=[axis],
        scan_input_directions=direction,
        scan_output_directions=direction,
    )
    _output(scan, out, var.dtype)
    is_empty = ctx.node("Equal", [ctx.node("Size", [x]), ctx.scalar(0, "int64")])
    out = ctx.node(
        "If",
        [is_empty],
        then_branch=empty.graph.to_proto(),
        else_branch=scan.graph.to_proto(),
    )
    ctx.set_output("Out", out)


def _output(em: Emitter, name: str, dtype: str) -> None:
    em.graph.outputs.append(Value(name, dtype).value_info())


# ---- element-wise gathers and scatters, one_hot, einsum ----


@exports("onnx_gather_elements")
def onnx_gather_elements(ctx: OpContext) -> None:
    inputs = [ctx.input("X"), ctx.input("Index")]
    ctx.set_output("Out", ctx.node("GatherElements", inputs, axis=ctx.attrs["axis"]))


_SCATTER_OPSET = {"none": 13, "add": 16, "mul": 16, "max": 18, "min": 18}


def _reduction(ctx: OpContext, op_type: str) -> str | None:
    reduction = ctx.attrs["reduction"]
    if reduction not in _SCATTER_OPSET:
        raise AttrError(f"reduction must be one of {list(_SCATTER_OPSET)}, got '{reduction}'")
    _needs(ctx, _SCATTER_OPSET[reduction], f"{op_type} with reduction '{reduction}'")
    return None if reduction == "none" else reduction


@exports("onnx_scatter_elements")
def onnx_scatter_elements(ctx: OpContext) -> None:
    inputs = [ctx.input("X"), ctx.input("Index"), ctx.input("Updates")]
    reduction = _reduction(ctx, "ScatterElements")
    out = ctx.node("ScatterElements", inputs, axis=ctx.attrs["axis"], reduction=reduction)
    ctx.set_output("Out", out)


@exports("onnx_scatter_nd")
def onnx_scatter_nd(ctx: OpContext) -> None:
    inputs = [ctx.input("X"), _int64(ctx, "Index"), ctx.input("Updates")]
    reduction = _reduction(ctx, "ScatterND")
    ctx.set_output("Out", ctx.node("ScatterND", inputs, reduction=reduction))


# Values dtypes onnxruntime's OneHot takes (with int64 indices and depth); others are composed
_ONE_HOT_VALUES = ("float32", "int64")


@exports("onnx_one_hot")
def onnx_one_hot(ctx: OpContext) -> None:
    axis, values = ctx.attrs["axis"], ctx.input("Values")
    indices, depth = _int64(ctx, "Indices"), ctx.to_scalar(_int64(ctx, "Depth"))
    if ctx.in_var("Values").dtype in _ONE_HOT_VALUES:
        ctx.set_output("Out", ctx.node("OneHot", [indices, depth, values], axis=axis))
        return
    # Equal(index, position along the new axis): negative indices count from the end
    rank = ctx.in_var("Indices").ndim + 1
    axis %= rank
    indices = ctx.node(
        "Where",
        [
            ctx.node("Less", [indices, ctx.scalar(0, "int64")]),
            ctx.node("Add", [indices, depth]),
            indices,
        ],
    )
    positions = ctx.node("Range", [ctx.scalar(0, "int64"), depth, ctx.scalar(1, "int64")])
    positions = ctx.reshape(positions, [-1 if i == axis else 1 for i in range(rank)])
    hot = ctx.node("Equal", [ctx.unsqueeze(indices, [axis]), positions])
    off, on = ctx.split(ctx.reshape(values, [-1]), 0, [1, 1], 2)
    ctx.set_output("Out", ctx.node("Where", [hot, ctx.to_scalar(on), ctx.to_scalar(off)]))


@exports("onnx_einsum")
def onnx_einsum(ctx: OpContext) -> None:
    out = ctx.node("Einsum", ctx.inputs("Inputs"), equation=ctx.attrs["equation"])
    ctx.set_output("Out", out)


# ---- resize ----

# Resize's attributes from opset 18, with the values that mean "not used"
_RESIZE_18 = {"antialias": False, "axes": [], "keep_aspect_ratio_policy": "stretch"}


@exports("onnx_resize")
def onnx_resize(ctx: OpContext) -> None:
    a = ctx.attrs
    for name, unused in _RESIZE_18.items():
        value = list(a[name]) if name == "axes" else a[name]
        if value != unused:
            _needs(ctx, 18, f"Resize's {name}")
    if a["coordinate_transformation_mode"] == "half_pixel_symmetric":
        _needs(ctx, 19, "Resize's coordinate_transformation_mode half_pixel_symmetric")
    roi = ctx.input("Roi") or ""
    scales = ctx.input("Scales") or ""
    if scales and ctx.in_var("Scales").dtype != "float32":
        scales = ctx.cast(scales, "float32")
    sizes = _int64(ctx, "Sizes") if ctx.has_input("Sizes") else ""
    inputs = [ctx.input("X"), roi, scales] + ([sizes] if sizes else [])
    new = ctx.opset >= 18
    out = ctx.node(
        "Resize",
        inputs,
        mode=a["mode"],
        coordinate_transformation_mode=a["coordinate_transformation_mode"],
        nearest_mode=a["nearest_mode"],
        cubic_coeff_a=float(a["cubic_coeff_a"]),
        exclude_outside=int(a["exclude_outside"]),
        extrapolation_value=float(a["extrapolation_value"]),
        antialias=int(a["antialias"]) if new and a["antialias"] else None,
        axes=list(a["axes"]) if new and list(a["axes"]) else None,
        keep_aspect_ratio_policy=a["keep_aspect_ratio_policy"]
        if new and a["keep_aspect_ratio_policy"] != "stretch"
        else None,
    )
    ctx.set_output("Out", out)
