"""Normalisation ops: batch_norm, layer_norm, group_norm, instance_norm (Fluid 1.8's slots,
attrs and statistics).

batch_norm normalises each channel over the batch and every other axis; in training it also
moves the running statistics: `MeanOut = momentum * Mean + (1 - momentum) * batch_mean` and the
same for the variance with the *biased* batch variance (divided by the element count, as
Fluid's kernel does; PyTorch's running_var takes the unbiased one, divided by count - 1).
SavedMean / SavedVariance hold the statistics the output was normalised with: the batch mean
and the batch's inverse standard deviation `1 / sqrt(var + epsilon)` (Fluid's SavedVariance),
or in inference the running mean and its inverse standard deviation.

layer_norm normalises each row of X flattened to 2-D at `begin_norm_axis`; Mean and Variance
(biased) are per row. group_norm normalises each (sample, group of channels); instance_norm is
the same with one channel per group (its SavedVariance is the inverse standard deviation).
"""

from __future__ import annotations

import math

import numpy as np

from nestflow.core.device_context import (
    CACHE_CHUNK_ELEMENTS,
    ROW_CHUNK_ELEMENTS,
    array_module,
    chunk_grain,
    device_context,
    thread_grain,
)
from nestflow.core.dtype import LOW_PRECISION, in_float32, is_floating
from nestflow.errors import AttrError, DTypeError
from nestflow.ops.math import spread_y
from nestflow.ops.registry import Required, VarInfo, fail, register_op

_LAYOUTS = ("NCHW", "NHWC")


def _check_epsilon(epsilon: float, op: str) -> None:
    if not 0.0 <= epsilon <= 1e-3:  # Fluid's checker on both ops
        raise AttrError(f"{op}: epsilon must lie in [0, 0.001], got {epsilon}")


def _require_float(X: VarInfo, op: str) -> None:
    if not is_floating(X.dtype):
        raise DTypeError(f"{op} needs a floating-point X, got {X.dtype}; cast it first")


def _stat_dtype(dtype: str) -> str:
    """The dtype of the affine parameters and statistics for an X of `dtype`: float32 for a
    float16/bfloat16 X (Fluid's BatchNormParamType; nf.amp keeps them float32 masters)."""
    return "float32" if dtype in LOW_PRECISION else dtype


