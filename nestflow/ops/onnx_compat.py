"""Ops for ONNX semantics that nestflow's Fluid-style ops do not compose, which the ONNX
importer (nestflow.onnx) emits:

- an ONNX operand that Fluid takes as an attribute (a shape, axes, pads, repeats, split
  sizes) but that is only known at run time: onnx_reshape, onnx_constant_of_shape,
  onnx_unsqueeze, onnx_squeeze, onnx_tile, onnx_slice, onnx_split, onnx_pad (also its reflect,
  edge and wrap modes), onnx_reduce, onnx_cumsum;
- ONNX indexing rules (negative indices, element-wise gathers and scatters): onnx_gather,
  onnx_gather_elements, onnx_scatter_elements, onnx_scatter_nd, onnx_one_hot;
- math NumPy has and Fluid 1.x does not: onnx_erf, onnx_log_softmax, onnx_floor/ceil/round,
  trigonometric and hyperbolic functions, onnx_isnan/isinf, onnx_mod, onnx_trilu,
  onnx_cumprod, onnx_einsum, integer bit operations, onnx_resize.

Each op reads its attribute-like tensors (int64 or int32, any shape holding the values) when
it runs, with ONNX's rules: negative axes count from the end, Slice clamps its bounds, Gather
takes negative indices. Names carry the `onnx_` prefix so that they never clash with a Fluid
op of the same name; the importer uses Fluid's ops (reshape, slice, pad, squeeze, ...) when
those values are known at import. Ops with a gradient have it (checked by central differences
in tests/ops/test_onnx_compat.py); integer and selection ops (mod, bit operations, isnan,
scatters, one_hot, cumprod, einsum) have none.

Kernels are written against their place's `xp`. The attribute-like tensors (shapes, axes,
pads, repeats, slice bounds, sizes, scales, a one-hot depth, a trilu K) are read on the host
when the op runs (`_values`, `_floats`): they decide the result's shape, so the op's meaning
needs the read. Index inputs are checked on the host for any index out of range (one read:
CuPy wraps such an index where nestflow raises; `_check_range`). Nothing else is read.
"""

from __future__ import annotations

import builtins
import itertools
import math

import numpy as np

from nestflow.core.device_context import DeviceContext, array_module
from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.ops.activation import erf
from nestflow.ops.indexing import check_index_range
from nestflow.ops.registry import (
    Required,
    VarInfo,
    broadcast_shapes,
    fail,
    get_op_def,
    place_args,
    register_op,
)


def _values(tensor) -> list[int]:
    """The ints an attribute-like tensor holds, read on the host (see the module docstring)."""
    return [] if tensor is None else [int(v) for v in tensor.reshape(-1).tolist()]


def _floats(tensor) -> list[float]:
    """The numbers a small tensor (Resize's Roi or Scales) holds, read on the host."""
    return [float(v) for v in tensor.reshape(-1).tolist()]


def _check_range(index, high, what: str, device: DeviceContext) -> None:
    """check_index_range on any place. CuPy wraps an out-of-range index where nestflow
    raises, so whether any is out is read on the host (a read the op's meaning needs); the
    error is made from a host copy. `high`: an int, or a host array broadcasting to index."""
    limit = high if isinstance(high, int) else device.xp.asarray(high)
    if bool(((index < 0) | (index >= limit)).any()):
        check_index_range(device.to_host(index), high, what)


def _require_ints(info: VarInfo | None, slot: str) -> None:
    if info is not None and np.dtype(info.dtype).kind not in "iu":
        raise DTypeError(f"{slot} must hold integers (int64), got {info.dtype}")


def _length(info: VarInfo, slot: str, needed: bool = True) -> int:
    """How many values the 1-D (or 0-d) tensor `info` holds. When unknown: -1, or (`needed`:
    the rank of the op's result depends on it) a ShapeError."""
    if info.ndim > 1:
        fail(f"{slot} must be a vector, got shape {list(info.shape)}")
    count = info.shape[0] if info.ndim else 1
    if count < 0 and needed:
        fail(
            f"{slot} holds a number of values unknown when the program is built, so the rank "
            f"of the result cannot be resolved"
        )
    return count


def _axes(axes: list[int], ndim: int, what: str) -> list[int]:
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"{what}: axis {a} is out of range for rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: axes {axes} name a dim twice")
    return out


# ---- elementwise: erf, log_softmax ----


@register_op
class onnx_erf:
    """Out = erf(X), the Gauss error function (float X, computed in float64)."""

    inputs, outputs = ("X",), ("Out",)

    def infer(X):
        if not is_floating(X.dtype):
            raise DTypeError(f"onnx_erf needs a floating-point X, got {X.dtype}")
        return X

    def forward(X, xp):
        return erf(X.astype(np.float64), xp).astype(X.dtype)

    def backward(X, Out, Out_grad, xp):
        slope = xp.exp(-xp.square(X.astype(np.float64))) * (2.0 / math.sqrt(math.pi))
        return (xp.asarray(Out_grad * slope).astype(X.dtype),)


