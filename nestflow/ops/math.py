"""Arithmetic ops: elementwise binary ops with broadcasting, scale, square, matmul/mul, sum."""

from __future__ import annotations

import functools

import numpy as np

from nestflow.errors import DTypeError
from nestflow.ops.registry import (
    VarInfo,
    broadcast_shapes,
    fail,
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


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum `grad` over the dims broadcasting added or stretched, giving an array of `shape`."""
    if grad.shape != shape:
        extra = grad.ndim - len(shape)
        axes = tuple(range(extra)) + tuple(
            i + extra for i, d in enumerate(shape) if d == 1 and grad.shape[i + extra] != 1
        )
        grad = (grad.sum(axis=axes, keepdims=True) if axes else grad).reshape(shape)
    # NumPy turns 0-d results into scalars; kernels must hand back arrays.
    return np.asarray(grad)


def _infer_binary(X: VarInfo, Y: VarInfo, axis: int) -> VarInfo:
    if X.dtype != Y.dtype:
        raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
    y_shape = Y.shape
    if 0 <= axis and len(Y.shape) < len(X.shape):
        if axis + len(Y.shape) > len(X.shape):
            fail(f"axis={axis} puts Y {list(Y.shape)} past the end of X {list(X.shape)}")
        y_shape = Y.shape + (1,) * (len(X.shape) - axis - len(Y.shape))
    return VarInfo(broadcast_shapes(X.shape, y_shape), X.dtype)


def _ufunc_when_aligned(ufunc):
    """specialize() for a binary op: when Y already lines up with X's trailing dims and the
    result is not 0-d (where ufuncs return NumPy scalars), the ufunc itself is the kernel."""

    def specialize(X, Y, axis):
        if X is None or Y is None or X.ndim == 0:
            return None
        if axis == -1 or axis + Y.ndim == X.ndim:
            return ufunc
        return None

    return specialize


@register_op
class elementwise_add:
    """Out = X + Y with broadcasting."""

    inputs, outputs = ("X", "Y"), ("Out",)
    attrs = {"axis": -1}
    infer = _infer_binary
    specialize = _ufunc_when_aligned(np.add)
    inplace = {"Out": "X"}

    def forward(X, Y, axis):
        return np.asarray(X + align_y(X.ndim, Y, axis))

    def backward(X, Y, Out, Out_grad, axis):
        y_shape = align_y(X.ndim, Y, axis).shape
        return unbroadcast(Out_grad, X.shape), unbroadcast(Out_grad, y_shape).reshape(Y.shape)


@register_op
class elementwise_sub:
    """Out = X - Y with broadcasting."""

    inputs, outputs = ("X", "Y"), ("Out",)
    attrs = {"axis": -1}
    infer = _infer_binary
    specialize = _ufunc_when_aligned(np.subtract)
    inplace = {"Out": "X"}

    def forward(X, Y, axis):
        return np.asarray(X - align_y(X.ndim, Y, axis))

    def backward(X, Y, Out, Out_grad, axis):
        y_shape = align_y(X.ndim, Y, axis).shape
        return unbroadcast(Out_grad, X.shape), unbroadcast(-Out_grad, y_shape).reshape(Y.shape)


@register_op
class elementwise_mul:
    """Out = X * Y with broadcasting."""

    inputs, outputs = ("X", "Y"), ("Out",)
    attrs = {"axis": -1}
    infer = _infer_binary
    specialize = _ufunc_when_aligned(np.multiply)
    inplace = {"Out": "X"}

    def forward(X, Y, axis):
        return np.asarray(X * align_y(X.ndim, Y, axis))

    def backward(X, Y, Out, Out_grad, axis):
        y = align_y(X.ndim, Y, axis)
        return (
            unbroadcast(Out_grad * y, X.shape),
            unbroadcast(Out_grad * X, y.shape).reshape(Y.shape),
        )


_divide_when_aligned = _ufunc_when_aligned(np.divide)


@register_op
class elementwise_div:
    """Out = X / Y with broadcasting. Out has X's dtype: integers divide truncating toward
    zero (Paddle's integer kernel; `x / 2` on an int variable gives the same)."""

    inputs, outputs = ("X", "Y"), ("Out",)
    attrs = {"axis": -1}
    infer = _infer_binary
    inplace = {"Out": "X"}

    def specialize(X, Y, axis):
        if X is not None and np.dtype(X.dtype).kind in "iu":
            return None  # np.divide would give floats
        return _divide_when_aligned(X, Y, axis)

    def forward(X, Y, axis):
        y = align_y(X.ndim, Y, axis)
        if X.dtype.kind in "iu":
            return np.asarray((X - np.fmod(X, y)) // y)
        return np.asarray(X / y)

    def backward(X, Y, Out, Out_grad, axis):
        y = align_y(X.ndim, Y, axis)
        return (
            unbroadcast(Out_grad / y, X.shape),
            unbroadcast(-Out_grad * Out / y, y.shape).reshape(Y.shape),
        )


@register_op
class scale:
    """Out = scale * X + bias (or scale * (X + bias) when bias_after_scale is False)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"scale": 1.0, "bias": 0.0, "bias_after_scale": True}
    infer = same_as(0)

    def specialize(X, scale, bias, bias_after_scale):
        # A float array keeps its dtype under a Python-float factor: no cast back needed.
        if X is None or not X.ndim or np.dtype(X.dtype).kind != "f":
            return None
        if bias == 0.0:
            return functools.partial(np.multiply, float(scale))
        scale, bias = float(scale), float(bias)

        def scaled_then_shifted(X):
            out = np.multiply(X, scale)
            return np.add(out, bias, out=out)

        def shifted_then_scaled(X):
            out = np.add(X, bias)
            return np.multiply(out, scale, out=out)

        return scaled_then_shifted if bias_after_scale else shifted_then_scaled

    def forward(X, scale, bias, bias_after_scale):
        out = X * scale + bias if bias_after_scale else (X + bias) * scale
        return np.asarray(out, X.dtype)

    def backward(X, Out, Out_grad, scale, bias, bias_after_scale):
        return (np.asarray(Out_grad * scale, X.dtype),)


@register_op
class square:
    """Out = X * X."""

    inputs, outputs = ("X",), ("Out",)
    infer = numeric_same_as(0)

    def forward(X):
        return np.asarray(np.square(X))

    def backward(X, Out, Out_grad):
        return (np.asarray(Out_grad * (X + X)),)


def _matmul_shapes(x, y, transpose_X, transpose_Y):
    """Both shapes in >= 2-D form, transposed; a 1-D operand is never transposed."""
    if transpose_X and len(x) > 1:
        x = x[:-2] + (x[-1], x[-2])
    if transpose_Y and len(y) > 1:
        y = y[:-2] + (y[-1], y[-2])
    if len(x) == 1:
        x = (1,) + tuple(x)
    if len(y) == 1:
        y = tuple(y) + (1,)
    return x, y


@register_op
class matmul:
    """Out = X @ Y (batched, NumPy rules), with optional transposes of the last two dims."""

    inputs, outputs = ("X", "Y"), ("Out",)
    attrs = {"transpose_X": False, "transpose_Y": False, "alpha": 1.0}

    def infer(X, Y, transpose_X, transpose_Y, alpha):
        if X.dtype != Y.dtype:
            raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
        if not X.shape or not Y.shape:
            fail(f"matmul needs at least 1-D inputs, got {list(X.shape)} and {list(Y.shape)}")
        x, y = _matmul_shapes(X.shape, Y.shape, transpose_X, transpose_Y)
        if x[-1] != y[-2] and -1 not in (x[-1], y[-2]):
            fail(
                f"inner dims differ: X {list(X.shape)} (k={x[-1]}) and Y {list(Y.shape)} "
                f"(k={y[-2]})"
            )
        batch = broadcast_shapes(x[:-2], y[:-2], "batch dims of X and Y")
        out = batch + (x[-2], y[-1])
        if len(X.shape) == 1:
            out = out[:-2] + out[-1:]
        if len(Y.shape) == 1:
            out = out[:-1]
        return VarInfo(out, X.dtype)

    def forward(X, Y, transpose_X, transpose_Y, alpha):
        x = np.swapaxes(X, -1, -2) if transpose_X and X.ndim > 1 else X
        y = np.swapaxes(Y, -1, -2) if transpose_Y and Y.ndim > 1 else Y
        out = np.asarray(np.matmul(x, y))
        return np.asarray(out * np.asarray(alpha, out.dtype)) if alpha != 1.0 else out

    def backward(X, Y, Out, Out_grad, transpose_X, transpose_Y, alpha, needs=(True, True)):
        if X.ndim == Y.ndim == 2 and not (transpose_X or transpose_Y) and alpha == 1.0:
            # The common matrix product: its two BLAS calls and nothing else (an RNN step).
            dx = Out_grad @ Y.T if needs[0] else None
            dy = X.T @ Out_grad if needs[1] else None
            return dx, dy
        # Work in the >= 2-D form, then undo the 1-D promotions and broadcasting.
        x = X.reshape((1,) + X.shape) if X.ndim == 1 else X
        y = Y.reshape(Y.shape + (1,)) if Y.ndim == 1 else Y
        g = Out_grad * np.asarray(alpha, Out_grad.dtype) if alpha != 1.0 else Out_grad
        if Y.ndim == 1:  # first: for two vectors g is 0-d
            g = np.expand_dims(g, -1)
        if X.ndim == 1:
            g = np.expand_dims(g, -2)
        transpose_X = transpose_X and X.ndim > 1
        transpose_Y = transpose_Y and Y.ndim > 1
        xt = np.swapaxes(x, -1, -2) if transpose_X else x
        yt = np.swapaxes(y, -1, -2) if transpose_Y else y
        dx = dy = None
        if needs[0]:
            dxt = np.matmul(g, np.swapaxes(yt, -1, -2))
            dx = np.swapaxes(dxt, -1, -2) if transpose_X else dxt
            dx = unbroadcast(dx, x.shape).reshape(X.shape)
        if needs[1]:
            dyt = np.matmul(np.swapaxes(xt, -1, -2), g)
            dy = np.swapaxes(dyt, -1, -2) if transpose_Y else dyt
            dy = unbroadcast(dy, y.shape).reshape(Y.shape)
        return dx, dy


def _flat2d(shape, num_col_dims):
    rows = int(np.prod(shape[:num_col_dims]))
    return rows, int(np.prod(shape[num_col_dims:]))


@register_op
class mul:
    """Out = flatten(X) @ flatten(Y): X flattened to 2-D at x_num_col_dims, Y at y_num_col_dims
    (the fc op's product; Out keeps X's leading dims and Y's trailing dims)."""

    inputs, outputs = ("X", "Y"), ("Out",)
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

    def specialize(X, Y, x_num_col_dims, y_num_col_dims):
        # A matrix times a matrix needs no flattening: the BLAS call alone.
        if (
            X is None
            or Y is None
            or (X.ndim, Y.ndim, x_num_col_dims, y_num_col_dims) != (2, 2, 1, 1)
        ):
            return None
        return np.matmul

    def forward(X, Y, x_num_col_dims, y_num_col_dims):
        out = X.reshape(_flat2d(X.shape, x_num_col_dims)) @ Y.reshape(
            _flat2d(Y.shape, y_num_col_dims)
        )
        return out.reshape(X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:])

    def backward(X, Y, Out, Out_grad, x_num_col_dims, y_num_col_dims, needs=(True, True)):
        if X.ndim == Y.ndim == 2 and x_num_col_dims == y_num_col_dims == 1:
            dx = Out_grad @ Y.T if needs[0] else None
            dy = X.T @ Out_grad if needs[1] else None
            return dx, dy
        x2 = X.reshape(_flat2d(X.shape, x_num_col_dims))
        y2 = Y.reshape(_flat2d(Y.shape, y_num_col_dims))
        g2 = Out_grad.reshape(x2.shape[0], y2.shape[1])
        dx = (g2 @ y2.T).reshape(X.shape) if needs[0] else None
        dy = (x2.T @ g2).reshape(Y.shape) if needs[1] else None
        return dx, dy


@register_op
class sum:
    """Out = X[0] + X[1] + ... (how several gradient contributions are added up)."""

    inputs, outputs = ("X*",), ("Out",)

    def infer(X):
        if not X:
            fail("sum needs at least one input")
        shape = X[0].shape
        for other in X[1:]:
            if other.dtype != X[0].dtype:
                raise DTypeError(f"inputs of sum differ in dtype: {X[0].dtype} and {other.dtype}")
            shape = broadcast_shapes(shape, other.shape, "inputs of sum")
        return VarInfo(shape, X[0].dtype)

    def forward(X):
        out = X[0]
        for x in X[1:]:
            out = out + x
        if len(X) == 1:
            return out.copy()
        # A tensor array's gradient (a list, ArrayGrad) stays a list; 0-d sums become arrays.
        return out if isinstance(out, list) else np.asarray(out)

    def backward(X, Out, Out_grad):
        return ([unbroadcast(Out_grad, x.shape) for x in X],)
