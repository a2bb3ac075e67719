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

from collections.abc import Sequence
from typing import Any

from nestflow.errors import DTypeError, ShapeError
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import append_op, as_float, as_int, layer_error
from nestflow.layers.nn import _binary, _compare, activation, fill_constant
from nestflow.layers.tensor import _reduce

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
    "log_softmax",
    "reduce_logsumexp",
    "logsumexp",
    "l2_normalize",
    "cos_sim",
    "masked_fill",
    "greater_equal",
    "less_equal",
    "not_equal",
    "zeros",
    "ones",
    "zeros_like",
    "ones_like",
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


# ---- log-space math, norms, masks, comparisons, constants (issue 30) ----


def log_softmax(x: VarDesc, axis: int = -1, name: str | None = None) -> VarDesc:
    """log(softmax(x)) along `axis`, computed as x - logsumexp(x) (float; never overflows).
    ShapeError for an axis outside x, DTypeError for a non-float x.

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.log_softmax(x)
    >>> nf.Executor().run(feed={"x": np.zeros((1, 2), "float32")}, fetch_list=[out])[0].round(4)
    array([[-0.6931, -0.6931]], dtype=float32)
    """
    return append_op(
        "log_softmax", {"X": x}, {"axis": as_int(axis, "log_softmax: axis")}, name=name
    )


def reduce_logsumexp(
    input: VarDesc, dim: Any = None, keep_dim: bool = False, name: str | None = None
) -> VarDesc:
    """log(sum(exp(input))) over `dim` (an int or list; None: every dim, a 0-d result),
    computed from input - max; `keep_dim` keeps the reduced dims as 1. Only -inf (or nothing)
    reduced gives -inf. ShapeError for a dim outside the input.

    >>> x = nf.data("x", [-1, 3])
    >>> out = nf.layers.reduce_logsumexp(x, dim=1)
    >>> nf.Executor().run(feed={"x": np.zeros((2, 3), "float32")}, fetch_list=[out])[0].round(4)
    array([1.0986, 1.0986], dtype=float32)
    """
    return _reduce("logsumexp", input, dim, keep_dim, name)


def logsumexp(
    x: VarDesc, dim: Any = None, keepdim: bool = False, name: str | None = None
) -> VarDesc:
    """reduce_logsumexp under Paddle's `paddle.logsumexp(x, dim, keepdim)` spelling.

    >>> x = nf.data("x", [2, 3])
    >>> nf.layers.logsumexp(x, dim=-1, keepdim=True).shape
    (2, 1)
    """
    return _reduce("logsumexp", x, dim, keepdim, name)


def l2_normalize(x: VarDesc, axis: int, epsilon: float = 1e-12, name: str | None = None) -> VarDesc:
    """x / sqrt(sum(x ** 2 along `axis`) + epsilon), Fluid's l2_normalize (the `norm` op);
    shaped like x (float). ShapeError for an axis outside x.

    >>> x = nf.data("x", [-1, 2])
    >>> out = nf.layers.l2_normalize(x, axis=1)
    >>> nf.Executor().run(feed={"x": np.array([[3.0, 4.0]], "float32")}, fetch_list=[out])[0]
    array([[0.6, 0.8]], dtype=float32)
    """
    axis = as_int(axis, "l2_normalize: axis")
    if x.ndim and axis < 0:
        axis += x.ndim  # Fluid's layer resolves a negative axis before the op sees it
    attrs = {"axis": axis, "epsilon": as_float(epsilon, "l2_normalize: epsilon")}
    out, _norm = append_op("norm", {"X": x}, attrs, outputs=("Out", "Norm"), name=name)
    return out


def cos_sim(X: VarDesc, Y: VarDesc) -> VarDesc:
    """The cosine similarity [N, 1] of the rows of X [N, ...] with those of Y [N, ...], or with
    Y's one row ([1, ...]); rows are flattened (Fluid's cos_sim). A zero row gives NaN, as in
    Fluid. ShapeError for rows of different sizes or counts, DTypeError for non-float inputs.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [1, 2])
    >>> out = nf.layers.cos_sim(x, y)
    >>> nf.Executor().run(feed={"x": np.array([[1.0, 0.0], [1.0, 1.0]], "float32"),
    ...     "y": np.array([[1.0, 0.0]], "float32")}, fetch_list=[out])[0].round(4)
    array([[1.    ],
           [0.7071]], dtype=float32)
    """
    out, _x_norm, _y_norm = append_op(
        "cos_sim", {"X": X, "Y": Y}, outputs=("Out", "XNorm", "YNorm")
    )
    return out