@register_op
class onnx_log_softmax:
    """Out = X - log(sum(exp(X))) along `axis` (computed from X - max, never overflowing)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"axis": -1}

    def infer(X, axis):
        if not is_floating(X.dtype):
            raise DTypeError(f"onnx_log_softmax needs a floating-point X, got {X.dtype}")
        if X.ndim and not -X.ndim <= axis < X.ndim:
            fail(f"axis {axis} is out of range for X {list(X.shape)}")
        return X

    def forward(X, axis, xp):
        if not X.size:
            return X.copy()
        shifted = X - X.max(axis=axis, keepdims=True)
        return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))

    def backward(X, Out, Out_grad, axis, xp):
        return (Out_grad - xp.exp(Out) * Out_grad.sum(axis=axis, keepdims=True),)


# ---- shapes from tensors: reshape, constant_of_shape, unsqueeze, squeeze, tile ----


@register_op
class onnx_reshape:
    """Out = X reshaped to the values of Shape: 0 copies X's dim (unless `allowzero`), one -1
    is inferred (ONNX Reshape)."""

    inputs, outputs = ("X", "Shape"), ("Out",)
    attrs = {"allowzero": False}
    no_grad_inputs = ("Shape",)

    def infer(X, Shape, allowzero):
        _require_ints(Shape, "Shape")
        return VarInfo((-1,) * _length(Shape, "Shape"), X.dtype)

    def forward(X, Shape, allowzero):
        target = _values(Shape)
        if not allowzero:
            target = [X.shape[i] if d == 0 and i < X.ndim else d for i, d in enumerate(target)]
        try:
            return X.reshape(target)
        except ValueError:
            raise ShapeError(f"cannot reshape X {list(X.shape)} to {_values(Shape)}") from None

    def backward(X, Shape, Out, Out_grad, allowzero):
        return (Out_grad.reshape(X.shape),)


@register_op
class onnx_constant_of_shape:
    """Out = a tensor of the shape held by Input (int64 values), filled with `value`."""

    inputs, outputs = ("Input",), ("Out",)
    attrs = {"value": 0.0, "dtype": "float32"}

    def infer(Input, value, dtype):
        _require_ints(Input, "Input")
        return VarInfo((-1,) * _length(Input, "Input"), dtype)

    def forward(Input, value, dtype, xp):
        shape = _values(Input)
        if any(d < 0 for d in shape):
            raise ShapeError(f"Input holds a negative dim: {shape}")
        return xp.full(shape, value, dtype=dtype)


@register_op
class onnx_unsqueeze:
    """Out = X with a dim of 1 at each of the Axes (positions in Out, negative from its end)."""

    inputs, outputs = ("X", "Axes"), ("Out",)
    no_grad_inputs = ("Axes",)

    def infer(X, Axes):
        _require_ints(Axes, "Axes")
        return VarInfo((-1,) * (X.ndim + _length(Axes, "Axes")), X.dtype)

    def forward(X, Axes, xp):
        values = _values(Axes)
        return xp.expand_dims(X, tuple(_axes(values, X.ndim + len(values), "onnx_unsqueeze")))

    def backward(X, Axes, Out, Out_grad):
        return (Out_grad.reshape(X.shape),)


@register_op
class onnx_squeeze:
    """Out = X without the Axes (each of size 1); without Axes, every dim of size 1."""

    inputs, outputs = ("X", "Axes?"), ("Out",)
    no_grad_inputs = ("Axes",)

    def infer(X, Axes):
        _require_ints(Axes, "Axes")
        if Axes is None:  # unknown dims are taken to stay (not to be 1)
            return VarInfo(tuple(d for d in X.shape if d != 1), X.dtype)
        return VarInfo((-1,) * (X.ndim - _length(Axes, "Axes")), X.dtype)

    def forward(X, Axes, xp):
        if Axes is None:
            return xp.squeeze(X)
        axes = _axes(_values(Axes), X.ndim, "onnx_squeeze")
        bad = [a for a in axes if X.shape[a] != 1]
        if bad:
            raise ShapeError(f"cannot squeeze dims {bad} of X {list(X.shape)}: not of size 1")
        return xp.squeeze(X, axis=tuple(axes))

    def backward(X, Axes, Out, Out_grad):
        return (Out_grad.reshape(X.shape),)


@register_op
class onnx_tile:
    """Out = X repeated Repeats[i] times along each dim i (np.tile; len(Repeats) = rank)."""

    inputs, outputs = ("X", "Repeats"), ("Out",)
    no_grad_inputs = ("Repeats",)

    def infer(X, Repeats):
        _require_ints(Repeats, "Repeats")
        count = _length(Repeats, "Repeats", needed=False)
        if count not in (-1, X.ndim):
            fail(f"Repeats holds {count} values but X {list(X.shape)} has rank {X.ndim}")
        return VarInfo((-1,) * X.ndim, X.dtype)

    def forward(X, Repeats, xp):
        repeats = _values(Repeats)
        if len(repeats) != X.ndim or any(r < 0 for r in repeats):
            raise ShapeError(f"Repeats {repeats} must hold {X.ndim} values >= 0")
        return xp.tile(X, repeats)

    def backward(X, Repeats, Out, Out_grad):
        # Out's dim i is (repeats[i], X.shape[i]): sum the repeat axes away.
        split = [v for r, d in zip(_values(Repeats), X.shape) for v in (r, d)]
        grad = Out_grad.reshape(split).sum(axis=tuple(range(0, 2 * X.ndim, 2)))
        return (grad.reshape(X.shape),)


# ---- indexing: slice, gather, split ----


def slice_index(shape, starts, ends, axes, steps) -> tuple[builtins.slice, ...]:
    """ONNX Slice's bounds as Python slices: negative starts/ends count from the end, then
    clamp to [0, dim] ([0, dim - 1] and [-1, dim - 1] for a negative step)."""
    index = [builtins.slice(None)] * len(shape)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(
            f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length"
        )
    for start, end, axis, step in zip(starts, ends, _axes(axes, len(shape), "slice"), steps):
        dim = shape[axis]
        if step == 0:
            raise ShapeError(f"slice step 0 on axis {axis}")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        index[axis] = builtins.slice(start, None if end < 0 else end, step)
    return tuple(index)


@register_op
class onnx_slice:
    """Out = Input[starts:ends:steps] along Axes (ONNX Slice; Axes default 0.., Steps 1)."""

    inputs, outputs = ("Input", "Starts", "Ends", "Axes?", "Steps?"), ("Out",)
    no_grad_inputs = ("Starts", "Ends", "Axes", "Steps")

    def infer(Input, Starts, Ends, Axes, Steps):
        for slot, info in (("Starts", Starts), ("Ends", Ends), ("Axes", Axes), ("Steps", Steps)):
            _require_ints(info, slot)
        return VarInfo((-1,) * Input.ndim, Input.dtype)

    def forward(Input, Starts, Ends, Axes, Steps):
        index = _slice_of(Input, Starts, Ends, Axes, Steps)
        return Input[index]

    def backward(Input, Starts, Ends, Axes, Steps, Out, Out_grad, xp):
        grad = xp.zeros(Input.shape, Out_grad.dtype)
        grad[_slice_of(Input, Starts, Ends, Axes, Steps)] = Out_grad
        return (grad,)


def _slice_of(Input, Starts, Ends, Axes, Steps):
    axes = None if Axes is None else _values(Axes)
    steps = None if Steps is None else _values(Steps)
    return slice_index(Input.shape, _values(Starts), _values(Ends), axes, steps)


@register_op
class onnx_gather:
    """Out = X's entries along `axis` picked by Index (any shape; negative indices count
    from the end): Out.shape = X.shape[:axis] + Index.shape + X.shape[axis + 1:]."""

    inputs, outputs = ("X", "Index"), ("Out",)
    attrs = {"axis": 0}
    no_grad_inputs = ("Index",)

    def infer(X, Index, axis):
        _require_ints(Index, "Index")
        if not -X.ndim <= axis < X.ndim:
            fail(f"axis {axis} is out of range for X {list(X.shape)}")
        ax = axis % X.ndim
        return VarInfo(X.shape[:ax] + Index.shape + X.shape[ax + 1 :], X.dtype)

    def forward(X, Index, axis, xp, device):
        return xp.take(X, _gather_index(X, Index, axis, device), axis=axis)

    def backward(X, Index, Out, Out_grad, axis, xp, device):
        ax = axis % X.ndim
        grad = xp.zeros(X.shape, Out_grad.dtype)
        index = (builtins.slice(None),) * ax + (_gather_index(X, Index, axis, device),)
        device.scatter_add(grad, index, Out_grad)
        return (grad,)


def _gather_index(X, Index, axis: int, device: DeviceContext):
    dim = X.shape[axis]
    index = device.xp.where(Index < 0, Index + dim, Index)
    _check_range(index, dim, f"onnx_gather from X {list(X.shape)} along axis {axis}", device)
    return index


@register_op
class onnx_split:
    """Out = X cut along `axis` into parts of the sizes in Split, or without Split into
    `num` parts of ceil(dim / num) (the last one smaller)."""

    inputs, outputs = ("X", "Split?"), ("Out*",)
    attrs = {"axis": 0, "num": Required(int)}
    no_grad_inputs = ("Split",)

    def infer(X, Split, axis, num):
        _require_ints(Split, "Split")
        if not -X.ndim <= axis < X.ndim:
            fail(f"axis {axis} is out of range for X {list(X.shape)}")
        ax = axis % X.ndim
        return [VarInfo(X.shape[:ax] + (-1,) + X.shape[ax + 1 :], X.dtype)] * num

    def forward(X, Split, axis, num, xp):
        ends = list(itertools.accumulate(_split_sizes(X, Split, axis, num)))
        return xp.split(X, ends[:-1], axis=axis)

    def backward(X, Split, Out, Out_grad, axis, num, xp):
        grads = [xp.zeros_like(o) if g is None else g for o, g in zip(Out, Out_grad or [])]
        grads += [xp.zeros_like(o) for o in Out[len(grads) :]]
        return (xp.concatenate(grads, axis=axis),)


def _split_sizes(X, Split, axis: int, num: int) -> list[int]:
    dim = X.shape[axis]
    if Split is None:
        part = -(-dim // num)
        return [min(part, max(dim - part * i, 0)) for i in range(num)]
    sizes = _values(Split)
    if len(sizes) != num or sum(sizes) != dim or any(s < 0 for s in sizes):
        raise ShapeError(f"Split {sizes} must be {num} sizes >= 0 summing to {dim}")
    return sizes


# ---- pad ----

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_positions(dim: int, before: int, after: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """For each output position along one dim: the input position it copies, and whether it
    copies one (False: the constant)."""
    positions = np.arange(-before, dim + after)
    inside = (positions >= 0) & (positions < dim)
    if mode == "constant" or dim == 0:
        return np.clip(positions, 0, max(dim - 1, 0)), inside
    if mode == "edge":
        return np.clip(positions, 0, dim - 1), np.ones_like(inside)
    if mode == "wrap":
        return positions % dim, np.ones_like(inside)
    if dim == 1:
        return np.zeros_like(positions), np.ones_like(inside)
    period = 2 * (dim - 1)
    folded = np.abs(positions) % period
    return np.where(folded >= dim, period - folded, folded), np.ones_like(inside)


def _pad_plan(X, Pads, Axes, mode: str, xp) -> list[tuple]:
    """Per padded axis: (axis, the input position of each output position, whether it copies
    one, whether all do). Made on the host from the pads (ints), moved to the place once."""
    pads = _values(Pads)
    axes = list(range(X.ndim)) if Axes is None else _axes(_values(Axes), X.ndim, "onnx_pad")
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pads {pads} must hold 2 values per padded axis ({len(axes)})")
    plan = []
    for k, axis in enumerate(axes):
        before, after = pads[k], pads[k + len(axes)]
        if X.shape[axis] + before + after < 0:
            raise ShapeError(f"Pads {pads} remove more than dim {axis} of X {list(X.shape)}")
        if mode in ("reflect", "wrap") and X.shape[axis] == 0 and before + after > 0:
            raise ShapeError(f"{mode} padding of the empty dim {axis} of X {list(X.shape)}")
        source, inside = _pad_positions(X.shape[axis], before, after, mode)
        plan.append((axis, xp.asarray(source), xp.asarray(inside), bool(inside.all())))
    return plan


@register_op
class onnx_pad:
    """Out = X padded by Pads ([begin per axis..., end per axis...]; negative values crop)
    along Axes (default: every dim); `mode` constant (Value, default 0), reflect, edge, wrap."""

    inputs, outputs = ("X", "Pads", "Value?", "Axes?"), ("Out",)
    attrs = {"mode": "constant"}
    no_grad_inputs = ("Pads", "Value", "Axes")

    def infer(X, Pads, Value, Axes, mode):
        if mode not in _PAD_MODES:
            raise AttrError(f"mode must be one of {list(_PAD_MODES)}, got '{mode}'")
        _require_ints(Pads, "Pads")
        _require_ints(Axes, "Axes")
        return VarInfo((-1,) * X.ndim, X.dtype)

    def forward(X, Pads, Value, Axes, mode, xp):
        out = X
        fill = xp.zeros((), X.dtype) if Value is None else Value.reshape(-1)[0]
        for axis, source, inside, full in _pad_plan(X, Pads, Axes, mode, xp):
            out = xp.take(out, source, axis=axis) if out.shape[axis] else _empty(out, axis, source)
            if mode == "constant" and not full:
                shape = [1] * out.ndim
                shape[axis] = -1
                out = xp.where(inside.reshape(shape), out, fill).astype(X.dtype, copy=False)
        return out

    def backward(X, Pads, Value, Axes, Out, Out_grad, mode, xp, device):
        # Undo the per-axis steps last first: each output position's gradient goes back to the
        # input position it copied (summed where several copy one), none from the constant.
        plan = _pad_plan(X, Pads, Axes, mode, xp)
        shapes = [X.shape]  # the input shape of each step
        for axis, source, _, _ in plan[:-1]:
            shapes.append(shapes[-1][:axis] + (len(source),) + shapes[-1][axis + 1 :])
        grad = Out_grad
        for (axis, source, inside, _), shape in zip(reversed(plan), reversed(shapes)):
            if mode == "constant":
                keep = [1] * grad.ndim
                keep[axis] = -1
                grad = xp.where(inside.reshape(keep), grad, 0).astype(Out_grad.dtype)
            back = xp.zeros(shape, Out_grad.dtype)
            device.scatter_add(back, (builtins.slice(None),) * axis + (source,), grad)
            grad = back
        return (grad,)


def _empty(out, axis: int, source):
    shape = list(out.shape)
    shape[axis] = len(source)
    return array_module(out).zeros(shape, out.dtype)


# ---- reductions over axes given at run time ----

_REDUCE_KINDS = {
    "sum": "reduce_sum",
    "mean": "reduce_mean",
    "max": "reduce_max",
    "min": "reduce_min",
    "prod": "reduce_prod",
}


@register_op
class onnx_reduce:
    """Out = X reduced (`kind`: sum, mean, max, min, prod) over the dims in Axes; no Axes (or
    none listed) reduces every dim, or none with `noop_with_empty_axes`. Max/min over no
    elements give the dtype's lowest/highest value (ONNX's identity), -inf/inf for floats."""

    inputs, outputs = ("X", "Axes?"), ("Out",)
    attrs = {"kind": Required(str), "keepdims": True, "noop_with_empty_axes": False}
    no_grad_inputs = ("Axes",)

    def infer(X, Axes, kind, keepdims, noop_with_empty_axes):
        if kind not in _REDUCE_KINDS:
            raise AttrError(f"kind must be one of {list(_REDUCE_KINDS)}, got '{kind}'")
        _require_ints(Axes, "Axes")
        if keepdims:
            return VarInfo((-1,) * X.ndim, X.dtype)
        count = 0 if Axes is None else _length(Axes, "Axes")
        if count == 0:
            return VarInfo(X.shape if noop_with_empty_axes else (), X.dtype)
        return VarInfo((-1,) * (X.ndim - count), X.dtype)

    def forward(X, Axes, kind, keepdims, noop_with_empty_axes, device):
        axes = _reduce_axes(X, Axes, noop_with_empty_axes)
        if axes is None:
            return X.copy()
        if kind in ("max", "min") and any(X.shape[a] == 0 for a in axes):
            return _empty_extreme(X, axes, kind, keepdims, device.xp)
        kwargs = {"dim": list(axes), "keep_dim": keepdims, "reduce_all": not axes}
        kernel = get_op_def(_REDUCE_KINDS[kind]).forward
        return kernel(X, **kwargs, **place_args(kernel, device))

    def backward(X, Axes, Out, Out_grad, kind, keepdims, noop_with_empty_axes, device):
        axes = _reduce_axes(X, Axes, noop_with_empty_axes)
        if axes is None:
            return (Out_grad,)
        kwargs = {"dim": list(axes), "keep_dim": keepdims, "reduce_all": not axes}
        kernel = get_op_def(_REDUCE_KINDS[kind]).backward
        return kernel(X, Out, Out_grad, **kwargs, **place_args(kernel, device))


def _reduce_axes(X, Axes, noop: bool) -> tuple[int, ...] | None:
    """The axes to reduce, () for all, None for none (a no-op)."""
    axes = _values(Axes)
    if not axes:
        return None if noop else tuple(range(X.ndim))
    return tuple(sorted(_axes(axes, X.ndim, "onnx_reduce")))


def _empty_extreme(X, axes, kind: str, keepdims: bool, xp):
    if X.dtype.kind == "f":
        fill = -np.inf if kind == "max" else np.inf
    elif X.dtype.kind == "b":
        fill = kind == "min"
    else:
        info = np.iinfo(X.dtype)
        fill = info.min if kind == "max" else info.max
    shape = [1 if i in axes else d for i, d in enumerate(X.shape)]
    if not keepdims:
        shape = [d for i, d in enumerate(X.shape) if i not in axes]
    return xp.full(shape, fill, X.dtype)


# ---- elementwise math NumPy has and Fluid 1.x does not ----


def _float_infer(name: str):
    def infer(X):
        if not is_floating(X.dtype):
            raise DTypeError(f"{name} needs a floating-point X, got {X.dtype}")
        return X

    return infer


def _unary(name: str, fn: str, slope=None, doc: str = "") -> type:
    """Register onnx_<name>: Out = xp.<fn>(X) (float X); `slope(xp, X, Out)` is dOut/dX, None
    for an op whose gradient is zero almost everywhere (floor, ceil, round)."""

    def forward(X, xp):
        return xp.asarray(getattr(xp, fn)(X)).astype(X.dtype, copy=False)

    def backward(X, Out, Out_grad, xp):
        if slope is None:
            return (xp.zeros_like(Out_grad),)
        return (xp.asarray(Out_grad * slope(xp, X, Out)).astype(X.dtype, copy=False),)

    body = {
        "__doc__": doc,
        "inputs": ("X",),
        "outputs": ("Out",),
        "infer": _float_infer(f"onnx_{name}"),
        "forward": forward,
        "backward": backward,
    }
    return register_op(type(f"onnx_{name}", (), body))


_UNARY = [
    ("floor", "floor", None, "Out = the largest integer <= X (zero gradient)."),
    ("ceil", "ceil", None, "Out = the smallest integer >= X (zero gradient)."),
    ("round", "round", None, "Out = X rounded to the nearest integer, halves to even."),
    ("sin", "sin", lambda xp, x, y: xp.cos(x), "Out = sin(X)."),
    ("cos", "cos", lambda xp, x, y: -xp.sin(x), "Out = cos(X)."),
    ("tan", "tan", lambda xp, x, y: 1 + y * y, "Out = tan(X)."),
    ("asin", "arcsin", lambda xp, x, y: 1 / xp.sqrt(1 - x * x), "Out = arcsin(X)."),
    ("acos", "arccos", lambda xp, x, y: -1 / xp.sqrt(1 - x * x), "Out = arccos(X)."),
    ("atan", "arctan", lambda xp, x, y: 1 / (1 + x * x), "Out = arctan(X)."),
    ("sinh", "sinh", lambda xp, x, y: xp.cosh(x), "Out = sinh(X)."),
    ("cosh", "cosh", lambda xp, x, y: xp.sinh(x), "Out = cosh(X)."),
    ("asinh", "arcsinh", lambda xp, x, y: 1 / xp.sqrt(x * x + 1), "Out = arcsinh(X)."),
    ("acosh", "arccosh", lambda xp, x, y: 1 / xp.sqrt(x * x - 1), "Out = arccosh(X)."),
    ("atanh", "arctanh", lambda xp, x, y: 1 / (1 - x * x), "Out = arctanh(X)."),
]
for _name, _fn, _slope, _doc in _UNARY:
    _unary(_name, _fn, _slope, _doc)


@register_op
class onnx_isnan:
    """Out = whether each element of X is NaN (bool)."""

    inputs, outputs = ("X",), ("Out",)

    def infer(X):
        return VarInfo(_float_infer("onnx_isnan")(X).shape, "bool")

    def forward(X, xp):
        return xp.isnan(X)


@register_op
class onnx_isinf:
    """Out = whether each element of X is +inf (`detect_positive`) or -inf
    (`detect_negative`) (bool)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"detect_positive": True, "detect_negative": True}

    def infer(X, detect_positive, detect_negative):
        return VarInfo(_float_infer("onnx_isinf")(X).shape, "bool")

    def forward(X, detect_positive, detect_negative, xp):
        return xp.isinf(X) & (((X > 0) & detect_positive) | ((X < 0) & detect_negative))


