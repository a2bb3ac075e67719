"""Log-space reductions and norms of Fluid 1.8: log_softmax, logsumexp, norm (l2_normalize's
op) and cos_sim, each with its gradient, written over `xp`.

Slots and attrs are Fluid's: log_softmax (X -> Out, axis), logsumexp (X -> Out, the reduce ops'
dim / keep_dim / reduce_all), norm (X -> Out, Norm; axis, epsilon: Norm = sqrt(sum(X^2) +
epsilon)), cos_sim (X, Y -> Out, XNorm, YNorm; Y of one row is compared with every row of X).
"""

from __future__ import annotations

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import DTypeError, ShapeError
from nestflow.ops.reduce import _REDUCE_ATTRS, _infer_reduce, _reduced_axes
from nestflow.ops.registry import VarInfo, fail, register_op


def _require_float(info: VarInfo, op: str, slot: str = "X") -> None:
    if not is_floating(info.dtype):
        raise DTypeError(f"{op} needs a floating-point {slot}, got {info.dtype}; cast it first")


def _check_axis(X: VarInfo, axis: int, op: str) -> None:
    if X.ndim and not -X.ndim <= axis < X.ndim:
        fail(f"{op}: axis {axis} is out of range for X {list(X.shape)}")


def _finite_or_zero(x, xp):
    """x with its infinite entries (the max of a row of -inf) replaced by 0, so that x - max
    never makes -inf - -inf = NaN."""
    return xp.where(xp.isfinite(x), x, 0.0).astype(x.dtype)


@register_op
class log_softmax:
    """Out = X - log(sum(exp(X))) along `axis` (computed from X - max: never overflows)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X",)
    attrs = {"axis": -1}

    def infer(X, axis):
        _require_float(X, "log_softmax")
        _check_axis(X, axis, "log_softmax")
        return X

    def forward(X, axis, xp):
        if not X.size:
            return X.copy()
        shifted = X - _finite_or_zero(X.max(axis=axis, keepdims=True), xp)
        with np.errstate(divide="ignore"):
            return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))

    def backward(X, Out, Out_grad, axis, xp):
        return (Out_grad - xp.exp(Out) * Out_grad.sum(axis=axis, keepdims=True),)


@register_op
class logsumexp:
    """Out = log(sum(exp(X))) over `dim` (every dim when `dim` is empty or `reduce_all`),
    computed from X - max; `keep_dim` keeps the reduced dims as 1. Reducing nothing, or only
    -inf, gives -inf."""

    inputs, outputs = ("X",), ("Out",)
    attrs = _REDUCE_ATTRS

    def infer(X, dim, keep_dim, reduce_all):
        _require_float(X, "logsumexp")
        return _infer_reduce(X, dim, keep_dim, reduce_all)

    def forward(X, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        if not X.size:
            with np.errstate(divide="ignore"):
                return xp.log(xp.exp(X).sum(axis=axes, keepdims=keep_dim))
        top = _finite_or_zero(X.max(axis=axes, keepdims=True), xp)
        with np.errstate(divide="ignore"):
            out = xp.log(xp.exp(X - top).sum(axis=axes, keepdims=True)) + top
        return out if keep_dim else out.reshape([d for i, d in enumerate(X.shape) if i not in axes])

    def backward(X, Out, Out_grad, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        kept = tuple(1 if i in axes else d for i, d in enumerate(X.shape))
        out = _finite_or_zero(Out.reshape(kept), xp)  # Out = -inf: every exp(X - 0) is 0 too
        return (Out_grad.reshape(kept) * xp.exp(X - out),)


@register_op
class norm:
    """Norm = sqrt(sum(X^2 along `axis`) + epsilon) (the axis kept as 1); Out = X / Norm.
    The op behind l2_normalize, with Fluid's slots and attrs."""

    inputs, outputs = ("X",), ("Out", "Norm")
    grad_no_need_buffer = ("X",)
    attrs = {"axis": 1, "epsilon": 1e-10, "is_test": False}

    def infer(X, axis, epsilon, is_test):
        _require_float(X, "norm")
        if not X.ndim or not -X.ndim <= axis < X.ndim:
            fail(f"norm: axis {axis} is out of range for X {list(X.shape)}")
        norm_shape = tuple(1 if i == axis % X.ndim else d for i, d in enumerate(X.shape))
        return X, VarInfo(norm_shape, X.dtype)

    def forward(X, axis, epsilon, is_test, xp):
        norm = xp.sqrt((X * X).sum(axis=axis, keepdims=True) + epsilon)
        return X / norm, norm

    def backward(X, Out, Norm, Out_grad, Norm_grad, axis, epsilon, is_test, xp):
        along = (Out_grad * Out).sum(axis=axis, keepdims=True)
        grad = (Out_grad - Out * along) / Norm
        if Norm_grad is not None:  # Norm used downstream too: dNorm/dX = X / Norm = Out
            grad = grad + Norm_grad * Out
        return (grad,)