def _check_vector(name: str, info: VarInfo | None, size: int, X: VarInfo, what: str) -> None:
    """`info` must be a 1-D vector of `size` elements (-1: unknown) with X's dtype (float32
    for a float16/bfloat16 X)."""
    if info is None:
        return
    if info.dtype != _stat_dtype(X.dtype):
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
        stat = VarInfo((channels,), _stat_dtype(X.dtype))
        return VarInfo(X.shape, X.dtype), stat, stat, stat, stat

    def forward(X, Scale, Bias, Mean, Variance, MomentumTensor, xp, device=None, **attrs):
        dtype, X = X.dtype, in_float32(X)
        c_axis = _channel_axis(X.ndim, attrs["data_layout"])
        epsilon = X.dtype.type(attrs["epsilon"])
        running = _uses_running_stats(
            attrs["is_test"], attrs["use_global_stats"], attrs["trainable_statistics"]
        )
        count = X.size // max(X.shape[c_axis], 1)
        if running:
            inv_std = 1.0 / xp.sqrt(Variance + epsilon)
            y = xp.subtract(X, spread_y(X, Mean, c_axis, xp))
            y *= spread_y(X, Scale * inv_std, c_axis, xp)
            y += spread_y(X, Bias, c_axis, xp)
            return y.astype(dtype, copy=False), Mean, Variance, Mean, inv_std
        if count <= 1:  # nothing to normalise over (Fluid: Y = X, statistics untouched)
            zeros = xp.zeros_like(Mean)
            return X.astype(dtype), Mean, Variance, zeros, zeros.copy()
        y, mean, var, inv_std = _by_channel(
            device,
            X,
            c_axis,
            (Scale, Bias),
            lambda *a, out: _normalized(*a, c_axis, epsilon, xp, out),
        )
        if MomentumTensor is None:
            momentum = attrs["momentum"]
            keep, take = X.dtype.type(momentum), X.dtype.type(1.0 - momentum)
        else:  # [1], kept where it lives: 1 - momentum in float64, as for the attribute
            momentum = MomentumTensor.reshape(-1)[:1].astype(np.float64)
            keep, take = momentum.astype(X.dtype), (1.0 - momentum).astype(X.dtype)
        y = y.astype(dtype, copy=False)
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
        device=None,
        **attrs,
    ):
        dtype, X, Y_grad = X.dtype, in_float32(X), in_float32(Y_grad)
        c_axis = _channel_axis(X.ndim, attrs["data_layout"])
        axes, shape = _per_channel(X.ndim, c_axis)
        epsilon = X.dtype.type(attrs["epsilon"])
        running = _uses_running_stats(
            attrs["is_test"], attrs["use_global_stats"], attrs["trainable_statistics"]
        )
        count = X.size // max(X.shape[c_axis], 1)
        if not running and count <= 1:  # Y = X was copied through
            zeros = xp.zeros_like(Scale)
            return Y_grad.astype(dtype), zeros, zeros.copy()
        if running:
            mean, inv_std = Mean, 1.0 / xp.sqrt(Variance + epsilon)
        elif SavedMean is not None and SavedVariance is not None:
            mean, inv_std = SavedMean, SavedVariance
        else:  # the forward op kept no statistics: compute them again
            mean = X.mean(axis=axes)
            inv_std = 1.0 / xp.sqrt(
                xp.mean(xp.square(X - mean.reshape(shape)), axis=axes) + epsilon
            )

        def part(x, y_grad, scale, mean, inv_std, out):
            args = (x, y_grad, scale, mean, inv_std, c_axis, running, needs[0])
            return _normalized_grads(*args, xp, out)

        x_grad, scale_grad, bias_grad = _by_channel(
            device, X, c_axis, (Y_grad, Scale, mean, inv_std), part
        )
        if x_grad is not None:
            x_grad = x_grad.astype(dtype, copy=False)
        return x_grad, scale_grad, bias_grad

    double_grad = ("X", "Scale", "Y@GRAD")

    def double_backward(
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
        dX,
        dScale,
        dBias,
        ddX,
        ddScale,
        ddBias,
        needs=(True,) * 3,
        *,
        xp,
        **attrs,
    ):
        dtype, X, Y_grad = X.dtype, in_float32(X), in_float32(Y_grad)
        ddX = None if ddX is None else in_float32(ddX)
        c_axis = _channel_axis(X.ndim, attrs["data_layout"])
        axes, shape = _per_channel(X.ndim, c_axis)
        running = _uses_running_stats(
            attrs["is_test"], attrs["use_global_stats"], attrs["trainable_statistics"]
        )
        count = X.size // max(X.shape[c_axis], 1)
        if not running and count <= 1:  # Y = X was copied through: dX = dY
            d_x = xp.zeros_like(X) if needs[0] else None
            d_scale = xp.zeros_like(Scale) if needs[1] else None
            d_dy = None
            if needs[2]:
                d_dy = xp.zeros_like(Y_grad) if ddX is None else ddX.astype(dtype, copy=False)
            return d_x, d_scale, d_dy
        epsilon = X.dtype.type(attrs["epsilon"])
        if running:
            mean, inv_std = Mean, 1.0 / xp.sqrt(Variance + epsilon)
        elif SavedMean is not None and SavedVariance is not None:
            mean, inv_std = SavedMean, SavedVariance
        else:
            mean = X.mean(axis=axes)
            inv_std = 1.0 / xp.sqrt(
                xp.mean(xp.square(X - mean.reshape(shape)), axis=axes) + epsilon
            )
        inv_std = inv_std.reshape(shape)
        x_hat = (X - mean.reshape(shape)) * inv_std
        d_x, d_scale, d_dy = _normalized_double(
            x_hat,
            inv_std,
            Y_grad,
            Scale.reshape(shape),
            ddX,
            None if ddScale is None else ddScale.reshape(shape),
            None if ddBias is None else ddBias.reshape(shape),
            lambda t: t.mean(axis=axes, keepdims=True),
            lambda t: t.sum(axis=axes),
            running,
            needs,
            xp,
        )
        if d_x is not None:
            d_x = d_x.astype(dtype, copy=False)
        if d_dy is not None:
            d_dy = d_dy.astype(dtype, copy=False)
        return d_x, d_scale, d_dy