@register_op
class onnx_mod:
    """Out = X mod Y, broadcast: with `fmod` the remainder has X's sign (C's fmod), without it
    Y's (Python's %)."""

    inputs, outputs = ("X", "Y"), ("Out",)
    attrs = {"fmod": False}

    def infer(X, Y, fmod):
        if X.dtype != Y.dtype:
            raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
        return VarInfo(broadcast_shapes(X.shape, Y.shape), X.dtype)

    def forward(X, Y, fmod, xp):
        with np.errstate(divide="ignore", invalid="ignore"):
            return xp.asarray(xp.fmod(X, Y) if fmod else xp.mod(X, Y))


# ---- integer bit operations ----


def _require_integers(X: VarInfo, op: str) -> VarInfo:
    if np.dtype(X.dtype).kind not in "iu":
        raise DTypeError(f"{op} needs integer operands, got {X.dtype}")
    return X


def _bitwise(name: str, fn: str, doc: str) -> type:
    """Register onnx_<name>: Out = xp.<fn>(X, Y), integers of one dtype, broadcast."""

    def infer(X, Y):
        if X.dtype != Y.dtype:
            raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
        _require_integers(X, f"onnx_{name}")
        return VarInfo(broadcast_shapes(X.shape, Y.shape), X.dtype)

    def forward(X, Y, xp):
        return xp.asarray(getattr(xp, fn)(X, Y))

    body = {
        "__doc__": doc,
        "inputs": ("X", "Y"),
        "outputs": ("Out",),
        "infer": infer,
        "forward": forward,
    }
    return register_op(type(f"onnx_{name}", (), body))


