"""Sequence ops over padded batches: sequence_pool, sequence_mask, sequence_reverse.

Fluid 1.x runs these on LoD tensors; nestflow's sequences are padded `[batch, time, ...]`
tensors with an integer `[batch]` lengths tensor (slot "Length", as Fluid's sequence_pad and
sequence_unpad name it): row n holds its sequence in steps `[0, Length[n])`, the rest is
padding that these ops never read (and whose gradient is zero). Without Length every row is
`time` steps long. Attrs and defaults are Fluid 1.8's (sequence_pool's `pooltype` spelled in
capitals, `pad_value` for rows of length 0; sequence_mask's `maxlen`, `out_dtype`).

Lengths outside `[0, time]`, or not one per row, are an ExecutionError at run time naming the
op, the offending row and value (at build time, when the shapes are known: a ShapeError).
"""

from __future__ import annotations

import numpy as np

from nestflow.core.device_context import array_module
from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from nestflow.ops.registry import VarInfo, register_op

_LENGTH_DTYPES = ("int32", "int64")
POOL_TYPES = ("AVERAGE", "SUM", "SQRT", "MAX", "FIRST", "LAST")


def _check_length_info(X: VarInfo, Length: VarInfo | None, op: str) -> None:
    """Build-time checks of a padded X [N, T, ...] and its Length [N]."""
    if X.ndim < 2:
        raise ShapeError(f"{op}: X {list(X.shape)} must be a padded [batch, time, ...] tensor")
    if Length is None:
        return
    if Length.dtype not in _LENGTH_DTYPES:
        raise DTypeError(f"{op}: Length must be int32 or int64, got {Length.dtype}")
    if Length.ndim != 1:
        raise ShapeError(f"{op}: Length {list(Length.shape)} must be [batch] (one length a row)")
    if -1 not in (X.shape[0], Length.shape[0]) and X.shape[0] != Length.shape[0]:
        raise ShapeError(
            f"{op}: Length {list(Length.shape)} has {Length.shape[0]} lengths but X "
            f"{list(X.shape)} has {X.shape[0]} rows"
        )


def valid_lengths(Length: np.ndarray | None, X: np.ndarray, op: str) -> np.ndarray:
    """Length as an int64 [N] array checked against the padded X [N, T, ...] (every row T
    steps when Length is None); ExecutionError naming the first bad row otherwise."""
    batch, steps = X.shape[0], X.shape[1]
    xp = array_module(X)
    if Length is None:
        return xp.full(batch, steps, np.int64)
    lengths = Length
    if lengths.dtype.kind not in "iu":
        raise ExecutionError(f"{op}: Length must hold integers, got {lengths.dtype}")
    if lengths.shape != (batch,):
        raise ExecutionError(
            f"{op}: Length has shape {list(lengths.shape)} but X {list(X.shape)} has {batch} "
            f"rows: give one length per row"
        )
    outside = (lengths < 0) | (lengths > steps)
    # A host read the op needs: a bad length is an error, not a silently clipped row.
    if bool(outside.any()):
        bad = xp.flatnonzero(outside)
        row = int(bad[0])
        raise ExecutionError(
            f"{op}: Length[{row}] = {int(lengths[row])} is outside [0, {steps}] (X "
            f"{list(X.shape)} has {steps} time steps; {bad.size} of {batch} lengths are bad)"
        )
    return lengths.astype(np.int64, copy=False)


def step_mask(lengths: np.ndarray, steps: int, ndim: int) -> np.ndarray:
    """bool [N, T, 1, ...] (rank `ndim`): True at the valid steps of each row."""
    mask = array_module(lengths).arange(steps) < lengths[:, None]
    return mask.reshape(mask.shape + (1,) * (ndim - 2))


