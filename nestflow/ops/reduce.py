"""Reductions: mean (of everything, a 0-d result), reduce_sum and reduce_mean over chosen dims.

A reduction over no elements follows NumPy: sums are 0 and means are NaN (without a warning).
"""

from __future__ import annotations

import numpy as np

from nestflow.errors import DTypeError
from nestflow.ops.registry import VarInfo, fail, register_op


def _require_float(X: VarInfo, op: str) -> None:
    if not np.issubdtype(np.dtype(X.dtype), np.floating):
        raise DTypeError(f"{op} needs a floating-point X, got {X.dtype}; cast it first")


def _mean_of(total: np.ndarray, count: int, dtype) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / np.asarray(count, dtype), dtype)


@register_op
class mean:
    """Out = the mean of all elements of X, a 0-d array of X's dtype."""

    inputs, outputs = ("X",), ("Out",)

    def infer(X):
        _require_float(X, "mean")
        return VarInfo((), X.dtype)

    def forward(X):
        return _mean_of(X.sum(), X.size, X.dtype)

    def backward(X, Out, Out_grad):
        return (np.full(X.shape, Out_grad / max(X.size, 1), X.dtype),)


def _reduced_axes(ndim: int, dim: list, reduce_all: bool) -> tuple[int, ...]:
    """The axes a reduce op sums over; raises ShapeError for dims outside X or repeated."""
    if reduce_all or not dim or ndim == 0:
        return tuple(range(ndim))
    axes = []
    for d in dim:
        if not -ndim <= d < ndim:
            fail(f"dim {d} is out of range for X of rank {ndim} (dims {list(dim)})")
        axes.append(d % ndim)
    if len(set(axes)) != len(axes):
        fail(f"dim {list(dim)} names an axis twice")
    return tuple(sorted(axes))


def _infer_reduce(X: VarInfo, dim: list, keep_dim: bool, reduce_all: bool) -> VarInfo:
    axes = _reduced_axes(X.ndim, dim, reduce_all)
    if keep_dim:
        shape = tuple(1 if i in axes else d for i, d in enumerate(X.shape))
    else:
        shape = tuple(d for i, d in enumerate(X.shape) if i not in axes)
    return VarInfo(shape, X.dtype)


def _spread(Out_grad: np.ndarray, X: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Out_grad put back in X's shape: the reduced axes restored as 1, then broadcast."""
    kept = tuple(1 if i in axes else d for i, d in enumerate(X.shape))
    return np.broadcast_to(Out_grad.reshape(kept), X.shape).astype(X.dtype, copy=True)


@register_op
class reduce_sum:
    """Out = X summed over `dim` (all dims when `dim` is empty or `reduce_all`); `keep_dim`
    keeps the reduced dims as size 1. Out keeps X's dtype."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"dim": [], "keep_dim": False, "reduce_all": False}
    infer = _infer_reduce

    def forward(X, dim, keep_dim, reduce_all):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        return np.asarray(X.sum(axis=axes, keepdims=keep_dim, dtype=X.dtype))

    def backward(X, Out, Out_grad, dim, keep_dim, reduce_all):
        return (_spread(Out_grad, X, _reduced_axes(X.ndim, dim, reduce_all)),)


@register_op
class reduce_mean:
    """Out = the mean of X over `dim` (all dims when `dim` is empty or `reduce_all`)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"dim": [], "keep_dim": False, "reduce_all": False}

    def infer(X, dim, keep_dim, reduce_all):
        _require_float(X, "reduce_mean")
        return _infer_reduce(X, dim, keep_dim, reduce_all)

    def forward(X, dim, keep_dim, reduce_all):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        count = int(np.prod([X.shape[a] for a in axes]))
        return _mean_of(X.sum(axis=axes, keepdims=keep_dim), count, X.dtype)

    def backward(X, Out, Out_grad, dim, keep_dim, reduce_all):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        count = max(int(np.prod([X.shape[a] for a in axes])), 1)
        return (_spread(Out_grad / np.asarray(count, Out_grad.dtype), X, axes),)