_bitwise("bitwise_and", "bitwise_and", "Out = X & Y (integers), broadcast.")
_bitwise("bitwise_or", "bitwise_or", "Out = X | Y (integers), broadcast.")
_bitwise("bitwise_xor", "bitwise_xor", "Out = X ^ Y (integers), broadcast.")
_bitwise("shift_left", "left_shift", "Out = X << Y (integers), broadcast.")
_bitwise("shift_right", "right_shift", "Out = X >> Y (integers), broadcast.")


@register_op
class onnx_bitwise_not:
    """Out = ~X (integers)."""

    inputs, outputs = ("X",), ("Out",)

    def infer(X):
        return _require_integers(X, "onnx_bitwise_not")

    def forward(X, xp):
        return xp.asarray(xp.invert(X))


# ---- triangles, cumulative sums, element-wise gathers and scatters ----


@register_op
class onnx_trilu:
    """Out = X with the elements below (`upper`) or above the K-th diagonal of its last two
    dims zeroed (K: a 1-element int64 tensor, default 0)."""

    inputs, outputs = ("X", "K?"), ("Out",)
    attrs = {"upper": True}
    no_grad_inputs = ("K",)

    def infer(X, K, upper):
        _require_ints(K, "K")
        if X.ndim < 2:
            fail(f"X {list(X.shape)} needs two dims")
        return X

    def forward(X, K, upper, xp):
        return _triangle(X, K, upper, xp)

    def backward(X, K, Out, Out_grad, upper, xp):
        return (_triangle(Out_grad, K, upper, xp),)


