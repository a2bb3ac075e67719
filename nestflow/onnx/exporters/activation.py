"""ONNX mappers of nestflow.ops.activation and the elementwise ops of nestflow.ops.clip."""

from __future__ import annotations

import math

import numpy as np

from nestflow.onnx.exporters.graph import OpContext, exports

_SAME_NAME = {
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "abs": "Abs",
    "softsign": "Softsign",
    "sign": "Sign",
}


@exports(*_SAME_NAME)
def unary(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node(_SAME_NAME[ctx.op.type], [ctx.input("X")]))


def _dtype(ctx: OpContext) -> str:
    return ctx.in_var("X").dtype


@exports("relu")
def relu(ctx: OpContext) -> None:
    x = ctx.input("X")
    if np.dtype(_dtype(ctx)).kind == "f":
        ctx.set_output("Out", ctx.node("Relu", [x]))
    else:  # integer Relu needs opset 14; Max works in every opset
        ctx.set_output("Out", ctx.node("Max", [x, ctx.scalar(0, _dtype(ctx))]))


@exports("softmax")
def softmax(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Softmax", [ctx.input("X")], axis=ctx.attrs["axis"]))


@exports("rsqrt")
def rsqrt(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("Reciprocal", [ctx.node("Sqrt", [ctx.input("X")])]))


@exports("pow")
def pow_(ctx: OpContext) -> None:
    x = ctx.input("X")
    if ctx.has_input("FactorTensor"):
        factor = ctx.to_scalar(ctx.input("FactorTensor"))
        if ctx.in_var("FactorTensor").dtype != _dtype(ctx):
            factor = ctx.cast(factor, _dtype(ctx))
    else:
        factor = ctx.scalar(ctx.attrs["factor"], _dtype(ctx))
    ctx.set_output("Out", ctx.node("Pow", [x, factor]))


@exports("clip")
def clip(ctx: OpContext) -> None:
    dtype = _dtype(ctx)
    low, high = ctx.scalar(ctx.attrs["min"], dtype), ctx.scalar(ctx.attrs["max"], dtype)
    ctx.set_output("Out", ctx.node("Clip", [ctx.input("X"), low, high]))


@exports("leaky_relu")
def leaky_relu(ctx: OpContext) -> None:
    # max(X, alpha X): Fluid's formula, which LeakyRelu equals only for alpha <= 1
    x = ctx.input("X")
    scaled = ctx.node("Mul", [x, ctx.scalar(ctx.attrs["alpha"], _dtype(ctx))])
    ctx.set_output("Out", ctx.node("Max", [x, scaled]))


@exports("elu")
def elu(ctx: OpContext) -> None:
    x, alpha, dtype = ctx.input("X"), ctx.attrs["alpha"], _dtype(ctx)
    if alpha >= 0:
        ctx.set_output("Out", ctx.node("Elu", [x], alpha=float(alpha)))
        return
    # max(0, X) + min(0, alpha * (exp(X) - 1)): for alpha < 0 not the usual ELU
    zero = ctx.scalar(0, dtype)
    exp_m1 = ctx.node("Sub", [ctx.node("Exp", [x]), ctx.scalar(1, dtype)])
    negative = ctx.node("Min", [ctx.node("Mul", [exp_m1, ctx.scalar(alpha, dtype)]), zero])
    ctx.set_output("Out", ctx.node("Add", [ctx.node("Max", [x, zero]), negative]))


@exports("hard_sigmoid")
def hard_sigmoid(ctx: OpContext) -> None:
    slope, offset = float(ctx.attrs["slope"]), float(ctx.attrs["offset"])
    ctx.set_output("Out", ctx.node("HardSigmoid", [ctx.input("X")], alpha=slope, beta=offset))


@exports("gelu")
def gelu(ctx: OpContext) -> None:
    x, dtype = ctx.input("X"), _dtype(ctx)
    half_x = ctx.node("Mul", [x, ctx.scalar(0.5, dtype)])
    if ctx.attrs["approximate"]:
        cube = ctx.node("Mul", [ctx.node("Mul", [x, x]), x])
        inner = ctx.node("Add", [x, ctx.node("Mul", [cube, ctx.scalar(0.044715, dtype)])])
        scaled = ctx.node("Mul", [inner, ctx.scalar(math.sqrt(2.0 / math.pi), dtype)])
        curve = ctx.node("Tanh", [scaled])
    else:
        curve = ctx.node("Erf", [ctx.node("Mul", [x, ctx.scalar(math.sqrt(0.5), dtype)])])
    ctx.set_output("Out", ctx.node("Mul", [half_x, ctx.node("Add", [curve, ctx.scalar(1, dtype)])]))


@exports("softplus")
def softplus(ctx: OpContext) -> None:
    # max(X, 0) + log(1 + exp(-|X|)): no overflow for large |X| (as nestflow's logaddexp)
    x, dtype = ctx.input("X"), _dtype(ctx)
    tail = ctx.node("Exp", [ctx.node("Neg", [ctx.node("Abs", [x])])])
    log1p = ctx.node("Log", [ctx.node("Add", [tail, ctx.scalar(1, dtype)])])
    ctx.set_output("Out", ctx.node("Add", [ctx.node("Max", [x, ctx.scalar(0, dtype)]), log1p]))


@exports("swish")
def swish(ctx: OpContext) -> None:
    x = ctx.input("X")
    scaled = ctx.node("Mul", [x, ctx.scalar(ctx.attrs["beta"], _dtype(ctx))])
    ctx.set_output("Out", ctx.node("Mul", [x, ctx.node("Sigmoid", [scaled])]))


def _l2_norm(ctx: OpContext, xs: list[str]) -> str:
    """The L2 norm of all elements of `xs` together (0-d)."""
    squares = [ctx.reduce("ReduceSumSquare", x, None, keepdims=False) for x in xs]
    total = squares[0] if len(squares) == 1 else ctx.node("Sum", squares)
    return ctx.node("Sqrt", [total])


@exports("clip_by_norm")
def clip_by_norm(ctx: OpContext) -> None:
    x, dtype = ctx.input("X"), _dtype(ctx)
    limit = ctx.scalar(ctx.attrs["max_norm"], dtype)
    norm = _l2_norm(ctx, [x])
    scaled = ctx.node("Mul", [x, ctx.node("Div", [limit, norm])])
    keep = ctx.node("LessOrEqual", [norm, limit])
    ctx.set_output("Out", ctx.node("Where", [keep, x, scaled]))


@exports("clip_by_global_norm")
def clip_by_global_norm(ctx: OpContext) -> None:
    xs = ctx.inputs("X")
    dtype = ctx.in_var("X").dtype
    limit = ctx.scalar(ctx.attrs["max_global_norm"], dtype)
    factor = ctx.node("Div", [limit, ctx.node("Max", [_l2_norm(ctx, xs), limit])])
    for i, x in enumerate(xs):
        ctx.set_output("Out", ctx.node("Mul", [x, factor]), i)
