"""ONNX mappers of nestflow.ops.norm: batch_norm (running or batch statistics, NCHW or NHWC)
and layer_norm (with its per-row Mean and Variance)."""

from __future__ import annotations

from nestflow.onnx.exporters.graph import OpContext, exports
from nestflow.ops.norm import _uses_running_stats


def _per_channel(ctx: OpContext, v: str, rank: int, c_axis: int) -> str:
    """A [C] vector shaped to broadcast against X along its channel axis."""
    if c_axis == rank - 1:
        return v
    return ctx.unsqueeze(v, list(range(1, rank - c_axis)))


@exports("batch_norm")
def batch_norm(ctx: OpContext) -> None:
    a = ctx.attrs
    x, var = ctx.input("X"), ctx.in_var("X")
    dtype, rank = var.dtype, var.ndim
    scale, bias = ctx.input("Scale"), ctx.input("Bias")
    mean, variance = ctx.input("Mean"), ctx.input("Variance")
    eps = ctx.scalar(a["epsilon"], dtype)
    c_axis = 1 if a["data_layout"] == "NCHW" else rank - 1
    running = _uses_running_stats(a["is_test"], a["use_global_stats"], a["trainable_statistics"])
    if running:
        inv_std = ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.node("Add", [variance, eps])])])
        if c_axis == 1:
            y = ctx.node(
                "BatchNormalization", [x, scale, bias, mean, variance], epsilon=float(a["epsilon"])
            )
        else:
            gain = ctx.node("Mul", [scale, inv_std])
            centered = ctx.node("Sub", [x, mean])
            y = ctx.node("Add", [ctx.node("Mul", [centered, gain]), bias])
        ctx.set_output("Y", y)
        for slot, value in (
            ("MeanOut", mean),
            ("VarianceOut", variance),
            ("SavedMean", mean),
            ("SavedVariance", inv_std),
        ):
            ctx.set_output(slot, ctx.node("Identity", [value]))
        return
    _batch_statistics(ctx, x, rank, c_axis, eps)


def _batch_statistics(ctx: OpContext, x: str, rank: int, c_axis: int, eps: str) -> None:
    """batch_norm in training form: the batch's statistics normalise, the running ones move.
    A batch of one element per channel is copied through with the statistics unchanged."""
    a = ctx.attrs
    dtype = ctx.in_var("X").dtype
    axes = [i for i in range(rank) if i != c_axis]
    batch_mean = ctx.reduce("ReduceMean", x, axes, keepdims=False)
    centered = ctx.node("Sub", [x, _per_channel(ctx, batch_mean, rank, c_axis)])
    batch_var = ctx.reduce("ReduceMean", ctx.node("Mul", [centered, centered]), axes, False)
    inv_std = ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.node("Add", [batch_var, eps])])])
    gain = _per_channel(ctx, ctx.node("Mul", [ctx.input("Scale"), inv_std]), rank, c_axis)
    shift = _per_channel(ctx, ctx.input("Bias"), rank, c_axis)
    y = ctx.node("Add", [ctx.node("Mul", [centered, gain]), shift])
    count = ctx.node(
        "Div", [ctx.node("Size", [x]), ctx.to_scalar(ctx.dim(x, c_axis))]
    )  # elements per channel
    tiny = ctx.node("LessOrEqual", [count, ctx.scalar(1, "int64")])
    ctx.set_output("Y", ctx.node("Where", [tiny, x, y]))
    if ctx.has_input("MomentumTensor"):
        keep = ctx.cast(ctx.to_scalar(ctx.input("MomentumTensor")), dtype)
    else:
        keep = ctx.scalar(a["momentum"], dtype)
    take = ctx.node("Sub", [ctx.scalar(1, dtype), keep])
    zeros = ctx.zeros_like(ctx.input("Mean"), dtype)
    for slot, old, new in (
        ("MeanOut", ctx.input("Mean"), batch_mean),
        ("VarianceOut", ctx.input("Variance"), batch_var),
    ):
        moved = ctx.node("Add", [ctx.node("Mul", [old, keep]), ctx.node("Mul", [new, take])])
        ctx.set_output(slot, ctx.node("Where", [tiny, old, moved]))
    ctx.set_output("SavedMean", ctx.node("Where", [tiny, zeros, batch_mean]))
    ctx.set_output("SavedVariance", ctx.node("Where", [tiny, zeros, inv_std]))


@exports("layer_norm")
def layer_norm(ctx: OpContext) -> None:
    """Rows of X flattened at begin_norm_axis, each normalised; Scale/Bias [width] reshaped to
    X's trailing dims."""
    x, var = ctx.input("X"), ctx.in_var("X")
    dtype, axis = var.dtype, ctx.attrs["begin_norm_axis"]
    rows = ctx.node("Flatten", [x], axis=axis)
    mean = ctx.reduce("ReduceMean", rows, [1], keepdims=True)
    centered = ctx.node("Sub", [rows, mean])
    variance = ctx.reduce("ReduceMean", ctx.node("Mul", [centered, centered]), [1], True)
    eps = ctx.scalar(ctx.attrs["epsilon"], dtype)
    inv_std = ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.node("Add", [variance, eps])])])
    y = ctx.node("Mul", [centered, inv_std])
    if ctx.has_input("Scale"):
        y = ctx.node("Mul", [y, ctx.input("Scale")])
    if ctx.has_input("Bias"):
        y = ctx.node("Add", [y, ctx.input("Bias")])
    ctx.set_output("Y", ctx.reshape(y, ctx.shape(x)))
    ctx.set_output("Mean", ctx.reshape(mean, [-1]))
    ctx.set_output("Variance", ctx.reshape(variance, [-1]))
