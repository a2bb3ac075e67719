"""Arithmetic ops: elementwise binary ops with broadcasting, scale, square, matmul/mul, sum."""

from __future__ import annotations

import functools
import math

import numpy as np

from nestflow.core.device_context import (
    ROW_CHUNK_ELEMENTS,
    device_context,
    may_be_large,
    pooled_ufunc,
)
from nestflow.core.dtype import (
    LOW_PRECISION,
    in_float32,
    is_floating,
    is_low_precision,
    rounded_to,
)
from nestflow.core.selected_rows import SelectedRows
from nestflow.errors import DTypeError
from nestflow.ops.gemm import matmul_tn
from nestflow.ops.registry import (
    VarInfo,
    bilinear_double,
    broadcast_shapes,
    fail,
    linear_double,
    numeric_same_as,
    register_op,
    same_as,
)


def align_y(x_ndim: int, y: np.ndarray, axis: int) -> np.ndarray:
    """Paddle's `axis` rule: Y's dims line up with X's starting at `axis` (-1: NumPy rule)."""
    if axis < 0 or y.ndim == x_ndim:
        return y
    trailing = x_ndim - axis - y.ndim
    return y.reshape(y.shape + (1,) * trailing)


def spread_y(X: np.ndarray, Y: np.ndarray, axis: int, xp) -> np.ndarray:
    """align_y's Y for a binary ufunc with X. Where Y lines up with X's middle axes and X's
    trailing axes stretch it (a conv bias [C] at axis 1 of [N, C, H, W]), NumPy gets Y spread
    over those axes ([C, H, W]): the ufunc then runs one contiguous loop per leading index
    instead of one per row with a scalar, about twice as fast (X + bias over [32, 64, 32, 32]:
    418 -> 217 us on the 2-vCPU EPYC, the spread included; batch_norm's per-channel operands:
    its fwd + bwd 1.4-2.3x faster on ResNet-18's shapes). The values are the same."""
    y = align_y(X.ndim, Y, axis)
    if xp is not np or axis <= 0 or y.ndim != X.ndim - axis or y.ndim == Y.ndim:
        return y
    if Y.shape != X.shape[axis : axis + Y.ndim] or math.prod(X.shape[axis + Y.ndim :]) < 8:
        return y
    spread = np.empty(X.shape[axis:], Y.dtype)
    spread[...] = y
    return spread


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum `grad` over the dims broadcasting added or stretched, giving an array of `shape`."""
    if grad.shape != shape:
        extra = grad.ndim - len(shape)
        axes = tuple(range(extra)) + tuple(
            i + extra for i, d in enumerate(shape) if d == 1 and grad.shape[i + extra] != 1
        )
        summed = _summed_around(grad, axes)
        if summed is None:
            summed = grad.sum(axis=axes, keepdims=True) if axes else grad
        grad = summed.reshape(shape)
    # NumPy turns 0-d results into scalars; kernels must hand back arrays (CuPy's are).
    return np.asarray(grad) if isinstance(grad, np.generic) else grad


def _summed_around(grad, axes: tuple[int, ...]):
    """grad summed over `axes` where they are some leading and some trailing axes around a
    kept middle (a conv bias's gradient: [N, C, H, W] -> [C]) and grad is a NumPy float
    array: each row of trailing elements by one dot product with ones, then the leading
    rows added (vecdot: no temporary; 293 -> 94 us over [32, 64, 32, 32] against
    sum(axis=(0, 2, 3)) on the 2-vCPU EPYC). None elsewhere."""
    if type(grad) is not np.ndarray or grad.dtype.kind != "f" or not axes:
        return None
    lead = 0
    while lead < len(axes) and axes[lead] == lead:
        lead += 1
    trail = axes[lead:]
    # (only leading axes: sum(axis=0) is already one contiguous pass)
    if not trail or not grad.size or trail != tuple(range(grad.ndim - len(trail), grad.ndim)):
        return None
    width = math.prod(grad.shape[grad.ndim - len(trail) :])
    rows = grad.reshape(math.prod(grad.shape[:lead]), -1, width)
    return np.vecdot(rows, np.ones(width, grad.dtype)).sum(axis=0)


def _infer_binary(X: VarInfo, Y: VarInfo, axis: int) -> VarInfo:
    if X.dtype != Y.dtype:
        raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
    y_shape = Y.shape
    if 0 <= axis and len(Y.shape) < len(X.shape):
        if axis + len(Y.shape) > len(X.shape):
            fail(f"axis={axis} puts Y {list(Y.shape)} past the end of X {list(X.shape)}")
        y_shape = Y.shape + (1,) * (len(X.shape) - axis - len(Y.shape))
    return VarInfo(broadcast_shapes(X.shape, y_shape), X.dtype)


def _ufunc_when_aligned(ufunc: str):
    """specialize() for a binary op: when Y already lines up with X's trailing dims and the
    result is not 0-d (where ufuncs return NumPy scalars), the place's ufunc is the kernel
    (on the CPU's pool for float X that may be large: pooled_ufunc)."""

    def specialize(X, Y, axis, xp):
        if X is None or Y is None or X.ndim == 0:
            return None
        if axis == -1 or axis + Y.ndim == X.ndim:
            if xp is np and is_floating(X.dtype) and may_be_large(X):
                return pooled_ufunc(getattr(np, ufunc))
            return getattr(xp, ufunc)
        return None

    return specialize


@register_op
class elementwise_add:
    """Out = X + Y with broadcasting."""

    inputs, outputs = ("X", "Y"), ("Out",)
    grad_no_need_buffer = ("X", "Y", "Out")
    attrs = {"axis": -1}
    infer = _infer_binary
    specialize = _ufunc_when_aligned("add")
    inplace = {"Out": "X"}

    def forward(X, Y, axis, xp):
        return xp.asarray(X + spread_y(X, Y, axis, xp))

    def backward(X, Y, Out, Out_grad, axis):
        if X.shape == Y.shape == Out_grad.shape and X.ndim:  # no broadcasting (an RNN step)
            return Out_grad, Out_grad
        y_shape = align_y(X.ndim, Y, axis).shape
        return unbroadcast(Out_grad, X.shape), unbroadcast(Out_grad, y_shape).reshape(Y.shape)

    double_backward = linear_double(forward, inputs=2)


@register_op
class elementwise_sub:
    """Out = X - Y with broadcasting."""

    inputs, outputs = ("X", "Y"), ("Out",)
    grad_no_need_buffer = ("X", "Y", "Out")
    attrs = {"axis": -1}
    infer = _infer_binary
    specialize = _ufunc_when_aligned("subtract")
    inplace = {"Out": "X"}

    def forward(X, Y, axis, xp):
        return xp.asarray(X - spread_y(X, Y, axis, xp))

    def backward(X, Y, Out, Out_grad, axis):
        y_shape = align_y(X.ndim, Y, axis).shape
        return unbroadcast(Out_grad, X.shape), unbroadcast(-Out_grad, y_shape).reshape(Y.shape)

    double_backward = linear_double(forward, inputs=2)


@register_op
class elementwise_mul:
    """Out = X * Y with broadcasting."""

    inputs, outputs = ("X", "Y"), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"axis": -1}
    infer = _infer_binary
    specialize = _ufunc_when_aligned("multiply")
    inplace = {"Out": "X"}

    def forward(X, Y, axis, xp):
        return xp.asarray(X * spread_y(X, Y, axis, xp))

    def backward(X, Y, Out, Out_grad, axis):
        y = align_y(X.ndim, Y, axis)
        return (
            unbroadcast(Out_grad * y, X.shape),
            unbroadcast(Out_grad * X, y.shape).reshape(Y.shape),
        )

    double_grad = ("X", "Y", "Out@GRAD")

    def double_backward(X, Y, Out, Out_grad, dX, dY, ddX, ddY, axis, xp, needs=(True,) * 3):
        def product(a, b):
            return elementwise_mul.forward(a, b, axis, xp)

        def grads(a, b, g, _needs):
            return elementwise_mul.backward(a, b, None, g, axis)

        return bilinear_double(product, grads, X, Y, Out_grad, ddX, ddY, needs, xp)


_divide_when_aligned = _ufunc_when_aligned("divide")


@register_op
class elementwise_div:
    """Out = X / Y with broadcasting. Out has X's dtype: integers divide truncating toward
    zero (Paddle's integer kernel; `x / 2` on an int variable gives the same)."""

    inputs, outputs = ("X", "Y"), ("Out",)
    attrs = {"axis": -1}
    infer = _infer_binary
    inplace = {"Out": "X"}

    def specialize(X, Y, axis, xp):
        if X is not None and np.dtype(X.dtype).kind in "iu":
            return None  # divide would give floats
        return _divide_when_aligned(X, Y, axis, xp)

    def forward(X, Y, axis, xp):
        y = spread_y(X, Y, axis, xp)
        if X.dtype.kind in "iu":
            return xp.asarray((X - xp.fmod(X, y)) // y)
        return xp.asarray(X / y)

    def backward(X, Y, Out, Out_grad, axis):
        y = align_y(X.ndim, Y, axis)
        return (
            unbroadcast(Out_grad / y, X.shape),
            unbroadcast(-Out_grad * Out / y, y.shape).reshape(Y.shape),
        )

    double_grad = ("Y", "Out", "Out@GRAD")

    def double_backward(X, Y, Out, Out_grad, dX, dY, ddX, ddY, axis, xp, needs=(True,) * 3):
        # dX = dOut / y, dY = -dOut * Out / y (both summed back to their shapes).
        y = align_y(X.ndim, Y, axis)
        ddy = None if ddY is None else align_y(X.ndim, ddY, axis)
        zeros = xp.zeros(Out_grad.shape, Out_grad.dtype)
        d_y = d_out = dd_out = None
        if needs[0]:
            total = zeros
            if ddX is not None:
                total = total - ddX * Out_grad / (y * y)
            if ddy is not None:
                total = total + ddy * Out_grad * Out / (y * y)
            d_y = unbroadcast(total, y.shape).reshape(Y.shape)
        if needs[1]:
            d_out = zeros if ddy is None else unbroadcast(zeros - ddy * Out_grad / y, Out.shape)
        if needs[2]:
            dd_out = zeros
            if ddX is not None:
                dd_out = dd_out + ddX / y
            if ddy is not None:
                dd_out = dd_out - ddy * Out / y
        return d_y, d_out, dd_out


def _routed(grad, to_x, x, y, Y, xp):
    """Out_grad sent to X where `to_x` holds and to Y (aligned as `y`) elsewhere, each summed
    back to its own shape."""
    zero = xp.zeros((), grad.dtype)
    dx = unbroadcast(xp.where(to_x, grad, zero), x.shape)
    dy = unbroadcast(xp.where(to_x, zero, grad), y.shape).reshape(Y.shape)
    return dx, dy


@register_op
class elementwise_max:
    """Out = max(X, Y) with broadcasting (NaN wins). The gradient goes to X where X > Y and to
    Y elsewhere: a tie gives it all to Y, as Fluid's kernel does."""

    inputs, outputs = ("X", "Y"), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"axis": -1}
    infer = _infer_binary
    specialize = _ufunc_when_aligned("maximum")
    inplace = {"Out": "X"}

    def forward(X, Y, axis, xp):
        return xp.asarray(xp.maximum(X, spread_y(X, Y, axis, xp)))

    def backward(X, Y, Out, Out_grad, axis, xp):
        y = align_y(X.ndim, Y, axis)
        return _routed(Out_grad, X > y, X, y, Y, xp)


@register_op
class elementwise_min:
    """Out = min(X, Y) with broadcasting (NaN wins). The gradient goes to X where X < Y and to
    Y elsewhere: a tie gives it all to Y, as Fluid's kernel does."""

    inputs, outputs = ("X", "Y"), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"axis": -1}
    infer = _infer_binary
    specialize = _ufunc_when_aligned("minimum")
    inplace = {"Out": "X"}

    def forward(X, Y, axis, xp):
        return xp.asarray(xp.minimum(X, spread_y(X, Y, axis, xp)))

    def backward(X, Y, Out, Out_grad, axis, xp):
        y = align_y(X.ndim, Y, axis)
        return _routed(Out_grad, X < y, X, y, Y, xp)