def _triangle(X, K, upper: bool, xp):
    k = _values(K)[0] if K is not None else 0
    return xp.triu(X, k) if upper else xp.tril(X, k)


def _infer_running(X, Axis, exclusive, reverse):
    """Shape of a running sum or product along the axis Axis holds: X's own."""
    _require_ints(Axis, "Axis")
    if X.dtype == "bool":
        raise DTypeError("X is bool; cast it to a number type first")
    return X


@register_op
class onnx_cumsum:
    """Out = running sums of X along the axis held by Axis (a 1-element int tensor), as
    nestflow's cumsum with `exclusive` and `reverse`."""

    inputs, outputs = ("X", "Axis"), ("Out",)
    attrs = {"exclusive": False, "reverse": False}
    no_grad_inputs = ("Axis",)

    infer = _infer_running

    def forward(X, Axis, exclusive, reverse, device):
        attrs = _cumsum_attrs(X, Axis, exclusive, reverse)
        kernel = get_op_def("cumsum").forward
        return kernel(X, **attrs, **place_args(kernel, device))

    def backward(X, Axis, Out, Out_grad, exclusive, reverse, device):
        attrs = _cumsum_attrs(X, Axis, exclusive, reverse)
        kernel = get_op_def("cumsum").backward
        return kernel(X, Out, Out_grad, **attrs, **place_args(kernel, device))


