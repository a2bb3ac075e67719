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


# ---- math NumPy has and Fluid 1.x does not (nestflow.ops.onnx_compat) ----

_NUMPY_UNARY = (
    "Floor Ceil Round Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh IsNaN".split()
)


@mapper(*_NUMPY_UNARY)
def numpy_unary(node: Node) -> None:
    node.op(f"onnx_{node.op_type.lower()}", {"X": node.input(0)}, out=0)


@mapper("IsInf")
def is_inf(node: Node) -> None:
    attrs = {
        "detect_positive": bool(node.attr("detect_positive", 1)),
        "detect_negative": bool(node.attr("detect_negative", 1)),
    }
    node.op("onnx_isinf", {"X": node.input(0)}, attrs, out=0)


@mapper("Mod")
def mod(node: Node) -> None:
    attrs = {"fmod": bool(node.attr("fmod", 0))}
    node.op("onnx_mod", {"X": node.input(0), "Y": node.input(1)}, attrs, out=0)


# ---- activations composed of nestflow's ----


@mapper("Selu")
def selu(node: Node) -> None:
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    elu = node.op("elu", {"X": node.input(0)}, {"alpha": alpha})
    node.op("scale", {"X": elu}, {"scale": gamma}, out=0)


@mapper("Celu")
def celu(node: Node) -> None:
    alpha = node.attr("alpha", 1.0)  # max(0, x) + min(0, alpha (exp(x / alpha) - 1))
    shrunk = node.op("scale", {"X": node.input(0)}, {"scale": 1.0 / alpha})
    elu = node.op("elu", {"X": shrunk}, {"alpha": 1.0})
    node.op("scale", {"X": elu}, {"scale": alpha}, out=0)


@mapper("ThresholdedRelu")
def thresholded_relu(node: Node) -> None:
    x, dtype = node.input(0), node.dtype(0)
    above = node.op("greater_than", {"X": x, "Y": node.constant(node.attr("alpha", 1.0), dtype)})
    node.op("where", {"Condition": above, "X": x, "Y": node.constant(0, dtype)}, out=0)


@mapper("HardSwish")
def hard_swish(node: Node) -> None:
    x = node.input(0)
    gate = node.op("hard_sigmoid", {"X": x}, {"slope": 1.0 / 6, "offset": 0.5})
    node.op("elementwise_mul", {"X": x, "Y": gate}, out=0)


@mapper("Mish")
def mish(node: Node) -> None:
    x = node.input(0)
    gate = node.op("tanh", {"X": node.op("softplus", {"X": x})})
    node.op("elementwise_mul", {"X": x, "Y": gate}, out=0)


@mapper("Shrink")
def shrink(node: Node) -> None:
    x, dtype = node.input(0), node.dtype(0)
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    high = node.op("greater_than", {"X": x, "Y": node.constant(lambd, dtype)})
    low = node.op("less_than", {"X": x, "Y": node.constant(-lambd, dtype)})
    down = node.op("elementwise_sub", {"X": x, "Y": node.constant(bias, dtype)})
    up = node.op("elementwise_add", {"X": x, "Y": node.constant(bias, dtype)})
    inner = node.op("where", {"Condition": low, "X": up, "Y": node.constant(0, dtype)})
    node.op("where", {"Condition": high, "X": down, "Y": inner}, out=0)


@mapper("Hardmax")
def hardmax(node: Node) -> None:
    """1 at the first largest element along the axis, 0 elsewhere (before opset 13: of X
    flattened to 2-D at the axis)."""
    x, dims, dtype = node.input(0), node.shape(0), node.dtype(0)
    rank = len(dims)
    axis = node.attr("axis", -1 if node.opset >= 13 else 1) % rank
    if node.opset < 13 and axis != rank - 1:
        x = node.op("flatten", {"X": x}, {"axis": axis})
        dims, axis = node.graph.info(x).shape, 1
    picked = node.op("arg_max", {"X": x}, {"axis": axis, "keepdims": False, "dtype": "int64"})
    if dims[axis] < 0:
        raise node.unsupported(f"Hardmax over dim {axis} of unknown size ({list(dims)})")
    inputs = {
        "Indices": picked,
        "Depth": node.constant(np.int64(dims[axis])),
        "Values": node.constant(np.asarray([0, 1], dtype)),
    }
    y = node.op("onnx_one_hot", inputs, {"axis": axis})
    if node.graph.info(y).ndim != node.rank(0):  # the coerced 2-D form: back to X's shape
        y = node.op("reshape", {"X": y}, {"shape": list(node.shape(0))})
    node.set_output(0, y)


_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


@mapper(*_BITWISE)
def bitwise(node: Node) -> None:
    inputs = {"X": node.input(0), "Y": node.input(1)}
    node.op(f"onnx_{_BITWISE[node.op_type]}", inputs, out=0)


@mapper("BitwiseNot")
def bitwise_not(node: Node) -> None:
    node.op("onnx_bitwise_not", {"X": node.input(0)}, out=0)


@mapper("BitShift")
def bit_shift(node: Node) -> None:
    direction = node.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise node.unsupported(f"BitShift direction '{direction}'")
    op_type = "onnx_shift_left" if direction == "LEFT" else "onnx_shift_right"
    node.op(op_type, {"X": node.input(0), "Y": node.input(1)}, out=0)