def _infer_numeric_binary(X: VarInfo, Y: VarInfo, axis: int) -> VarInfo:
    if X.dtype == "bool":
        raise DTypeError("X and Y are bool, which power's arithmetic does not keep; cast them")
    return _infer_binary(X, Y, axis)


@register_op
class elementwise_pow:
    """Out = X ** Y with broadcasting. dX = Y * X ** (Y - 1), dY = ln(X) * X ** Y (NaN for
    X < 0, as Fluid's). Integers raised to negative integers fail when run, as in NumPy."""

    inputs, outputs = ("X", "Y"), ("Out",)
    attrs = {"axis": -1}
    infer = _infer_numeric_binary
    specialize = _ufunc_when_aligned("power")
    inplace = {"Out": "X"}

    def forward(X, Y, axis, xp):
        return xp.asarray(xp.power(X, spread_y(X, Y, axis, xp)))

    def backward(X, Y, Out, Out_grad, axis, xp, needs=(True, True)):
        y = align_y(X.ndim, Y, axis)
        dx = dy = None
        if needs[0]:
            dx = unbroadcast(Out_grad * y * xp.power(X, y - 1), X.shape)
        if needs[1]:
            with np.errstate(divide="ignore", invalid="ignore"):
                dy = unbroadcast(Out_grad * xp.log(X) * Out, y.shape).reshape(Y.shape)
        return dx, dy