def _flat(a):
    return a.reshape(a.shape[0], int(np.prod(a.shape[1:], dtype=np.int64)))


def _rows(info: VarInfo) -> tuple[int, int]:
    """[N, D] of a [N, ...] input flattened after its first dim (-1: unknown)."""
    rest = info.shape[1:]
    return info.shape[0], -1 if any(d < 0 for d in rest) else int(np.prod(rest, dtype=np.int64))


@register_op
class cos_sim:
    """Out[i] = <X[i], Y[i]> / (|X[i]| |Y[i]|) for X [N, ...] and Y [N, ...] or [1, ...] (one
    row compared with every row of X), each row flattened; Out, XNorm [N, 1], YNorm [N or 1,
    1] (Fluid's slots). A zero row divides by zero, as in Fluid (inf or NaN)."""

    inputs, outputs = ("X", "Y"), ("Out", "XNorm", "YNorm")

    def infer(X, Y):
        _require_float(X, "cos_sim")
        _require_float(Y, "cos_sim", "Y")
        if X.dtype != Y.dtype:
            raise DTypeError(f"cos_sim: X is {X.dtype} but Y is {Y.dtype}; cast one of them")
        shapes = f"X {list(X.shape)} and Y {list(Y.shape)}"
        if X.ndim < 1 or X.ndim != Y.ndim:
            raise ShapeError(f"cos_sim: {shapes} need one rank, at least 1 ([N, ...])")
        (nx, dx), (ny, dy) = _rows(X), _rows(Y)
        if dx >= 0 and dy >= 0 and dx != dy:
            raise ShapeError(f"cos_sim: {shapes} rows hold {dx} and {dy} values")
        if ny != 1 and nx >= 0 and ny >= 0 and nx != ny:
            raise ShapeError(f"cos_sim: {shapes}: Y needs X's {nx} rows or a single row")
        return (
            VarInfo((nx, 1), X.dtype),
            VarInfo((nx, 1), X.dtype),
            VarInfo((ny, 1), X.dtype),
        )

    def forward(X, Y, xp):
        x, y = _flat(X), _flat(Y)
        x_norm = xp.sqrt((x * x).sum(axis=1, keepdims=True))
        y_norm = xp.sqrt((y * y).sum(axis=1, keepdims=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (x * y).sum(axis=1, keepdims=True) / (x_norm * y_norm)
        return out, x_norm, y_norm

    def backward(X, Y, Out, XNorm, YNorm, Out_grad, XNorm_grad, YNorm_grad, xp, needs=(1, 1)):
        x, y = _flat(X), _flat(Y)
        with np.errstate(divide="ignore", invalid="ignore"):
            both = XNorm * YNorm
            dx = dy = None
            if needs[0]:
                dx = Out_grad * (y / both - Out * x / (XNorm * XNorm))
                dx = dx.reshape(X.shape)
            if needs[1]:
                dy = Out_grad * (x / both - Out * y / (YNorm * YNorm))
                if Y.shape[0] != X.shape[0]:  # one Y row met every X row
                    dy = dy.sum(axis=0, keepdims=True)
                dy = dy.reshape(Y.shape)
        return dx, dy


__all__ = ["cos_sim", "log_softmax", "logsumexp", "norm"]
