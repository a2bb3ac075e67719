"""Mappers of ONNX's tensor ops: constants, shapes, casts, layout and indexing.

Where an operand that nestflow's op takes as an attribute (a shape, axes, pads, repeats) is
known at import, the Fluid-style op is used; where it is computed at run time, the
`onnx_*` op of nestflow.ops.onnx_compat that reads it when it runs.
"""

from __future__ import annotations

import numpy as np

from nestflow.errors import AttrError
from nestflow.onnx.importer import element_dtype
from nestflow.onnx.importers.registry import Node, mapper


def _axis(axis: int, rank: int, node: Node) -> int:
    if not -rank <= axis < rank:
        raise AttrError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def shape_tensor(node: Node, x: str, shape) -> str:
    """An int64 vector holding the shape of variable `x` (declared `shape`): a constant when
    every dim is known, else computed at run time."""
    if -1 not in shape:
        return node.constant(np.asarray(shape, np.int64))
    int32 = node.op("shape", {"Input": x})
    return node.op("cast", {"X": int32}, {"out_dtype": "int64"})


# ---- constants ----


@mapper("Constant")
def constant(node: Node) -> None:
    for name, kind in (
        ("value", None),
        ("value_float", "float32"),
        ("value_floats", "float32"),
        ("value_int", "int64"),
        ("value_ints", "int64"),
    ):
        if node.has_attr(name):
            node.const_output(0, np.asarray(node.attr(name), kind))
            return
    raise node.unsupported(
        f"Constant with attribute(s) {sorted(node._attrs)} (strings and sparse tensors)"
    )


@mapper("ConstantOfShape")
def constant_of_shape(node: Node) -> None:
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    shape = node.ints(0, "the shape")
    if shape is not None and node.graph.small(shape, value.dtype):
        node.const_output(0, np.full(shape, value[0], value.dtype))
        return
    attrs = {"value": float(value[0]), "dtype": value.dtype.name}
    # a known shape too big to compute at import is computed (or refused) when run
    node.op("onnx_constant_of_shape", {"Input": node.input(0)}, attrs, out=0, fold=False)


# ---- shapes and casts ----


@mapper("Shape")
def shape(node: Node) -> None:
    dims = node.shape(0)
    rank = len(dims)
    start, end = node.attr("start", 0), node.attr("end", rank)
    start, end = [min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end)]
    picked = dims[start:end]
    if -1 not in picked:
        node.const_output(0, np.asarray(picked, np.int64))
        return
    full = shape_tensor(node, node.input(0), dims)
    if (start, end) == (0, rank):
        node.set_output(0, full)
    else:
        node.op("slice", {"Input": full}, {"axes": [0], "starts": [start], "ends": [end]}, out=0)


@mapper("Size")
def size(node: Node) -> None:
    dims = node.shape(0)
    if -1 not in dims:
        node.const_output(0, np.asarray(int(np.prod(dims)), np.int64))
        return
    full = shape_tensor(node, node.input(0), dims)
    node.op("reduce_prod", {"X": full}, {"reduce_all": True}, out=0)


@mapper("Cast", "CastLike")
def cast(node: Node) -> None:
    if node.op_type == "Cast":
        dtype = element_dtype(node.attr("to"), f"{node.where}: Cast's 'to'")
    else:
        dtype = node.dtype(1)
    if dtype == node.dtype(0):
        node.set_output(0, node.name_of(0))
        return
    node.op("cast", {"X": node.input(0)}, {"out_dtype": dtype}, out=0)


# ---- layout ----


@mapper("Reshape")
def reshape(node: Node) -> None:
    x = node.input(0)
    allowzero = bool(node.attr("allowzero", 0))
    target = node.ints(1, "the shape")
    if target is not None and not (allowzero and 0 in target):
        node.op("reshape", {"X": x}, {"shape": target}, out=0)
        return
    node.op("onnx_reshape", {"X": x, "Shape": node.input(1)}, {"allowzero": allowzero}, out=0)


