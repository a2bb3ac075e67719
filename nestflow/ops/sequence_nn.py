"""Sequence ops for networks over padded batches (Fluid 1.8's): sequence_conv,
sequence_softmax, sequence_expand.

They follow nestflow.ops.sequence's convention: a padded `[batch, time, ...]` X and an optional
int `[batch]` Length (row n holds its sequence in steps `[0, Length[n])`); padding steps are
never read, their outputs and gradients are 0.
"""

from __future__ import annotations

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.ops.registry import Required, VarInfo, register_op
from nestflow.ops.sequence import _check_length_info, step_mask, valid_lengths


def _require_float(op: str, slot: str, info: VarInfo) -> None:
    if not is_floating(info.dtype):
        raise DTypeError(f"{op}: {slot} must be floating point, got {info.dtype}")


def _shifted(X, offset: int, xp):
    """Y[:, t] = X[:, t + offset] where that step exists, 0 elsewhere."""
    steps = X.shape[1]
    out = xp.zeros_like(X)
    if offset >= 0 and offset < steps:
        out[:, : steps - offset] = X[:, offset:]
    elif offset < 0 and -offset < steps:
        out[:, -offset:] = X[:, : steps + offset]
    return out


@register_op
class sequence_conv:
    """Out[n, t] = concat_k X[n, t + contextStart + k] (k < contextLength; 0 outside the row's
    steps) @ Filter: a 1-D convolution along time within each row. X is [N, T, D], Filter
    [contextLength * D, F], Out [N, T, F]. Fluid's contextStride must be 1 and its trainable
    padding (paddingTrainable, PaddingData) is not supported: rows are padded with zeros."""

    inputs, outputs = ("X", "Filter", "PaddingData?", "Length?"), ("Out",)
    attrs = {
        "contextLength": Required(int),
        "contextStart": 0,
        "contextStride": 1,
        "paddingTrainable": False,
    }
    no_grad_inputs = ("PaddingData", "Length")
    grad_no_need_buffer = ("Out",)

    def infer(X, Filter, PaddingData, Length, contextLength, contextStart, contextStride,
              paddingTrainable):  # fmt: skip
        if contextLength < 1:
            raise AttrError(f"sequence_conv: contextLength must be >= 1, got {contextLength}")
        if contextStride != 1:
            raise AttrError(
                f"sequence_conv: contextStride must be 1 (as Fluid's), got {contextStride}"
            )
        if paddingTrainable or PaddingData is not None:
            raise AttrError(
                "sequence_conv: trainable padding (paddingTrainable, PaddingData) is not "
                "supported; rows are padded with zeros (docs/departures.md)"
            )
        _check_length_info(X, Length, "sequence_conv")
        _require_float("sequence_conv", "X", X)
        if X.ndim != 3:
            raise ShapeError(f"sequence_conv: X {list(X.shape)} must be [batch, time, features]")
        width = X.shape[2] * contextLength if X.shape[2] >= 0 else -1
        if Filter.ndim != 2 or -1 not in (width, Filter.shape[0]) and Filter.shape[0] != width:
            raise ShapeError(
                f"sequence_conv: Filter {list(Filter.shape)} must be [contextLength * features, "
                f"num_filters] = [{contextLength} * {X.shape[2]}, F] for X {list(X.shape)}"
            )
        if Filter.dtype != X.dtype:
            raise DTypeError(f"sequence_conv: Filter is {Filter.dtype} but X is {X.dtype}")
        return VarInfo((X.shape[0], X.shape[1], Filter.shape[1]), X.dtype)

    def forward(X, Filter, PaddingData, Length, contextLength, contextStart, contextStride,
                paddingTrainable, xp):  # fmt: skip
        mask = step_mask(valid_lengths(Length, X, "sequence_conv"), X.shape[1], 3)
        columns = _columns(xp.where(mask, X, 0), contextLength, contextStart, xp)
        return xp.where(mask, xp.matmul(columns, Filter), 0).astype(X.dtype)

    def backward(X, Filter, PaddingData, Length, Out, Out_grad, contextLength, contextStart,
                 contextStride, paddingTrainable, xp):  # fmt: skip
        n, t, d = X.shape
        mask = step_mask(valid_lengths(Length, X, "sequence_conv"), t, 3)
        grad = xp.where(mask, Out_grad, 0).astype(X.dtype)
        columns = _columns(xp.where(mask, X, 0), contextLength, contextStart, xp)
        width, filters = Filter.shape
        d_filter = xp.matmul(columns.reshape(n * t, width).T, grad.reshape(n * t, filters))
        d_columns = xp.matmul(grad, Filter.T).reshape(n, t, contextLength, d)
        d_x = xp.zeros_like(X)
        for k in range(contextLength):
            # column k of step t read step t + offset: its gradient goes back there
            d_x = d_x + _shifted(d_columns[:, :, k], -(contextStart + k), xp)
        return xp.where(mask, d_x, 0).astype(X.dtype), d_filter.astype(Filter.dtype), None, None


