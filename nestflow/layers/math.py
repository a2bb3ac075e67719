"""Elementwise math and activation layers, with Fluid 1.8's signatures and defaults.

Each appends one op of nestflow/ops/activation.py or ops/math.py; the op's docstring states
its formula, gradient and edge cases. All but `abs` and `elementwise_max/min/pow` need a
floating-point input (a DTypeError when appended otherwise). Every name is also an `act=`
string of fc and the elementwise layers.

    >>> import nestflow as nf
    >>> x = nf.data("x", [2, 3], "float32")
    >>> nf.layers.clip(nf.layers.gelu(x), min=-1.0, max=1.0).shape
    (2, 3)
"""

from __future__ import annotations

from typing import Any

from nestflow.framework.program import VarDesc
from nestflow.layers.helper import append_op, as_float
from nestflow.layers.nn import _binary, activation

__all__ = [
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "abs",
    "pow",
    "clip",
    "leaky_relu",
    "elu",
    "gelu",
    "softplus",
    "softsign",
    "swish",
    "hard_sigmoid",
    "elementwise_max",
    "elementwise_min",
    "elementwise_pow",
]


def exp(x: VarDesc, name: str | None = None) -> VarDesc:
    """e ** x, shaped like x (float).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.exp(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[0.0, 1.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[1.    , 2.7183]], dtype=float32)
    """
    return append_op("exp", {"X": x}, name=name)


def log(x: VarDesc, name: str | None = None) -> VarDesc:
    """The natural logarithm of x (float; -inf at 0 and NaN below, as NumPy's).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.log(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[1.0, 2.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[0.    , 0.6931]], dtype=float32)
    """
    return append_op("log", {"X": x}, name=name)


def sqrt(x: VarDesc, name: str | None = None) -> VarDesc:
    """x ** 0.5 (float).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.sqrt(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[4.0, 9.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[2., 3.]], dtype=float32)
    """
    return append_op("sqrt", {"X": x}, name=name)


def rsqrt(x: VarDesc, name: str | None = None) -> VarDesc:
    """1 / sqrt(x) (float).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.rsqrt(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[4.0, 0.25]], "float32")}, fetch_list=[out])[0].round(4)
    array([[0.5, 2. ]], dtype=float32)
    """
    return append_op("rsqrt", {"X": x}, name=name)


def abs(x: VarDesc, name: str | None = None) -> VarDesc:
    """|x|; integers keep their dtype (bool is a DTypeError).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.abs(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[-1.5, 2.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[1.5, 2. ]], dtype=float32)
    """
    return append_op("abs", {"X": x}, name=name)


def pow(x: VarDesc, factor: float | VarDesc = 1.0, name: str | None = None) -> VarDesc:
    """x ** factor (float). `factor` is a number, or a float variable of one element whose
    value is read when the program runs (Fluid's FactorTensor; it gets no gradient).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.pow(x, factor=2.0)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[2.0, 3.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[4., 9.]], dtype=float32)
    """
    if isinstance(factor, VarDesc):
        return append_op("pow", {"X": x, "FactorTensor": factor}, name=name)
    return append_op("pow", {"X": x}, {"factor": as_float(factor, "pow: factor")}, name=name)


def clip(x: VarDesc, min: float, max: float, name: str | None = None) -> VarDesc:
    """x limited to [min, max] (float); min > max is an AttrError.

    >>> x = nf.data("x", [-1, 3])
    >>> out = nf.layers.clip(x, min=-1.0, max=1.0)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[-2.0, 0.5, 3.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[-1. ,  0.5,  1. ]], dtype=float32)
    """
    attrs = {"min": as_float(min, "clip: min"), "max": as_float(max, "clip: max")}
    return append_op("clip", {"X": x}, attrs, name=name)


def leaky_relu(x: VarDesc, alpha: float = 0.02, name: str | None = None) -> VarDesc:
    """max(x, alpha * x) (float).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.leaky_relu(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[-1.0, 2.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[-0.02,  2.  ]], dtype=float32)
    """
    return append_op(
        "leaky_relu", {"X": x}, {"alpha": as_float(alpha, "leaky_relu: alpha")}, name=name
    )


