"""ONNX mappers of nestflow.ops.sequence (padded [batch, time, ...] sequences with lengths) and
nestflow.ops.rnn_unit (one LSTM or GRU step)."""

from __future__ import annotations

import numpy as np

from nestflow.onnx.exporters.graph import OpContext, exports


def _lengths(ctx: OpContext, x: str) -> str:
    """Length as int64 [batch]; every row the whole time dim when it is not given."""
    if ctx.has_input("Length"):
        lengths = ctx.input("Length")
        return lengths if ctx.in_var("Length").dtype == "int64" else ctx.cast(lengths, "int64")
    return ctx.node("Expand", [ctx.dim(x, 1), ctx.dim(x, 0)])


def _steps(ctx: OpContext, x: str) -> str:
    """int64 [time]: 0, 1, ..., time - 1."""
    time = ctx.to_scalar(ctx.dim(x, 1))
    return ctx.node("Range", [ctx.scalar(0, "int64"), time, ctx.scalar(1, "int64")])


def _per_row(ctx: OpContext, v: str, rank: int, from_axis: int) -> str:
    """v shaped to broadcast against a rank-`rank` tensor (dims of 1 from `from_axis` on)."""
    return ctx.unsqueeze(v, list(range(from_axis, rank))) if rank > from_axis else v


def _at_steps(ctx: OpContext, x: str, rank: int, steps: str) -> str:
    """x[n, steps[n]] for every row n ([batch, ...])."""
    index = _per_row(ctx, steps, rank, 1)  # [batch, 1, 1, ...]
    shape = ctx.node("Concat", [ctx.dim(x, 0), ctx.ints([1]), ctx.shape(x, 2, None)], axis=0)
    picked = ctx.node("GatherElements", [x, ctx.node("Expand", [index, shape])], axis=1)
    return ctx.squeeze(picked, [1])


@exports("sequence_mask")
def sequence_mask(ctx: OpContext) -> None:
    x = ctx.input("X")
    dtype = ctx.in_var("X").dtype
    if ctx.has_input("MaxLenTensor"):
        maxlen = ctx.to_scalar(ctx.input("MaxLenTensor"))
        if ctx.in_var("MaxLenTensor").dtype != dtype:
            maxlen = ctx.cast(maxlen, dtype)
    elif ctx.attrs["maxlen"] >= 0:
        maxlen = ctx.scalar(ctx.attrs["maxlen"], dtype)
    else:  # the longest length (0 for no lengths at all)
        flat = ctx.node("Concat", [ctx.reshape(x, [-1]), ctx.const(np.zeros(1, dtype))], axis=0)
        maxlen = ctx.reduce("ReduceMax", flat, None, keepdims=False)
    steps = ctx.node("Range", [ctx.scalar(0, dtype), maxlen, ctx.scalar(1, dtype)])
    inside = ctx.node("Less", [steps, ctx.unsqueeze(x, [-1])])
    ctx.set_output("Y", ctx.cast(inside, ctx.attrs["out_dtype"]))


@exports("sequence_pool")
def sequence_pool(ctx: OpContext) -> None:
    x, var = ctx.input("X"), ctx.in_var("X")
    dtype, rank = var.dtype, var.ndim
    kind = ctx.attrs["pooltype"]
    lengths = _lengths(ctx, x)
    empty = _per_row(ctx, ctx.node("Equal", [lengths, ctx.scalar(0, "int64")]), rank - 1, 1)
    valid = _per_row(ctx, ctx.node("Less", [_steps(ctx, x), ctx.unsqueeze(lengths, [1])]), rank, 2)
    index = None
    if kind in ("SUM", "AVERAGE", "SQRT"):
        masked = ctx.node("Where", [valid, x, ctx.scalar(0, dtype)])
        out = ctx.reduce("ReduceSum", masked, [1], keepdims=False)
        if kind != "SUM":
            count = ctx.cast(ctx.node("Max", [lengths, ctx.scalar(1, "int64")]), dtype)
            count = count if kind == "AVERAGE" else ctx.node("Sqrt", [count])
            out = ctx.node("Div", [out, _per_row(ctx, count, rank - 1, 1)])
    elif kind == "MAX":
        masked = ctx.node("Where", [valid, x, ctx.scalar(-np.inf, dtype)])
        out = ctx.reduce("ReduceMax", masked, [1], keepdims=False)
        first = ctx.cast(ctx.node("ArgMax", [masked], axis=1, keepdims=0), "int32")
        index = ctx.node("Where", [empty, ctx.scalar(-1, "int32"), first])
    else:
        last = ctx.node("Sub", [lengths, ctx.scalar(1, "int64")])
        at = last if kind == "LAST" else ctx.node("Mul", [lengths, ctx.scalar(0, "int64")])
        out = _at_steps(ctx, x, rank, ctx.node("Max", [at, ctx.scalar(0, "int64")]))
    pad = ctx.scalar(ctx.attrs["pad_value"], dtype)
    ctx.set_output("Out", ctx.node("Where", [empty, pad, out]))
    if ctx.has_output("MaxIndex"):
        if index is None:
            index = ctx.zeros_like(out, "int32")
        ctx.set_output("MaxIndex", index)


