"""Indexing and shape ops: where, arg_max/arg_min, top_k, gather, gather_nd, scatter, one_hot,
pad, expand, squeeze/unsqueeze, stack/unstack, cumsum, range, shape,
fill_constant_batch_size_like and strided_slice.

Slot names, attrs and defaults follow PaddlePaddle Fluid 1.8's operators of the same names.
An index outside its tensor (gather, gather_nd, scatter, one_hot) is an ExecutionError at run
time naming the offending value and its position in the index tensor.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from nestflow.core.device_context import array_module
from nestflow.core.dtype import dtype_name
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from nestflow.ops.math import unbroadcast
from nestflow.ops.registry import Required, VarInfo, broadcast_shapes, fail, register_op
from nestflow.ops.tensor import decreased_shape

_INDEX_DTYPES = ("int32", "int64")


def _require_index(info: VarInfo, slot: str) -> None:
    if info.dtype not in _INDEX_DTYPES:
        raise DTypeError(f"{slot} must be int32 or int64, got {info.dtype}")


def _normalized_axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        fail(f"axis {axis} is out of range for {what} of rank {ndim}")
    return axis % ndim


def check_index_range(index: np.ndarray, high, what: str, device=None) -> None:
    """ExecutionError unless every value of `index` lies in [0, high) (`high` broadcasts
    against index): names the first offending value, its position and how many are bad.
    Given a `device` that defers checks, the flag stays there until the run's end
    (DeviceContext.check); else it is read at once (a device wraps bad indexes around where
    they must raise)."""
    bad = (index < 0) | (index >= high)
    if device is not None and device.defers_checks:
        device.check(bad.any(), lambda: _index_range_error(index, high, what))
        return
    if bool(bad.any()):
        raise ExecutionError(_index_range_error(index, high, what))


def _index_range_error(index, high, what: str) -> str:
    # the mask again: the run's temporaries may be gone, or rewritten by a CUDA graph's replay
    xp = array_module(index)
    positions = xp.argwhere((index < 0) | (index >= high)).tolist()
    first = tuple(positions[0])
    limit = int(xp.broadcast_to(high, index.shape)[first]) if hasattr(high, "shape") else high
    return (
        f"{what}: index {int(index[first])} at position {list(first)} is out of range "
        f"[0, {limit}) ({len(positions)} of {index.size} indexes are out of range; "
        f"index shape {list(index.shape)})"
    )


# ---- selection: where ----


@register_op
class where:
    """Out = X where Condition holds, else Y (elementwise; Condition bool). Fluid 1.8 needs
    equal shapes; here the three broadcast (NumPy rules) and gradients are summed back."""

    inputs, outputs = ("Condition", "X", "Y"), ("Out",)
    no_grad_inputs = ("Condition",)

    def infer(Condition, X, Y):
        if Condition.dtype != "bool":
            raise DTypeError(f"Condition must be bool, got {Condition.dtype}")
        if X.dtype != Y.dtype:
            raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
        shape = broadcast_shapes(X.shape, Y.shape)
        return VarInfo(broadcast_shapes(Condition.shape, shape, "Condition and X/Y"), X.dtype)

    def specialize(Condition, X, Y, xp):
        return xp.where  # already returns an array of X's dtype, 0-d included

    def forward(Condition, X, Y, xp):
        return xp.where(Condition, X, Y)

    def backward(Condition, X, Y, Out, Out_grad, xp, needs=(True, True)):
        zero = xp.zeros((), Out_grad.dtype)
        dx = unbroadcast(xp.where(Condition, Out_grad, zero), X.shape) if needs[0] else None
        dy = unbroadcast(xp.where(Condition, zero, Out_grad), Y.shape) if needs[1] else None
        return dx, dy


@register_op
class where_index:
    """Out = the coordinates of Condition's true elements, int64 [count, rank], in row-major
    order (Fluid 1.8's `layers.where(condition)`)."""

    inputs, outputs = ("Condition",), ("Out",)

    def infer(Condition):
        return VarInfo((-1, Condition.ndim), "int64")

    def forward(Condition, xp):
        return xp.argwhere(Condition).astype(np.int64)


# ---- arg_max / arg_min / top_k ----


def _infer_arg(X: VarInfo, axis: int, keepdims: bool, dtype: str, flatten: bool) -> VarInfo:
    if dtype not in _INDEX_DTYPES:
        raise AttrError(f"dtype must be int32 or int64, got {dtype}")
    if flatten:
        if X.ndim and all(d >= 0 for d in X.shape) and not math.prod(X.shape):
            fail(f"X {list(X.shape)} is empty: it has no extreme element")
        return VarInfo((1,), dtype)
    if X.ndim == 0:
        fail("X is 0-d: give it a dim (or use flatten=True)")
    ax = _normalized_axis(axis, X.ndim, f"X {list(X.shape)}")
    if X.shape[ax] == 0:
        fail(f"dim {ax} of X {list(X.shape)} is empty: it has no extreme element")
    kept = (1,) if keepdims else ()
    return VarInfo(X.shape[:ax] + kept + X.shape[ax + 1 :], dtype)


def _arg(xp, find, X, axis, keepdims, dtype, flatten):
    if flatten:
        X, axis, keepdims = X.reshape(-1), 0, True
    if X.shape[axis] == 0:
        raise ShapeError(f"dim {axis} of X {list(X.shape)} is empty: it has no extreme element")
    return xp.asarray(find(X, axis=axis, keepdims=keepdims)).astype(dtype, copy=False)


_ARG_ATTRS = {"axis": Required(int), "keepdims": False, "dtype": "int64", "flatten": False}


@register_op
class arg_max:
    """Out = the index of the largest element of X along `axis` (the first of equal ones; NaN
    counts as largest). `flatten` searches all of X and gives shape [1]."""

    inputs, outputs = ("X",), ("Out",)
    attrs = _ARG_ATTRS
    infer = _infer_arg

    def forward(X, axis, keepdims, dtype, flatten, xp):
        return _arg(xp, xp.argmax, X, axis, keepdims, dtype, flatten)


@register_op
class arg_min:
    """Out = the index of the smallest element of X along `axis` (the first of equal ones; NaN
    counts as smallest)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = _ARG_ATTRS
    infer = _infer_arg

    def forward(X, axis, keepdims, dtype, flatten, xp):
        return _arg(xp, xp.argmin, X, axis, keepdims, dtype, flatten)


def _descending_order(xp, X: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest along the last axis, largest first; equal values keep their
    order (the smaller index first) and NaN ranks above every number, as torch.topk does."""
    n = X.shape[-1]
    # The partitioned path decides on the host whether it may be used; a device sorts fully
    # rather than wait for that read.
    if xp is np and 0 < k <= n // 4:
        picked = _partitioned_order(X, k)
        if picked is not None:
            return picked
    # A stable ascending sort of the reversed row, read backwards, is a descending sort whose
    # ties come out in increasing index order; it works for every dtype (bool, unsigned).
    ascending = xp.argsort(X[..., ::-1], axis=-1, kind="stable")
    return (n - 1) - ascending[..., ::-1][..., :k]


def _partitioned_order(X: np.ndarray, k: int) -> np.ndarray | None:
    """_descending_order for k much smaller than the row, by argpartition (linear, not a full
    sort: 25x faster on [40, 10000], k=4); None when values equal to the k-th largest lie on
    both sides of the cut, where only the full sort says which (smaller) indexes win."""
    n = X.shape[-1]
    # Candidates by decreasing index, so that the stable sort below, reversed, puts equal
    # values in increasing index order.
    picked = np.sort(np.argpartition(X, n - k, axis=-1)[..., n - k :], axis=-1)[..., ::-1]
    values = np.take_along_axis(X, picked, axis=-1)
    order = np.argsort(values, axis=-1, kind="stable")
    cut = np.take_along_axis(values, order[..., :1], axis=-1)  # the k-th largest (NaN last)

    def at_cut(a: np.ndarray) -> np.ndarray:
        same = a == cut
        return same | (np.isnan(a) & np.isnan(cut)) if a.dtype.kind in "fc" else same

    if (at_cut(X).sum(axis=-1) != at_cut(values).sum(axis=-1)).any():
        return None
    return np.take_along_axis(picked, order[..., ::-1], axis=-1)


@register_op
class top_k:
    """Out, Indices = the k largest values of X along its last axis, largest first, and their
    int64 positions. K (a 1-element tensor), when given, overrides the attr `k`."""

    inputs, outputs = ("X", "K?"), ("Out", "Indices")
    attrs = {"k": 1}
    no_grad_inputs = ("K",)

    def infer(X, K, k):
        if X.ndim == 0:
            fail("X is 0-d: top_k works along the last axis")
        if K is not None:
            last = -1
        else:
            if k < 0:
                raise AttrError(f"k must be >= 0, got {k}")
            if 0 <= X.shape[-1] < k:
                fail(f"k={k} is larger than the last dim of X {list(X.shape)}")
            last = k
        shape = X.shape[:-1] + (last,)
        return VarInfo(shape, X.dtype), VarInfo(shape, "int64")

    def forward(X, K, k, xp):
        if K is not None:
            k = int(K.reshape(-1)[0])  # a host read the op needs: k is Out's last dim
        if not 0 <= k <= X.shape[-1]:
            raise ShapeError(f"k={k} is outside [0, {X.shape[-1]}], the last dim of X")
        indices = _descending_order(xp, X, k)
        return xp.take_along_axis(X, indices, axis=-1), indices.astype(np.int64, copy=False)

    def backward(X, K, Out, Indices, Out_grad, Indices_grad, k, xp):
        grad = xp.zeros(X.shape, Out_grad.dtype)
        xp.put_along_axis(grad, Indices, Out_grad, axis=-1)
        return (grad,)


# ---- gather / gather_nd / scatter ----


def _row_ids(info: VarInfo, slot: str) -> None:
    _require_index(info, slot)
    if not (info.ndim == 1 or (info.ndim == 2 and info.shape[1] in (1, -1))):
        fail(f"{slot} must be [N] or [N, 1], got {list(info.shape)}")


def _ids_vector(ids: np.ndarray, slot: str) -> np.ndarray:
    """Ids [N] or [N, 1] as a vector; ShapeError for a column count other than 1 that the
    build could not see (a -1 dim)."""
    if ids.ndim == 2 and ids.shape[1] != 1:
        raise ShapeError(f"{slot} {list(ids.shape)} must be [N] or [N, 1]")
    return ids.reshape(-1)


def _last_occurrences(ids: np.ndarray) -> np.ndarray:
    """Positions in `ids` of the last occurrence of each distinct value."""
    _, first_from_end = array_module(ids).unique(ids[::-1], return_index=True)
    return ids.size - 1 - first_from_end


@register_op
class gather:
    """Out = the rows of X picked by Index ([N] or [N, 1], int32/int64): Out[i] = X[Index[i]].

    The gradient adds every pick's gradient into its row when `overwrite` is False. With
    `overwrite` True (Fluid's default) a row picked several times gets only the gradient of
    its last pick, as Fluid's overwrite mode does; give unique indexes or overwrite=False for
    the true gradient.
    """

    inputs, outputs = ("X", "Index"), ("Out",)
    grad_no_need_buffer = ("X", "Out")
    attrs = {"overwrite": True}
    no_grad_inputs = ("Index",)

    def infer(X, Index, overwrite):
        _row_ids(Index, "Index")
        if X.ndim == 0:
            fail("X is 0-d: gather picks rows of dim 0")
        return VarInfo(Index.shape[:1] + X.shape[1:], X.dtype)

    def forward(X, Index, overwrite, device):
        ids = _ids_vector(Index, "Index")
        check_index_range(ids, X.shape[0], f"gather from X {list(X.shape)}", device)
        return X[ids]

    def backward(X, Index, Out, Out_grad, overwrite, xp, device):
        ids = _ids_vector(Index, "Index")
        grad = xp.zeros(X.shape, Out_grad.dtype)
        if overwrite:
            last = _last_occurrences(ids)
            grad[ids[last]] = Out_grad[last]
        else:
            device.scatter_add(grad, ids, Out_grad)
        return (grad,)


def _nd_coordinates(X: np.ndarray, Index: np.ndarray) -> tuple[np.ndarray, ...]:
    depth = Index.shape[-1]
    bound = array_module(Index).asarray(X.shape[:depth])
    check_index_range(Index, bound, f"gather_nd from X {list(X.shape)}")
    return tuple(Index[..., j] for j in builtins.range(depth))


@register_op
class gather_nd:
    """Out = X at the coordinates in Index's last dim: Index [..., k] (k <= rank of X, int32 or
    int64) gives Out of shape Index.shape[:-1] + X.shape[k:]. Repeated coordinates add their
    gradients."""

    inputs, outputs = ("X", "Index"), ("Out",)
    no_grad_inputs = ("Index",)

    def infer(X, Index):
        _require_index(Index, "Index")
        if Index.ndim == 0:
            fail("Index is 0-d: it needs a last dim holding coordinates")
        depth = Index.shape[-1]
        if depth < 0:
            fail(f"the last dim of Index {list(Index.shape)} must be known")
        if depth > X.ndim:
            fail(
                f"Index {list(Index.shape)} has {depth} coordinates but X {list(X.shape)} "
                f"has rank {X.ndim}"
            )
        return VarInfo(Index.shape[:-1] + X.shape[depth:], X.dtype)

    def forward(X, Index, xp):
        if Index.shape[-1] == 0:
            return xp.broadcast_to(X, Index.shape[:-1] + X.shape).copy()
        return X[_nd_coordinates(X, Index)]

    def backward(X, Index, Out, Out_grad, xp, device):
        if Index.shape[-1] == 0:
            return (Out_grad.reshape((-1,) + X.shape).sum(axis=0),)
        grad = xp.zeros(X.shape, Out_grad.dtype)
        device.scatter_add(grad, _nd_coordinates(X, Index), Out_grad)
        return (grad,)


@register_op
class scatter:
    """Out = X with rows Ids ([N] or [N, 1]) replaced by the rows of Updates [N, ...X.shape[1:]].

    `overwrite` True: a row named several times takes the last update. False: the named rows
    are zeroed, then every update is added in (repeats accumulate). X's gradient is zero on
    the replaced rows; an update overwritten by a later one gets no gradient (Fluid gives it
    the row's gradient all the same).
    """

    inputs, outputs = ("X", "Ids", "Updates"), ("Out",)
    attrs = {"overwrite": True}
    no_grad_inputs = ("Ids",)

    def infer(X, Ids, Updates, overwrite):
        _row_ids(Ids, "Ids")
        if X.dtype != Updates.dtype:
            raise DTypeError(f"X is {X.dtype} but Updates is {Updates.dtype}")
        if X.ndim == 0:
            fail("X is 0-d: scatter replaces rows of dim 0")
        want = Ids.shape[:1] + X.shape[1:]
        if Updates.ndim != len(want) or any(
            a != b and -1 not in (a, b) for a, b in zip(Updates.shape, want)
        ):
            fail(
                f"Updates {list(Updates.shape)} must be {list(want)} (one row of X "
                f"{list(X.shape)} per id of Ids {list(Ids.shape)})"
            )
        return X

    def forward(X, Ids, Updates, overwrite, device):
        ids = _ids_vector(Ids, "Ids")
        check_index_range(ids, X.shape[0], f"scatter into X {list(X.shape)}")
        if Updates.shape[0] != ids.size:
            raise ShapeError(f"Updates {list(Updates.shape)} has not one row per id ({ids.size})")
        out = X.copy()
        if overwrite:
            last = _last_occurrences(ids)
            out[ids[last]] = Updates[last]
        else:
            out[ids] = 0
            device.scatter_add(out, ids, Updates)
        return out

    def backward(X, Ids, Updates, Out, Out_grad, overwrite, xp):
        ids = _ids_vector(Ids, "Ids")
        dx = Out_grad.copy()
        dx[ids] = 0
        if overwrite:
            du = xp.zeros(Updates.shape, Out_grad.dtype)
            last = _last_occurrences(ids)
            du[last] = Out_grad[ids[last]]
        else:
            du = Out_grad[ids]
        return dx, du


# ---- one_hot ----


def _one_hot(ids: np.ndarray, depth: int, dtype: str, allow_out_of_range: bool) -> np.ndarray:
    if not allow_out_of_range:
        check_index_range(ids, depth, f"one_hot of depth {depth}")
    xp = array_module(ids)
    out = xp.zeros(ids.shape + (depth,), dtype)
    inside = (ids >= 0) & (ids < depth)
    # Out-of-range ids (allowed) leave their row all zeros.
    xp.put_along_axis(out, xp.where(inside, ids, 0)[..., None], inside[..., None], axis=-1)
    return out


def _one_hot_depth(depth: int, depth_tensor) -> int:
    if depth_tensor is not None:
        return int(depth_tensor.reshape(-1)[0])  # a host read the op needs: Out's last dim
    return depth


def _check_one_hot(X: VarInfo, depth: int, depth_tensor) -> int:
    _require_index(X, "X")
    if depth_tensor is not None:
        return -1
    if depth < 1:
        raise AttrError(f"depth must be >= 1 (or given by depth_tensor), got {depth}")
    return depth


_ONE_HOT_ATTRS = {"depth": -1, "dtype": "float32", "allow_out_of_range": False}


@register_op
class one_hot:
    """Out = one-hot rows of `depth` for int ids X [..., 1] (Fluid 1.8's `one_hot`): shape
    X.shape[:-1] + [depth]. Ids outside [0, depth) are an ExecutionError, or all-zero rows
    with `allow_out_of_range`."""

    inputs, outputs = ("X", "depth_tensor?"), ("Out",)
    attrs = _ONE_HOT_ATTRS

    def infer(X, depth_tensor, depth, dtype, allow_out_of_range):
        size = _check_one_hot(X, depth, depth_tensor)
        if X.ndim == 0 or X.shape[-1] not in (1, -1):
            fail(f"X {list(X.shape)} must end in a dim of 1 (one_hot_v2 takes ids of any shape)")
        return VarInfo(X.shape[:-1] + (size,), dtype_name(dtype))

    def forward(X, depth_tensor, depth, dtype, allow_out_of_range):
        size = _one_hot_depth(depth, depth_tensor)
        return _one_hot(X.reshape(X.shape[:-1]), size, dtype, allow_out_of_range)


@register_op
class one_hot_v2:
    """Out = one-hot rows of `depth` for int ids X of any shape: shape X.shape + [depth]."""

    inputs, outputs = ("X", "depth_tensor?"), ("Out",)
    attrs = _ONE_HOT_ATTRS

    def infer(X, depth_tensor, depth, dtype, allow_out_of_range):
        size = _check_one_hot(X, depth, depth_tensor)
        return VarInfo(X.shape + (size,), dtype_name(dtype))

    def forward(X, depth_tensor, depth, dtype, allow_out_of_range):
        return _one_hot(X, _one_hot_depth(depth, depth_tensor), dtype, allow_out_of_range)


# ---- pad / expand ----


def _pad_pairs(ndim: int, paddings: list[int]) -> list[tuple[int, int]]:
    if len(paddings) != 2 * ndim:
        raise AttrError(f"paddings {paddings} must hold 2 numbers per dim of X (rank {ndim})")
    if any(p < 0 for p in paddings):
        raise AttrError(f"paddings {paddings} must be >= 0")
    return [(paddings[2 * i], paddings[2 * i + 1]) for i in builtins.range(ndim)]


@register_op
class pad:
    """Out = X with paddings[2i] values before and paddings[2i+1] after dim i, all pad_value."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"paddings": Required(list), "pad_value": 0.0}

    def infer(X, paddings, pad_value):
        pairs = _pad_pairs(X.ndim, paddings)
        return VarInfo(
            tuple(-1 if d < 0 else d + a + b for d, (a, b) in zip(X.shape, pairs)), X.dtype
        )

    def forward(X, paddings, pad_value, xp):
        return xp.pad(X, _pad_pairs(X.ndim, paddings), constant_values=pad_value)

    def backward(X, Out, Out_grad, paddings, pad_value):
        pairs = _pad_pairs(X.ndim, paddings)
        return (Out_grad[tuple(builtins.slice(a, a + d) for (a, _), d in zip(pairs, X.shape))],)


def _check_expand(ndim: int, expand_times: list[int]) -> None:
    if len(expand_times) != ndim:
        raise AttrError(
            f"expand_times {expand_times} must hold one number per dim of X (rank {ndim})"
        )
    if any(t < 1 for t in expand_times):
        raise AttrError(f"expand_times {expand_times} must be >= 1")


@register_op
class expand:
    """Out = X tiled expand_times[i] times along each dim i (np.tile)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X", "Out")
    attrs = {"expand_times": []}

    def infer(X, expand_times):
        _check_expand(X.ndim, expand_times)
        return VarInfo(
            tuple(-1 if d < 0 else d * t for d, t in zip(X.shape, expand_times)), X.dtype
        )

    def forward(X, expand_times, xp):
        _check_expand(X.ndim, expand_times)
        return xp.tile(X, expand_times)

    def backward(X, Out, Out_grad, expand_times, xp):
        # Out viewed as [t0, d0, t1, d1, ...]: the copies lie along the t axes.
        split = [n for pair in zip(expand_times, X.shape) for n in pair]
        tiles = tuple(builtins.range(0, 2 * X.ndim, 2))
        return (xp.asarray(Out_grad.reshape(split).sum(axis=tiles)),)


# ---- squeeze / unsqueeze ----


def squeezed_shape(shape: tuple[int, ...], axes: list[int]) -> tuple[int, ...]:
    """Fluid 1.8's rule: no axes squeezes every dim of 1; a listed dim is squeezed when it is 1
    (or unknown, at build time) and kept otherwise."""
    ndim = len(shape)
    if not axes:
        drop = {i for i, d in enumerate(shape) if d == 1}
    else:
        drop = {_normalized_axis(a, ndim, f"X {list(shape)}") for a in axes}
        drop = {i for i in drop if shape[i] in (1, -1)}
    return tuple(d for i, d in enumerate(shape) if i not in drop)


def unsqueezed_shape(shape: tuple[int, ...], axes: list[int]) -> tuple[int, ...]:
    """A dim of 1 inserted at each axis in turn; a negative axis counts from the end of the
    shape as it is at that point (-1 appends)."""
    out = list(shape)
    for axis in axes:
        at = axis + len(out) + 1 if axis < 0 else axis
        if not 0 <= at <= len(out):
            fail(
                f"axis {axis} is out of range for a dim inserted into rank {len(out)} "
                f"(axes {axes}, X {list(shape)})"
            )
        out.insert(at, 1)
    return tuple(out)


def _x_shape(X: VarInfo) -> VarInfo:
    """XShape: X's shape behind a leading 0, holding no data (what the gradient reads)."""
    return VarInfo((0,) + X.shape, X.dtype)


def _run_squeeze(X: np.ndarray, axes: list[int]) -> np.ndarray:
    return X.reshape(squeezed_shape(X.shape, axes))


def _reshaped_back(X, Out, Out_grad, axes):
    """The gradient of a reshaping op: Out's gradient in X's shape."""
    return (Out_grad.reshape(X.shape),)


def _reshaped_back_past_xshape(X, Out, XShape, Out_grad, XShape_grad, axes):
    return (Out_grad.reshape(X.shape),)


@register_op
class squeeze2:
    """Out = X without the dims of size 1 named in `axes` (all dims of 1 when `axes` is
    empty); a named dim of another size is kept (Fluid 1.8). XShape records X's shape."""

    inputs, outputs = ("X",), ("Out", "XShape?")
    attrs = {"axes": []}

    def infer(X, axes):
        return VarInfo(squeezed_shape(X.shape, axes), X.dtype), _x_shape(X)

    def forward(X, axes, xp):
        return _run_squeeze(X, axes), xp.empty((0,) + X.shape, X.dtype)

    backward = _reshaped_back_past_xshape


@register_op
class squeeze:
    """Out = X without the dims of size 1 named in `axes` (Fluid's first squeeze op)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"axes": []}

    def infer(X, axes):
        return VarInfo(squeezed_shape(X.shape, axes), X.dtype)

    def forward(X, axes):
        return _run_squeeze(X, axes)

    backward = _reshaped_back


@register_op
class unsqueeze2:
    """Out = X with a dim of 1 inserted at each of `axes` in turn. XShape records X's shape."""

    inputs, outputs = ("X",), ("Out", "XShape?")
    attrs = {"axes": []}

    def infer(X, axes):
        return VarInfo(unsqueezed_shape(X.shape, axes), X.dtype), _x_shape(X)

    def forward(X, axes, xp):
        return X.reshape(unsqueezed_shape(X.shape, axes)), xp.empty((0,) + X.shape, X.dtype)

    backward = _reshaped_back_past_xshape


@register_op
class unsqueeze:
    """Out = X with a dim of 1 inserted at each of `axes` (Fluid's first unsqueeze op)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"axes": []}

    def infer(X, axes):
        return VarInfo(unsqueezed_shape(X.shape, axes), X.dtype)

    def forward(X, axes):
        return X.reshape(unsqueezed_shape(X.shape, axes))

    backward = _reshaped_back


# ---- stack / unstack ----


@register_op
class stack:
    """Y = the X tensors (all of one shape and dtype) stacked along a new dim `axis`."""

    inputs, outputs = ("X*",), ("Y",)
    attrs = {"axis": 0}

    def infer(X, axis):
        if not X:
            fail("stack needs at least one input")
        first = X[0]
        shape = list(first.shape)
        for i, x in enumerate(X[1:], 1):
            if x.dtype != first.dtype:
                raise DTypeError(f"X[{i}] is {x.dtype} but X[0] is {first.dtype}")
            if x.ndim != first.ndim or any(
                a != b and -1 not in (a, b) for a, b in zip(x.shape, shape)
            ):
                fail(f"X[{i}] {list(x.shape)} and X[0] {list(first.shape)} differ in shape")
            shape = [b if a == -1 else a for a, b in zip(shape, x.shape)]
        at = _normalized_axis(axis, first.ndim + 1, f"the stacked result of X[0] {shape}")
        return VarInfo(tuple(shape[:at]) + (len(X),) + tuple(shape[at:]), first.dtype)

    def forward(X, axis, xp):
        return xp.stack(X, axis=axis)

    def backward(X, Y, Y_grad, axis, xp):
        return (list(xp.moveaxis(Y_grad, axis, 0)),)


@register_op
class unstack:
    """Y = the `num` slices of X along `axis` (num must equal that dim), each without it."""

    inputs, outputs = ("X",), ("Y*",)
    attrs = {"axis": 0, "num": Required(int)}

    def infer(X, axis, num):
        ax = _normalized_axis(axis, X.ndim, f"X {list(X.shape)}")
        if num < 0 or X.shape[ax] not in (num, -1):
            fail(f"num={num} differs from dim {ax} of X {list(X.shape)}")
        return [VarInfo(X.shape[:ax] + X.shape[ax + 1 :], X.dtype)] * num

    def forward(X, axis, num, xp):
        if X.shape[axis] != num:
            raise ShapeError(f"num={num} differs from dim {axis} of X {list(X.shape)}")
        return [part.copy() for part in xp.moveaxis(X, axis, 0)]

    def backward(X, Y, Y_grad, axis, num, xp):
        parts = Y_grad or []
        grads = [xp.zeros(y.shape, X.dtype) if g is None else g for y, g in zip(Y, parts)]
        grads += [xp.zeros(y.shape, X.dtype) for y in Y[len(grads) :]]
        return (xp.stack(grads, axis=axis) if grads else xp.zeros(X.shape, X.dtype),)


# ---- cumsum ----


def _cumsum(X: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    xp = array_module(X)
    x = xp.flip(X, axis) if reverse else X
    out = xp.cumsum(x, axis=axis, dtype=X.dtype)
    if exclusive:
        # Each position holds the sum of the elements before it: shift by one, 0 first.
        shifted = xp.zeros_like(out)
        head = [builtins.slice(None)] * out.ndim
        tail = [builtins.slice(None)] * out.ndim
        head[axis], tail[axis] = builtins.slice(1, None), builtins.slice(None, -1)
        shifted[tuple(head)] = out[tuple(tail)]
        out = shifted
    return xp.flip(out, axis) if reverse else out


@register_op
class cumsum:
    """Out = running sums of X along `axis` (`flatten`: over all of X, as a 1-D result);
    `exclusive` leaves each element out of its own sum; `reverse` sums from the end."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"axis": -1, "flatten": False, "exclusive": False, "reverse": False}

    def infer(X, axis, flatten, exclusive, reverse):
        if X.dtype == "bool":
            raise DTypeError("X is bool; cast it to a number type first")
        if flatten:
            size = -1 if any(d < 0 for d in X.shape) else math.prod(X.shape)
            return VarInfo((size,), X.dtype)
        _normalized_axis(axis, X.ndim, f"X {list(X.shape)}")
        return X

    def forward(X, axis, flatten, exclusive, reverse):
        if flatten:
            return _cumsum(X.reshape(-1), 0, exclusive, reverse)
        return _cumsum(X, axis % X.ndim, exclusive, reverse)

    def backward(X, Out, Out_grad, axis, flatten, exclusive, reverse):
        # Each input feeds the sums after it (before it when reversed): sum the other way.
        ax = 0 if flatten else axis % X.ndim
        return (_cumsum(Out_grad, ax, exclusive, not reverse).reshape(X.shape),)


# ---- range / shape / fill_constant_batch_size_like ----


@register_op
class range:
    """Out = [Start, Start + Step, ...] up to (not including) End; Start, End and Step are
    1-element tensors of one dtype, which Out takes. Step 0 is an ExecutionError; a Step
    pointing away from End gives an empty Out (NumPy's arange)."""

    inputs, outputs = ("Start", "End", "Step"), ("Out",)

    def infer(Start, End, Step):
        for slot, info in (("Start", Start), ("End", End), ("Step", Step)):
            if info.dtype != Start.dtype:
                raise DTypeError(f"{slot} is {info.dtype} but Start is {Start.dtype}")
            if all(d >= 0 for d in info.shape) and math.prod(info.shape) != 1:
                fail(f"{slot} {list(info.shape)} must hold one number")
        return VarInfo((-1,), Start.dtype)

    def forward(Start, End, Step, xp):
        # A host read the op needs: the three values give Out's length.
        start, end, step = (v.reshape(-1)[0].item() for v in (Start, End, Step))
        if step == 0:
            raise ExecutionError(f"Step is 0 (Start {start}, End {end}): the range never ends")
        return xp.arange(start, end, step, dtype=Start.dtype)


@register_op
class shape:
    """Out = the shape of Input as an int32 vector [rank]."""

    inputs, outputs = ("Input",), ("Out",)

    def infer(Input):
        return VarInfo((Input.ndim,), "int32")

    def forward(Input, xp):
        return xp.asarray(Input.shape, np.int32)


def _batch_like_shape(in_shape, shape, input_dim_idx, output_dim_idx) -> list[int]:
    if not 0 <= input_dim_idx < len(in_shape):
        raise AttrError(f"input_dim_idx {input_dim_idx} is outside Input {list(in_shape)}")
    if not 0 <= output_dim_idx < len(shape):
        raise AttrError(f"output_dim_idx {output_dim_idx} is outside shape {shape}")
    out = list(shape)
    out[output_dim_idx] = in_shape[input_dim_idx]
    return out


@register_op
class fill_constant_batch_size_like:
    """Out = `value` in `shape`, whose dim output_dim_idx is taken from Input's dim
    input_dim_idx (a batch size known only at run time). `force_cpu` is accepted and
    ignored (every tensor lives on the CPU here); `str_value`, when set, overrides `value`."""

    inputs, outputs = ("Input",), ("Out",)
    attrs = {
        "shape": Required(list),
        "dtype": "float32",
        "value": 0.0,
        "str_value": "",
        "input_dim_idx": 0,
        "output_dim_idx": 0,
        "force_cpu": False,
    }
    # a fill takes no gradient from Input, whose values it never reads

    def infer(Input, shape, dtype, value, str_value, input_dim_idx, output_dim_idx, force_cpu):
        out = _batch_like_shape(Input.shape, shape, input_dim_idx, output_dim_idx)
        rest = [d for i, d in enumerate(out) if i != output_dim_idx]
        if any(d < 0 for d in rest):
            fail(f"shape {shape} must be known apart from dim {output_dim_idx}")
        if str_value:
            _str_value(str_value)
        return VarInfo(tuple(out), dtype)

    def forward(
        Input, shape, dtype, value, str_value, input_dim_idx, output_dim_idx, force_cpu, xp
    ):
        out = _batch_like_shape(Input.shape, shape, input_dim_idx, output_dim_idx)
        return xp.full(out, _str_value(str_value) if str_value else value, dtype=dtype)


def _str_value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise AttrError(f"str_value {text!r} is not a number") from None


# ---- strided_slice ----


def _strided_index(shape, axes, starts, ends, strides, what: str) -> list[builtins.slice]:
    """Per-dim Python slices. Fluid's convention is kept: an end of -1 with a negative stride
    runs through index 0 (it stands for Python's omitted stop)."""
    if not len(axes) == len(starts) == len(ends) == len(strides):
        raise AttrError(
            f"axes {axes}, starts {starts}, ends {ends} and strides {strides} differ in length"
        )
    index = [builtins.slice(None)] * len(shape)
    seen = set()
    for axis, start, end, stride in zip(axes, starts, ends, strides):
        ax = _normalized_axis(axis, len(shape), what)
        if ax in seen:
            fail(f"axes {axes} name dim {ax} twice")
        if stride == 0:
            raise AttrError(f"strides {strides} hold a 0")
        seen.add(ax)
        index[ax] = builtins.slice(start, None if (stride < 0 and end == -1) else end, stride)
    return index


def _strided_dim(dim: int, s: builtins.slice) -> int:
    if s == builtins.slice(None):
        return dim
    return -1 if dim < 0 else len(builtins.range(*s.indices(dim)))


@register_op
class strided_slice:
    """Out = Input[starts:ends:strides] along each of `axes` (Python slicing; an end of -1 with
    a negative stride means "through index 0", as in Fluid); then the dims in
    `decrease_axis` (each of size 1) are dropped."""

    inputs, outputs = ("Input",), ("Out",)
    attrs = {
        "axes": Required(list),
        "starts": Required(list),
        "ends": Required(list),
        "strides": Required(list),
        "infer_flags": [],
        "decrease_axis": [],
    }

    def infer(Input, axes, starts, ends, strides, infer_flags, decrease_axis):
        what = f"Input {list(Input.shape)}"
        index = _strided_index(Input.shape, axes, starts, ends, strides, what)
        shape = tuple(_strided_dim(d, s) for d, s in zip(Input.shape, index))
        return VarInfo(decreased_shape(shape, decrease_axis), Input.dtype)

    def forward(Input, axes, starts, ends, strides, infer_flags, decrease_axis):
        index = tuple(_strided_index(Input.shape, axes, starts, ends, strides, "Input"))
        out = Input[index].copy()
        return out.reshape(decreased_shape(out.shape, decrease_axis)) if decrease_axis else out

    def backward(Input, Out, Out_grad, axes, starts, ends, strides, infer_flags, decrease_axis, xp):
        index = tuple(_strided_index(Input.shape, axes, starts, ends, strides, "Input"))
        grad = xp.zeros(Input.shape, Out_grad.dtype)
        grad[index] = Out_grad.reshape(grad[index].shape)
        return (grad,)
