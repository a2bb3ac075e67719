"""Mappers of ONNX's arithmetic: elementwise binary ops (NumPy broadcasting), variadic
Sum/Mean/Max/Min, unary math and activations, MatMul and Gemm."""

from __future__ import annotations

import numpy as np

from nestflow.onnx.importers.registry import Node, mapper

_BINARY = {
    "Add": "elementwise_add",
    "Sub": "elementwise_sub",
    "Mul": "elementwise_mul",
    "Div": "elementwise_div",
}


@mapper(*_BINARY)
def binary(node: Node) -> None:
    node.op(_BINARY[node.op_type], {"X": node.input(0), "Y": node.input(1)}, out=0)


@mapper("Pow")
def power(node: Node) -> None:
    x, dtype = node.input(0), node.dtype(0)
    exponent = node.const(1)
    if exponent is not None and exponent.size == 1 and np.dtype(dtype).kind == "f":
        if exponent.ndim <= node.rank(0):  # a scalar exponent does not change X's shape
            node.op("pow", {"X": x}, {"factor": float(exponent.reshape(-1)[0])}, out=0)
            return
    y = node.input(1)
    if node.dtype(1) != dtype:  # Pow (opset 12+) takes an exponent of another type
        y = node.op("cast", {"X": y}, {"out_dtype": dtype})
    node.op("elementwise_pow", {"X": x, "Y": y}, out=0)


@mapper("Sum", "Mean")
def total(node: Node) -> None:
    xs = node.inputs()
    if node.op_type == "Sum":
        node.op("sum", {"X": xs}, out=0)
        return
    summed = node.op("sum", {"X": xs})
    node.op("scale", {"X": summed}, {"scale": 1.0 / len(xs)}, out=0)


@mapper("Max", "Min")
def extreme(node: Node) -> None:
    xs = node.inputs()
    op_type = "elementwise_max" if node.op_type == "Max" else "elementwise_min"
    if len(xs) == 1:
        node.op("assign", {"X": xs[0]}, out=0)
        return
    result = xs[0]
    for k, x in enumerate(xs[1:], 2):
        result = node.op(op_type, {"X": result, "Y": x}, out=0 if k == len(xs) else None)


# ---- unary ----

_UNARY = {
    "Relu": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Abs": "abs",
    "Sign": "sign",
    "Softplus": "softplus",
    "Softsign": "softsign",
    "Erf": "onnx_erf",
}


@mapper(*_UNARY)
def unary(node: Node) -> None:
    node.op(_UNARY[node.op_type], {"X": node.input(0)}, out=0)


@mapper("Identity")
def identity(node: Node) -> None:
    node.set_output(0, node.name_of(0))


@mapper("Neg")
def negative(node: Node) -> None:
    x = node.input(0)
    if np.dtype(node.dtype(0)).kind == "f":
        node.op("scale", {"X": x}, {"scale": -1.0}, out=0)
    else:  # integers: 0 - x keeps every value (a float scale would round int64)
        zero = node.constant(0, node.dtype(0))
        node.op("elementwise_sub", {"X": zero, "Y": x}, out=0)


@mapper("Reciprocal")
def reciprocal(node: Node) -> None:
    one = node.constant(1, node.dtype(0))
    node.op("elementwise_div", {"X": one, "Y": node.input(0)}, out=0)


@mapper("LeakyRelu")
def leaky_relu(node: Node) -> None:
    alpha = node.attr("alpha", 0.01)
    x = node.input(0)
    if alpha <= 1:
        node.op("leaky_relu", {"X": x}, {"alpha": alpha}, out=0)
        return
    # leaky_relu is max(X, alpha X), which is alpha X for X > 0 when alpha > 1
    scaled = node.op("scale", {"X": x}, {"scale": alpha})
    node.op("elementwise_min", {"X": x, "Y": scaled}, out=0)


@mapper("Elu")
def elu(node: Node) -> None:
    alpha = node.attr("alpha", 1.0)
    x = node.input(0)
    if alpha >= 0:
        node.op("elu", {"X": x}, {"alpha": alpha}, out=0)
        return
    raise node.unsupported(f"Elu with alpha {alpha} < 0")


