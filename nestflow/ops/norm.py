"""Normalisation ops: batch_norm, layer_norm (Fluid 1.8's slots, attrs and statistics).

batch_norm normalises each channel over the batch and every other axis; in training it also
moves the running statistics: `MeanOut = momentum * Mean + (1 - momentum) * batch_mean` and the
same for the variance with the *biased* batch variance (divided by the element count, as
Fluid's kernel does; PyTorch's running_var takes the unbiased one, divided by count - 1).
SavedMean / SavedVariance hold the statistics the output was normalised with: the batch mean
and the batch's inverse standard deviation `1 / sqrt(var + epsilon)` (Fluid's SavedVariance),
or in inference the running mean and its inverse standard deviation.

layer_norm normalises each row of X flattened to 2-D at `begin_norm_axis`; Mean and Variance
(biased) are per row.
"""

from __future__ import annotations

import math

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError
from nestflow.ops.registry import VarInfo, fail, register_op

_LAYOUTS = ("NCHW", "NHWC")


def _check_epsilon(epsilon: float, op: str) -> None:
    if not 0.0 <= epsilon <= 1e-3:  # Fluid's checker on both ops
        raise AttrError(f"{op}: epsilon must lie in [0, 0.001], got {epsilon}")


def _require_float(X: VarInfo, op: str) -> None:
    if not is_floating(X.dtype):
        raise DTypeError(f"{op} needs a floating-point X, got {X.dtype}; cast it first")


def _check_vector(name: str, info: VarInfo | None, size: int, X: VarInfo, what: str) -> None:
    """`info` must be a 1-D vector of `size` elements (-1: unknown) with X's dtype."""
    if info is None:
        return
    if info.dtype != X.dtype:
        raise DTypeError(f"{name} is {info.dtype} but X is {X.dtype}; they must match")
    if len(info.shape) != 1 or (-1 not in (size, info.shape[0]) and info.shape[0] != size):
        fail(f"{name} must be [{size}] ({what} of X {list(X.shape)}), got {list(info.shape)}")


# ---- batch_norm ----


def _channel_axis(ndim: int, data_layout: str) -> int:
    return 1 if data_layout == "NCHW" else ndim - 1


def _per_channel(ndim: int, c_axis: int):
    """(the axes statistics reduce over, the shape that broadcasts a [C] vector against X)."""
    axes = tuple(i for i in range(ndim) if i != c_axis)
    shape = [1] * ndim
    shape[c_axis] = -1
    return axes, tuple(shape)


def _uses_running_stats(is_test: bool, use_global_stats: bool, trainable_statistics: bool):
    # Fluid: is_test normalises with the running statistics unless trainable_statistics asks
    # for batch statistics even in inference; use_global_stats always takes the running ones.
    return (is_test and not trainable_statistics) or use_global_stats


