"""Activations and elementwise math of one input: relu, sigmoid, tanh, softmax, exp, log, sqrt,
rsqrt, abs, pow, clip, leaky_relu, elu, gelu, softplus, softsign, swish, hard_sigmoid.

Slots (X -> Out), attrs and defaults are Fluid 1.8's. Every op here but relu and abs is
float-only: its kernel makes floats and Out has X's dtype, so a non-float X is a DTypeError
when the op is appended.

Kernels are written against `xp`, their place's array module. NumPy ufuncs return scalars for
0-d arrays, hence the xp.asarray around elementwise results, and `specialize` offers the
place's bare ufunc (no Python frame per call) only when X has rank >= 1.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from nestflow.core.device_context import ROW_CHUNK_ELEMENTS, device_context
from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError
from nestflow.ops.registry import (
    Required,
    VarInfo,
    fail,
    numeric_same_as,
    register_op,
    registered_ops,
)


def _require_float(X: VarInfo, op: str) -> VarInfo:
    """X, if it is floating point: these kernels make floats, and Out has X's dtype."""
    if not is_floating(X.dtype):
        raise DTypeError(f"{op} needs a floating-point X, got {X.dtype}; cast it first")
    return X


def _float_only(op: str):
    """infer: Out is shaped like X, which must be floating point."""

    def infer(X, **_attrs):
        return _require_float(X, op)

    return infer


def _bare(ufunc: str):
    """specialize: the place's ufunc `ufunc` itself for X of rank >= 1."""

    def specialize(X, xp, **_attrs):
        return getattr(xp, ufunc) if X is not None and X.ndim else None

    return specialize


def _constant(value: float, dtype, xp):
    # A 0-d array of X's dtype: given a Python number, a ufunc resolves the operand type on
    # every call, which doubles its cost on small arrays.
    return xp.asarray(value, dtype)


# NumPy's maximum of an array and a scalar runs several times slower than of two arrays
# (float32 [64, 6, 24, 24]: 280-430 us against 53 us; [32, 128]: 7.7 against 3.6 us), so relu
# (and the fused conv's relu) reads zeros from a shared buffer, grown as needed, never written.
# np.zeros leaves its pages unmapped until read, and reading maps the one zero page: it costs no
# memory.
_ZERO_BUFFERS: dict[np.dtype, np.ndarray] = {}


def shared_zeros(x: np.ndarray) -> np.ndarray:
    """A read-only view of x.size zeros of x's dtype, in x's shape."""
    buffer = _ZERO_BUFFERS.get(x.dtype)
    if buffer is None or buffer.size < x.size:
        buffer = np.zeros(max(x.size, 4096), x.dtype)
        buffer.flags.writeable = False
        _ZERO_BUFFERS[x.dtype] = buffer
    return buffer[: x.size].reshape(x.shape)


