"""ONNX mappers of nestflow.ops.reduce: mean and the reduce_* ops (Fluid's dim/keep_dim/
reduce_all)."""

from __future__ import annotations

from nestflow.onnx.exporters.graph import OpContext, exports


@exports("mean")
def mean(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.mean(ctx.input("X"), None, False, ctx.in_var("X").dtype))


def _axes(ctx: OpContext) -> list[int] | None:
    """The reduced axes (None: all), as nestflow's _reduced_axes picks them."""
    rank = ctx.in_var("X").ndim
    dim, reduce_all = ctx.attrs["dim"], ctx.attrs["reduce_all"]
    if reduce_all or not dim or rank == 0:
        return None
    return sorted(d % rank for d in dim)


_REDUCE = {
    "reduce_sum": "ReduceSum",
    "reduce_max": "ReduceMax",
    "reduce_min": "ReduceMin",
    "reduce_prod": "ReduceProd",
}


@exports("reduce_mean")
def reduce_mean(ctx: OpContext) -> None:
    x, dtype = ctx.input("X"), ctx.in_var("X").dtype
    ctx.set_output("Out", ctx.mean(x, _axes(ctx), ctx.attrs["keep_dim"], dtype))


@exports(*_REDUCE)
def reduce(ctx: OpContext) -> None:
    out = ctx.reduce(_REDUCE[ctx.op.type], ctx.input("X"), _axes(ctx), ctx.attrs["keep_dim"])
    ctx.set_output("Out", out)


@exports("reduce_all", "reduce_any")
def reduce_logical(ctx: OpContext) -> None:
    # Counted in int64 so that nothing reduced gives all=True / any=False, as NumPy.
    x = ctx.input("X")
    if ctx.op.type == "reduce_all":
        x = ctx.node("Not", [x])
    count = ctx.reduce("ReduceSum", ctx.cast(x, "int64"), _axes(ctx), ctx.attrs["keep_dim"])
    zero = ctx.scalar(0, "int64")
    if ctx.op.type == "reduce_all":
        ctx.set_output("Out", ctx.node("Equal", [count, zero]))
    else:
        ctx.set_output("Out", ctx.node("Greater", [count, zero]))