def masked_fill(x: VarDesc, mask: VarDesc, value: float, name: str | None = None) -> VarDesc:
    """x with `value` where the bool `mask` (broadcastable to x) is True (one `where` op;
    the gradient reaches x where mask is False). ShapeError when mask does not broadcast to
    x's shape, DTypeError for a non-bool mask.

    >>> x, mask = nf.data("x", [-1, 3]), nf.data("mask", [3], "bool")
    >>> out = nf.layers.masked_fill(x, mask, float("-inf"))
    >>> nf.Executor().run(feed={"x": np.ones((1, 3), "float32"),
    ...     "mask": np.array([False, True, False])}, fetch_list=[out])[0]
    array([[  1., -inf,   1.]], dtype=float32)
    """
    if not isinstance(mask, VarDesc) or mask.dtype != "bool":
        what = mask.dtype if isinstance(mask, VarDesc) else type(mask).__name__
        raise layer_error(DTypeError, "masked_fill", f"mask must be a bool variable, got {what}")
    if mask.ndim > x.ndim or any(
        m not in (1, d) and m >= 0 and d >= 0
        for m, d in zip(reversed(mask.shape), reversed(x.shape))
    ):
        raise layer_error(
            ShapeError,
            "masked_fill",
            f"mask '{mask.name}' {list(mask.shape)} does not broadcast to x '{x.name}' "
            f"{list(x.shape)}",
        )
    fill = fill_constant([1], x.dtype, as_float(value, "masked_fill: value"))
    return append_op("where", {"Condition": mask, "X": fill, "Y": x}, name=name)


def greater_equal(x: VarDesc, y: Any, cond: VarDesc | None = None, name=None) -> VarDesc:
    """x >= y elementwise (bool, no gradient); y may be a number; written into `cond` when
    given.

    >>> x = nf.data("x", [-1])
    >>> out = nf.layers.greater_equal(x, 1.0)
    >>> nf.Executor().run(feed={"x": np.array([0, 1], "float32")}, fetch_list=[out])[0]
    array([False,  True])
    """
    return _compare("greater_equal", x, y, cond, name)


def less_equal(x: VarDesc, y: Any, cond: VarDesc | None = None, name=None) -> VarDesc:
    """x <= y elementwise (bool, no gradient); y may be a number; written into `cond` when
    given.

    >>> x = nf.data("x", [-1])
    >>> out = nf.layers.less_equal(x, 1.0)
    >>> nf.Executor().run(feed={"x": np.array([1, 2], "float32")}, fetch_list=[out])[0]
    array([ True, False])
    """
    return _compare("less_equal", x, y, cond, name)


def not_equal(x: VarDesc, y: Any, cond: VarDesc | None = None, name=None) -> VarDesc:
    """x != y elementwise (bool, no gradient); y may be a number; written into `cond` when
    given.

    >>> x = nf.data("x", [-1], "int64")
    >>> out = nf.layers.not_equal(x, 2)
    >>> nf.Executor().run(feed={"x": np.array([1, 2])}, fetch_list=[out])[0]
    array([ True, False])
    """
    return _compare("not_equal", x, y, cond, name)


def zeros(shape: Sequence[int], dtype: Any, force_cpu: bool = False) -> VarDesc:
    """A tensor of `shape` (known dims) filled with 0 (Fluid's zeros; `force_cpu` is accepted
    and ignored: there is one place per run).

    >>> nf.Executor().run(fetch_list=[nf.layers.zeros([2], "int64")])[0]
    array([0, 0])
    """
    return fill_constant(shape, dtype, 0.0)


def ones(shape: Sequence[int], dtype: Any, force_cpu: bool = False) -> VarDesc:
    """A tensor of `shape` (known dims) filled with 1 (Fluid's ones).

    >>> nf.Executor().run(fetch_list=[nf.layers.ones([2], "float32")])[0]
    array([1., 1.], dtype=float32)
    """
    return fill_constant(shape, dtype, 1.0)


def zeros_like(x: VarDesc, out: VarDesc | None = None) -> VarDesc:
    """Zeros of x's shape (unknown dims included) and dtype; written into `out` when given.

    >>> x = nf.data("x", [-1, 2])
    >>> nf.Executor().run(feed={"x": np.ones((1, 2), "float32")},
    ...     fetch_list=[nf.layers.zeros_like(x)])[0]
    array([[0., 0.]], dtype=float32)
    """
    return append_op("fill_zeros_like", {"X": x}, out=out, stop_gradient=True)


def ones_like(x: VarDesc, out: VarDesc | None = None) -> VarDesc:
    """Ones of x's shape (unknown dims included) and dtype; written into `out` when given.

    >>> x = nf.data("x", [-1, 2], "int64")
    >>> nf.Executor().run(feed={"x": np.zeros((1, 2), "int64")},
    ...     fetch_list=[nf.layers.ones_like(x)])[0]
    array([[1, 1]])
    """
    return append_op("fill_any_like", {"X": x}, {"value": 1.0}, out=out, stop_gradient=True)
