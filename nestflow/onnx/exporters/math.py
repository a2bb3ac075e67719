"""ONNX mappers of nestflow.ops.math: elementwise binary ops (Fluid's `axis` alignment), scale,
square, matmul, mul, sum."""

from __future__ import annotations

import numpy as np

from nestflow.errors import ShapeError
from nestflow.onnx.exporters.graph import OpContext, exports


def aligned_y(ctx: OpContext) -> str:
    """Y reshaped as Fluid's `axis` rule lines it up with X (trailing dims of 1 added), ready
    for ONNX's NumPy broadcasting."""
    y = ctx.input("Y")
    axis = ctx.attrs.get("axis", -1)
    x_rank, y_rank = ctx.in_var("X").ndim, ctx.in_var("Y").ndim
    if axis < 0 or y_rank >= x_rank:
        return y
    trailing = x_rank - axis - y_rank
    if trailing <= 0:
        return y
    return ctx.unsqueeze(y, list(range(y_rank, y_rank + trailing)))


_BINARY = {
    "elementwise_add": "Add",
    "elementwise_sub": "Sub",
    "elementwise_mul": "Mul",
    "elementwise_max": "Max",
    "elementwise_min": "Min",
    "elementwise_pow": "Pow",
}


@exports(*_BINARY)
def binary(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node(_BINARY[ctx.op.type], [ctx.input("X"), aligned_y(ctx)]))


@exports("elementwise_div")
def elementwise_div(ctx: OpContext) -> None:
    # ONNX's integer Div truncates toward zero, as nestflow's does.
    ctx.set_output("Out", ctx.node("Div", [ctx.input("X"), aligned_y(ctx)]))


@exports("scale")
def scale(ctx: OpContext) -> None:
    x = ctx.input("X")
    dtype = ctx.in_var("X").dtype
    factor, bias = ctx.attrs["scale"], ctx.attrs["bias"]
    work = dtype if np.dtype(dtype).kind == "f" else "float64"
    if work != dtype:  # integer X: computed in floats, then truncated back (astype)
        x = ctx.cast(x, work)
    if not ctx.attrs["bias_after_scale"]:
        x = ctx.node("Add", [x, ctx.scalar(bias, work)]) if bias else x
        out = ctx.node("Mul", [x, ctx.scalar(factor, work)])
    else:
        out = ctx.node("Mul", [x, ctx.scalar(factor, work)])
        out = ctx.node("Add", [out, ctx.scalar(bias, work)]) if bias else out
    ctx.set_output("Out", out if work == dtype else ctx.cast(out, dtype))


@exports("square")
def square(ctx: OpContext) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", ctx.node("Mul", [x, x]))


@exports("sum")
def sum_(ctx: OpContext) -> None:
    xs = ctx.inputs("X")
    if len(xs) == 1:
        ctx.set_output("Out", ctx.node("Identity", xs))
        return
    if np.dtype(ctx.in_var("X").dtype).kind == "f":
        ctx.set_output("Out", ctx.node("Sum", xs))
        return
    out = xs[0]
    for x in xs[1:]:  # ONNX's Sum takes floats only
        out = ctx.node("Add", [out, x])
    ctx.set_output("Out", out)


def _swap_last(ctx: OpContext, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ctx.node("Transpose", [x], perm=perm)


@exports("matmul")
def matmul(ctx: OpContext) -> None:
    """Fluid's vector rules: X [K] is a row, Y [K] a column (each transposed by its flag);
    Out drops X's row dim / Y's column dim where it is 1 ([1] when nothing is left)."""
    x, y = ctx.input("X"), ctx.input("Y")
    x_var, y_var = ctx.in_var("X"), ctx.in_var("Y")
    tx, ty = ctx.attrs["transpose_X"], ctx.attrs["transpose_Y"]
    if x_var.ndim == 1:
        x = ctx.unsqueeze(x, [0])  # [1, K]
    if y_var.ndim == 1:
        y = ctx.unsqueeze(y, [1])  # [K, 1]
    x_rank, y_rank = max(x_var.ndim, 2), max(y_var.ndim, 2)
    if tx:
        x = _swap_last(ctx, x, x_rank)
    if ty:
        y = _swap_last(ctx, y, y_rank)
    out = ctx.node("MatMul", [x, y])
    alpha = ctx.attrs["alpha"]
    if alpha != 1.0:
        out = ctx.node("Mul", [out, ctx.scalar(alpha, x_var.dtype)])
    rank = max(x_rank, y_rank)
    drop = []
    for var, flag, dim in ((x_var, tx, rank - 2), (y_var, ty, rank - 1)):
        if var.ndim != 1:
            continue
        # a vector's row (X) or column (Y) dim is 1, or its size when transposed
        size = var.shape[0] if flag else 1
        if size < 0:
            raise ShapeError(
                f"'{var.name}' is a vector of unknown size and transposed: whether matmul "
                f"keeps its dim depends on that size, which ONNX export needs known"
            )
        if size == 1:
            drop.append(dim)
    if drop:
        out = ctx.squeeze(out, drop)
        if len(drop) == rank:
            out = ctx.reshape(out, [1])
    ctx.set_output("Out", out)


@exports("mul")
def mul(ctx: OpContext) -> None:
    """flatten(X) @ flatten(Y), reshaped to X's leading dims + Y's trailing dims."""
    x, y = ctx.input("X"), ctx.input("Y")
    x_var, y_var = ctx.in_var("X"), ctx.in_var("Y")
    xn, yn = ctx.attrs["x_num_col_dims"], ctx.attrs["y_num_col_dims"]
    if y_var.ndim == 2 and yn == 1 and xn == x_var.ndim - 1:
        # X [..., K] @ Y [K, N] is already [..., N]: MatMul broadcasts the leading dims
        ctx.set_output("Out", ctx.node("MatMul", [x, y]))
        return
    x2 = x if (x_var.ndim, xn) == (2, 1) else ctx.node("Flatten", [x], axis=xn)
    y2 = y if (y_var.ndim, yn) == (2, 1) else ctx.node("Flatten", [y], axis=yn)
    out = ctx.node("MatMul", [x2, y2])
    if xn == 1 and y_var.ndim - yn == 1:
        ctx.set_output("Out", out)
        return
    lead = ctx.shape(x, 0, xn)
    tail = _tail_shape(ctx, y, y_var.shape, yn)
    ctx.set_output("Out", ctx.reshape(out, ctx.node("Concat", [lead, tail], axis=0)))


def _tail_shape(ctx: OpContext, y: str, shape: tuple[int, ...], start: int) -> str:
    tail = shape[start:]
    if all(d >= 0 for d in tail):
        return ctx.ints(tail)
    return ctx.shape(y, start, None)