@register_op
class scale:
    """Out = scale * X + bias (or scale * (X + bias) when bias_after_scale is False)."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("X", "Out")
    attrs = {"scale": 1.0, "bias": 0.0, "bias_after_scale": True}
    infer = same_as(0)
    inplace = {"Out": "X"}

    def specialize(X, scale, bias, bias_after_scale, xp):
        # Float X only: its kernel needs no cast back to X's dtype. The factors are 0-d arrays
        # of X's dtype: given Python floats, a ufunc resolves the operand types on every call,
        # which doubles its cost on small arrays.
        if X is None or not X.ndim or np.dtype(X.dtype).kind != "f":
            return None
        factor, shift = xp.asarray(scale, X.dtype), xp.asarray(bias, X.dtype)
        if bias == 0.0:
            return functools.partial(xp.multiply, factor)

        def scaled_then_shifted(X, out=None):
            out = xp.multiply(X, factor, out=out)
            return xp.add(out, shift, out=out)

        def shifted_then_scaled(X, out=None):
            out = xp.add(X, shift, out=out)
            return xp.multiply(out, factor, out=out)

        return scaled_then_shifted if bias_after_scale else shifted_then_scaled

    def forward(X, scale, bias, bias_after_scale, xp):
        out = X * scale + bias if bias_after_scale else (X + bias) * scale
        return xp.asarray(out, X.dtype)

    def backward(X, Out, Out_grad, scale, bias, bias_after_scale, xp):
        return (xp.asarray(Out_grad * scale, X.dtype),)

    def double_backward(X, Out, Out_grad, dX, ddX, scale, bias, bias_after_scale, xp):
        return (xp.asarray(ddX * scale, X.dtype),)


@register_op
class square:
    """Out = X * X."""

    inputs, outputs = ("X",), ("Out",)
    grad_no_need_buffer = ("Out",)
    infer = numeric_same_as(0)

    def forward(X, xp):
        return xp.asarray(xp.square(X))

    def backward(X, Out, Out_grad, xp):
        return (xp.asarray(Out_grad * (X + X)),)

    double_grad = ("X", "Out@GRAD")

    def double_backward(X, Out, Out_grad, dX, ddX, xp):
        return xp.asarray(2 * Out_grad * ddX), xp.asarray(2 * X * ddX)


def _as_matrix(shape: tuple[int, ...], vector_as_row: bool) -> tuple[int, ...]:
    """A 1-D operand as a matrix (Fluid's rule): X [K] is a row [1, K], Y [K] a column
    [K, 1]; any other shape is kept."""
    if len(shape) != 1:
        return tuple(shape)
    return (1, shape[0]) if vector_as_row else (shape[0], 1)


def _transposed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[:-2] + (shape[-1], shape[-2])


def _squeeze_vectors(full: tuple[int, ...], x_vector: bool, y_vector: bool) -> tuple[int, ...]:
    """Out's shape from the matrix product's `full` shape (Fluid's matmul InferShape): a 1-D X
    drops the row dim when it is 1, a 1-D Y the column dim when it is 1; nothing left is [1]."""
    out = list(full)
    if x_vector and out[-2] == 1:
        del out[-2]
    if y_vector and out[-1] == 1:
        del out[-1]
    return tuple(out) or (1,)


@register_op
class matmul:
    """Out = alpha * op(X) @ op(Y), batched over the leading dims (NumPy broadcasting), op
    transposing the last two dims when transpose_X / transpose_Y is set.

    A 1-D operand follows Fluid: X [K] is the row [1, K] (with transpose_X the column [K, 1]),
    Y [K] the column [K, 1] (with transpose_Y the row [1, K]); Out then drops the row dim of a
    1-D X and the column dim of a 1-D Y where that dim is 1, and two vectors give [1]:
    [K] @ [K] -> [1], [K] @ [K, N] -> [N], [M] (transpose_X) @ [1, N] -> [M, N].
    """

    inputs, outputs = ("X", "Y"), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"transpose_X": False, "transpose_Y": False, "alpha": 1.0}

    def infer(X, Y, transpose_X, transpose_Y, alpha):
        if X.dtype != Y.dtype:
            raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
        if not X.shape or not Y.shape:
            fail(f"matmul needs at least 1-D inputs, got {list(X.shape)} and {list(Y.shape)}")
        x = _as_matrix(X.shape, vector_as_row=True)
        y = _as_matrix(Y.shape, vector_as_row=False)
        x = _transposed(x) if transpose_X else x
        y = _transposed(y) if transpose_Y else y
        if x[-1] != y[-2] and -1 not in (x[-1], y[-2]):
            fail(
                f"inner dims differ: X {list(X.shape)} (k={x[-1]}) and Y {list(Y.shape)} "
                f"(k={y[-2]}) with transpose_X={transpose_X}, transpose_Y={transpose_Y}"
            )
        batch = broadcast_shapes(x[:-2], y[:-2], "batch dims of X and Y")
        full = batch + (x[-2], y[-1])
        return VarInfo(_squeeze_vectors(full, len(X.shape) == 1, len(Y.shape) == 1), X.dtype)

    def specialize(X, Y, transpose_X, transpose_Y, alpha, xp):
        # A plain product of two matrices (an RNN step's h @ W): the BLAS call alone.
        if X is None or Y is None or (X.ndim, Y.ndim) != (2, 2) or X.dtype in LOW_PRECISION:
            return None
        return xp.matmul if not (transpose_X or transpose_Y) and alpha == 1.0 else None

    def forward(X, Y, transpose_X, transpose_Y, alpha, xp):
        if is_low_precision(X.dtype):
            # summed in float32 and rounded once, as conv2d: NumPy's float16 product is a
            # scalar loop, and CuPy 14.2 has no batched bfloat16 one
            wide = matmul.forward(in_float32(X), in_float32(Y), transpose_X, transpose_Y, alpha, xp)
            return rounded_to(wide, X.dtype)
        x = X.reshape(_as_matrix(X.shape, True)) if X.ndim == 1 else X
        y = Y.reshape(_as_matrix(Y.shape, False)) if Y.ndim == 1 else Y
        x = xp.swapaxes(x, -1, -2) if transpose_X else x
        y = xp.swapaxes(y, -1, -2) if transpose_Y else y
        out = xp.matmul(x, y)
        if alpha != 1.0:
            out = out * xp.asarray(alpha, out.dtype)
        if X.ndim == 1 or Y.ndim == 1:
            out = out.reshape(_squeeze_vectors(out.shape, X.ndim == 1, Y.ndim == 1))
        return xp.asarray(out)

    def backward(X, Y, Out, Out_grad, transpose_X, transpose_Y, alpha, xp, needs=(True, True)):
        if is_low_precision(X.dtype):  # as forward
            wide = (in_float32(X), in_float32(Y), Out, in_float32(Out_grad))
            dx, dy = matmul.backward(*wide, transpose_X, transpose_Y, alpha, xp, needs)
            return rounded_to(dx, X.dtype), rounded_to(dy, Y.dtype)
        if X.ndim == Y.ndim == 2 and not (transpose_X or transpose_Y) and alpha == 1.0:
            # The common matrix product: its two BLAS calls and nothing else (an RNN step).
            dx = Out_grad @ Y.T if needs[0] else None
            dy = matmul_tn(X, Out_grad) if needs[1] else None
            return dx, dy
        # Work in the matrix form, then undo the vector promotions and broadcasting.
        x = X.reshape(_as_matrix(X.shape, True))
        y = Y.reshape(_as_matrix(Y.shape, False))
        xt = xp.swapaxes(x, -1, -2) if transpose_X else x
        yt = xp.swapaxes(y, -1, -2) if transpose_Y else y
        batch = np.broadcast_shapes(xt.shape[:-2], yt.shape[:-2])
        g = Out_grad.reshape(batch + (xt.shape[-2], yt.shape[-1]))
        if alpha != 1.0:
            g = g * xp.asarray(alpha, g.dtype)
        dx = dy = None
        # A transposed operand's gradient is computed in its own layout (yt @ g^T, not the
        # transpose of g @ yt^T): a transposed view would reach the optimizer, whose
        # elementwise update beside the C-contiguous parameter reads it across its rows.
        if needs[0]:
            if transpose_X:
                dx = xp.matmul(yt, xp.swapaxes(g, -1, -2))
            else:
                dx = xp.matmul(g, xp.swapaxes(yt, -1, -2))
            dx = unbroadcast(dx, x.shape).reshape(X.shape)
        if needs[1]:
            if transpose_Y:
                dy = xp.matmul(xp.swapaxes(g, -1, -2), xt)
            else:
                dy = xp.matmul(xp.swapaxes(xt, -1, -2), g)
            dy = unbroadcast(dy, y.shape).reshape(Y.shape)
        return dx, dy

    double_grad = ("X", "Y", "Out@GRAD")

    def double_backward(
        X,
        Y,
        Out,
        Out_grad,
        dX,
        dY,
        ddX,
        ddY,
        transpose_X,
        transpose_Y,
        alpha,
        xp,
        needs=(True,) * 3,
    ):
        def product(a, b):
            return matmul.forward(a, b, transpose_X, transpose_Y, alpha, xp)

        def grads(a, b, g, wanted):
            return matmul.backward(a, b, None, g, transpose_X, transpose_Y, alpha, xp, wanted)

        return bilinear_double(product, grads, X, Y, Out_grad, ddX, ddY, needs, xp)


def _flat2d(shape, num_col_dims):
    return math.prod(shape[:num_col_dims]), math.prod(shape[num_col_dims:])


@register_op
class mul:
    """Out = flatten(X) @ flatten(Y): X flattened to 2-D at x_num_col_dims, Y at y_num_col_dims
    (the fc op's product; Out keeps X's leading dims and Y's trailing dims)."""

    inputs, outputs = ("X", "Y"), ("Out",)
    grad_no_need_buffer = ("Out",)
    attrs = {"x_num_col_dims": 1, "y_num_col_dims": 1}

    def infer(X, Y, x_num_col_dims, y_num_col_dims):
        if X.dtype != Y.dtype:
            raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
        # Rank 0 is how a Net declares a variable whose shape it does not know yet.
        if (
            X.ndim
            and Y.ndim
            and not (0 < x_num_col_dims <= X.ndim and 0 < y_num_col_dims <= Y.ndim)
        ):
            fail(
                f"x_num_col_dims={x_num_col_dims} / y_num_col_dims={y_num_col_dims} must lie in "
                f"[1, rank] for X {list(X.shape)} and Y {list(Y.shape)}"
            )
        x_inner = X.shape[x_num_col_dims:]
        y_inner = Y.shape[:y_num_col_dims]
        if -1 not in x_inner + y_inner and int(np.prod(x_inner)) != int(np.prod(y_inner)):
            fail(
                f"X {list(X.shape)} flattened at dim {x_num_col_dims} has "
                f"{int(np.prod(x_inner))} columns but Y {list(Y.shape)} has "
                f"{int(np.prod(y_inner))} rows"
            )
        return VarInfo(X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:], X.dtype)

    def specialize(X, Y, x_num_col_dims, y_num_col_dims, xp):
        # A matrix times a matrix needs no flattening: the BLAS call alone.
        if (
            X is None
            or Y is None
            or (X.ndim, Y.ndim, x_num_col_dims, y_num_col_dims) != (2, 2, 1, 1)
        ):
            return None
        return xp.matmul

    def forward(X, Y, x_num_col_dims, y_num_col_dims):
        out = X.reshape(_flat2d(X.shape, x_num_col_dims)) @ Y.reshape(
            _flat2d(Y.shape, y_num_col_dims)
        )
        return out.reshape(X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:])

    def backward(X, Y, Out, Out_grad, x_num_col_dims, y_num_col_dims, needs=(True, True)):
        if X.ndim == Y.ndim == 2 and x_num_col_dims == y_num_col_dims == 1:
            dx = Out_grad @ Y.T if needs[0] else None
            dy = matmul_tn(X, Out_grad) if needs[1] else None
            return dx, dy
        x2 = X.reshape(_flat2d(X.shape, x_num_col_dims))
        y2 = Y.reshape(_flat2d(Y.shape, y_num_col_dims))
        g2 = Out_grad.reshape(x2.shape[0], y2.shape[1])
        dx = (g2 @ y2.T).reshape(X.shape) if needs[0] else None
        dy = matmul_tn(x2, g2).reshape(Y.shape) if needs[1] else None
        return dx, dy

    double_grad = ("X", "Y", "Out@GRAD")

    def double_backward(
        X, Y, Out, Out_grad, dX, dY, ddX, ddY, x_num_col_dims, y_num_col_dims, xp, needs=(True,) * 3
    ):
        def product(a, b):
            return mul.forward(a, b, x_num_col_dims, y_num_col_dims)

        def grads(a, b, g, wanted):
            return mul.backward(a, b, None, g, x_num_col_dims, y_num_col_dims, wanted)

        return bilinear_double(product, grads, X, Y, Out_grad, ddX, ddY, needs, xp)


@register_op
class sum:
    """Out = X[0] + X[1] + ... (how several gradient contributions are added up). SelectedRows
    inputs (sparse gradients) add up to a SelectedRows holding all their rows when every input
    is one, else they are added into the dense sum (Fluid's sum)."""

    inputs, outputs = ("X*",), ("Out",)
    grad_no_need_buffer = ("Out",)

    def infer_op(op):
        block = op.block
        xs = [block.find_var(n) for n in op.input("X") if n]
        info = sum.infer([VarInfo(tuple(v.shape), v.dtype) for v in xs])
        for name in op.output("Out"):
            if name:
                out = block.find_var(name) or block.create_var(name)
                out.shape, out.dtype = info.shape, info.dtype
                if all(v.type == "selected_rows" for v in xs):
                    out.type = "selected_rows"

    def infer(X):
        if not X:
            fail("sum needs at least one input")
        shape = X[0].shape
        for other in X[1:]:
            if other.dtype != X[0].dtype:
                raise DTypeError(f"inputs of sum differ in dtype: {X[0].dtype} and {other.dtype}")
            shape = broadcast_shapes(shape, other.shape, "inputs of sum")
        return VarInfo(shape, X[0].dtype)

    def forward(X, xp, device=None):
        if any(isinstance(x, SelectedRows) for x in X):
            return _sum_with_rows(X, xp, device or device_context())
        if xp is np and getattr(X[0], "size", 0) >= 2 * ROW_CHUNK_ELEMENTS and _pooled_sum(X):
            return device_context().map_rows(_add_all, np.empty_like(X[0]), *X)
        out = X[0]
        for x in X[1:]:
            out = out + x
        if len(X) == 1:
            return out.copy()
        # A tensor array's gradient (a list, ArrayGrad) stays a list; 0-d sums become arrays.
        return out if isinstance(out, list) else xp.asarray(out)

    def backward(X, Out, Out_grad):
        return ([unbroadcast(Out_grad, x.shape) for x in X],)

    double_backward = linear_double(forward)


def _pooled_sum(X) -> bool:
    """Whether sum's dense arrays are alike and large enough for the CPU's pool (a gradient
    summed over the ops that read a large activation)."""
    first = X[0]
    return (
        len(X) > 1
        and isinstance(first, np.ndarray)
        and all(
            type(x) is np.ndarray and x.shape == first.shape and x.dtype == first.dtype for x in X
        )
    )


def _add_all(*X: np.ndarray, out: np.ndarray) -> np.ndarray:
    """X[0] + X[1] + ... in that order (sum's own), into out."""
    np.add(X[0], X[1], out=out)
    for x in X[2:]:
        np.add(out, x, out=out)
    return out


def _sum_with_rows(X, xp, device):
    """sum's kernel when some of X are SelectedRows: their rows joined when all are, else
    scatter-added into the sum of the dense ones."""
    rows = [x for x in X if isinstance(x, SelectedRows)]
    dense = [x for x in X if not isinstance(x, SelectedRows)]
    if not dense:
        return SelectedRows(
            xp.concatenate([x.rows for x in rows]),
            xp.concatenate([x.values for x in rows]),
            rows[0].height,
            check=False,
        )
    out = dense[0].copy()
    for x in dense[1:]:
        out = out + x
    out = xp.asarray(out)
    for x in rows:
        device.scatter_add(out, x.rows, x.values.astype(out.dtype, copy=False))
    return out
