"""Reductions: mean (of everything, a 0-d result) and reduce_sum/mean/max/min/prod/all/any over
chosen dims.

The reduce ops take Fluid's attrs and defaults: `dim` [0], `keep_dim` False, `reduce_all`
False (an empty `dim` also reduces every dim). Reducing every dim without keep_dim gives a 0-d
result (Fluid gives [1]), as `mean` does. A reduction over no elements follows NumPy: sums are
0, products 1, means NaN (without a warning), all True, any False; max and min of nothing are
a ShapeError.
"""

from __future__ import annotations

import math

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import DTypeError, ShapeError
from nestflow.ops.registry import VarInfo, fail, linear_double, register_op


def _require_float(X: VarInfo, op: str) -> None:
    if not is_floating(X.dtype):
        raise DTypeError(f"{op} needs a floating-point X, got {X.dtype}; cast it first")


def _mean_of(total, count: int, dtype, xp):
    # the count goes to the device as a kernel argument (of the dtype: float16 rounds it as
    # NumPy does), not as an array copied over (a synchronous copy on CUDA)
    with np.errstate(invalid="ignore", divide="ignore"):
        return xp.asarray(total / np.dtype(dtype).type(count), dtype)


@register_op
class mean:
    """Out = the mean of all elements of X, a 0-d array of X's dtype."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X", "Out")

    def infer(X):
        _require_float(X, "mean")
        return VarInfo((), X.dtype)

    def forward(X, xp):
        return _mean_of(X.sum(), X.size, X.dtype, xp)

    def backward(X, Out, Out_grad, xp):
        # One value everywhere: a read-only broadcast view, no [X.shape] array to fill (an
        # op never writes into an input; the executor reuses only writeable buffers).
        share = xp.asarray(Out_grad / max(X.size, 1), X.dtype)
        return (xp.broadcast_to(share, X.shape),)

    double_backward = linear_double(forward)


def _reduced_axes(ndim: int, dim: list, reduce_all: bool) -> tuple[int, ...]:
    """The axes a reduce op reduces; raises ShapeError for dims outside X or repeated."""
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


# Fluid's ReduceOpMaker: dim defaults to [0], not to every dim.
_REDUCE_ATTRS = {"dim": [0], "keep_dim": False, "reduce_all": False}


def _infer_reduce(X: VarInfo, dim: list, keep_dim: bool, reduce_all: bool) -> VarInfo:
    axes = _reduced_axes(X.ndim, dim, reduce_all)
    if keep_dim:
        shape = tuple(1 if i in axes else d for i, d in enumerate(X.shape))
    else:
        shape = tuple(d for i, d in enumerate(X.shape) if i not in axes)
    return VarInfo(shape, X.dtype)


def _spread(Out_grad, X, axes: tuple[int, ...], xp):
    """Out_grad put back in X's shape: the reduced axes restored as 1, then broadcast."""
    kept = tuple(1 if i in axes else d for i, d in enumerate(X.shape))
    return xp.broadcast_to(Out_grad.reshape(kept), X.shape).astype(X.dtype, copy=True)


