"""Tensor creation and layout ops: fill_constant, random fills, assign, cast, reshape, ..."""

from __future__ import annotations

import builtins
import itertools
import math
import operator

import numpy as np

from nestflow.core.dtype import dtype_name, is_floating
from nestflow.core.selected_rows import SelectedRows
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from nestflow.ops.random_state import generator
from nestflow.ops.registry import Required, VarInfo, fail, linear_double, register_op, same_as


def _static_shape(shape: list[int]) -> tuple[int, ...]:
    if any(d < 0 for d in shape):
        fail(f"shape {shape} must be fully known to create a tensor")
    return tuple(shape)


@register_op
class fill_constant:
    """Out = a tensor of `shape` filled with `value`."""

    inputs, outputs = (), ("Out",)
    attrs = {"shape": Required(list), "dtype": "float32", "value": 0.0}

    def infer(shape, dtype, value):
        return VarInfo(_static_shape(shape), dtype)

    def forward(shape, dtype, value, xp):
        return xp.full(shape, value, dtype=dtype)


@register_op
class uniform_random:
    """Out ~ U(min, max) of `shape`; seed 0 draws from the global generator (nf.seed)."""

    inputs, outputs = (), ("Out",)
    attrs = {"shape": Required(list), "dtype": "float32", "min": -1.0, "max": 1.0, "seed": 0}

    def infer(shape, dtype, min, max, seed):
        return VarInfo(_static_shape(shape), dtype)

    def forward(shape, dtype, min, max, seed, device):
        return device.random(generator(seed)).uniform(min, max, size=shape).astype(dtype)


@register_op
class gaussian_random:
    """Out ~ N(mean, std^2) of `shape`."""

    inputs, outputs = (), ("Out",)
    attrs = {"shape": Required(list), "dtype": "float32", "mean": 0.0, "std": 1.0, "seed": 0}

    def infer(shape, dtype, mean, std, seed):
        return VarInfo(_static_shape(shape), dtype)

    def forward(shape, dtype, mean, std, seed, device):
        return device.random(generator(seed)).normal(mean, std, size=shape).astype(dtype)


# ---- copies and dtype ----


@register_op
class assign:
    """Out = a copy of X."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X", "Out")
    infer = same_as(0)

    def forward(X):
        return X.copy()

    def backward(X, Out, Out_grad):
        return (Out_grad,)


@register_op
class cast:
    """Out = X converted to `out_dtype`; the gradient is cast back to X's dtype (float to float
    only: an integer or bool X has no gradient)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X", "Out")
    # in_dtype: Fluid's cast op carries X's dtype too; X's declared dtype is what counts here.
    attrs = {"out_dtype": Required(str), "in_dtype": None}

    def infer(X, out_dtype, in_dtype=None):
        return VarInfo(X.shape, out_dtype)

    def forward(X, out_dtype, in_dtype=None):
        return X.astype(out_dtype)

    def backward(X, Out, Out_grad, out_dtype, in_dtype=None):
        if not is_floating(X.dtype):
            return (None,)
        return (Out_grad.astype(X.dtype),)


@register_op
class increment:
    """Out = X + step, keeping X's dtype (a loop counter). dOut/dX = 1 (Paddle's
    increment_grad) for a floating-point X; an integer counter has no gradient."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"step": 1.0}
    infer = same_as(0)

    def forward(X, step, xp):
        return xp.asarray(X + step).astype(X.dtype, copy=False)

    def backward(X, Out, Out_grad, step):
        return (Out_grad if is_floating(X.dtype) else None,)


@register_op
class fill_zeros_like:
    """Out = zeros of X's shape and dtype."""

    inputs, outputs = ("X",), ("Out",)
    infer = same_as(0)

    def forward(X, xp):
        return xp.zeros_like(X)