def _cumsum_attrs(X, Axis, exclusive: bool, reverse: bool) -> dict:
    (axis,) = _axes(_values(Axis)[:1], X.ndim, "onnx_cumsum")
    return {"axis": axis, "flatten": False, "exclusive": exclusive, "reverse": reverse}


@register_op
class onnx_cumprod:
    """Out = running products of X along the axis held by Axis (a 1-element int tensor);
    `exclusive` leaves each element out of its own product, `reverse` multiplies from the
    end (ONNX CumProd)."""

    inputs, outputs = ("X", "Axis"), ("Out",)
    attrs = {"exclusive": False, "reverse": False}

    infer = _infer_running

    def forward(X, Axis, exclusive, reverse, xp):
        (axis,) = _axes(_values(Axis)[:1], X.ndim, "onnx_cumprod")
        x = xp.flip(X, axis) if reverse else X
        if exclusive and X.shape[axis]:  # a 1 in front, the last element left out
            ones = xp.ones(x.shape[:axis] + (1,) + x.shape[axis + 1 :], x.dtype)
            most = x[(builtins.slice(None),) * axis + (builtins.slice(-1),)]
            x = xp.concatenate([ones, most], axis=axis)
        out = xp.cumprod(x, axis=axis, dtype=X.dtype)
        return xp.flip(out, axis) if reverse else out


def _element_index(X, Index, axis: int, what: str, device: DeviceContext) -> tuple:
    """The full index (a tuple of arrays shaped like Index) of ONNX GatherElements /
    ScatterElements: Index's values (negative from the end) along `axis`, positions elsewhere."""
    xp = device.xp
    ax = axis % X.ndim
    dim = X.shape[ax]
    index = xp.where(Index < 0, Index + dim, Index)
    _check_range(index, dim, f"{what} along axis {ax} of X {list(X.shape)}", device)
    # np.indices(Index.shape, sparse=True), which CuPy lacks: an arange along each dim
    ones = (1,) * Index.ndim
    grid = [
        xp.arange(n).reshape(ones[:i] + (n,) + ones[i + 1 :]) for i, n in enumerate(Index.shape)
    ]
    grid[ax] = index
    return tuple(grid)


@register_op
class onnx_gather_elements:
    """Out[i][j][k] = X[Index[i][j][k]][j][k] for axis 0 (and so on): Out has Index's shape
    (ONNX GatherElements; negative indices count from the end)."""

    inputs, outputs = ("X", "Index"), ("Out",)
    attrs = {"axis": 0}
    no_grad_inputs = ("Index",)

    def infer(X, Index, axis):
        _require_ints(Index, "Index")
        if Index.ndim != X.ndim or not -X.ndim <= axis < X.ndim:
            fail(f"Index {list(Index.shape)} and axis {axis} do not fit X {list(X.shape)}")
        return VarInfo(Index.shape, X.dtype)

    def forward(X, Index, axis, device):
        return X[_element_index(X, Index, axis, "onnx_gather_elements", device)]

    def backward(X, Index, Out, Out_grad, axis, xp, device):
        grad = xp.zeros(X.shape, Out_grad.dtype)
        index = _element_index(X, Index, axis, "onnx_gather_elements", device)
        device.scatter_add(grad, index, Out_grad)
        return (grad,)


