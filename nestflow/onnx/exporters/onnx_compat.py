"""ONNX mappers of nestflow.ops.onnx_compat: the ops the importer makes for ONNX operators whose
shapes, axes, pads or sizes are tensors, exported back to those operators (so an imported model
exports again)."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from nestflow.errors import AttrError
from nestflow.onnx.exporters.graph import OpContext, exports


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