@register_op
class fill_any_like:
    """Out = `value` in X's shape, of `dtype` (None: X's dtype)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"value": 0.0, "dtype": None}

    def infer(X, value, dtype):
        return VarInfo(X.shape, X.dtype if dtype is None else dtype_name(dtype))

    def forward(X, value, dtype, xp):
        return xp.full(X.shape, value, dtype=X.dtype if dtype is None else dtype)


# ---- layout: reshape, transpose, concat, split, slice ----


def _known(shape) -> bool:
    return all(d >= 0 for d in shape)


def _resolve_reshape(x_shape: tuple[int, ...], shape: list[int]) -> list[int]:
    """`shape` with each 0 replaced by X's dim at that index; checks the spelling of `shape`."""
    if sum(1 for d in shape if d == -1) > 1:
        fail(f"shape {shape} has more than one -1; only one dim can be inferred")
    out = []
    for i, d in enumerate(shape):
        if d < -1:
            fail(f"shape {shape} has dim {d}; dims are >= 0, or -1 for the one inferred dim")
        if d == 0:
            if i >= len(x_shape):
                fail(f"shape {shape} copies dim {i} (0) but X {list(x_shape)} has {len(x_shape)}")
            d = x_shape[i]
            # A copied unknown dim is not "the inferred dim"; mark it apart from the real -1.
            d = -2 if d == -1 else d
        out.append(d)
    return out