@register_op
class batch_norm:
    """Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias per channel (axis 1 for NCHW, the
    last axis for NHWC; X of rank 2 to 5). In training mean/var are the batch's and the running
    statistics move (MeanOut, VarianceOut: the layer names them as Mean and Variance, so they
    update in place); with is_test or use_global_stats the running Mean/Variance normalise and
    are passed through unchanged. A batch of one element per channel (N * spatial == 1) is
    copied through in training, as Fluid does; an empty batch leaves the statistics alone.
    MomentumTensor, if given, overrides the momentum attribute (one element)."""

    inputs = ("X", "Scale", "Bias", "Mean", "Variance", "MomentumTensor?")
    outputs = ("Y", "MeanOut?", "VarianceOut?", "SavedMean?", "SavedVariance?")
    attrs = {
        "is_test": False,
        "momentum": 0.9,
        "epsilon": 1e-5,
        "data_layout": "NCHW",
        "use_global_stats": False,
        "trainable_statistics": False,
        "use_mkldnn": False,  # a device choice in Fluid; one CPU kernel here
        "fuse_with_relu": False,
    }
    no_grad_inputs = ("Mean", "Variance", "MomentumTensor")

    def infer(X, Scale, Bias, Mean, Variance, MomentumTensor, **attrs):
        _require_float(X, "batch_norm")
        _check_epsilon(attrs["epsilon"], "batch_norm")
        layout = attrs["data_layout"]
        if layout not in _LAYOUTS:
            raise AttrError(f"batch_norm: data_layout must be one of {_LAYOUTS}, got {layout!r}")
        if attrs["fuse_with_relu"]:
            raise AttrError(
                "batch_norm: fuse_with_relu is set by Fluid's MKL-DNN fusion passes, which "
                "nestflow does not have; apply relu after batch_norm (act='relu')"
            )
        if not 2 <= X.ndim <= 5:
            fail(f"batch_norm needs X of rank 2 to 5, got {list(X.shape)} (rank {X.ndim})")
        channels = X.shape[_channel_axis(X.ndim, layout)]
        what = f"the channels, dim {_channel_axis(X.ndim, layout)} for {layout}"
        for name, info in (("Scale", Scale), ("Bias", Bias), ("Mean", Mean)):
            _check_vector(name, info, channels, X, what)
        _check_vector("Variance", Variance, channels, X, what)
        if MomentumTensor is not None and -1 not in MomentumTensor.shape:
            if math.prod(MomentumTensor.shape) != 1:
                fail(f"MomentumTensor must hold one value, got {list(MomentumTensor.shape)}")
        stat = VarInfo((channels,), X.dtype)
        return VarInfo(X.shape, X.dtype), stat, stat, stat, stat

    def forward(X, Scale, Bias, Mean, Variance, MomentumTensor, xp, **attrs):
        c_axis = _channel_axis(X.ndim, attrs["data_layout"])
        axes, shape = _per_channel(X.ndim, c_axis)
        epsilon = X.dtype.type(attrs["epsilon"])
        running = _uses_running_stats(
            attrs["is_test"], attrs["use_global_stats"], attrs["trainable_statistics"]
        )
        count = X.size // max(X.shape[c_axis], 1)
        if running:
            inv_std = 1.0 / xp.sqrt(Variance + epsilon)
            new_scale = (Scale * inv_std).reshape(shape)
            y = (X - Mean.reshape(shape)) * new_scale + Bias.reshape(shape)
            return y, Mean, Variance, Mean, inv_std
        if count <= 1:  # nothing to normalise over (Fluid: Y = X, statistics untouched)
            zeros = xp.zeros_like(Mean)
            return X.copy(), Mean, Variance, zeros, zeros.copy()
        mean = X.mean(axis=axes)
        centered = X - mean.reshape(shape)
        var = xp.mean(xp.square(centered), axis=axes)
        inv_std = 1.0 / xp.sqrt(var + epsilon)
        y = centered * (Scale * inv_std).reshape(shape) + Bias.reshape(shape)
        if MomentumTensor is None:
            momentum = attrs["momentum"]
            keep, take = X.dtype.type(momentum), X.dtype.type(1.0 - momentum)
        else:  # [1], kept where it lives: 1 - momentum in float64, as for the attribute
            momentum = MomentumTensor.reshape(-1)[:1].astype(np.float64)
            keep, take = momentum.astype(X.dtype), (1.0 - momentum).astype(X.dtype)
        return y, Mean * keep + mean * take, Variance * keep + var * take, mean, inv_std

    def backward(
        X,
        Scale,
        Bias,
        Mean,
        Variance,
        MomentumTensor,
        Y,
        MeanOut,
        VarianceOut,
        SavedMean,
        SavedVariance,
        Y_grad,
        MeanOut_grad,
        VarianceOut_grad,
        SavedMean_grad,
        SavedVariance_grad,
        needs=(True, True, True),
        *,
        xp,
        **attrs,
    ):
        c_axis = _channel_axis(X.ndim, attrs["data_layout"])
        axes, shape = _per_channel(X.ndim, c_axis)
        epsilon = X.dtype.type(attrs["epsilon"])
        running = _uses_running_stats(
            attrs["is_test"], attrs["use_global_stats"], attrs["trainable_statistics"]
        )
        count = X.size // max(X.shape[c_axis], 1)
        if not running and count <= 1:  # Y = X was copied through
            zeros = xp.zeros_like(Scale)
            return Y_grad.copy(), zeros, zeros.copy()
        if running:
            mean, inv_std = Mean, 1.0 / xp.sqrt(Variance + epsilon)
        elif SavedMean is not None and SavedVariance is not None:
            mean, inv_std = SavedMean, SavedVariance
        else:  # the forward op kept no statistics: compute them again
            mean = X.mean(axis=axes)
            inv_std = 1.0 / xp.sqrt(
                xp.mean(xp.square(X - mean.reshape(shape)), axis=axes) + epsilon
            )
        x_hat = (X - mean.reshape(shape)) * inv_std.reshape(shape)
        bias_grad = Y_grad.sum(axis=axes)
        scale_grad = (Y_grad * x_hat).sum(axis=axes)
        x_grad = None
        if needs[0]:
            gain = (Scale * inv_std).reshape(shape)
            if running:  # the statistics are constants: Y is affine in X
                x_grad = Y_grad * gain
            else:
                x_grad = gain * (
                    Y_grad
                    - (bias_grad / count).reshape(shape)
                    - x_hat * (scale_grad / count).reshape(shape)
                )
        return x_grad, scale_grad, bias_grad