@exports("sequence_reverse")
def sequence_reverse(ctx: OpContext) -> None:
    x, rank = ctx.input("X"), ctx.in_var("X").ndim
    if not ctx.has_input("Length"):
        ctx.set_output(
            "Y",
            ctx.node(
                "Slice", [x, ctx.ints([-1]), ctx.ints([-(2**63)]), ctx.ints([1]), ctx.ints([-1])]
            ),
        )
        return
    steps = ctx.unsqueeze(_steps(ctx, x), [0])  # [1, time]
    lengths = ctx.unsqueeze(_lengths(ctx, x), [1])  # [batch, 1]
    flipped = ctx.node("Sub", [ctx.node("Sub", [lengths, ctx.scalar(1, "int64")]), steps])
    inside = ctx.node("GreaterOrEqual", [flipped, ctx.scalar(0, "int64")])
    source = ctx.node("Where", [inside, flipped, ctx.node("Expand", [steps, ctx.shape(flipped)])])
    index = ctx.node("Expand", [_per_row(ctx, source, rank, 2), ctx.shape(x)])
    ctx.set_output("Y", ctx.node("GatherElements", [x, index], axis=1))


# ---- rnn_unit ----


@exports("lstm_unit")
def lstm_unit(ctx: OpContext) -> None:
    x, dtype = ctx.input("X"), ctx.in_var("X").dtype
    axis = ctx.in_var("X").ndim - 1
    i, f, o, g = ctx.split(x, axis, None, 4)  # Fluid's gate order
    bias = ctx.attrs["forget_bias"]
    if bias:
        f = ctx.node("Add", [f, ctx.scalar(bias, dtype)])
    c = ctx.node(
        "Add",
        [
            ctx.node("Mul", [ctx.input("C_prev"), ctx.node("Sigmoid", [f])]),
            ctx.node("Mul", [ctx.node("Sigmoid", [i]), ctx.node("Tanh", [g])]),
        ],
    )
    ctx.set_output("C", c)
    ctx.set_output("H", ctx.node("Mul", [ctx.node("Tanh", [c]), ctx.node("Sigmoid", [o])]))


@exports("gru_cell")
def gru_cell(ctx: OpContext) -> None:
    x = ctx.input("X")
    axis = ctx.in_var("X").ndim - 1
    hidden = ctx.input("HiddenProj")
    if ctx.has_input("Bias"):
        hidden = ctx.node("Add", [hidden, ctx.input("Bias")])
    x_r, x_z, x_n = ctx.split(x, axis, None, 3)
    h_r, h_z, h_n = ctx.split(hidden, axis, None, 3)
    r = ctx.node("Sigmoid", [ctx.node("Add", [x_r, h_r])])
    z = ctx.node("Sigmoid", [ctx.node("Add", [x_z, h_z])])
    n = ctx.node("Tanh", [ctx.node("Add", [x_n, ctx.node("Mul", [r, h_n])])])
    out = ctx.node("Add", [ctx.node("Mul", [ctx.node("Sub", [ctx.input("HiddenPrev"), n]), z]), n])
    ctx.set_output("Hidden", out)