def _infer_reshape_dims(x_shape: tuple[int, ...], shape: list[int]) -> tuple[int, ...]:
    target = _resolve_reshape(x_shape, shape)
    known_x = math.prod(d for d in x_shape if d >= 0)
    known_t = math.prod(d for d in target if d >= 0)
    unknown_x = sum(1 for d in x_shape if d < 0)
    copied_unknown = sum(1 for d in target if d == -2)
    mismatch = f"cannot reshape X {list(x_shape)} to {shape}"
    # Unknown dims of X cancel exactly when each is copied by a 0, so sizes can be compared.
    if unknown_x == copied_unknown:
        if -1 in target:
            if known_t == 0 or known_x % known_t:
                fail(f"{mismatch}: {known_x} elements do not divide into dims of size {known_t}")
            target = [known_x // known_t if d == -1 else d for d in target]
        elif known_x != known_t:
            fail(f"{mismatch}: {known_x} elements vs {known_t}")
    elif -1 not in target and copied_unknown == 0 and known_x and known_t % known_x:
        # X holds (unknown) * known_x elements: a fully known target must be a multiple of it.
        fail(f"{mismatch}: the size is a multiple of {known_x}, not of {known_t}")
    return tuple(-1 if d < 0 else d for d in target)


@register_op
class reshape:
    """Out = X with a new shape: 0 copies X's dim at that index, one -1 is inferred.

    Raises ShapeError (naming both shapes) when the sizes cannot match.
    """

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X", "Out")
    attrs = {"shape": Required(list)}

    def infer(X, shape):
        return VarInfo(_infer_reshape_dims(X.shape, shape), X.dtype)

    def specialize(X, shape, xp):
        # X's shape known when built (the sizes were checked then; rank 0 is a Net's "not
        # known yet"): a reshape to X's own shape is X itself (xp.asarray returns it), any
        # other X.reshape(*dims) bound as a C-level call; both views of X, as forward gives.
        # Views are safe: kernels never write their inputs, and the executor lends a buffer
        # to an in-place op only when nothing else holds its memory (plan._owned).
        if X is None or not X.shape or not _known(X.shape):
            return None
        if any(d == 0 and i >= len(X.shape) for i, d in enumerate(shape)):
            return None
        dims = _infer_reshape_dims(X.shape, shape)
        if dims == tuple(X.shape):
            return xp.asarray
        # reshape(*dims) is faster than reshape(dims), but 0-d needs reshape(()).
        return operator.methodcaller("reshape", *(dims or ((),)))

    def forward(X, shape):
        target = _resolve_reshape(X.shape, shape)
        try:
            return X.reshape(target)
        except ValueError:
            raise ShapeError(
                f"cannot reshape X {list(X.shape)} ({X.size} elements) to {shape}"
            ) from None

    def backward(X, Out, Out_grad, shape):
        return (Out_grad.reshape(X.shape),)

    double_backward = linear_double(forward)


def _axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        fail(f"axis {axis} is out of range for {what} of rank {ndim}")
    return axis % ndim


@register_op
class transpose:
    """Out = X with its dims permuted: Out.shape[i] = X.shape[axis[i]]."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X", "Out")
    attrs = {"axis": Required(list)}

    def infer(X, axis):
        in_range = all(-X.ndim <= d < X.ndim for d in axis)
        if not in_range or sorted(d % X.ndim for d in axis) != list(range(X.ndim)):
            fail(f"axis {axis} is not a permutation of the {X.ndim} dims of X {list(X.shape)}")
        return VarInfo(tuple(X.shape[d] for d in axis), X.dtype)

    def forward(X, axis, xp):
        return xp.transpose(X, axis)

    def backward(X, Out, Out_grad, axis, xp):
        inverse = sorted(builtins.range(X.ndim), key=lambda i: axis[i] % X.ndim)
        return (xp.transpose(Out_grad, inverse),)

    double_backward = linear_double(forward)


@register_op
class concat:
    """Out = the X tensors joined along `axis`; all other dims must agree."""

    inputs, outputs = ("X*",), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"axis": 0}

    def infer(X, axis):
        if not X:
            fail("concat needs at least one input")
        first = X[0]
        ax = _axis(axis, first.ndim, f"X[0] {list(first.shape)}")
        out = list(first.shape)
        for i, x in enumerate(X[1:], 1):
            if x.dtype != first.dtype:
                fail(f"X[{i}] is {x.dtype} but X[0] is {first.dtype}")
            if x.ndim != first.ndim:
                fail(f"X[{i}] {list(x.shape)} and X[0] {list(first.shape)} differ in rank")
            for d, (a, b) in enumerate(zip(out, x.shape)):
                if d == ax:
                    out[d] = -1 if -1 in (a, b) else a + b
                elif a != b and -1 not in (a, b):
                    fail(
                        f"X[{i}] {list(x.shape)} and X[0] {list(first.shape)} differ in dim {d} "
                        f"(concat axis is {ax})"
                    )
                elif a == -1:
                    out[d] = b
        return VarInfo(tuple(out), first.dtype)

    def forward(X, axis, xp):
        return xp.concatenate(X, axis=axis)

    def backward(X, Out, Out_grad, axis, xp):
        bounds = list(itertools.accumulate(x.shape[axis] for x in X))[:-1]
        return (xp.split(Out_grad, bounds, axis=axis),)

    double_backward = linear_double(forward)


def _split_sizes(dim: int, num: int, sections: list[int], where: str) -> list[int]:
    """Part sizes along the split axis (-1 where unknown at build time)."""
    if sections:
        if num not in (0, len(sections)):
            fail(f"num={num} disagrees with sections {sections}")
        if sum(1 for s in sections if s == -1) > 1 or any(s < -1 for s in sections):
            fail(f"sections {sections} may hold one -1 and otherwise sizes >= 0")
        if dim < 0:
            return list(sections)
        rest = sum(s for s in sections if s >= 0)
        if -1 in sections:
            if rest > dim:
                fail(f"sections {sections} need more than the {dim} of {where}")
            return [dim - rest if s == -1 else s for s in sections]
        if rest != dim:
            fail(f"sections {sections} sum to {rest}, not to the {dim} of {where}")
        return list(sections)
    if num <= 0:
        fail("split needs num > 0 or a list of sections")
    if dim < 0:
        return [-1] * num
    if dim % num:
        fail(f"the {dim} of {where} does not split into {num} equal parts")
    return [dim // num] * num


@register_op
class split:
    """Out = X cut along `axis` into `num` equal parts or parts of size `sections` (one may be
    -1: the rest)."""

    inputs, outputs = ("X",), ("Out*",)
    grad_no_need_buffer = ("X",)
    attrs = {"num": 0, "sections": [], "axis": -1}

    def infer(X, num, sections, axis):
        ax = _axis(axis, X.ndim, f"X {list(X.shape)}")
        where = f"dim {ax} of X {list(X.shape)}"
        sizes = _split_sizes(X.shape[ax], num, sections, where)
        return [VarInfo(X.shape[:ax] + (s,) + X.shape[ax + 1 :], X.dtype) for s in sizes]

    def forward(X, num, sections, axis, xp):
        ax = axis % X.ndim
        sizes = _split_sizes(X.shape[ax], num, sections, f"dim {ax} of X {list(X.shape)}")
        return xp.split(X, list(itertools.accumulate(sizes))[:-1], axis=ax)

    def backward(X, Out, Out_grad, num, sections, axis, xp):
        # Parts no gradient flows to contribute zeros.
        grads = [xp.zeros_like(o) if g is None else g for o, g in zip(Out, Out_grad or [])]
        grads += [xp.zeros_like(o) for o in Out[len(grads) :]]
        return (xp.concatenate(grads, axis=axis),)


def _slices(shape, axes, starts, ends, where: str) -> list[builtins.slice]:
    """Per-dim Python slices; starts/ends clamp like Python's (negative counts from the end)."""
    if not len(axes) == len(starts) == len(ends):
        raise AttrError(f"axes {axes}, starts {starts} and ends {ends} differ in length")
    index = [builtins.slice(None)] * len(shape)
    seen = set()
    for ax, start, end in zip(axes, starts, ends):
        ax = _axis(ax, len(shape), where)
        if ax in seen:
            fail(f"axes {axes} name dim {ax} twice")
        seen.add(ax)
        index[ax] = builtins.slice(start, end)
    return index


def _sliced_dim(dim: int, s: builtins.slice) -> int:
    if s.start is None:
        return dim
    if dim < 0:
        return -1
    return len(range(*s.indices(dim)))


def decreased_shape(shape: tuple[int, ...], decrease_axis: list[int]) -> tuple[int, ...]:
    """`shape` without the dims in `decrease_axis`, each of which must be 1 (or unknown).
    Dropping every dim gives [1], as Fluid 1.x's slice does (`w[1, 1, 1]` has shape (1,))."""
    drop = set()
    for axis in decrease_axis:
        ax = _axis(axis, len(shape), f"the sliced shape {list(shape)}")
        if shape[ax] not in (1, -1):
            fail(f"decrease_axis {decrease_axis} drops dim {ax} of {list(shape)}, not of size 1")
        drop.add(ax)
    kept = tuple(d for i, d in enumerate(shape) if i not in drop)
    return kept if kept or not drop else (1,)


@register_op
class slice:
    """Out = Input[starts:ends] along each of `axes` (Python slicing rules, step 1); then the
    dims in `decrease_axis` (each of size 1) are dropped, as Input[i] drops one. `infer_flags`
    is accepted for Fluid programs and ignored (starts and ends are always attrs here)."""

    inputs, outputs = ("Input",), ("Out",)
    grad_no_need_buffer = ("Input", "Out")
    attrs = {
        "axes": Required(list),
        "starts": Required(list),
        "ends": Required(list),
        "infer_flags": [],
        "decrease_axis": [],
    }

    def infer(Input, axes, starts, ends, infer_flags, decrease_axis):
        index = _slices(Input.shape, axes, starts, ends, f"Input {list(Input.shape)}")
        shape = tuple(_sliced_dim(d, s) for d, s in zip(Input.shape, index))
        return VarInfo(decreased_shape(shape, decrease_axis), Input.dtype)

    def specialize(Input, axes, starts, ends, infer_flags, decrease_axis, xp):
        # Input[index] bound as a C-level call; a slice keeping every dim (all known when
        # built) whole is Input itself. Views, as forward gives: see reshape.specialize.
        if Input is None or not Input.shape or decrease_axis:
            return None
        index = _slices(Input.shape, axes, starts, ends, "Input")
        if all(d >= 0 and s.indices(d) == (0, d, 1) for d, s in zip(Input.shape, index)):
            return xp.asarray
        return operator.itemgetter(tuple(index))

    def forward(Input, axes, starts, ends, infer_flags, decrease_axis):
        # A view of Input, as NumPy's slicing gives (see reshape.specialize on views).
        out = Input[tuple(_slices(Input.shape, axes, starts, ends, "Input"))]
        return out.reshape(decreased_shape(out.shape, decrease_axis)) if decrease_axis else out

    def backward(Input, Out, Out_grad, axes, starts, ends, infer_flags, decrease_axis, xp):
        grad = xp.zeros(Input.shape, Out_grad.dtype)
        index = tuple(_slices(Input.shape, axes, starts, ends, "Input"))
        grad[index] = Out_grad.reshape(grad[index].shape) if decrease_axis else Out_grad
        return (grad,)

    double_backward = linear_double(forward)


# ---- embedding and dropout ----


def _ids_shape(ids_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Ids [..., 1] (Paddle's column of ids) look up like Ids [...]."""
    return ids_shape[:-1] if len(ids_shape) >= 2 and ids_shape[-1] == 1 else ids_shape


@register_op
class lookup_table:
    """Out = rows of W [vocab, dim] picked by int Ids [...] (or [..., 1]): shape [..., dim].

    Rows looked up with `padding_idx` (-1: none) are zeros and give W no gradient. Ids outside
    [0, vocab) raise ExecutionError. With `is_sparse` W's gradient is a SelectedRows (Fluid's):
    one row per id (repeats kept, their values adding up) holding Out's gradient, ids x dim
    memory instead of the table's. `is_distributed` (Fluid's parameter-server table) must
    stay False.
    """

    inputs, outputs = ("W", "Ids"), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"padding_idx": -1, "is_sparse": False, "is_distributed": False}
    no_grad_inputs = ("Ids",)
    sparse_grad = {"W": "is_sparse"}

    def infer(W, Ids, padding_idx, is_sparse, is_distributed):
        if is_distributed:
            raise AttrError(
                "is_distributed=True needs Fluid's parameter server, which nestflow has not: "
                "use is_sparse=True (with nf.distributed, the gradient is all-reduced dense)"
            )
        if W.ndim != 2:
            fail(f"W must be a [vocab, dim] table, got {list(W.shape)}")
        if np.dtype(Ids.dtype).kind not in "iu":
            raise DTypeError(f"Ids must be an integer tensor (int64), got {Ids.dtype}")
        vocab = W.shape[0]
        if padding_idx != -1 and (padding_idx < 0 or 0 <= vocab <= padding_idx):
            raise AttrError(f"padding_idx {padding_idx} is outside W {list(W.shape)}'s rows")
        return VarInfo(_ids_shape(Ids.shape) + (W.shape[1],), W.dtype)

    def forward(W, Ids, padding_idx, is_sparse, is_distributed, device):
        ids = Ids.reshape(_ids_shape(Ids.shape))
        rows = W.shape[0]

        def message() -> str:
            bad = ids[(ids < 0) | (ids >= rows)]
            return (
                f"Ids hold {bad[:5].tolist()} outside the table's rows [0, {rows}) "
                f"(W {list(W.shape)}, Ids {list(Ids.shape)})"
            )

        # A device wraps bad ids around where they must raise: checked after its run there
        # (DeviceContext.check), on the host at once with two reductions.
        if ids.size and device.defers_checks:
            device.check(((ids < 0) | (ids >= rows)).any(), message)
        elif ids.size and bool((ids.min() < 0) | (ids.max() >= rows)):
            raise ExecutionError(message())
        out = W[ids]
        if padding_idx != -1:
            out[ids == padding_idx] = 0
        return out

    def backward(W, Ids, Out, Out_grad, padding_idx, is_sparse, is_distributed, xp, device):
        ids = Ids.reshape(-1)
        if is_sparse:
            values = Out_grad.reshape(ids.size, W.shape[1])
            if padding_idx != -1:
                values = xp.where((ids == padding_idx)[:, None], xp.zeros((), values.dtype), values)
            return (SelectedRows(ids, values, W.shape[0], check=False),)
        grad = xp.zeros_like(W, dtype=Out_grad.dtype)
        # Repeated ids add up: add.at accumulates where fancy-index assignment would overwrite.
        device.scatter_add(grad, ids, Out_grad.reshape(ids.size, W.shape[1]))
        if padding_idx != -1:
            grad[padding_idx] = 0
        return (grad,)


DROPOUT_IMPLEMENTATIONS = ("downgrade_in_infer", "upscale_in_train")


@register_op
class dropout:
    """Fluid 1.x's dropout. `dropout_implementation` "downgrade_in_infer" (Fluid's default):
    Out = X * Mask in training, X * (1 - p) when `is_test`; "upscale_in_train" (PyTorch's):
    Out = X * Mask / (1 - p) in training, X itself when `is_test`.

    Mask (uint8) marks the kept elements, each kept with probability 1 - dropout_prob; `seed`
    0 draws from the global generator (nf.seed), another value gives the same mask every run.
    """

    inputs, outputs = ("X",), ("Out", "Mask")
    grad_no_need_buffer = ("X", "Out")
    attrs = {
        "dropout_prob": 0.5,
        "is_test": False,
        "seed": 0,
        "dropout_implementation": "downgrade_in_infer",
    }

    def infer(X, dropout_prob, is_test, seed, dropout_implementation):
        if not 0.0 <= dropout_prob <= 1.0:
            raise AttrError(f"dropout_prob must be in [0, 1], got {dropout_prob}")
        if dropout_implementation not in DROPOUT_IMPLEMENTATIONS:
            raise AttrError(
                f"dropout_implementation must be one of {list(DROPOUT_IMPLEMENTATIONS)}, got "
                f"{dropout_implementation!r}"
            )
        return VarInfo(X.shape, X.dtype), VarInfo(X.shape, "uint8")

    def forward(X, dropout_prob, is_test, seed, dropout_implementation, xp, device):
        upscale = dropout_implementation == "upscale_in_train"
        if is_test or dropout_prob == 0.0:
            out = X.copy() if upscale else (X * xp.asarray(1.0 - dropout_prob, X.dtype))
            return out.astype(X.dtype, copy=False), xp.ones(X.shape, np.uint8)
        if dropout_prob == 1.0:
            return xp.zeros_like(X), xp.zeros(X.shape, np.uint8)
        draws = device.random(generator(seed)).random(X.shape)
        mask = (draws >= dropout_prob).astype(np.uint8)
        if not upscale:
            return (X * mask).astype(X.dtype), mask
        return (X * mask * xp.asarray(1.0 / (1.0 - dropout_prob), X.dtype)).astype(X.dtype), mask

    def backward(
        X, Out, Mask, Out_grad, Mask_grad, dropout_prob, is_test, seed, dropout_implementation, xp
    ):
        upscale = dropout_implementation == "upscale_in_train"
        if is_test:
            scale = 1.0 if upscale else 1.0 - dropout_prob
            return ((Out_grad * xp.asarray(scale, Out_grad.dtype)).astype(Out_grad.dtype),)
        if dropout_prob == 1.0:
            return (xp.zeros_like(Out_grad),)
        if not upscale:
            return ((Out_grad * Mask).astype(Out_grad.dtype),)
        scale = xp.asarray(1.0 / (1.0 - dropout_prob), Out_grad.dtype)
        return ((Out_grad * Mask * scale).astype(Out_grad.dtype),)
