"""ONNX mappers of nestflow.ops.logic: comparisons (Fluid's `axis` alignment) and logical ops."""

from __future__ import annotations

from nestflow.onnx.exporters.graph import OpContext, exports
from nestflow.onnx.exporters.math import aligned_y

_COMPARE = {
    "equal": "Equal",
    "greater_than": "Greater",
    "greater_equal": "GreaterOrEqual",
    "less_than": "Less",
    "less_equal": "LessOrEqual",
}


@exports(*_COMPARE)
def compare(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node(_COMPARE[ctx.op.type], [ctx.input("X"), aligned_y(ctx)]))


@exports("not_equal")
def not_equal(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Not", [ctx.node("Equal", [ctx.input("X"), aligned_y(ctx)])]))


def _as_bool(ctx: OpContext, slot: str) -> str:
    """The input as bool (NumPy's logical ops take any number: nonzero is true)."""
    x = ctx.input(slot)
    return x if ctx.in_var(slot).dtype == "bool" else ctx.cast(x, "bool")


_LOGICAL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}


@exports(*_LOGICAL)
def logical(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node(_LOGICAL[ctx.op.type], [_as_bool(ctx, "X"), _as_bool(ctx, "Y")]))


@exports("logical_not")
def logical_not(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Not", [_as_bool(ctx, "X")]))
