"""Mappers of ONNX's reductions (Reduce*, ArgMax/ArgMin) and TopK.

The reduced axes are an attribute before opset 18 (13 for ReduceSum) and an optional input
from then on; known at import they give nestflow's reduce_* ops, else `onnx_reduce`.
ReduceL1/L2/LogSum/LogSumExp/SumSquare compose a sum with elementwise ops.
"""

from __future__ import annotations

from nestflow.onnx.importers.registry import Node, mapper

# ONNX op -> (elementwise op before the reduction, reduction kind, op after it)
_REDUCE = {
    "ReduceSum": (None, "sum", None),
    "ReduceMean": (None, "mean", None),
    "ReduceMax": (None, "max", None),
    "ReduceMin": (None, "min", None),
    "ReduceProd": (None, "prod", None),
    "ReduceL1": ("abs", "sum", None),
    "ReduceL2": ("square", "sum", "sqrt"),
    "ReduceSumSquare": ("square", "sum", None),
    "ReduceLogSum": (None, "sum", "log"),
    "ReduceLogSumExp": ("exp", "sum", "log"),
}

# the opset from which each op takes its axes as an input
_AXES_INPUT_SINCE = {"ReduceSum": 13}


@mapper(*_REDUCE)
def reduce(node: Node) -> None:
    before, kind, after = _REDUCE[node.op_type]
    x, rank = node.input(0), node.rank(0)
    keepdims = bool(node.attr("keepdims", 1))
    noop = bool(node.attr("noop_with_empty_axes", 0))
    if node.opset >= _AXES_INPUT_SINCE.get(node.op_type, 18):
        axes = node.ints(1, "the axes") if node.has_input(1) else []
    else:
        axes = node.attr("axes", [])
    if before is not None:
        x = node.op(before, {"X": x})
    if axes is None:  # computed at run time
        attrs = {"kind": kind, "keepdims": keepdims, "noop_with_empty_axes": noop}
        y = node.op("onnx_reduce", {"X": x, "Axes": node.input(1)}, attrs)
    elif not axes and noop:
        y = x
    else:
        attrs = {
            "dim": [a % max(rank, 1) for a in axes],
            "keep_dim": keepdims,
            "reduce_all": not axes,
        }
        y = node.op(f"reduce_{kind}", {"X": x}, attrs)
    if after is not None:
        y = node.op(after, {"X": y})
    if y == node.name_of(0):
        node.op("assign", {"X": y}, out=0)
    else:
        node.set_output(0, y)


@mapper("ArgMax", "ArgMin")
def arg_extreme(node: Node) -> None:
    op_type = "arg_max" if node.op_type == "ArgMax" else "arg_min"
    x, dims = node.input(0), node.shape(0)
    axis = node.attr("axis", 0) % max(len(dims), 1)
    attrs = {"axis": axis, "keepdims": bool(node.attr("keepdims", 1)), "dtype": "int64"}
    if not node.attr("select_last_index", 0):
        node.op(op_type, {"X": x}, attrs, out=0)
        return
    # the last extreme: the first one of X reversed along the axis, counted from the end
    if dims[axis] < 0:
        raise node.unsupported(f"select_last_index over dim {axis} of unknown size {list(dims)}")
    reverse = {"axes": [axis], "starts": [-1], "ends": [-dims[axis] - 1], "strides": [-1]}
    flipped = node.op("strided_slice", {"Input": x}, reverse)
    first = node.op(op_type, {"X": flipped}, attrs)
    node.op("scale", {"X": first}, {"scale": -1.0, "bias": float(dims[axis] - 1)}, out=0)


@mapper("TopK")
def top_k(node: Node) -> None:
    x, dims = node.input(0), node.shape(0)
    rank = len(dims)
    axis = node.attr("axis", -1) % rank
    if node.opset < 10:
        k_input, k = None, node.attr("k")
    else:
        k_input = node.input(1)
        known = node.ints(1, "k")
        k = None if known is None else known[0]
    largest = node.attr("largest", 1)
    if not node.attr("sorted", 1):
        pass  # sorted output is a valid answer for sorted=0 (the order is then unspecified)
    last = rank - 1
    perm = list(range(rank))
    perm[axis], perm[last] = perm[last], perm[axis]
    if axis != last:
        x = node.op("transpose", {"X": x}, {"axis": perm})
    if not largest:
        if node.dtype(0).startswith("uint") or node.dtype(0) == "bool":
            raise node.unsupported(f"TopK smallest of {node.dtype(0)}")
        x = _negated(node, x)
    inputs = {"X": x, "K": k_input if k is None else None}
    attrs = {} if k is None else {"k": k}
    values, indices = node.op("top_k", inputs, attrs, outputs=("Out", "Indices"))
    if not largest:
        values = _negated(node, values)
    if axis != last:
        values = node.op("transpose", {"X": values}, {"axis": perm})
        indices = node.op("transpose", {"X": indices}, {"axis": perm})
    node.set_output(0, values)
    node.set_output(1, indices)


def _negated(node: Node, x: str) -> str:
    info = node.graph.info(x)
    if info.dtype.startswith("float"):
        return node.op("scale", {"X": x}, {"scale": -1.0})
    zero = node.constant(0, info.dtype)
    return node.op("elementwise_sub", {"X": zero, "Y": x})