# The intra-op pool splits batch_norm over channels (thread_grain) in chunks of at least
# _NORM_CHUNK_ELEMENTS, or of a thread's share of X down to _NORM_MIN_CHUNK_ELEMENTS: its
# passes are cheap, and a region costs about 60 us. On the 2-vCPU EPYC at 2 threads, forward +
# gradient on [32, 64, 32, 32] took 1.57 ms in two chunks against 2.16 whole; ResNet-18's (W13)
# deeper layers in two chunks against whole (one process per variant, two each):
# [32, 128, 16, 16] 0.86-0.92 against 1.15-1.17 ms, [32, 256, 8, 8] 0.56-0.57 against
# 0.64-0.66. Alternating the variants in one process: W14's [32, 64, 56, 56] 13.8 ms a step in
# chunks of 1M against 13.9 in chunks of 256K, [32, 512, 4, 4] (256K) 0.57 in two against 0.41.
_NORM_CHUNK_ELEMENTS = 1 << 20
_NORM_MIN_CHUNK_ELEMENTS = 1 << 18


def _by_channel(device, X, c_axis: int, operands, body):
    """body(X, *operands, out=...) over chunks of X's channels on device's pool (one call for
    small X or no device): operands are X-shaped arrays or [C] vectors, sliced alike; out is
    the chunk's slice of one X-shaped result, which body writes (it returns it, or None where
    it makes no X-shaped result, then the vectors). The chunks' vectors are put together."""
    xp = array_module(X)
    out = xp.empty(X.shape, X.dtype)
    channels = X.shape[c_axis]
    share = X.size // getattr(device, "num_threads", 1)
    least = min(_NORM_CHUNK_ELEMENTS, max(_NORM_MIN_CHUNK_ELEMENTS, share))
    grain = thread_grain(channels, X.size // max(channels, 1), least)
    if device is None or grain >= channels:
        return body(X, *operands, out=out)
    lead = (slice(None),) * c_axis

    def sliced(a, part):
        return a[part] if a.ndim == 1 else a[lead + (part,)]

    def chunk(start: int, stop: int):  # (its slice of out, or None), then its vectors
        part = slice(start, stop)
        return body(sliced(X, part), *(sliced(a, part) for a in operands), out=sliced(out, part))

    parts = device.parallel_for(channels, chunk, grain)
    return (out if parts[0][0] is not None else None,) + tuple(
        xp.concatenate(v) for v in list(zip(*parts))[1:]
    )


# vecdot runs its inner loop once per (image, channel) row: on a few pixels a row the calls
# cost more than the sums. On the EPYC, [32, 512, 4, 4]: 130 us per sum against 26 adding the
# images first, 132 against 58 for a sum of products (their product made first); on
# [32, 256, 8, 8] 62 against 44, but 64 against 107 for products.
_VECDOT_MIN_PIXELS = 64


def _channel_sums(a, b, c_axis: int, xp):
    """The per-channel sums of a * b (b None: of a) over every axis but c_axis. Where the
    channels come before the pixels (NCHW) each image's channel row is one dot product
    (vecdot: no a * b temporary, 0.11 ms against 0.48 for square-and-mean over [32, 64, 32,
    32]), then the images are added; on fewer than _VECDOT_MIN_PIXELS pixels the images are
    added first, then each channel's pixels. Either way the same bits for a chunk of channels
    as for all."""
    vecdot = getattr(xp, "vecdot", None)
    if c_axis == 1 and a.ndim >= 3 and vecdot is not None:
        # a channel slice's pixels stay contiguous (no -1: an empty batch has 0 rows)
        rows = a.reshape(a.shape[0], a.shape[1], math.prod(a.shape[2:]))
        if rows.shape[-1] >= _VECDOT_MIN_PIXELS:
            other = xp.ones(rows.shape[-1], a.dtype) if b is None else b.reshape(rows.shape)
            return vecdot(rows, other).sum(axis=0)
        terms = rows if b is None else xp.multiply(rows, b.reshape(rows.shape))
        return terms.sum(axis=0).sum(axis=-1)  # the images first, then each channel's pixels
    axes = tuple(i for i in range(a.ndim) if i != c_axis)
    return (a if b is None else a * b).sum(axis=axes)


def _normalized(X, Scale, Bias, c_axis, epsilon, xp, out):
    """batch_norm's training forward on X (a chunk of its channels), Y written into out:
    (Y, mean, biased var, inverse std)."""
    count = X.size // max(Scale.shape[0], 1)
    mean = _channel_sums(X, None, c_axis, xp) / count
    centered = xp.subtract(X, spread_y(X, mean, c_axis, xp), out=out)
    var = _channel_sums(centered, centered, c_axis, xp) / count
    inv_std = 1.0 / xp.sqrt(var + epsilon)
    centered *= spread_y(X, Scale * inv_std, c_axis, xp)
    centered += spread_y(X, Bias, c_axis, xp)
    return centered, mean, var, inv_std


def _normalized_grads(X, Y_grad, Scale, mean, inv_std, c_axis, running, wants_x, xp, out):
    """batch_norm's gradients on X (a chunk of its channels), the X gradient written into
    out: (X grad or None, Scale grad, Bias grad). With x_hat = (X - mean) * inv_std and the
    sums over each channel, X grad = Scale * inv_std * (dY - sum(dY) / count - x_hat *
    sum(dY * x_hat) / count), made in out from X - mean, one pass a term."""
    count = X.size // max(Scale.shape[0], 1)
    centered = xp.subtract(X, spread_y(X, mean, c_axis, xp), out=out)
    bias_grad = _channel_sums(Y_grad, None, c_axis, xp)
    scale_grad = _channel_sums(Y_grad, centered, c_axis, xp) * inv_std
    if not wants_x:
        return None, scale_grad, bias_grad
    gain = spread_y(X, Scale * inv_std, c_axis, xp)
    if running:  # the statistics are constants: Y is affine in X
        return xp.multiply(Y_grad, gain, out=out), scale_grad, bias_grad
    x_grad = centered
    x_grad *= spread_y(X, -inv_std * scale_grad / count, c_axis, xp)  # -x_hat sum(dY x_hat) / N
    x_grad += Y_grad
    x_grad -= spread_y(X, bias_grad / count, c_axis, xp)
    x_grad *= gain
    return x_grad, scale_grad, bias_grad


def _normalized_double(
    x_hat, inv_std, dy, a, dd_x, dd_a, dd_b, group_mean, reduce, fixed, needs, xp
):
    """The second order shared by batch_norm and layer_norm, Y = a * x_hat + b with
    x_hat = (x - mean) * inv_std over groups: the gradients of <dX, dd_x> + <dA, dd_a> +
    <dB, dd_b> with respect to x, a and dY (None where `needs` says no one takes them).

    Arrays come broadcastable against x (a, dd_a, dd_b, inv_std too; a None is 1);
    group_mean(t) is t's mean over each group, kept broadcastable; reduce(t) sums t to a's
    vector. With `fixed`
    statistics (inference) x_hat is affine in x, so its Jacobian is inv_std alone. Otherwise
    J v = inv_std * (v - mean(v) - x_hat * mean(x_hat v)) (symmetric), and the gradient of
    <g, J v> with respect to x is -inv_std^2 * (x_hat * (mean(g_c v) - 3 mean(x_hat v)
    mean(x_hat g)) + mean(x_hat g) * v_c + mean(x_hat v) * g_c), centred g_c, v_c."""

    def jacobian(v):
        if fixed:
            return inv_std * v
        return inv_std * (v - group_mean(v) - x_hat * group_mean(x_hat * v))

    j_dd_x = jacobian(dd_x) if dd_x is not None else None
    d_x = d_a = d_dy = None
    if needs[0]:
        d_x = xp.zeros_like(x_hat)
        if dd_a is not None:  # dA = reduce(dY * x_hat): <dY * dd_a, x_hat> through x_hat
            d_x = d_x + jacobian(dy * dd_a)
        if dd_x is not None and not fixed:
            g = dy if a is None else a * dy
            v_c, g_c = dd_x - group_mean(dd_x), g - group_mean(g)
            hv, hg = group_mean(x_hat * dd_x), group_mean(x_hat * g)
            cross = group_mean(g_c * dd_x)
            d_x = d_x - inv_std * inv_std * (x_hat * (cross - 3.0 * hv * hg) + hg * v_c + hv * g_c)
    if needs[1]:
        d_a = reduce(dy * j_dd_x if j_dd_x is not None else xp.zeros_like(dy))
    if needs[2]:  # the JVP of the forward
        d_dy = xp.zeros_like(dy)
        if j_dd_x is not None:
            d_dy = d_dy + (j_dd_x if a is None else a * j_dd_x)
        if dd_a is not None:
            d_dy = d_dy + x_hat * dd_a
        if dd_b is not None:
            d_dy = d_dy + dd_b
    return d_x, d_a, d_dy


# ---- layer_norm ----


def _rows_and_width(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    """X flattened to [rows, width] at `axis` (-1 where a dim is unknown)."""
    lead, tail = shape[:axis], shape[axis:]
    rows = -1 if -1 in lead else math.prod(lead)
    width = -1 if -1 in tail else math.prod(tail)
    return rows, width


def _normalized_rows(x, Scale, Bias, epsilon: float, xp, out=None) -> tuple:
    """layer_norm of the rows of x [rows, width]: (y, written into `out` if given; mean,
    variance), each row on its own (a slice of the rows gives those rows' bits). y's buffer
    holds the centred rows on the way: no temporary as large as x but their squares."""
    mean = x.mean(axis=1)
    y = xp.subtract(x, mean[:, None], out=out)
    var = xp.mean(xp.square(y), axis=1)
    y *= (1.0 / xp.sqrt(var + x.dtype.type(epsilon)))[:, None]
    if Scale is not None:
        y *= Scale
    if Bias is not None:
        y += Bias
    return y, mean, var


def _layer_norm_grad_rows(x, dy, stats, Scale, epsilon: float, wants, out=None) -> tuple:
    """layer_norm's gradients over rows x [rows, width] (dy alike; stats: their (Mean,
    Variance), or None to compute them): (x_grad, written into `out` if given; these rows'
    share of the Scale and of the Bias gradient), None for what `wants` leaves out."""
    xp = array_module(x)
    if stats is None:
        mean = x.mean(axis=1)
        var = xp.mean(xp.square(x - mean[:, None]), axis=1)
    else:
        mean, var = stats
    inv_std = (1.0 / xp.sqrt(var + x.dtype.type(epsilon)))[:, None]
    x_hat = (x - mean[:, None]) * inv_std
    scale_grad = (dy * x_hat).sum(axis=0) if wants[1] else None
    bias_grad = dy.sum(axis=0) if wants[2] else None
    if not wants[0]:
        return None, scale_grad, bias_grad
    g = dy * Scale if Scale is not None else dy
    inner = g - g.mean(axis=1, keepdims=True) - x_hat * (g * x_hat).mean(axis=1, keepdims=True)
    x_grad = xp.multiply(inv_std, inner, out=out)
    return x_grad, scale_grad, bias_grad


def _summed_in_order(parts: list):
    """The chunks' partial sums added in chunk order (None where they are None): the same
    chunks give the same bits at any thread count (chunk_grain)."""
    if parts[0] is None:
        return None
    total = parts[0]
    for more in parts[1:]:
        total = total + more
    return total


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
        stat = VarInfo((rows,), _stat_dtype(X.dtype))
        return VarInfo(X.shape, X.dtype), stat, stat

    def forward(X, Scale, Bias, epsilon, begin_norm_axis, is_test, use_mkldnn, xp):
        dtype, X = X.dtype, in_float32(X)
        rows, width = _rows_and_width(X.shape, begin_norm_axis)
        x = X.reshape(rows, width)
        if xp is np and X.size >= 2 * ROW_CHUNK_ELEMENTS:  # rows on the intra-op pool
            y = np.empty((rows, width), X.dtype)
            mean, var = np.empty(rows, X.dtype), np.empty(rows, X.dtype)

            def part(start: int, stop: int) -> None:
                rows = slice(start, stop)
                _, mean[rows], var[rows] = _normalized_rows(
                    x[rows], Scale, Bias, epsilon, np, y[rows]
                )

            grain = thread_grain(rows, width, ROW_CHUNK_ELEMENTS)
            device_context().parallel_for(rows, part, grain)
        else:
            y, mean, var = _normalized_rows(x, Scale, Bias, epsilon, xp)
        return y.reshape(X.shape).astype(dtype, copy=False), mean, var

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
        dtype, X, Y_grad = X.dtype, in_float32(X), in_float32(Y_grad)
        rows, width = _rows_and_width(X.shape, begin_norm_axis)
        x, dy = X.reshape(rows, width), Y_grad.reshape(rows, width)
        wants = (needs[0], Scale is not None and needs[1], Bias is not None and needs[2])
        x_grad = np.empty((rows, width), X.dtype) if xp is np and wants[0] else None

        def part(start: int, stop: int) -> tuple:
            chunk = slice(start, stop)
            stats = None if Mean is None or Variance is None else (Mean[chunk], Variance[chunk])
            into = None if x_grad is None else x_grad[chunk]
            return _layer_norm_grad_rows(x[chunk], dy[chunk], stats, Scale, epsilon, wants, into)

        if xp is np and X.size >= 2 * ROW_CHUNK_ELEMENTS:  # rows on the intra-op pool
            grain = chunk_grain(rows, width, CACHE_CHUNK_ELEMENTS)
            parts = device_context().parallel_for(rows, part, grain)
        else:
            parts = [part(0, rows)]
        if x_grad is None and wants[0]:  # a device's array, made by the one part
            x_grad = parts[0][0]
        if x_grad is not None:
            x_grad = x_grad.reshape(X.shape).astype(dtype, copy=False)
        return (x_grad, *(_summed_in_order([p[k] for p in parts]) for k in (1, 2)))

    double_grad = ("X", "Scale", "Y@GRAD")

    def double_backward(
        X,
        Scale,
        Bias,
        Y,
        Mean,
        Variance,
        Y_grad,
        Mean_grad,
        Variance_grad,
        dX,
        dScale,
        dBias,
        ddX,
        ddScale,
        ddBias,
        epsilon,
        begin_norm_axis,
        is_test,
        use_mkldnn,
        needs=(True,) * 3,
        *,
        xp,
    ):
        dtype, X, Y_grad = X.dtype, in_float32(X), in_float32(Y_grad)
        rows, width = _rows_and_width(X.shape, begin_norm_axis)
        x = X.reshape(rows, width)
        if Mean is None or Variance is None:
            Mean = x.mean(axis=1)
            Variance = xp.mean(xp.square(x - Mean[:, None]), axis=1)
        inv_std = (1.0 / xp.sqrt(Variance + X.dtype.type(epsilon)))[:, None]
        x_hat = (x - Mean[:, None]) * inv_std
        d_x, d_scale, d_dy = _normalized_double(
            x_hat,
            inv_std,
            Y_grad.reshape(rows, width),
            Scale,
            None if ddX is None else in_float32(ddX).reshape(rows, width),
            ddScale if Scale is not None else None,
            ddBias if Bias is not None else None,
            lambda t: t.mean(axis=1, keepdims=True),
            lambda t: t.sum(axis=0),
            False,
            (needs[0], needs[1] and Scale is not None, needs[2]),
            xp,
        )
        if d_x is not None:
            d_x = d_x.reshape(X.shape).astype(dtype, copy=False)
        if d_dy is not None:
            d_dy = d_dy.reshape(X.shape).astype(dtype, copy=False)
        return d_x, d_scale, d_dy


# ---- group_norm, instance_norm ----


def _grouped(x, groups: int):
    """x [N, C, ...] as [N, groups, C / groups * spatial] (a view where x is contiguous)."""
    return x.reshape(x.shape[0], groups, math.prod(x.shape[1:]) // groups)


def _group_normalise(x, groups: int, epsilon: float, xp):
    """(x normalised per (sample, group), mean [N, G], biased variance [N, G])."""
    g = _grouped(x, groups)
    mean = g.mean(axis=2)
    centered = g - mean[:, :, None]
    var = xp.mean(xp.square(centered), axis=2)
    inv_std = 1.0 / xp.sqrt(var + x.dtype.type(epsilon))
    return (centered * inv_std[:, :, None]).reshape(x.shape), mean, var


def _channel_vector(v, ndim: int):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _group_norm_grads(x, y_grad, scale, has_bias, groups, epsilon, needs, xp):
    """(x, scale, bias) gradients of y = normalise(x) * scale + bias, x [N, C, ...]."""
    x_hat, _, var = _group_normalise(x, groups, epsilon, xp)
    reduce_axes = (0,) + tuple(range(2, x.ndim))
    scale_grad = (y_grad * x_hat).sum(axis=reduce_axes) if scale is not None and needs[1] else None
    bias_grad = y_grad.sum(axis=reduce_axes) if has_bias and needs[2] else None
    x_grad = None
    if needs[0]:
        g = y_grad * _channel_vector(scale, x.ndim) if scale is not None else y_grad
        g, h = _grouped(g, groups), _grouped(x_hat, groups)
        inv_std = (1.0 / xp.sqrt(var + x.dtype.type(epsilon)))[:, :, None]
        x_grad = inv_std * (
            g - g.mean(axis=2, keepdims=True) - h * (g * h).mean(axis=2, keepdims=True)
        )
        x_grad = x_grad.reshape(x.shape)
    return x_grad, scale_grad, bias_grad


def _affine(y, scale, bias):
    if scale is not None:
        y = y * _channel_vector(scale, y.ndim)
    if bias is not None:
        y = y + _channel_vector(bias, y.ndim)
    return y


def _channels_first(x, layout: str):
    return _moveaxis(x, -1, 1) if layout == "NHWC" else x


def _channels_back(x, layout: str):
    return _moveaxis(x, 1, -1) if layout == "NHWC" else x


def _moveaxis(x, source: int, dest: int):
    axes = list(range(x.ndim))
    axes.insert(dest % x.ndim, axes.pop(source % x.ndim))
    return x.transpose(axes)


@register_op
class group_norm:
    """X [N, C, ...] (rank >= 3; NHWC with data_layout) split into `groups` groups of C /
    groups channels; each (sample, group) normalised over its channels and spatial positions:
    Y = (X - Mean) / sqrt(Variance + epsilon) * Scale + Bias, Scale/Bias optional [C],
    Mean/Variance (biased) [N, groups]. ShapeError when C does not divide by groups."""

    inputs, outputs = ("X", "Scale?", "Bias?"), ("Y", "Mean?", "Variance?")
    grad_no_need_buffer = ("Y",)
    attrs = {"epsilon": 1e-5, "groups": Required(int), "data_layout": "NCHW"}

    def infer(X, Scale, Bias, epsilon, groups, data_layout):
        _require_float(X, "group_norm")
        _check_epsilon(epsilon, "group_norm")
        if data_layout not in _LAYOUTS:
            raise AttrError(
                f"group_norm: data_layout must be one of {_LAYOUTS}, got {data_layout!r}"
            )
        if X.ndim < 3:
            fail(f"group_norm needs X of rank >= 3 ([N, C, ...]), got {list(X.shape)}")
        channels = X.shape[-1] if data_layout == "NHWC" else X.shape[1]
        if groups < 1 or (channels >= 0 and channels % groups):
            fail(
                f"group_norm: the {channels} channels of X {list(X.shape)} do not divide into "
                f"groups={groups}"
            )
        what = "the channels of X"
        _check_vector("Scale", Scale, channels, X, what)
        _check_vector("Bias", Bias, channels, X, what)
        stat = VarInfo((X.shape[0], groups), X.dtype)
        return VarInfo(X.shape, X.dtype), stat, stat

    def forward(X, Scale, Bias, epsilon, groups, data_layout, xp):
        x = xp.ascontiguousarray(_channels_first(X, data_layout))
        y, mean, var = _group_normalise(x, groups, epsilon, xp)
        return _channels_back(_affine(y, Scale, Bias), data_layout), mean, var

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
        groups,
        data_layout,
        needs=(True, True, True),
        *,
        xp,
    ):
        x = xp.ascontiguousarray(_channels_first(X, data_layout))
        dy = xp.ascontiguousarray(_channels_first(Y_grad, data_layout))
        dx, ds, db = _group_norm_grads(x, dy, Scale, Bias is not None, groups, epsilon, needs, xp)
        return (None if dx is None else _channels_back(dx, data_layout)), ds, db


@register_op
class instance_norm:
    """X [N, C, ...] (rank >= 3) normalised per (sample, channel) over its spatial positions:
    Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias, Scale/Bias optional [C]; SavedMean
    and SavedVariance [N * C] hold the mean and the inverse standard deviation
    1 / sqrt(var + epsilon), as Fluid's."""

    inputs, outputs = ("X", "Scale?", "Bias?"), ("Y", "SavedMean?", "SavedVariance?")
    grad_no_need_buffer = ("Y",)
    attrs = {"epsilon": 1e-5}

    def infer(X, Scale, Bias, epsilon):
        _require_float(X, "instance_norm")
        _check_epsilon(epsilon, "instance_norm")
        if X.ndim < 3:
            fail(f"instance_norm needs X of rank >= 3 ([N, C, ...]), got {list(X.shape)}")
        _check_vector("Scale", Scale, X.shape[1], X, "the channels of X")
        _check_vector("Bias", Bias, X.shape[1], X, "the channels of X")
        n, c = X.shape[:2]
        stat = VarInfo((-1 if -1 in (n, c) else n * c,), X.dtype)
        return VarInfo(X.shape, X.dtype), stat, stat

    def forward(X, Scale, Bias, epsilon, xp):
        x = xp.ascontiguousarray(X)
        y, mean, var = _group_normalise(x, X.shape[1], epsilon, xp)
        inv_std = 1.0 / xp.sqrt(var + X.dtype.type(epsilon))
        return _affine(y, Scale, Bias), mean.reshape(mean.size), inv_std.reshape(mean.size)

    def backward(
        X,
        Scale,
        Bias,
        Y,
        SavedMean,
        SavedVariance,
        Y_grad,
        SavedMean_grad,
        SavedVariance_grad,
        epsilon,
        needs=(True, True, True),
        *,
        xp,
    ):
        x = xp.ascontiguousarray(X)
        return _group_norm_grads(x, Y_grad, Scale, Bias is not None, X.shape[1], epsilon, needs, xp)


__all__ = ["batch_norm", "group_norm", "instance_norm", "layer_norm"]