# reduction -> the ufunc whose `at` combines repeated indices (the place's scatter_at: CuPy's
# `at` lacks multiply)
_REDUCTIONS = {"none": None, "add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _scatter(X, index: tuple, Updates, reduction: str, device: DeviceContext):
    if reduction not in _REDUCTIONS:
        raise AttrError(f"reduction must be one of {list(_REDUCTIONS)}, got '{reduction}'")
    out = X.copy()
    if reduction == "none":
        out[index] = Updates
    else:
        device.scatter_at(out, index, Updates, _REDUCTIONS[reduction])
    return out


@register_op
class onnx_scatter_elements:
    """Out = X with Out[Index[i][j]][j] = Updates[i][j] for axis 0 (and so on), or combined
    with it by `reduction` (add, mul, max, min) (ONNX ScatterElements)."""

    inputs, outputs = ("X", "Index", "Updates"), ("Out",)
    attrs = {"axis": 0, "reduction": "none"}

    def infer(X, Index, Updates, axis, reduction):
        _require_ints(Index, "Index")
        if Updates.dtype != X.dtype:
            raise DTypeError(f"Updates is {Updates.dtype} but X is {X.dtype}")
        return X

    def forward(X, Index, Updates, axis, reduction, device):
        index = _element_index(X, Index, axis, "onnx_scatter_elements", device)
        return _scatter(X, index, Updates, reduction, device)


@register_op
class onnx_scatter_nd:
    """Out = X with the slices at Index's last-dim coordinates set to (or combined by
    `reduction` with) Updates (ONNX ScatterND)."""

    inputs, outputs = ("X", "Index", "Updates"), ("Out",)
    attrs = {"reduction": "none"}

    def infer(X, Index, Updates, reduction):
        _require_ints(Index, "Index")
        if Updates.dtype != X.dtype:
            raise DTypeError(f"Updates is {Updates.dtype} but X is {X.dtype}")
        return X

    def forward(X, Index, Updates, reduction, xp, device):
        depth = Index.shape[-1]
        dims = np.asarray(X.shape[:depth])
        coords = Index.reshape(-1, depth)
        coords = xp.where(coords < 0, coords + xp.asarray(dims), coords)
        _check_range(coords, dims, f"onnx_scatter_nd into X {list(X.shape)}", device)
        updates = Updates.reshape((-1,) + X.shape[depth:])
        return _scatter(X, tuple(coords.T), updates, reduction, device)


@register_op
class onnx_one_hot:
    """Out = Values[1] where the position along the new dim `axis` equals the index (indices
    in [-Depth, Depth), negative from the end), Values[0] elsewhere (ONNX OneHot)."""

    inputs, outputs = ("Indices", "Depth", "Values"), ("Out",)
    attrs = {"axis": -1}

    def infer(Indices, Depth, Values, axis):
        rank = Indices.ndim + 1
        if not -rank <= axis < rank:
            fail(f"axis {axis} is out of range for the result of rank {rank}")
        shape = list(Indices.shape)
        shape.insert(axis % rank, -1)
        return VarInfo(tuple(shape), Values.dtype)

    def forward(Indices, Depth, Values, axis, xp):
        depth = _values(Depth)[0]  # the result's shape: read on the host
        off, on = Values.reshape(-1)[:2]
        index = Indices.astype(np.int64)
        index = xp.where(index < 0, index + depth, index)
        hot = index[..., None] == xp.arange(depth)
        out = xp.where(hot, on, off).astype(Values.dtype)
        return xp.moveaxis(out, -1, axis % (index.ndim + 1))


@register_op
class onnx_einsum:
    """Out = np.einsum(`equation`, *Inputs) (ONNX Einsum)."""

    inputs, outputs = ("Inputs*",), ("Out",)
    attrs = {"equation": Required(str)}

    def infer(Inputs, equation):
        terms, _, result = equation.replace(" ", "").partition("->")
        if not result and "->" not in equation:
            letters = sorted(c for c in terms if c.isalpha() and terms.count(c) == 1)
            result = ("..." if "..." in terms else "") + "".join(letters)
        rank = len(result.replace("...", ""))
        if "..." in result:
            rank += max(
                x.ndim - len(t.replace("...", "")) for x, t in zip(Inputs, terms.split(","))
            )
        return VarInfo((-1,) * rank, Inputs[0].dtype)

    def forward(Inputs, equation, xp):
        return xp.asarray(xp.einsum(equation, *Inputs))


# ---- resize ----

_RESIZE_MODES = ("nearest", "linear", "cubic")
_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source_coordinate(
    i: np.ndarray, size: int, out: int, scale: float, mode: str, roi
) -> np.ndarray:
    """Where output positions `i` of one axis lie in the input (ONNX Resize's
    coordinate_transformation_mode; the output's length as float is scale * size)."""
    width = scale * size
    if mode == "align_corners":
        return np.zeros_like(i) if width == 1 else i * (size - 1) / (width - 1)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if width == 1:
            return np.full_like(i, (end - start) * (size - 1) / 2 + start * (size - 1))
        return i * (end - start) * (size - 1) / (width - 1) + start * (size - 1)
    if mode == "pytorch_half_pixel" and width == 1:
        return np.full_like(i, -0.5)
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - out / width)
        return offset + (i + 0.5) / scale - 0.5
    return (i + 0.5) / scale - 0.5


def _resize_weights(ratio: np.ndarray, scale: float, attrs: dict) -> np.ndarray:
    """[out, n] weights of the n neighbours of each position (ratio in (0, 1]: its distance
    past the left neighbour of the middle pair)."""
    mode = attrs["mode"]
    if mode == "nearest":
        rule = attrs["nearest_mode"]
        right = {
            "round_prefer_floor": ratio > 0.5,
            "round_prefer_ceil": ratio >= 0.5,
            "floor": np.zeros_like(ratio, bool),
            "ceil": np.ones_like(ratio, bool),
        }[rule] | (ratio == 1)
        return np.stack([~right, right], axis=1).astype(np.float64)
    r = ratio[:, None]
    if not attrs["antialias"] or scale >= 1:
        if mode == "linear":
            return np.concatenate([1 - r, r], axis=1)
        a = attrs["cubic_coeff_a"]
        distances = np.concatenate([r + 1, r, 1 - r, 2 - r], axis=1)
    else:  # a filter stretched by 1 / scale when shrinking
        support = 1 if mode == "linear" else 2
        start = int(np.floor(-support / scale) + 1)
        distances = np.abs((np.arange(start, 2 - start) - r) * scale)
        if mode == "linear":
            weights = np.clip(1 - distances, 0, 1)
            return weights / weights.sum(axis=1, keepdims=True)
        a = attrs["cubic_coeff_a"]
    d = np.abs(distances)
    cubic = np.where(
        d <= 1,
        (a + 2) * d**3 - (a + 3) * d**2 + 1,
        np.where(d < 2, a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a, 0.0),
    )
    if attrs["antialias"] and scale < 1:
        cubic = cubic / cubic.sum(axis=1, keepdims=True)
    return cubic