def _at_step(X: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """X[n, steps[n]] for every row n (steps clipped into range; callers mask empty rows)."""
    xp = array_module(X)
    index = xp.clip(steps, 0, max(X.shape[1] - 1, 0)).reshape((-1, 1) + (1,) * (X.ndim - 2))
    return xp.take_along_axis(X, index, axis=1)[:, 0]


@register_op
class sequence_pool:
    """Out[n] = the `pooltype` pool of X[n, :Length[n]] over time: SUM, AVERAGE (sum / length),
    SQRT (sum / sqrt(length)), MAX (MaxIndex: the step of the first maximum, int32), FIRST,
    LAST; X is a padded [N, T, ...] float tensor, Out is [N, ...]. A row of length 0 gives
    `pad_value` (and MaxIndex -1)."""

    inputs, outputs = ("X", "Length?"), ("Out", "MaxIndex?")
    grad_no_need_buffer = ("Out",)
    attrs = {"pooltype": "AVERAGE", "is_test": False, "pad_value": 0.0}
    no_grad_inputs = ("Length",)

    def infer(X, Length, pooltype, is_test, pad_value):
        if pooltype not in POOL_TYPES:
            raise AttrError(f"pooltype must be one of {list(POOL_TYPES)}, got {pooltype!r}")
        _check_length_info(X, Length, "sequence_pool")
        if not is_floating(X.dtype):
            raise DTypeError(f"sequence_pool needs a floating-point X, got {X.dtype}")
        shape = (X.shape[0], *X.shape[2:])
        return VarInfo(shape, X.dtype), VarInfo(shape, "int32")

    def forward(X, Length, pooltype, is_test, pad_value, xp):
        lengths = valid_lengths(Length, X, "sequence_pool")
        empty = (lengths == 0).reshape((-1,) + (1,) * (X.ndim - 2))
        index = None
        if pooltype in ("SUM", "AVERAGE", "SQRT"):
            out = xp.where(step_mask(lengths, X.shape[1], X.ndim), X, 0).sum(axis=1)
            if pooltype != "SUM":
                count = xp.maximum(lengths, 1).astype(X.dtype)
                count = count if pooltype == "AVERAGE" else xp.sqrt(count)
                out /= count.reshape(empty.shape)
        elif pooltype == "MAX":
            lowest = xp.asarray(-np.inf, X.dtype)
            masked = xp.where(step_mask(lengths, X.shape[1], X.ndim), X, lowest)
            pooled_shape = (X.shape[0], *X.shape[2:])
            index = masked.argmax(axis=1) if X.shape[1] else xp.zeros(pooled_shape, np.int64)
            if X.shape[1]:
                out = xp.take_along_axis(X, index[:, None], axis=1)[:, 0]
            else:
                out = xp.zeros(index.shape, X.dtype)
            index = xp.where(empty, -1, index).astype(np.int32)
        else:
            out = _at_step(X, lengths - 1 if pooltype == "LAST" else xp.zeros_like(lengths))
        out = xp.where(empty, xp.asarray(pad_value, X.dtype), out).astype(X.dtype, copy=False)
        if index is None:
            index = xp.zeros(out.shape, np.int32)
        return out, index

    def backward(
        X, Length, Out, MaxIndex, Out_grad, MaxIndex_grad, pooltype, is_test, pad_value, xp
    ):
        lengths = valid_lengths(Length, X, "sequence_pool")
        batch, steps = X.shape[:2]
        row = (-1,) + (1,) * (X.ndim - 2)
        grad = xp.where((lengths == 0).reshape(row), xp.zeros((), Out_grad.dtype), Out_grad)
        if pooltype in ("SUM", "AVERAGE", "SQRT"):
            if pooltype != "SUM":
                count = xp.maximum(lengths, 1).astype(X.dtype)
                grad = grad / (count if pooltype == "AVERAGE" else xp.sqrt(count)).reshape(row)
            mask = step_mask(lengths, steps, X.ndim)
            return (xp.where(mask, grad[:, None], xp.zeros((), grad.dtype)).astype(X.dtype),)
        if pooltype == "MAX":
            if MaxIndex is None:  # the op was built without its MaxIndex output
                MaxIndex = sequence_pool.forward(X, Length, pooltype, is_test, pad_value, xp)[1]
            at = xp.maximum(MaxIndex.astype(np.int64), 0)
        else:
            at = xp.maximum(lengths - 1, 0) if pooltype == "LAST" else xp.zeros(batch, np.int64)
            at = xp.broadcast_to(at.reshape(row), grad.shape)
        dx = xp.zeros(X.shape, X.dtype)
        if steps:
            xp.put_along_axis(dx, at[:, None], grad[:, None], axis=1)
        return (dx,)


@register_op
class sequence_mask:
    """Y[..., j] = j < X[...] as `out_dtype`: X holds lengths (int32/int64, any shape), Y has
    X's shape plus a last dim of `maxlen` (MaxLenTensor when given; maxlen < 0: max(X))."""

    inputs, outputs = ("X", "MaxLenTensor?"), ("Y",)
    attrs = {"maxlen": -1, "out_dtype": "int64"}

    def infer(X, MaxLenTensor, maxlen, out_dtype):
        if X.dtype not in _LENGTH_DTYPES:
            raise DTypeError(f"sequence_mask: X (lengths) must be int32 or int64, got {X.dtype}")
        if MaxLenTensor is not None and MaxLenTensor.dtype not in _LENGTH_DTYPES:
            raise DTypeError(f"MaxLenTensor must be int32 or int64, got {MaxLenTensor.dtype}")
        width = -1 if MaxLenTensor is not None or maxlen < 0 else maxlen
        return VarInfo((*X.shape, width), out_dtype)

    def forward(X, MaxLenTensor, maxlen, out_dtype, xp):
        # Host reads the op needs: maxlen (MaxLenTensor's value or X's largest) is Y's last dim.
        if MaxLenTensor is not None:
            size = MaxLenTensor.reshape(-1)
            if size.size != 1:
                raise ExecutionError(
                    f"sequence_mask: MaxLenTensor must hold one value, got {list(size.shape)}"
                )
            maxlen = int(size[0])
            if maxlen < 0:
                raise ExecutionError(f"sequence_mask: MaxLenTensor is {maxlen}, below 0")
        elif maxlen < 0:
            maxlen = int(X.max()) if X.size else 0
        return (xp.arange(maxlen) < X[..., None]).astype(out_dtype)


@register_op
class sequence_reverse:
    """Y[n, :Length[n]] = X[n, :Length[n]] reversed in time; the padding steps stay where they
    are. X is [N, T, ...]; without Length every row is reversed whole."""

    inputs, outputs = ("X", "Length?"), ("Y",)
    grad_no_need_buffer = ("Y",)
    no_grad_inputs = ("Length",)

    def infer(X, Length):
        _check_length_info(X, Length, "sequence_reverse")
        return VarInfo(X.shape, X.dtype)

    def forward(X, Length, xp):
        if Length is None:
            return X[:, ::-1].copy()
        return xp.take_along_axis(X, _reversed_steps(X, Length), axis=1)

    def backward(X, Length, Y, Y_grad, xp):
        # The permutation is its own inverse: the gradient is reversed the same way.
        if Length is None:
            return (Y_grad[:, ::-1].copy(),)
        return (xp.take_along_axis(Y_grad, _reversed_steps(X, Length), axis=1),)


def _reversed_steps(X: np.ndarray, Length: np.ndarray) -> np.ndarray:
    """[N, T, 1, ...] source step of each output step: Length[n] - 1 - t inside a row, t in its
    padding."""
    lengths = valid_lengths(Length, X, "sequence_reverse")
    xp = array_module(X)
    steps = xp.arange(X.shape[1])
    flipped = lengths[:, None] - 1 - steps
    index = xp.where(flipped >= 0, flipped, steps)
    return index.reshape(index.shape + (1,) * (X.ndim - 2))