def _relu(X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    if X.size >= 2 * ROW_CHUNK_ELEMENTS:  # on the intra-op pool
        out = np.empty_like(X) if out is None else out
        return device_context().map_rows(_relu_rows, out, X)
    return np.maximum(shared_zeros(X), X, out=out)


def _relu_rows(X: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.maximum(shared_zeros(X), X, out=out)


def _relu_grad(Out_grad: np.ndarray, Out: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.multiply(Out_grad, Out > 0, out=out)


@register_op
class relu:
    """Out = max(X, 0)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X",)
    infer = numeric_same_as(0)
    inplace = {"Out": "X"}
    grad_inplace = {"X@GRAD": "Out@GRAD"}

    def specialize(X, xp):
        if X is None or not X.ndim:
            return None
        small = all(d >= 0 for d in X.shape) and math.prod(X.shape) < 4096
        if xp is np and not small:
            return _relu  # NumPy's maximum with a scalar is slow: see shared_zeros
        # maximum(0, X) as a C-level partial, no Python frame
        return functools.partial(xp.maximum, _constant(0, X.dtype, xp))

    def forward(X, xp):
        return xp.asarray(xp.maximum(X, 0))

    def backward(X, Out, Out_grad, xp, out=None):
        if not Out.ndim:
            return (xp.asarray(Out_grad * (Out > 0)),)
        if xp is np and Out.size >= 2 * ROW_CHUNK_ELEMENTS:
            out = np.empty_like(Out_grad) if out is None else out
            return (device_context().map_rows(_relu_grad, out, Out_grad, Out),)
        return (xp.multiply(Out_grad, Out > 0, out=out),)

    def double_backward(X, Out, Out_grad, dX, ddX, xp):
        return (xp.asarray(ddX * (Out > 0)),)


@register_op
class sigmoid:
    """Out = 1 / (1 + exp(-X))."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X",)
    grad_inplace = {"X@GRAD": "Out@GRAD"}
    infer = _float_only("sigmoid")

    def forward(X, xp):
        # tanh form: no overflow warning for large |X|, same value as 1/(1+exp(-X)).
        return xp.asarray((xp.tanh(X * 0.5) + 1) * xp.asarray(0.5, X.dtype))

    def backward(X, Out, Out_grad, xp, out=None):
        if not Out.ndim:
            return (xp.asarray(Out_grad * Out * (1 - Out)),)
        grad = xp.multiply(Out_grad, Out, out=out)
        return (xp.multiply(grad, 1 - Out, out=grad),)

    double_grad = ("Out", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, xp):
        return xp.asarray(ddX * Out_grad * (1 - 2 * Out)), xp.asarray(ddX * Out * (1 - Out))


@register_op
class tanh:
    """Out = tanh(X)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X",)
    inplace = {"Out": "X"}
    grad_inplace = {"X@GRAD": "Out@GRAD"}
    infer = _float_only("tanh")
    specialize = _bare("tanh")

    def forward(X, xp):
        return xp.asarray(xp.tanh(X))

    def backward(X, Out, Out_grad, xp, out=None):
        if not Out.ndim:
            return (xp.asarray(Out_grad * (1 - Out * Out)),)
        return (xp.multiply(Out_grad, 1 - Out * Out, out=out),)

    double_grad = ("Out", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, xp):
        return xp.asarray(-2 * ddX * Out_grad * Out), xp.asarray(ddX * (1 - Out * Out))


def rows_apart(X: np.ndarray, axis: int) -> bool:
    """Whether a softmax over `axis` of X (softmax, softmax_with_cross_entropy) splits into
    rows of its leading axis for the pool: a large X whose leading axis is not the one
    normalised."""
    return X.ndim > 1 and axis % X.ndim != 0 and X.size >= 2 * ROW_CHUNK_ELEMENTS


def _softmax(X: np.ndarray, axis: int, out: np.ndarray) -> np.ndarray:
    """softmax's forward into out, step for step as its NumPy body (the same bits)."""
    np.subtract(X, X.max(axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    return np.divide(out, out.sum(axis=axis, keepdims=True), out=out)


def _softmax_grad(Out: np.ndarray, Out_grad: np.ndarray, axis: int, out: np.ndarray):
    np.subtract(Out_grad, (Out_grad * Out).sum(axis=axis, keepdims=True), out=out)
    return np.multiply(Out, out, out=out)


@register_op
class softmax:
    """Out = exp(X) / sum(exp(X)) along `axis` (default: the last)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X",)
    attrs = {"axis": -1}

    def infer(X, axis):
        if X.ndim and not -X.ndim <= axis < X.ndim:  # rank 0: not known yet (a Net's var)
            fail(f"axis {axis} is out of range for X {list(X.shape)}")
        return _require_float(X, "softmax")

    def forward(X, axis, xp):
        if xp is np and rows_apart(X, axis):  # rows on the intra-op pool, each whole
            out = np.empty_like(X)
            return device_context().map_rows(functools.partial(_softmax, axis=axis), out, X)
        shifted = xp.exp(X - X.max(axis=axis, keepdims=True)) if X.size else X.copy()
        return shifted / shifted.sum(axis=axis, keepdims=True) if X.size else shifted

    def backward(X, Out, Out_grad, axis, xp):
        if xp is np and rows_apart(Out, axis):
            grad = functools.partial(_softmax_grad, axis=axis)
            return (device_context().map_rows(grad, np.empty_like(Out), Out, Out_grad),)
        return (Out * (Out_grad - (Out_grad * Out).sum(axis=axis, keepdims=True)),)

    double_grad = ("Out", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, axis):
        # dX = Out * (dOut - s), s = sum(dOut * Out): symmetric in ddX and dOut.
        s = (Out_grad * Out).sum(axis=axis, keepdims=True)
        t = (ddX * Out).sum(axis=axis, keepdims=True)
        return ddX * (Out_grad - s) - Out_grad * t, Out * (ddX - t)


# ---- exponentials, logarithms, roots, powers ----


@register_op
class exp:
    """Out = e ** X."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X",)
    inplace = {"Out": "X"}
    grad_inplace = {"X@GRAD": "Out@GRAD"}
    infer = _float_only("exp")
    specialize = _bare("exp")

    def forward(X, xp):
        return xp.asarray(xp.exp(X))

    def backward(X, Out, Out_grad, xp, out=None):
        return (xp.asarray(xp.multiply(Out_grad, Out, out=out if Out.ndim else None)),)

    double_grad = ("Out", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, xp):
        return xp.asarray(ddX * Out_grad), xp.asarray(ddX * Out)


@register_op
class log:
    """Out = ln(X) (-inf at 0, NaN below, as NumPy's log)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    inplace = {"Out": "X"}
    infer = _float_only("log")
    specialize = _bare("log")

    def forward(X, xp):
        return xp.asarray(xp.log(X))

    def backward(X, Out, Out_grad, xp):
        return (xp.asarray(Out_grad / X),)

    double_grad = ("X", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, xp):
        return xp.asarray(-ddX * Out_grad / (X * X)), xp.asarray(ddX / X)


@register_op
class sqrt:
    """Out = X ** 0.5."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X",)
    inplace = {"Out": "X"}
    infer = _float_only("sqrt")
    specialize = _bare("sqrt")

    def forward(X, xp):
        return xp.asarray(xp.sqrt(X))

    def backward(X, Out, Out_grad, xp):
        return (xp.asarray(Out_grad * 0.5 / Out),)

    double_grad = ("Out", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, xp):
        return xp.asarray(-0.5 * ddX * Out_grad / (Out * Out)), xp.asarray(ddX * 0.5 / Out)


@register_op
class rsqrt:
    """Out = 1 / sqrt(X)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X",)
    inplace = {"Out": "X"}
    infer = _float_only("rsqrt")

    def specialize(X, xp):
        if X is None or not X.ndim:
            return None

        def reciprocal_root(X, out=None):
            root = xp.sqrt(X, out=out)
            return xp.divide(1.0, root, out=root)

        return reciprocal_root

    def forward(X, xp):
        return xp.asarray(1.0 / xp.sqrt(X), X.dtype)

    def backward(X, Out, Out_grad, xp):
        return (xp.asarray(Out_grad * -0.5 * Out * Out * Out),)


@register_op
class abs:
    """Out = |X|. Integers keep their dtype; the gradient at X = 0 is 0 (sign(0))."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    inplace = {"Out": "X"}
    infer = numeric_same_as(0)
    specialize = _bare("absolute")

    def forward(X, xp):
        return xp.asarray(xp.absolute(X))

    def backward(X, Out, Out_grad, xp):
        return (xp.asarray(Out_grad * xp.sign(X)),)


@register_op
class pow:
    """Out = X ** factor; FactorTensor (a float tensor of one element), when given, replaces
    the `factor` attribute (Fluid 1.8; it gets no gradient)."""

    inputs, outputs = ("X", "FactorTensor?"), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"factor": 1.0}
    no_grad_inputs = ("FactorTensor",)
    inplace = {"Out": "X"}

    def infer(X, FactorTensor, factor):
        if FactorTensor is not None:
            if not is_floating(FactorTensor.dtype):
                raise DTypeError(f"FactorTensor must be floating point, got {FactorTensor.dtype}")
            if -1 not in FactorTensor.shape and int(np.prod(FactorTensor.shape)) != 1:
                fail(f"FactorTensor must hold one element, got shape {list(FactorTensor.shape)}")
        return _require_float(X, "pow")

    def specialize(X, FactorTensor, factor, xp):
        if X is None or not X.ndim or FactorTensor is not None:
            return None
        exponent = _constant(factor, X.dtype, xp)

        def power(X, FactorTensor, out=None):
            return xp.power(X, exponent, out=out)

        return power

    def forward(X, FactorTensor, factor, xp):
        return xp.asarray(xp.power(X, _exponent(X, FactorTensor, factor, xp)))

    def backward(X, FactorTensor, Out, Out_grad, factor, xp):
        f = _exponent(X, FactorTensor, factor, xp)
        return (xp.asarray(Out_grad * f * xp.power(X, f - 1)),)


def _exponent(X, factor_tensor, factor: float, xp):
    """The exponent as a 0-d array of X's dtype; FactorTensor's stays on the device."""
    if factor_tensor is None:
        return _constant(factor, X.dtype, xp)
    return xp.asarray(factor_tensor.reshape(-1)[0], X.dtype)


# ---- piecewise: clip, leaky_relu, elu, hard_sigmoid ----


@register_op
class clip:
    """Out = min(max(X, min), max). The gradient passes where min < X < max (strictly), as
    Fluid's; min > max is an AttrError."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"min": Required(float), "max": Required(float)}
    inplace = {"Out": "X"}

    def infer(X, min, max):
        if min > max:
            raise AttrError(f"clip needs min <= max, got min={min} and max={max}")
        return _require_float(X, "clip")

    def specialize(X, min, max, xp):
        if X is None or not X.ndim:
            return None
        low, high = _constant(min, X.dtype, xp), _constant(max, X.dtype, xp)

        def clipped(X, out=None):
            out = xp.maximum(X, low, out=out)
            return xp.minimum(out, high, out=out)

        return clipped

    def forward(X, min, max, xp):
        low, high = _constant(min, X.dtype, xp), _constant(max, X.dtype, xp)
        return xp.asarray(xp.minimum(xp.maximum(X, low), high))

    def backward(X, Out, Out_grad, min, max, xp):
        return (xp.asarray(Out_grad * ((X > min) & (X < max))),)


@register_op
class leaky_relu:
    """Out = max(X, alpha * X) (Fluid 1.8's formula: X where X > 0, alpha * X elsewhere for
    alpha <= 1). The gradient is that of this formula; at X = 0 it is alpha for alpha <= 1."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"alpha": 0.02}
    inplace = {"Out": "X"}
    infer = _float_only("leaky_relu")

    def specialize(X, alpha, xp):
        if X is None or not X.ndim:
            return None
        slope = _constant(alpha, X.dtype, xp)

        def leaky(X, out=None):
            scaled = xp.multiply(X, slope)
            return xp.maximum(X, scaled, out=out if out is not None else scaled)

        return leaky

    def forward(X, alpha, xp):
        return xp.asarray(xp.maximum(X, X * _constant(alpha, X.dtype, xp)))

    def backward(X, Out, Out_grad, alpha, xp):
        # max(X, alpha X) follows X where X > 0 when alpha <= 1, and alpha X there otherwise.
        positive, negative = (1.0, alpha) if alpha <= 1 else (alpha, 1.0)
        return (xp.asarray(Out_grad * xp.where(X > 0, positive, negative).astype(X.dtype)),)

    def double_backward(X, Out, Out_grad, dX, ddX, alpha, xp):
        positive, negative = (1.0, alpha) if alpha <= 1 else (alpha, 1.0)
        return (xp.asarray(ddX * xp.where(X > 0, positive, negative).astype(X.dtype)),)


@register_op
class elu:
    """Out = max(0, X) + min(0, alpha * (exp(X) - 1)) (Fluid 1.8's formula: for alpha >= 0
    the usual ELU; for alpha < 0 it is X + alpha * (exp(X) - 1) where X > 0 and 0 elsewhere).
    The gradient is that formula's, alpha at X = 0 for alpha > 0 (as Fluid and PyTorch)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"alpha": 1.0}
    infer = _float_only("elu")

    def forward(X, alpha, xp):
        negative = xp.minimum(xp.expm1(X) * _constant(alpha, X.dtype, xp), 0)
        return xp.asarray(xp.maximum(X, 0) + negative, X.dtype)

    def backward(X, Out, Out_grad, alpha, xp):
        if alpha > 0:
            slope = xp.where(X > 0, 1, xp.exp(X) * alpha)
        else:  # the min term is alpha * (exp(X) - 1) where X > 0, and 0 elsewhere
            slope = xp.where(X > 0, 1 + xp.exp(X) * alpha, 0)
        return (xp.asarray(Out_grad * slope, X.dtype),)


@register_op
class hard_sigmoid:
    """Out = clip(slope * X + offset, 0, 1); the gradient is slope where 0 < Out < 1."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"slope": 0.2, "offset": 0.5}
    infer = _float_only("hard_sigmoid")

    def forward(X, slope, offset, xp):
        linear = X * _constant(slope, X.dtype, xp) + _constant(offset, X.dtype, xp)
        return xp.asarray(xp.clip(linear, 0, 1), X.dtype)

    def backward(X, Out, Out_grad, slope, offset, xp):
        inside = (Out > 0) & (Out < 1)
        return (xp.asarray(Out_grad * inside * _constant(slope, X.dtype, xp)),)


# ---- smooth: gelu, softplus, softsign, swish ----


# erf's rational approximations from Cephes (S. L. Moshier, public domain; scipy's too):
# x T(x^2) / U(x^2) for |x| <= 1, else 1 - exp(-x^2) P(|x|) / Q(|x|); within 4e-16 of
# math.erf (tests/ops/test_onnx_compat.py). Past |x| = 6, erfc < 2**-54: erf is +-1 exactly.
_ERF_T = (
    9.60497373987051638749e0,
    9.00260197203842689217e1,
    2.23200534594684319226e3,
    7.00332514112805075473e3,
    5.55923013010394962768e4,
)
_ERF_U = (
    1.0,
    3.35617141647503099647e1,
    5.21357949780152679795e2,
    4.59432382970980127987e3,
    2.26290000613890934246e4,
    4.92673942608635921086e4,
)
_ERFC_P = (
    2.46196981473530512524e-10,
    5.64189564831068821977e-1,
    7.46321056442269912687e0,
    4.86371970985681366614e1,
    1.96520832956077098242e2,
    5.26445194995477358631e2,
    9.34528527171957607540e2,
    1.02755188689515710272e3,
    5.57535335369399327526e2,
)
_ERFC_Q = (
    1.0,
    1.32281951154744992508e1,
    8.67072140885989742329e1,
    3.54937778887819891062e2,
    9.75708501743205489753e2,
    1.82390916687909736289e3,
    2.24633760818710981792e3,
    1.65666309194161350182e3,
    5.57535340817727675546e2,
)


def _polynomial(x, coefficients: tuple[float, ...]):
    total = coefficients[0]
    for c in coefficients[1:]:
        total = total * x + c
    return total


def _rational_erf(x, xp):
    """erf of float64 `x` from xp's elementwise functions (CuPy's core has no erf)."""
    inner = xp.clip(x, -1.0, 1.0)  # the |x| <= 1 branch, kept finite everywhere
    z = inner * inner
    small = inner * _polynomial(z, _ERF_T) / _polynomial(z, _ERF_U)
    a = xp.minimum(xp.abs(x), 6.0)
    large = 1.0 - xp.exp(-a * a) * _polynomial(a, _ERFC_P) / _polynomial(a, _ERFC_Q)
    return xp.where(xp.abs(x) <= 1.0, small, xp.copysign(large, x))


def erf(x, xp):
    """erf of a float64 array. NumPy has none: math.erf (libm's, within an ulp or two) mapped
    over the elements, about 0.1 µs each (mapped over a list: faster than np.frompyfunc). On a
    device, Cephes' rational erf from xp's elementwise functions (within 5e-16 of math.erf). Shared by gelu and onnx_erf."""
    if xp is not np:
        return _rational_erf(x, xp)
    flat = np.fromiter(map(math.erf, x.ravel().tolist()), np.float64, count=x.size)
    return flat.reshape(x.shape)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@register_op
class gelu:
    """Out = X * Phi(X) = 0.5 * X * (1 + erf(X / sqrt(2))); with `approximate`, the tanh form
    0.5 * X * (1 + tanh(sqrt(2/pi) * (X + 0.044715 X^3))). Computed in float64."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"approximate": False}
    infer = _float_only("gelu")

    def forward(X, approximate, xp):
        x = X.astype(np.float64)
        if approximate:
            out = 0.5 * x * (1.0 + xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
        else:
            out = 0.5 * x * (1.0 + erf(x * math.sqrt(0.5), xp))
        return xp.asarray(out, X.dtype)

    def backward(X, Out, Out_grad, approximate, xp):
        x = X.astype(np.float64)
        if approximate:
            inner = _SQRT_2_OVER_PI * (x + 0.044715 * x**3)
            t = xp.tanh(inner)
            slope = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
            dout_dx = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope
        else:
            cdf = 0.5 * (1.0 + erf(x * math.sqrt(0.5), xp))
            dout_dx = cdf + x * xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return (xp.asarray(Out_grad * dout_dx, X.dtype),)

    double_grad = ("X", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, approximate, xp):
        x = X.astype(np.float64)
        if approximate:
            t = xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))
            slope = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
            dout_dx = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope
            curvature = (1.0 - t * t) * (
                slope - x * t * slope * slope + 3 * 0.044715 * _SQRT_2_OVER_PI * x * x
            )
        else:
            density = xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
            dout_dx = 0.5 * (1.0 + erf(x * math.sqrt(0.5), xp)) + x * density
            curvature = density * (2.0 - x * x)
        return (
            xp.asarray(ddX * Out_grad * curvature, X.dtype),
            xp.asarray(ddX * dout_dx, X.dtype),
        )


def _stable_sigmoid(x, xp):
    return (xp.tanh(x * 0.5) + 1) * xp.asarray(0.5, x.dtype)


@register_op
class softplus:
    """Out = log(1 + exp(X)), computed without overflow for large X."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    infer = _float_only("softplus")

    def forward(X, xp):
        return xp.asarray(xp.logaddexp(X, _constant(0, X.dtype, xp)))

    def backward(X, Out, Out_grad, xp):
        return (xp.asarray(Out_grad * _stable_sigmoid(X, xp)),)

    double_grad = ("X", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, xp):
        s = _stable_sigmoid(X, xp)
        return xp.asarray(ddX * Out_grad * s * (1 - s)), xp.asarray(ddX * s)


@register_op
class softsign:
    """Out = X / (1 + |X|)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    infer = _float_only("softsign")

    def forward(X, xp):
        return xp.asarray(X / (1 + xp.absolute(X)))

    def backward(X, Out, Out_grad, xp):
        denominator = 1 + xp.absolute(X)
        return (xp.asarray(Out_grad / (denominator * denominator)),)


@register_op
class swish:
    """Out = X * sigmoid(beta * X)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"beta": 1.0}
    infer = _float_only("swish")

    def forward(X, beta, xp):
        return xp.asarray(X * _stable_sigmoid(X * _constant(beta, X.dtype, xp), xp))

    def backward(X, Out, Out_grad, beta, xp):
        sig = _stable_sigmoid(X * _constant(beta, X.dtype, xp), xp)
        beta_out = X * sig * beta
        return (xp.asarray(Out_grad * (beta_out + sig * (1 - beta_out)), X.dtype),)


# What a layer's `act=` may name: this family's ops that need no attribute set (clip does).
ACTIVATIONS = frozenset(
    name
    for name, op_def in registered_ops().items()
    if op_def.forward_type is None
    and op_def.forward is not None
    and op_def.forward.__module__ == __name__
    and not any(spec.required for spec in op_def.attrs.values())
)