def _columns(X, length: int, start: int, xp):
    """[N, T, length * D]: the context window of every step, zeros outside the row."""
    return xp.concatenate([_shifted(X, start + k, xp) for k in range(length)], axis=2)


@register_op
class sequence_softmax:
    """Out[n, :Length[n]] = softmax over time of X[n, :Length[n]] (for each trailing index);
    X is [N, T] or [N, T, ...] float, its padding gives 0 (as do rows of length 0)."""

    inputs, outputs = ("X", "Length?"), ("Out",)
    no_grad_inputs = ("Length",)
    grad_no_need_buffer = ("X",)

    def infer(X, Length):
        _check_length_info(X, Length, "sequence_softmax")
        _require_float("sequence_softmax", "X", X)
        return VarInfo(X.shape, X.dtype)

    def forward(X, Length, xp):
        mask = step_mask(valid_lengths(Length, X, "sequence_softmax"), X.shape[1], X.ndim)
        lowest = xp.asarray(-np.inf, X.dtype)
        top = xp.where(mask, X, lowest).max(axis=1, keepdims=True) if X.shape[1] else 0
        top = xp.where(xp.isfinite(top), top, 0)
        exps = xp.where(mask, xp.exp(X - top), 0)
        total = exps.sum(axis=1, keepdims=True)
        return (exps / xp.where(total > 0, total, 1)).astype(X.dtype)

    def backward(X, Length, Out, Out_grad, xp):
        inner = (Out_grad * Out).sum(axis=1, keepdims=True)
        return ((Out_grad - inner) * Out).astype(X.dtype), None


@register_op
class sequence_expand:
    """Out[n, t] = X[n] for the steps t < Length[n] of Y's rows (0 in the padding): one row of
    X per sequence of Y, repeated along Y's time. X is [N, ...], Y a padded [N, T, ...] (read
    for its time length only), Out [N, T, ...X's]. Fluid's X with its own LoD (a sequence
    repeated per sequence of Y) has no padded form; ref_level must be -1 or 0."""

    inputs, outputs = ("X", "Y", "Length?"), ("Out",)
    attrs = {"ref_level": -1}
    no_grad_inputs = ("Y", "Length")
    grad_no_need_buffer = ("X", "Y", "Out")

    def infer(X, Y, Length, ref_level):
        if ref_level not in (-1, 0):
            raise AttrError(
                f"sequence_expand: ref_level must be -1 or 0 (a padded Y has one level of "
                f"sequences), got {ref_level}"
            )
        _check_length_info(Y, Length, "sequence_expand")
        if X.ndim < 1 or -1 not in (X.shape[0], Y.shape[0]) and X.shape[0] != Y.shape[0]:
            raise ShapeError(
                f"sequence_expand: X {list(X.shape)} must have one row per sequence of Y "
                f"{list(Y.shape)}"
            )
        return VarInfo((X.shape[0], Y.shape[1], *X.shape[1:]), X.dtype)

    def forward(X, Y, Length, ref_level, xp):
        if X.shape[0] != Y.shape[0]:
            raise ShapeError(
                f"sequence_expand: X {list(X.shape)} has {X.shape[0]} rows but Y "
                f"{list(Y.shape)} has {Y.shape[0]} sequences"
            )
        steps = Y.shape[1]
        mask = step_mask(valid_lengths(Length, Y, "sequence_expand"), steps, X.ndim + 1)
        out = xp.broadcast_to(X[:, None], (X.shape[0], steps, *X.shape[1:]))
        return xp.where(mask, out, xp.zeros((), X.dtype))

    def backward(X, Y, Length, Out, Out_grad, ref_level, xp):
        mask = step_mask(valid_lengths(Length, Y, "sequence_expand"), Y.shape[1], Out_grad.ndim)
        return xp.where(mask, Out_grad, 0).sum(axis=1).astype(X.dtype), None, None