@mapper("Flatten")
def flatten(node: Node) -> None:
    rank = node.rank(0)
    axis = node.attr("axis", 1)
    axis = axis + rank if axis < 0 else axis
    node.op("flatten", {"X": node.input(0)}, {"axis": axis}, out=0)


@mapper("Transpose")
def transpose(node: Node) -> None:
    perm = node.attr("perm", list(reversed(range(node.rank(0)))))
    node.op("transpose", {"X": node.input(0)}, {"axis": list(perm)}, out=0)


@mapper("Concat")
def concat(node: Node) -> None:
    node.op("concat", {"X": node.inputs()}, {"axis": node.attr("axis", 0)}, out=0)


@mapper("Squeeze")
def squeeze(node: Node) -> None:
    x, dims = node.input(0), node.shape(0)
    axes = node.attr("axes") if node.opset < 13 else node.ints(1, "the axes")
    if node.opset >= 13 and node.has_input(1) and axes is None:
        node.op("onnx_squeeze", {"X": x, "Axes": node.input(1)}, out=0)
    elif axes:
        node.op("squeeze", {"X": x}, {"axes": sorted(a % len(dims) for a in axes)}, out=0)
    elif -1 not in dims:
        node.op("squeeze", {"X": x}, {"axes": []}, out=0)
    else:  # which unknown dims are 1 is seen only at run time
        node.op("onnx_squeeze", {"X": x}, out=0)


@mapper("Unsqueeze")
def unsqueeze(node: Node) -> None:
    x, rank = node.input(0), node.rank(0)
    axes = node.attr("axes") if node.opset < 13 else node.ints(1, "the axes")
    if axes is None:
        node.op("onnx_unsqueeze", {"X": x, "Axes": node.input(1)}, out=0)
        return
    out_rank = rank + len(axes)
    node.op("unsqueeze", {"X": x}, {"axes": sorted(a % out_rank for a in axes)}, out=0)