@mapper("HardSigmoid")
def hard_sigmoid(node: Node) -> None:
    attrs = {"slope": node.attr("alpha", 0.2), "offset": node.attr("beta", 0.5)}
    node.op("hard_sigmoid", {"X": node.input(0)}, attrs, out=0)


@mapper("Gelu")
def gelu(node: Node) -> None:
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise node.unsupported(f"Gelu approximate='{approximate}'")
    node.op("gelu", {"X": node.input(0)}, {"approximate": approximate == "tanh"}, out=0)


@mapper("Swish")
def swish(node: Node) -> None:
    x, dtype = node.input(0), node.dtype(0)
    if dtype == "float16":  # half precision loses digits in the sigmoid: compute in float32
        x = node.op("cast", {"X": x}, {"out_dtype": "float32"})
    y = node.op(
        "swish", {"X": x}, {"beta": node.attr("alpha", 1.0)}, out=None if dtype == "float16" else 0
    )
    if dtype == "float16":
        node.op("cast", {"X": y}, {"out_dtype": dtype}, out=0)


@mapper("PRelu")
def prelu(node: Node) -> None:
    # max(X, 0) + slope * min(X, 0): the slope broadcasts to X
    x, slope = node.input(0), node.input(1)
    zero = node.constant(0, node.dtype(0))
    positive = node.op("elementwise_max", {"X": x, "Y": zero})
    negative = node.op("elementwise_min", {"X": x, "Y": zero})
    scaled = node.op("elementwise_mul", {"X": negative, "Y": slope})
    node.op("elementwise_add", {"X": positive, "Y": scaled}, out=0)


@mapper("Clip")
def clip(node: Node) -> None:
    x, dtype = node.input(0), node.dtype(0)
    if node.opset < 11:
        low, high = node.attr("min"), node.attr("max")
        low_name = None if low is None else node.constant(low, dtype)
        high_name = None if high is None else node.constant(high, dtype)
    else:
        low_name, high_name = node.input(1), node.input(2)
        low = None if low_name is None else node.const(1)
        high = None if high_name is None else node.const(2)
    floating = np.dtype(dtype).kind == "f"
    known = (low_name is None or low is not None) and (high_name is None or high is not None)
    if floating and known:
        lo = -np.inf if low_name is None else float(np.asarray(low).reshape(-1)[0])
        hi = np.inf if high_name is None else float(np.asarray(high).reshape(-1)[0])
        if lo <= hi:
            node.op("clip", {"X": x}, {"min": lo, "max": hi}, out=0)
            return
    # bounds known only at run time, integers, or min > max (ONNX: the result is max)
    if low_name is not None:
        x = node.op(
            "elementwise_max", {"X": x, "Y": low_name}, out=0 if high_name is None else None
        )
    if high_name is not None:
        x = node.op("elementwise_min", {"X": x, "Y": high_name}, out=0)
    if low_name is None and high_name is None:
        node.op("assign", {"X": x}, out=0)


# ---- products ----


@mapper("MatMul")
def matmul(node: Node) -> None:
    a, b = node.input(0), node.input(1)
    vector_product = node.rank(0) == 1 and node.rank(1) == 1
    product = node.op("matmul", {"X": a, "Y": b}, out=None if vector_product else 0)
    if vector_product:  # NumPy gives a 0-d result where Fluid's matmul gives [1]
        node.op("reshape", {"X": product}, {"shape": []}, out=0)


@mapper("Gemm")
def gemm(node: Node) -> None:
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    attrs = {
        "transpose_X": bool(node.attr("transA", 0)),
        "transpose_Y": bool(node.attr("transB", 0)),
        "alpha": alpha,
    }
    has_c = node.has_input(2) and beta != 0.0
    product = node.op(
        "matmul", {"X": node.input(0), "Y": node.input(1)}, attrs, out=None if has_c else 0
    )
    if not has_c:
        return
    c = node.input(2)
    if beta != 1.0:
        c = node.op("scale", {"X": c}, {"scale": beta})
    node.op("elementwise_add", {"X": product, "Y": c}, out=0)
