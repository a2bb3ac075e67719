"""ONNX mappers of nestflow.ops.indexing: where, arg_max/min, top_k, gather(_nd), scatter,
one_hot, pad, expand, (un)squeeze, stack/unstack, cumsum, range, shape,
fill_constant_batch_size_like."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from nestflow.errors import AttrError
from nestflow.onnx.exporters.graph import OpContext, exports


@exports("where")
def where(ctx: OpContext) -> None:
    inputs = [ctx.input("Condition"), ctx.input("X"), ctx.input("Y")]
    ctx.set_output("Out", ctx.node("Where", inputs))


@exports("where_index")
def where_index(ctx: OpContext) -> None:
    coords = ctx.node("NonZero", [ctx.input("Condition")])  # [rank, count]
    ctx.set_output("Out", ctx.node("Transpose", [coords], perm=[1, 0]))


@exports("arg_max", "arg_min")
def arg_extreme(ctx: OpContext) -> None:
    x = ctx.input("X")
    axis, keepdims = ctx.attrs["axis"], ctx.attrs["keepdims"]
    if ctx.attrs["flatten"]:
        x, axis, keepdims = ctx.reshape(x, [-1]), 0, True
    op_type = "ArgMax" if ctx.op.type == "arg_max" else "ArgMin"
    out = ctx.node(op_type, [x], axis=axis, keepdims=int(keepdims))
    dtype = ctx.attrs["dtype"]
    ctx.set_output("Out", out if dtype == "int64" else ctx.cast(out, dtype))


@exports("top_k")
def top_k(ctx: OpContext) -> None:
    if ctx.has_input("K"):
        k = ctx.reshape(ctx.input("K"), [1])
        if ctx.in_var("K").dtype != "int64":
            k = ctx.cast(k, "int64")
    else:
        k = ctx.ints([ctx.attrs["k"]])
    # sorted TopK puts equal values in increasing index order, as nestflow's stable sort
    values, indices = ctx.node("TopK", [ctx.input("X"), k], outputs=2, axis=-1, largest=1)
    ctx.set_output("Out", values)
    ctx.set_output("Indices", indices)


def _row_ids(ctx: OpContext, slot: str) -> str:
    """Ids [N] or [N, 1] as an int64 vector."""
    ids = ctx.reshape(ctx.input(slot), [-1])
    return ids if ctx.in_var(slot).dtype == "int64" else ctx.cast(ids, "int64")


@exports("gather")
def gather(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Gather", [ctx.input("X"), _row_ids(ctx, "Index")], axis=0))


@exports("gather_nd")
def gather_nd(ctx: OpContext) -> None:
    index, var = ctx.input("Index"), ctx.in_var("Index")
    if var.shape[-1] == 0:
        raise ctx.unsupported("an Index with 0 coordinates (ONNX's GatherND needs at least 1)")
    if var.dtype != "int64":
        index = ctx.cast(index, "int64")
    ctx.set_output("Out", ctx.node("GatherND", [ctx.input("X"), index]))


@exports("scatter")
def scatter(ctx: OpContext) -> None:
    x, updates = ctx.input("X"), ctx.input("Updates")
    ids = ctx.unsqueeze(_row_ids(ctx, "Ids"), [-1])
    if ctx.attrs["overwrite"]:
        ctx.set_output("Out", ctx.node("ScatterND", [x, ids, updates]))
        return
    if ctx.opset < 16:
        raise AttrError(
            f"scatter with overwrite=False adds repeated updates, which needs ScatterND's "
            f"reduction (ONNX opset >= 16); the export asked for opset {ctx.opset}"
        )
    zeros = ctx.zeros_like(updates, ctx.in_var("Updates").dtype)
    cleared = ctx.node("ScatterND", [x, ids, zeros])
    ctx.set_output("Out", ctx.node("ScatterND", [cleared, ids, updates], reduction="add"))


def _one_hot(ctx: OpContext, ids: str) -> None:
    """Equal(ids[..., None], range(depth)): ids outside [0, depth) give zero rows (ONNX's
    OneHot would count negative ids from the end)."""
    ids_dtype = ctx.in_var("X").dtype
    if ctx.has_input("depth_tensor"):
        depth = ctx.to_scalar(ctx.input("depth_tensor"))
        if ctx.in_var("depth_tensor").dtype != ids_dtype:
            depth = ctx.cast(depth, ids_dtype)
    else:
        depth = ctx.scalar(ctx.attrs["depth"], ids_dtype)
    classes = ctx.node("Range", [ctx.scalar(0, ids_dtype), depth, ctx.scalar(1, ids_dtype)])
    hot = ctx.node("Equal", [ctx.unsqueeze(ids, [-1]), classes])
    ctx.set_output("Out", ctx.cast(hot, ctx.attrs["dtype"]))


@exports("one_hot")
def one_hot(ctx: OpContext) -> None:
    _one_hot(ctx, ctx.squeeze(ctx.input("X"), [ctx.in_var("X").ndim - 1]))


@exports("one_hot_v2")
def one_hot_v2(ctx: OpContext) -> None:
    _one_hot(ctx, ctx.input("X"))


@exports("pad")
def pad(ctx: OpContext) -> None:
    paddings = ctx.attrs["paddings"]
    pads = paddings[0::2] + paddings[1::2]  # ONNX: all begins, then all ends
    value = ctx.scalar(ctx.attrs["pad_value"], ctx.in_var("X").dtype)
    ctx.set_output("Out", ctx.node("Pad", [ctx.input("X"), ctx.ints(pads), value]))


@exports("expand")
def expand(ctx: OpContext) -> None:
    repeats = ctx.ints(ctx.attrs["expand_times"])
    ctx.set_output("Out", ctx.node("Tile", [ctx.input("X"), repeats]))


def _x_shape(ctx: OpContext) -> None:
    """XShape: an empty [0, *X.shape] tensor recording X's shape."""
    if ctx.has_output("XShape"):
        shape = ctx.node("Concat", [ctx.ints([0]), ctx.shape(ctx.input("X"))], axis=0)
        ctx.set_output("XShape", ctx.fill(shape, 0, ctx.in_var("X").dtype))