def _resize_axis(size: int, out: int, scale: float, roi, attrs: dict):
    """(neighbour indexes [out, n], weights [out, n], positions outside the input or None)."""
    x = _source_coordinate(
        np.arange(out, dtype=np.float64),
        size,
        out,
        scale,
        attrs["coordinate_transformation_mode"],
        roi,
    )
    base = np.ceil(x) - 1  # the left neighbour of the middle pair: ratio in (0, 1]
    ratio = x - base
    weights = _resize_weights(ratio, scale, attrs)
    n = weights.shape[1]
    index = base[:, None].astype(np.int64) + np.arange(n) - (n // 2 - 1)
    if attrs["exclude_outside"]:
        weights = np.where((index < 0) | (index >= size), 0.0, weights)
        weights = weights / weights.sum(axis=1, keepdims=True)
    outside = None
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        outside = (x < 0) | (x > size - 1)
    return np.clip(index, 0, size - 1), weights, outside


def _resize_plan(X, Roi, Scales, Sizes, attrs: dict, xp) -> list[tuple]:
    """Per resized axis: (axis, indexes, weights, outside mask or None), made on the host from
    Roi, Scales and Sizes (read there: they decide the output's shape and coordinates) and
    moved to X's place once."""
    rank = X.ndim
    axes = [a % rank for a in attrs["axes"]] or list(range(rank))
    scales, sizes = [1.0] * rank, list(X.shape)
    roi = [(0.0, 1.0)] * rank
    if Roi is not None and Roi.size:
        values = _floats(Roi)
        for k, a in enumerate(axes):
            roi[a] = (values[k], values[k + len(axes)])
    if Sizes is not None and Sizes.size:
        wanted = _values(Sizes)
        for k, a in enumerate(axes):
            sizes[a] = wanted[k]
            scales[a] = wanted[k] / X.shape[a]
        policy = attrs["keep_aspect_ratio_policy"]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(scales[a] for a in axes)
            for a in axes:
                scales[a], sizes[a] = scale, int(scale * X.shape[a] + 0.5)
    elif Scales is not None and Scales.size:
        factors = _floats(Scales)
        for k, a in enumerate(axes):
            scales[a] = factors[k]
            sizes[a] = int(factors[k] * X.shape[a])
    else:
        raise ShapeError("onnx_resize needs Scales or Sizes")
    plan = []
    for a in axes:
        trivial = (
            roi[a] == (0.0, 1.0) or attrs["coordinate_transformation_mode"] != "tf_crop_and_resize"
        )
        if math.isclose(scales[a], 1.0) and sizes[a] == X.shape[a] and trivial:
            continue
        index, weights, outside = _resize_axis(X.shape[a], sizes[a], scales[a], roi[a], attrs)
        outside = None if outside is None else xp.asarray(outside)
        plan.append((a, xp.asarray(index), xp.asarray(weights), outside))
    return plan


def _along(x, axis: int, index, weights, xp):
    """sum_k weights[:, k] * x[index[:, k]] along `axis`."""
    moved = xp.moveaxis(x, axis, 0)
    picked = moved[index]  # [out, n, ...]
    weights = weights.reshape(weights.shape + (1,) * (moved.ndim - 1))
    return xp.moveaxis((picked * weights).sum(axis=1), 0, axis)


@register_op
class onnx_resize:
    """Out = X resized along `axes` (all by default) to Sizes or by Scales, each output
    position interpolated (`mode`: nearest, linear, cubic) at the input coordinate
    `coordinate_transformation_mode` gives it, as ONNX Resize (separably, one axis after
    another, in float64; integer results rounded and saturated)."""

    inputs, outputs = ("X", "Roi?", "Scales?", "Sizes?"), ("Out",)
    attrs = {
        "mode": "nearest",
        "coordinate_transformation_mode": "half_pixel",
        "nearest_mode": "round_prefer_floor",
        "cubic_coeff_a": -0.75,
        "exclude_outside": False,
        "extrapolation_value": 0.0,
        "antialias": False,
        "axes": [],
        "keep_aspect_ratio_policy": "stretch",
    }
    no_grad_inputs = ("Roi", "Scales", "Sizes")

    def infer(X, Roi, Scales, Sizes, **attrs):
        for name, allowed in (
            ("mode", _RESIZE_MODES),
            ("coordinate_transformation_mode", _COORDINATE_MODES),
            ("nearest_mode", _NEAREST_MODES),
            ("keep_aspect_ratio_policy", ("stretch", "not_larger", "not_smaller")),
        ):
            if attrs[name] not in allowed:
                raise AttrError(f"{name} must be one of {list(allowed)}, got '{attrs[name]}'")
        _require_ints(Sizes, "Sizes")
        return VarInfo((-1,) * X.ndim, X.dtype)

    def forward(X, Roi, Scales, Sizes, xp, **attrs):
        y = X.astype(np.float64)
        outside = xp.zeros((), bool)
        for axis, index, weights, out_of_range in _resize_plan(X, Roi, Scales, Sizes, attrs, xp):
            y = _along(y, axis, index, weights, xp)
            if out_of_range is not None:
                shape = [1] * y.ndim
                shape[axis] = -1
                outside = outside | out_of_range.reshape(shape)
        y = xp.where(outside, attrs["extrapolation_value"], y)
        if X.dtype.kind in "iu":
            info = np.iinfo(X.dtype)
            y = xp.clip(xp.round(y), info.min, info.max)
        return y.astype(X.dtype)

    def backward(X, Roi, Scales, Sizes, Out, Out_grad, xp, device, **attrs):
        plan = _resize_plan(X, Roi, Scales, Sizes, attrs, xp)
        shapes = [X.shape]  # each step's input shape
        for axis, index, _, _ in plan[:-1]:
            shapes.append(shapes[-1][:axis] + (len(index),) + shapes[-1][axis + 1 :])
        grad = Out_grad.astype(np.float64)
        outside = xp.zeros((), bool)
        for axis, _, _, out_of_range in plan:
            if out_of_range is not None:
                shape = [1] * grad.ndim
                shape[axis] = -1
                outside = outside | out_of_range.reshape(shape)
        grad = xp.where(outside, 0.0, grad)
        for (axis, index, weights, _), shape in zip(reversed(plan), reversed(shapes)):
            moved = xp.moveaxis(grad, axis, 0)
            spread = moved[:, None] * weights.reshape(weights.shape + (1,) * (moved.ndim - 1))
            back = xp.zeros((shape[axis],) + moved.shape[1:])
            device.scatter_add(back, index, spread)
            grad = xp.moveaxis(back, 0, axis)
        return (grad.astype(X.dtype),)


__all__ = [
    "onnx_bitwise_not",
    "onnx_cumprod",
    "onnx_resize",
    "onnx_cumsum",
    "onnx_einsum",
    "onnx_gather_elements",
    "onnx_isinf",
    "onnx_isnan",
    "onnx_mod",
    "onnx_one_hot",
    "onnx_scatter_elements",
    "onnx_scatter_nd",
    "onnx_trilu",
    "onnx_constant_of_shape",
    "onnx_erf",
    "onnx_gather",
    "onnx_log_softmax",
    "onnx_pad",
    "onnx_reduce",
    "onnx_reshape",
    "onnx_slice",
    "onnx_split",
    "onnx_squeeze",
    "onnx_tile",
    "onnx_unsqueeze",
    "slice_index",
]