def elu(x: VarDesc, alpha: float = 1.0, name: str | None = None) -> VarDesc:
    """x where x > 0, else alpha * (exp(x) - 1) (float).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.elu(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[-1.0, 2.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[-0.6321,  2.    ]], dtype=float32)
    """
    return append_op("elu", {"X": x}, {"alpha": as_float(alpha, "elu: alpha")}, name=name)


def gelu(x: VarDesc, approximate: bool = False, name: str | None = None) -> VarDesc:
    """x * Phi(x) with the exact erf (or the tanh approximation when `approximate`); float.

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.gelu(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[0.0, 1.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[0.    , 0.8413]], dtype=float32)
    """
    return append_op("gelu", {"X": x}, {"approximate": bool(approximate)}, name=name)


def softplus(x: VarDesc, name: str | None = None) -> VarDesc:
    """log(1 + exp(x)), without overflow (float).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.softplus(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[0.0, 1.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[0.6931, 1.3133]], dtype=float32)
    """
    return append_op("softplus", {"X": x}, name=name)


def softsign(x: VarDesc, name: str | None = None) -> VarDesc:
    """x / (1 + |x|) (float).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.softsign(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[-1.0, 3.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[-0.5 ,  0.75]], dtype=float32)
    """
    return append_op("softsign", {"X": x}, name=name)


def swish(x: VarDesc, beta: float = 1.0, name: str | None = None) -> VarDesc:
    """x * sigmoid(beta * x) (float).

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.swish(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[0.0, 1.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[0.    , 0.7311]], dtype=float32)
    """
    return append_op("swish", {"X": x}, {"beta": as_float(beta, "swish: beta")}, name=name)


def hard_sigmoid(
    x: VarDesc, slope: float = 0.2, offset: float = 0.5, name: str | None = None
) -> VarDesc:
    """clip(slope * x + offset, 0, 1) (float).

    >>> x = nf.data("x", [-1, 3])
    >>> out = nf.layers.hard_sigmoid(x)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[-5.0, 0.0, 5.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[0. , 0.5, 1. ]], dtype=float32)
    """
    attrs = {
        "slope": as_float(slope, "hard_sigmoid: slope"),
        "offset": as_float(offset, "hard_sigmoid: offset"),
    }
    return append_op("hard_sigmoid", {"X": x}, attrs, name=name)


def elementwise_max(
    x: VarDesc, y: Any, axis: int = -1, act: str | None = None, name: str | None = None
) -> VarDesc:
    """max(x, y) with broadcasting (Fluid's `axis` rule); at ties the gradient goes to y.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [2])
    >>> out = nf.layers.elementwise_max(x, y)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[1, 5]], "float32"),
    ...     "y": np.array([3, 3], "float32")}, fetch_list=[out])[0]
    array([[3., 5.]], dtype=float32)
    """
    return activation(_binary("elementwise_max", x, y, axis, name), act)


def elementwise_min(
    x: VarDesc, y: Any, axis: int = -1, act: str | None = None, name: str | None = None
) -> VarDesc:
    """min(x, y) with broadcasting (Fluid's `axis` rule); at ties the gradient goes to y.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [2])
    >>> out = nf.layers.elementwise_min(x, y)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[1, 5]], "float32"),
    ...     "y": np.array([3, 3], "float32")}, fetch_list=[out])[0]
    array([[1., 3.]], dtype=float32)
    """
    return activation(_binary("elementwise_min", x, y, axis, name), act)


def elementwise_pow(
    x: VarDesc, y: Any, axis: int = -1, act: str | None = None, name: str | None = None
) -> VarDesc:
    """x ** y with broadcasting (Fluid's `axis` rule).

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [2])
    >>> out = nf.layers.elementwise_pow(x, y)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[2, 3]], "float32"),
    ...     "y": np.array([3, 2], "float32")}, fetch_list=[out])[0]
    array([[8., 9.]], dtype=float32)
    """
    return activation(_binary("elementwise_pow", x, y, axis, name), act)