@exports("squeeze", "squeeze2")
def squeeze(ctx: OpContext) -> None:
    var = ctx.in_var("X")
    axes = ctx.attrs["axes"]
    if not axes:  # every dim of size 1, found at run time as nestflow does
        out = ctx.squeeze(ctx.input("X"))
    else:
        # a listed dim is dropped when it is 1, or unknown (as shape inference assumed)
        drop = sorted({a % var.ndim for a in axes if var.shape[a % var.ndim] in (1, -1)})
        out = ctx.squeeze(ctx.input("X"), drop) if drop else ctx.node("Identity", [ctx.input("X")])
    ctx.set_output("Out", out)
    _x_shape(ctx)


def inserted_axes(rank: int, axes: list[int]) -> list[int]:
    """The positions in the result of the dims nestflow's unsqueeze inserts one at a time
    (a negative axis counts from the end of the shape as it is at that point)."""
    dims: list[bool] = [False] * rank  # True: an inserted dim
    for axis in axes:
        at = axis + len(dims) + 1 if axis < 0 else axis
        dims.insert(at, True)
    return [i for i, new in enumerate(dims) if new]


@exports("unsqueeze", "unsqueeze2")
def unsqueeze(ctx: OpContext) -> None:
    axes = inserted_axes(ctx.in_var("X").ndim, ctx.attrs["axes"])
    ctx.set_output("Out", ctx.unsqueeze(ctx.input("X"), axes))
    _x_shape(ctx)


@exports("stack")
def stack(ctx: OpContext) -> None:
    axis = ctx.attrs["axis"] % (ctx.in_var("X").ndim + 1)
    parts = [ctx.unsqueeze(x, [axis]) for x in ctx.inputs("X")]
    ctx.set_output("Y", ctx.node("Concat", parts, axis=axis))


@exports("unstack")
def unstack(ctx: OpContext) -> None:
    axis = ctx.attrs["axis"] % ctx.in_var("X").ndim
    num = ctx.attrs["num"]
    parts = ctx.split(ctx.input("X"), axis, [1] * num, num) if num else []
    for i, part in enumerate(parts):
        ctx.set_output("Y", ctx.squeeze(part, [axis]), i)


@exports("cumsum")
def cumsum(ctx: OpContext) -> None:
    x, axis = ctx.input("X"), ctx.attrs["axis"]
    if ctx.attrs["flatten"]:
        x, axis = ctx.reshape(x, [-1]), 0
    attrs = {"exclusive": int(ctx.attrs["exclusive"]), "reverse": int(ctx.attrs["reverse"])}
    ctx.set_output("Out", ctx.node("CumSum", [x, ctx.scalar(axis, "int64")], **attrs))


@exports("range")
def range_(ctx: OpContext) -> None:
    ends = [ctx.to_scalar(ctx.input(slot)) for slot in ("Start", "End", "Step")]
    ctx.set_output("Out", ctx.node("Range", ends))


@exports("shape")
def shape(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.cast(ctx.shape(ctx.input("Input")), "int32"))


@exports("fill_constant_batch_size_like")
def fill_constant_batch_size_like(ctx: OpContext) -> None:
    a = ctx.attrs
    shape = list(a["shape"])
    out_idx, in_idx = a["output_dim_idx"], a["input_dim_idx"]
    parts = []
    if shape[:out_idx]:
        parts.append(ctx.ints(shape[:out_idx]))
    parts.append(ctx.dim(ctx.input("Input"), in_idx))
    if shape[out_idx + 1 :]:
        parts.append(ctx.ints(shape[out_idx + 1 :]))
    dims = parts[0] if len(parts) == 1 else ctx.node("Concat", parts, axis=0)
    value = float(a["str_value"]) if a["str_value"] else a["value"]
    fill = numpy_helper.from_array(np.asarray([value], dtype=a["dtype"]))
    ctx.set_output("Out", ctx.node("ConstantOfShape", [dims], value=fill))
