"""ONNX mappers of nestflow.ops.tensor and ops/constant.py: fills, copies, casts, layout
(reshape, transpose, concat, split, slice), lookup_table, dropout (inference)."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from nestflow.onnx.exporters.graph import INT64_MIN, OpContext, exports


@exports("fill_constant")
def fill_constant(ctx: OpContext) -> None:
    dtype = ctx.attrs["dtype"]
    value = numpy_helper.from_array(np.asarray([ctx.attrs["value"]], dtype=dtype))
    shape = ctx.ints(ctx.attrs["shape"])
    ctx.set_output("Out", ctx.node("ConstantOfShape", [shape], value=value))


@exports("assign_value")
def assign_value(ctx: OpContext) -> None:
    values = np.asarray(ctx.attrs["values"], dtype=ctx.attrs["dtype"])
    ctx.set_output("Out", ctx.node("Identity", [ctx.const(values.reshape(ctx.attrs["shape"]))]))


@exports("assign")
def assign(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Identity", [ctx.input("X")]))


@exports("cast")
def cast(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.cast(ctx.input("X"), ctx.attrs["out_dtype"]))


@exports("increment")
def increment(ctx: OpContext) -> None:
    x, dtype, step = ctx.input("X"), ctx.in_var("X").dtype, ctx.attrs["step"]
    if np.dtype(dtype).kind == "f" or float(step).is_integer():
        ctx.set_output("Out", ctx.node("Add", [x, ctx.scalar(step, dtype)]))
        return
    # an integer counter and a fractional step: added in floats, truncated back
    total = ctx.node("Add", [ctx.cast(x, "float64"), ctx.scalar(step, "float64")])
    ctx.set_output("Out", ctx.cast(total, dtype))


@exports("fill_zeros_like")
def fill_zeros_like(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.zeros_like(ctx.input("X"), ctx.in_var("X").dtype))


@exports("fill_any_like")
def fill_any_like(ctx: OpContext) -> None:
    dtype = ctx.attrs["dtype"] or ctx.in_var("X").dtype
    ctx.set_output("Out", ctx.zeros_like(ctx.input("X"), dtype, ctx.attrs["value"]))


@exports("reshape")
def reshape(ctx: OpContext) -> None:
    # ONNX's Reshape reads 0 (copy X's dim) and -1 (inferred) as Fluid's does. A -1 that
    # build-time inference resolved is given as its size: ONNX cannot infer a dim of an
    # empty tensor.
    out_shape = ctx.out_var("Out").shape
    shape = [
        out_shape[i] if d == -1 and len(out_shape) == len(ctx.attrs["shape"]) else d
        for i, d in enumerate(ctx.attrs["shape"])
    ]
    ctx.set_output("Out", ctx.reshape(ctx.input("X"), shape))


@exports("transpose")
def transpose(ctx: OpContext) -> None:
    rank = ctx.in_var("X").ndim
    perm = [d % rank for d in ctx.attrs["axis"]]
    ctx.set_output("Out", ctx.node("Transpose", [ctx.input("X")], perm=perm))


@exports("concat")
def concat(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Concat", ctx.inputs("X"), axis=ctx.attrs["axis"]))


@exports("split")
def split(ctx: OpContext) -> None:
    var = ctx.in_var("X")
    axis = ctx.attrs["axis"] % var.ndim
    dim = var.shape[axis]
    sections, num = ctx.attrs["sections"], ctx.attrs["num"]
    count = len(ctx.op.output("Out"))
    sizes: list[int] | str | None
    if not sections:
        sizes = None if dim < 0 else [dim // num] * num
    elif -1 not in sections or dim >= 0:
        rest = dim - sum(s for s in sections if s >= 0)
        sizes = [rest if s == -1 else s for s in sections]
    else:
        # one section is "the rest" of a dim known only at run time
        known = ctx.ints([sum(s for s in sections if s >= 0)])
        rest = ctx.node("Sub", [ctx.dim(ctx.input("X"), axis), known])
        parts = [rest if s == -1 else ctx.ints([s]) for s in sections]
        sizes = ctx.node("Concat", parts, axis=0)
    for i, part in enumerate(ctx.split(ctx.input("X"), axis, sizes, count)):
        ctx.set_output("Out", part, i)


def slice_node(ctx: OpContext, x: str, axes, starts, ends, steps=None) -> str:
    inputs = [x, ctx.ints(starts), ctx.ints(ends), ctx.ints(axes)]
    if steps is not None:
        inputs.append(ctx.ints(steps))
    return ctx.node("Slice", inputs)


def decrease(ctx: OpContext, out: str, rank: int) -> str:
    """Drop the dims of `decrease_axis` (each of size 1) from the sliced `out`."""
    axes = sorted({a % rank for a in ctx.attrs["decrease_axis"]})
    return ctx.squeeze(out, axes) if axes else out


@exports("slice")
def slice_(ctx: OpContext) -> None:
    rank = ctx.in_var("Input").ndim
    a = ctx.attrs
    out = slice_node(ctx, ctx.input("Input"), a["axes"], a["starts"], a["ends"])
    ctx.set_output("Out", decrease(ctx, out, rank))


@exports("strided_slice")
def strided_slice(ctx: OpContext) -> None:
    rank = ctx.in_var("Input").ndim
    a = ctx.attrs
    # Fluid's convention: an end of -1 with a negative stride runs through index 0
    ends = [INT64_MIN if s < 0 and e == -1 else e for e, s in zip(a["ends"], a["strides"])]
    out = slice_node(ctx, ctx.input("Input"), a["axes"], a["starts"], ends, a["strides"])
    ctx.set_output("Out", decrease(ctx, out, rank))


@exports("lookup_table")
def lookup_table(ctx: OpContext) -> None:
    ids, ids_var = ctx.input("Ids"), ctx.in_var("Ids")
    if ids_var.ndim >= 2 and ids_var.shape[-1] == 1:
        ids = ctx.squeeze(ids, [ids_var.ndim - 1])  # Paddle's column of ids
    out = ctx.node("Gather", [ctx.input("W"), ids], axis=0)
    padding_idx = ctx.attrs["padding_idx"]
    if padding_idx != -1:
        padded = ctx.node("Equal", [ids, ctx.scalar(padding_idx, ids_var.dtype)])
        zero = ctx.scalar(0, ctx.in_var("W").dtype)
        out = ctx.node("Where", [ctx.unsqueeze(padded, [-1]), zero, out])
    ctx.set_output("Out", out)


@exports("dropout")
def dropout(ctx: OpContext) -> None:
    x, dtype = ctx.input("X"), ctx.in_var("X").dtype
    p = ctx.attrs["dropout_prob"]
    upscale = ctx.attrs.get("dropout_implementation") == "upscale_in_train"
    if ctx.attrs["is_test"] or p == 0.0:
        # Fluid's downgrade_in_infer scales at inference instead of in training.
        kept = (
            ctx.node("Identity", [x])
            if upscale or p == 0.0
            else (ctx.node("Mul", [x, ctx.scalar(1.0 - p, dtype)]))
        )
        ctx.set_output("Out", kept)
        ctx.set_output("Mask", ctx.zeros_like(x, "uint8", 1))
    elif p == 1.0:
        ctx.set_output("Out", ctx.zeros_like(x, dtype))
        ctx.set_output("Mask", ctx.zeros_like(x, "uint8"))
    else:
        raise ctx.unsupported(
            f"dropout in training (is_test False, dropout_prob {p}) draws random masks; "
            f"the exported program is cloned for_test, so this op sits where clone does not "
            f"reach it"
        )