@register_op
class reduce_sum:
    """Out = X summed over `dim` (all dims when `dim` is empty or `reduce_all`); `keep_dim`
    keeps the reduced dims as size 1. Out keeps X's dtype."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = _REDUCE_ATTRS
    infer = _infer_reduce

    def forward(X, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        return xp.asarray(X.sum(axis=axes, keepdims=keep_dim, dtype=X.dtype))

    def backward(X, Out, Out_grad, dim, keep_dim, reduce_all, xp):
        return (_spread(Out_grad, X, _reduced_axes(X.ndim, dim, reduce_all), xp),)

    double_backward = linear_double(forward)


@register_op
class reduce_mean:
    """Out = the mean of X over `dim` (all dims when `dim` is empty or `reduce_all`)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = _REDUCE_ATTRS

    def infer(X, dim, keep_dim, reduce_all):
        _require_float(X, "reduce_mean")
        return _infer_reduce(X, dim, keep_dim, reduce_all)

    def forward(X, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        count = math.prod(X.shape[a] for a in axes)
        return _mean_of(X.sum(axis=axes, keepdims=keep_dim), count, X.dtype, xp)

    def backward(X, Out, Out_grad, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        count = max(math.prod(X.shape[a] for a in axes), 1)
        return (_spread(Out_grad / xp.asarray(count, Out_grad.dtype), X, axes, xp),)

    double_backward = linear_double(forward)


def _infer_extreme(X: VarInfo, dim: list, keep_dim: bool, reduce_all: bool) -> VarInfo:
    if X.dtype == "bool":
        raise DTypeError("X is bool; use reduce_all/reduce_any, or cast it first")
    axes = _reduced_axes(X.ndim, dim, reduce_all)
    empty = [a for a in axes if X.shape[a] == 0]
    if empty:
        fail(f"dim {empty[0]} of X {list(X.shape)} is empty: it has no extreme element")
    return _infer_reduce(X, dim, keep_dim, reduce_all)


def _extreme(find: str):
    def forward(X, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        if any(X.shape[a] == 0 for a in axes):
            raise ShapeError(f"X {list(X.shape)} has no elements along dims {list(axes)}")
        return xp.asarray(getattr(xp, find)(X, axis=axes, keepdims=keep_dim))

    return forward


def _extreme_grad(X, Out, Out_grad, dim, keep_dim, reduce_all, xp):
    """The gradient of max/min goes to the positions holding the extreme value, split evenly
    when several tie (torch.amax's rule; Fluid gives each tied position the whole gradient)."""
    axes = _reduced_axes(X.ndim, dim, reduce_all)
    kept = tuple(1 if i in axes else d for i, d in enumerate(X.shape))
    out = Out.reshape(kept)
    hits = X == out
    if X.dtype.kind == "f":
        hits |= xp.isnan(X) & xp.isnan(out)  # a NaN extreme came from the NaN positions
    share = Out_grad.reshape(kept) / hits.sum(axis=axes, keepdims=True)
    return (xp.where(hits, share, xp.zeros((), Out_grad.dtype)).astype(X.dtype, copy=False),)


@register_op
class reduce_max:
    """Out = the largest element of X over `dim` (NaN wins, as in np.max); the gradient goes
    to the maximal positions, split evenly between ties."""

    inputs, outputs = ("X",), ("Out",)
    attrs = _REDUCE_ATTRS
    infer = _infer_extreme

    forward = _extreme("max")
    backward = _extreme_grad


@register_op
class reduce_min:
    """Out = the smallest element of X over `dim`; the gradient goes to the minimal positions,
    split evenly between ties."""

    inputs, outputs = ("X",), ("Out",)
    attrs = _REDUCE_ATTRS
    infer = _infer_extreme

    forward = _extreme("min")
    backward = _extreme_grad


def _product_of_others(X, axes: tuple[int, ...], xp):
    """For each element, the product of the other elements of its reduced group, without
    dividing (exact with zeros): exclusive running products from the left and the right."""
    kept = [i for i in range(X.ndim) if i not in axes]
    order = kept + list(axes)
    moved = xp.transpose(X, order)
    count = math.prod(X.shape[a] for a in axes)
    if count == 0:
        return xp.zeros(X.shape, X.dtype)
    rows = moved.reshape(moved.shape[: len(kept)] + (count,))
    ones = xp.ones(rows.shape[:-1] + (1,), X.dtype)
    left = xp.cumprod(xp.concatenate([ones, rows[..., :-1]], axis=-1), axis=-1)
    right = xp.cumprod(xp.concatenate([ones, rows[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
    undo = sorted(range(len(order)), key=order.__getitem__)  # the inverse permutation
    return (left * right).reshape(moved.shape).transpose(undo)


@register_op
class reduce_prod:
    """Out = the product of X over `dim`; the gradient is exact where X holds zeros (each
    element's gradient is the product of the others in its group, never Out / X)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = _REDUCE_ATTRS
    infer = _infer_reduce

    def forward(X, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        return xp.asarray(xp.prod(X, axis=axes, keepdims=keep_dim, dtype=X.dtype))

    def backward(X, Out, Out_grad, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        others = _product_of_others(X, axes, xp)
        return ((others * _spread(Out_grad, X, axes, xp)).astype(X.dtype, copy=False),)


def _infer_logical(X: VarInfo, dim: list, keep_dim: bool, reduce_all: bool) -> VarInfo:
    if X.dtype != "bool":
        raise DTypeError(f"X must be bool, got {X.dtype}; compare or cast it first")
    return _infer_reduce(X, dim, keep_dim, reduce_all)


def _logical(test: str):
    def forward(X, dim, keep_dim, reduce_all, xp):
        axes = _reduced_axes(X.ndim, dim, reduce_all)
        return xp.asarray(getattr(xp, test)(X, axis=axes, keepdims=keep_dim))

    return forward


@register_op
class reduce_all:
    """Out = whether every element of bool X over `dim` is True (True over no elements)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = _REDUCE_ATTRS
    infer = _infer_logical
    forward = _logical("all")


@register_op
class reduce_any:
    """Out = whether any element of bool X over `dim` is True (False over no elements)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = _REDUCE_ATTRS
    infer = _infer_logical
    forward = _logical("any")