# ---- layer_norm ----


def _rows_and_width(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    """X flattened to [rows, width] at `axis` (-1 where a dim is unknown)."""
    lead, tail = shape[:axis], shape[axis:]
    rows = -1 if -1 in lead else math.prod(lead)
    width = -1 if -1 in tail else math.prod(tail)
    return rows, width


@register_op
class layer_norm:
    """X flattened to 2-D [rows, width] at begin_norm_axis; each row normalised:
    Y = (X - Mean) / sqrt(Variance + epsilon) * Scale + Bias, Scale/Bias optional [width]
    vectors, Mean/Variance (biased) [rows]. begin_norm_axis lies in [1, rank(X))."""

    inputs, outputs = ("X", "Scale?", "Bias?"), ("Y", "Mean?", "Variance?")
    grad_no_need_buffer = ("Y",)
    attrs = {"epsilon": 1e-5, "begin_norm_axis": 1, "is_test": False, "use_mkldnn": False}

    def infer(X, Scale, Bias, epsilon, begin_norm_axis, is_test, use_mkldnn):
        _require_float(X, "layer_norm")
        _check_epsilon(epsilon, "layer_norm")
        if not 1 <= begin_norm_axis < X.ndim:
            fail(
                f"begin_norm_axis={begin_norm_axis} must lie in [1, {X.ndim}) for X "
                f"{list(X.shape)} (rank {X.ndim})"
            )
        rows, width = _rows_and_width(X.shape, begin_norm_axis)
        what = f"the product of X's dims from {begin_norm_axis} on"
        _check_vector("Scale", Scale, width, X, what)
        _check_vector("Bias", Bias, width, X, what)
        stat = VarInfo((rows,), X.dtype)
        return VarInfo(X.shape, X.dtype), stat, stat

    def forward(X, Scale, Bias, epsilon, begin_norm_axis, is_test, use_mkldnn, xp):
        rows, width = _rows_and_width(X.shape, begin_norm_axis)
        x = X.reshape(rows, width)
        mean = x.mean(axis=1)
        centered = x - mean[:, None]
        var = xp.mean(xp.square(centered), axis=1)
        y = centered * (1.0 / xp.sqrt(var + X.dtype.type(epsilon)))[:, None]
        if Scale is not None:
            y = y * Scale
        if Bias is not None:
            y = y + Bias
        return y.reshape(X.shape), mean, var

    def backward(
        X,
        Scale,
        Bias,
        Y,
        Mean,
        Variance,
        Y_grad,
        Mean_grad,
        Variance_grad,
        epsilon,
        begin_norm_axis,
        is_test,
        use_mkldnn,
        needs=(True, True, True),
        *,
        xp,
    ):
        rows, width = _rows_and_width(X.shape, begin_norm_axis)
        x = X.reshape(rows, width)
        dy = Y_grad.reshape(rows, width)
        if Mean is None or Variance is None:
            Mean = x.mean(axis=1)
            Variance = xp.mean(xp.square(x - Mean[:, None]), axis=1)
        inv_std = (1.0 / xp.sqrt(Variance + X.dtype.type(epsilon)))[:, None]
        x_hat = (x - Mean[:, None]) * inv_std
        scale_grad = (dy * x_hat).sum(axis=0) if Scale is not None and needs[1] else None
        bias_grad = dy.sum(axis=0) if Bias is not None and needs[2] else None
        x_grad = None
        if needs[0]:
            g = dy * Scale if Scale is not None else dy
            x_grad = inv_std * (
                g - g.mean(axis=1, keepdims=True) - x_hat * (g * x_hat).mean(axis=1, keepdims=True)
            )
            x_grad = x_grad.reshape(X.shape)
        return x_grad, scale_grad, bias_grad


__all__ = ["batch_norm", "layer_norm"]