@mapper("Split")
def split(node: Node) -> None:
    x, dims = node.input(0), node.shape(0)
    axis = _axis(node.attr("axis", 0), len(dims), node)
    count = node.num_outputs
    sizes = node.attr("split") if node.opset < 13 else node.ints(1, "the split sizes")
    dim = dims[axis]
    if sizes is None and not node.has_input(1) and dim >= 0:
        part = -(-dim // count)  # opset 18: the last part may be smaller
        sizes = [min(part, max(dim - part * i, 0)) for i in range(count)]
    if sizes is not None:
        parts = node.op(
            "split", {"X": x}, {"sections": sizes, "axis": axis}, outputs=[("Out", count)]
        )
    else:
        split_sizes = node.input(1) if node.has_input(1) else None
        attrs = {"axis": axis, "num": count}
        parts = node.op(
            "onnx_split", {"X": x, "Split": split_sizes}, attrs, outputs=[("Out", count)]
        )
    for k, part in enumerate(parts):
        node.set_output(k, part)


@mapper("Slice")
def slice_(node: Node) -> None:
    x, dims = node.input(0), node.shape(0)
    if node.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes", list(range(len(starts)))), None
        operands = [node.constant(np.asarray(v, np.int64)) for v in (starts, ends, axes)]
        operands.append(None)
    else:
        starts, ends = node.ints(1, "starts"), node.ints(2, "ends")
        axes = node.ints(3, "axes") if node.has_input(3) else list(range(len(starts or [])))
        steps = node.ints(4, "steps") if node.has_input(4) else None
        operands = [node.input(i) for i in (1, 2, 3, 4)]
    known = None not in (starts, ends, axes) and (steps is not None or not node.has_input(4))
    if known and all(s == 1 for s in steps or [1]):
        attrs = {"axes": [a % len(dims) for a in axes], "starts": starts, "ends": ends}
        node.op("slice", {"Input": x}, attrs, out=0)
        return
    inputs = dict(zip(("Starts", "Ends", "Axes", "Steps"), operands))
    node.op("onnx_slice", {"Input": x, **inputs}, out=0)


@mapper("Gather")
def gather(node: Node) -> None:
    x, dims = node.input(0), node.shape(0)
    axis = _axis(node.attr("axis", 0), len(dims), node)
    index = node.const(1)
    if index is not None and axis == 0 and index.ndim == 1 and (index >= 0).all():
        node.op("gather", {"X": x, "Index": node.input(1)}, out=0)
        return
    node.op("onnx_gather", {"X": x, "Index": node.input(1)}, {"axis": axis}, out=0)


@mapper("Expand")
def expand(node: Node) -> None:
    """X broadcast to Shape both ways (NumPy's rule): X plus zeros of Shape."""
    x, dtype = node.input(0), node.dtype(0)
    target = node.ints(1, "the shape")
    if target is not None and node.graph.small(target, dtype):
        zeros = node.constant(np.zeros(target, dtype))
    else:
        attrs = {"value": 0.0, "dtype": dtype}
        zeros = node.op("onnx_constant_of_shape", {"Input": node.input(1)}, attrs, fold=False)
    if dtype == "bool":
        node.op("logical_or", {"X": x, "Y": zeros}, out=0)
    else:
        node.op("elementwise_add", {"X": x, "Y": zeros}, out=0)


@mapper("Tile")
def tile(node: Node) -> None:
    repeats = node.ints(1, "the repeats")
    if repeats is not None and all(r >= 1 for r in repeats):
        node.op("expand", {"X": node.input(0)}, {"expand_times": repeats}, out=0)
        return
    node.op("onnx_tile", {"X": node.input(0), "Repeats": node.input(1)}, out=0)


@mapper("Pad")
def pad(node: Node) -> None:
    x, rank = node.input(0), node.rank(0)
    mode = node.attr("mode", "constant")
    if node.opset < 11:
        pads = node.attr("pads")
        value = node.attr("value", 0.0)
        operands = {"Pads": node.constant(np.asarray(pads, np.int64))}
        if value:
            operands["Value"] = node.constant(value, node.dtype(0))
        axes = list(range(rank))
    else:
        pads = node.ints(1, "the pads")
        value = node.const(2) if node.has_input(2) else np.zeros((), node.dtype(0))
        value = None if value is None else float(np.asarray(value).reshape(-1)[0])
        axes = node.ints(3, "the axes") if node.has_input(3) else list(range(rank))
        operands = {"Pads": node.input(1), "Value": node.input(2), "Axes": node.input(3)}
    static = None not in (pads, value, axes) and mode == "constant" and min(pads or [0]) >= 0
    if static:
        per_dim = [0] * (2 * rank)
        for k, axis in enumerate(axes):
            per_dim[2 * (axis % rank)] = pads[k]
            per_dim[2 * (axis % rank) + 1] = pads[k + len(axes)]
        node.op("pad", {"X": x}, {"paddings": per_dim, "pad_value": value}, out=0)
        return
    node.op("onnx_pad", {"X": x, **operands}, {"mode": mode}, out=0)


@mapper("Range")
def range_(node: Node) -> None:
    inputs = {"Start": node.input(0), "End": node.input(1), "Step": node.input(2)}
    node.op("range", inputs, out=0)


@mapper("Where")
def where(node: Node) -> None:
    inputs = {"Condition": node.input(0), "X": node.input(1), "Y": node.input(2)}
    node.op("where", inputs, out=0)


# ---- element-wise indexing, triangles, running sums (nestflow.ops.onnx_compat) ----


@mapper("Trilu")
def trilu(node: Node) -> None:
    inputs = {"X": node.input(0), "K": node.input(1)}
    node.op("onnx_trilu", inputs, {"upper": bool(node.attr("upper", 1))}, out=0)


@mapper("CumSum")
def cumsum(node: Node) -> None:
    attrs = {"exclusive": bool(node.attr("exclusive", 0)), "reverse": bool(node.attr("reverse", 0))}
    axis = node.ints(1, "the axis")
    if axis is not None:
        attrs["axis"] = _axis(axis[0], node.rank(0), node)
        node.op("cumsum", {"X": node.input(0)}, attrs, out=0)
        return
    node.op("onnx_cumsum", {"X": node.input(0), "Axis": node.input(1)}, attrs, out=0)


@mapper("GatherElements")
def gather_elements(node: Node) -> None:
    inputs = {"X": node.input(0), "Index": node.input(1)}
    node.op("onnx_gather_elements", inputs, {"axis": node.attr("axis", 0)}, out=0)


@mapper("ScatterElements", "Scatter")
def scatter_elements(node: Node) -> None:
    inputs = {"X": node.input(0), "Index": node.input(1), "Updates": node.input(2)}
    attrs = {"axis": node.attr("axis", 0), "reduction": node.attr("reduction", "none")}
    node.op("onnx_scatter_elements", inputs, attrs, out=0)


@mapper("ScatterND")
def scatter_nd(node: Node) -> None:
    inputs = {"X": node.input(0), "Index": node.input(1), "Updates": node.input(2)}
    attrs = {"reduction": node.attr("reduction", "none")}
    node.op("onnx_scatter_nd", inputs, attrs, out=0)


@mapper("OneHot")
def one_hot(node: Node) -> None:
    inputs = {"Indices": node.input(0), "Depth": node.input(1), "Values": node.input(2)}
    node.op("onnx_one_hot", inputs, {"axis": node.attr("axis", -1)}, out=0)


@mapper("NonZero")
def non_zero(node: Node) -> None:
    x = node.input(0)
    if node.dtype(0) != "bool":
        x = node.op("cast", {"X": x}, {"out_dtype": "bool"})
    coordinates = node.op("where_index", {"Condition": x})  # [count, rank]
    node.op("transpose", {"X": coordinates}, {"axis": [1, 0]}, out=0)


@mapper("Einsum")
def einsum(node: Node) -> None:
    node.op("onnx_einsum", {"Inputs": node.inputs()}, {"equation": node.attr("equation")}, out=0)


@mapper("DepthToSpace", "SpaceToDepth")
def depth_to_space(node: Node) -> None:
    """Rearranged by a reshape, a transpose and a reshape (X's C, H, W known); mode DCR
    (default) or CRD orders the moved block's elements depth-column-row or column-row-depth."""
    n, c, h, w = node.shape(0)
    b = node.attr("blocksize")
    if -1 in (c, h, w):
        raise node.unsupported(f"{node.op_type} of X {list(node.shape(0))} of unknown size")
    crd = node.attr("mode", "DCR") == "CRD"
    if node.op_type == "SpaceToDepth":
        split = [0, c, h // b, b, w // b, b]
        perm = [0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4]
        target = [0, c * b * b, h // b, w // b]
    else:
        split = [0, c // (b * b), b, b, h, w] if crd else [0, b, b, c // (b * b), h, w]
        perm = [0, 1, 4, 2, 5, 3] if crd else [0, 3, 4, 1, 5, 2]
        target = [0, c // (b * b), h * b, w * b]
    parts = node.op("reshape", {"X": node.input(0)}, {"shape": split})
    moved = node.op("transpose", {"X": parts}, {"axis": perm})
    node.op("reshape", {"X": moved}, {"shape": target}, out=0)


@mapper("CumProd")
def cumprod(node: Node) -> None:
    attrs = {"exclusive": bool(node.attr("exclusive", 0)), "reverse": bool(node.attr("reverse", 0))}
    node.op("onnx_cumprod", {"X": node.input(0), "Axis": node.input(1)}, attrs, out=0)
