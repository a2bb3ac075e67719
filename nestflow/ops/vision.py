"""Volume and resampling ops (Fluid 1.8's slots, attrs and defaults): conv3d, pool3d,
bilinear_interp, nearest_interp, pixel_shuffle.

conv3d and pool3d loop over the kernel offsets (kd * kh * kw of them), each a strided slice of
the padded input over the whole batch; conv3d stacks those slices into columns and contracts
them with the filter in one einsum per call (grouped), and its input gradient adds each
offset's columns back into its slice. The resize ops are separable linear maps: each spatial
axis is multiplied by an [out, in] interpolation matrix (two taps per row for bilinear, one for
nearest), so forward and gradient are the same two contractions, transposed.

Kernels are written against `xp` (NumPy on the CPU, CuPy or the stand-in on devices). Attrs
that steer Fluid's hardware back ends (use_cudnn, use_mkldnn, ...) are accepted without effect.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from nestflow.core.device_context import array_module
from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.ops.registry import Required, VarInfo, register_op

__all__: list[str] = []

_HINTS = {"use_cudnn": False, "use_mkldnn": False, "is_test": False}
_ALGORITHMS = ("EXPLICIT", "SAME", "VALID")


def _require_float(op: str, info: VarInfo, slot: str) -> None:
    if not is_floating(info.dtype):
        raise DTypeError(
            f"{op}: {slot} {list(info.shape)} is {info.dtype}; it computes in floating point, "
            "cast it first"
        )


def _require_rank(op: str, info: VarInfo, slot: str, rank: int, layout: str) -> None:
    if info.ndim != rank:
        raise ShapeError(
            f"{op}: {slot} must be a {rank}-D {layout} tensor, got shape {list(info.shape)}"
        )


def _triple(op: str, values: list, name: str, low: int) -> tuple[int, ...]:
    if len(values) != 3 or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise AttrError(f"{op}: {name} must be 3 ints (depth, height, width), got {values}")
    if min(values) < low:
        raise AttrError(f"{op}: {name} must be >= {low}, got {values}")
    return tuple(values)


def _pads3(op: str, paddings: list) -> tuple[tuple[int, int], ...]:
    """Fluid's 3-D paddings: [d, h, w] (both sides alike) or [front, back, top, bottom,
    left, right]."""
    if len(paddings) not in (3, 6) or any(not isinstance(p, int) or p < 0 for p in paddings):
        raise AttrError(
            f"{op}: paddings must be 3 ints [pad_d, pad_h, pad_w] or 6 [front, back, top, "
            f"bottom, left, right], each >= 0; got {paddings}"
        )
    if len(paddings) == 3:
        return tuple((p, p) for p in paddings)
    return tuple((paddings[2 * d], paddings[2 * d + 1]) for d in range(3))


def _same(size: int, k: int, stride: int) -> tuple[int, int]:
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def _channel_last(op: str, data_format: str) -> bool:
    if data_format not in ("NCDHW", "NDHWC", "AnyLayout"):
        raise AttrError(f"{op}: data_format must be 'NCDHW' or 'NDHWC', got '{data_format}'")
    return data_format == "NDHWC"


def _to_first(x, channel_last: bool):
    return x.transpose(0, 4, 1, 2, 3) if channel_last else x


def _to_last(y, channel_last: bool):
    return array_module(y).ascontiguousarray(y.transpose(0, 2, 3, 4, 1)) if channel_last else y


def _offsets(ksize) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(k) for k in ksize)))


def _slices(offset, dilations, strides, out_size) -> tuple[slice, ...]:
    """The strided slice of the padded input that kernel offset `offset` reads."""
    return (slice(None), slice(None)) + tuple(
        slice(o * dl, o * dl + s * (n - 1) + 1, s)
        for o, dl, s, n in zip(offset, dilations, strides, out_size)
    )


# ---- conv3d ----


def _conv3d_geometry(in_size, k_size, attrs: dict):
    """(pads, strides, dilations, out_size) of Fluid's conv3d InferShape; -1 for unknown dims."""
    op = "conv3d"
    if attrs["padding_algorithm"] not in _ALGORITHMS:
        raise AttrError(
            f"{op}: padding_algorithm must be one of {list(_ALGORITHMS)}, "
            f"got '{attrs['padding_algorithm']}'"
        )
    strides = _triple(op, attrs["strides"], "strides", 1)
    dilations = _triple(op, attrs["dilations"], "dilations", 1)
    pads = _pads3(op, attrs["paddings"])
    if attrs["padding_algorithm"] == "VALID":
        pads, dilations = ((0, 0),) * 3, dilations
    elif attrs["padding_algorithm"] == "SAME" and min(in_size) >= 0:
        pads = tuple(_same(n, k, s) for n, k, s in zip(in_size, k_size, strides))
        dilations = (1, 1, 1)
    out = []
    for d in range(3):
        if in_size[d] < 0:
            out.append(-1)
            continue
        span = in_size[d] + sum(pads[d]) - (dilations[d] * (k_size[d] - 1) + 1)
        if span < 0:
            raise ShapeError(
                f"{op}: the dilated filter ({dilations[d] * (k_size[d] - 1) + 1}) is larger "
                f"than the padded input ({in_size[d] + sum(pads[d])}) in spatial dim {d}"
            )
        out.append(span // strides[d] + 1)
    return pads, strides, dilations, tuple(out)


def _infer_conv3d(Input: VarInfo, Filter: VarInfo, **attrs) -> VarInfo:
    op = "conv3d"
    channel_last = _channel_last(op, attrs["data_format"])
    _require_rank(op, Input, "Input", 5, attrs["data_format"])
    _require_rank(op, Filter, "Filter", 5, "[M, C/groups, kd, kh, kw]")
    _require_float(op, Input, "Input")
    if Filter.dtype != Input.dtype:
        raise DTypeError(f"{op}: Filter is {Filter.dtype} but Input is {Input.dtype}")
    groups = attrs["groups"]
    if groups < 1:
        raise AttrError(f"{op}: groups must be >= 1, got {groups}")
    channels = Input.shape[4] if channel_last else Input.shape[1]
    if channels >= 0 and channels != Filter.shape[1] * groups:
        raise ShapeError(
            f"{op}: Input {list(Input.shape)} has {channels} channels but Filter "
            f"{list(Filter.shape)} with groups={groups} takes {Filter.shape[1] * groups}"
        )
    if Filter.shape[0] % groups:
        raise ShapeError(f"{op}: Filter's {Filter.shape[0]} outputs do not divide by {groups}")
    in_size = Input.shape[1:4] if channel_last else Input.shape[2:]
    *_, out = _conv3d_geometry(in_size, Filter.shape[2:], attrs)
    m = Filter.shape[0]
    shape = (Input.shape[0], *out, m) if channel_last else (Input.shape[0], m, *out)
    return VarInfo(shape, Input.dtype)


def _columns(x, w_shape, attrs):
    """(the padded input's kernel-offset slices stacked [N, C, K, *out], geometry)."""
    xp = array_module(x)
    pads, strides, dilations, out = _conv3d_geometry(x.shape[2:], w_shape[2:], attrs)
    padded = xp.pad(x, ((0, 0), (0, 0)) + pads)
    cols = xp.stack(
        [padded[_slices(o, dilations, strides, out)] for o in _offsets(w_shape[2:])], axis=2
    )
    return cols, (padded.shape, pads, strides, dilations, out)


@register_op
class conv3d:
    """Output = Input (*) Filter over depth, height and width: Input [N, C, D, H, W], Filter
    [M, C / groups, kd, kh, kw] -> Output [N, M, OD, OH, OW], OD = (D + pad_front + pad_back -
    (dilation * (kd - 1) + 1)) // stride + 1 (likewise OH, OW). `paddings` is [d, h, w] or
    [front, back, top, bottom, left, right]; padding_algorithm "SAME"/"VALID" as Fluid's;
    data_format "NDHWC" takes and gives channel-last data. ShapeError when the channels do
    not fit the filter and groups or the filter is larger than the padded input."""

    inputs, outputs = ("Input", "Filter"), ("Output",)
    attrs = {
        "strides": [1, 1, 1],
        "paddings": [0, 0, 0],
        "padding_algorithm": "EXPLICIT",
        "groups": 1,
        "dilations": [1, 1, 1],
        "data_format": "NCDHW",
        "workspace_size_MB": 512,
        "exhaustive_search": False,
        **_HINTS,
    }
    infer = _infer_conv3d

    def forward(Input, Filter, xp, **attrs):
        channel_last = _channel_last("conv3d", attrs["data_format"])
        x = _to_first(Input, channel_last)
        g, n, m = attrs["groups"], x.shape[0], Filter.shape[0]
        cols, (*_, out) = _columns(x, Filter.shape, attrs)
        rows = math.prod(Filter.shape[1:])
        cols = cols.reshape(n, g, rows, math.prod(out))
        w = Filter.reshape(g, m // g, rows)
        y = xp.einsum("gmr,ngrp->ngmp", w, cols).reshape((n, m) + out)
        return _to_last(y, channel_last)

    def backward(Input, Filter, Output, Output_grad, needs=(True, True), *, xp, **attrs):
        channel_last = _channel_last("conv3d", attrs["data_format"])
        x = _to_first(Input, channel_last)
        dy = _to_first(Output_grad, channel_last)
        g, (n, c), m = attrs["groups"], x.shape[:2], Filter.shape[0]
        cols, (padded_shape, pads, strides, dilations, out) = _columns(x, Filter.shape, attrs)
        rows = math.prod(Filter.shape[1:])
        cols = cols.reshape(n, g, rows, math.prod(out))
        dy = dy.reshape(n, g, m // g, math.prod(out))
        w = Filter.reshape(g, m // g, rows)
        w_grad = None
        if needs[1]:
            w_grad = xp.einsum("ngmp,ngrp->gmr", dy, cols).reshape(Filter.shape)
        x_grad = None
        if needs[0]:
            k = Filter.shape[2:]
            dcols = xp.einsum("gmr,ngmp->ngrp", w, dy).reshape((n, c, math.prod(k)) + out)
            dpadded = xp.zeros(padded_shape, dy.dtype)
            for j, o in enumerate(_offsets(k)):
                dpadded[_slices(o, dilations, strides, out)] += dcols[:, :, j]
            inner = tuple(slice(lo, lo + size) for (lo, _), size in zip(pads, x.shape[2:]))
            x_grad = _to_last(dpadded[(slice(None), slice(None)) + inner], channel_last)
        return x_grad, w_grad


# ---- pool3d ----


def _pool3d_geometry(in_size, attrs: dict):
    """(ksize, strides, pads (grown at the far edges for ceil_mode), out_size) of Fluid's
    pool3d InferShape; out_size holds -1 for unknown dims."""
    op = "pool3d"
    if attrs["pooling_type"] not in ("max", "avg"):
        raise AttrError(f"{op}: pooling_type must be 'max' or 'avg', got '{attrs['pooling_type']}'")
    if attrs["padding_algorithm"] not in _ALGORITHMS:
        raise AttrError(
            f"{op}: padding_algorithm must be one of {list(_ALGORITHMS)}, "
            f"got '{attrs['padding_algorithm']}'"
        )
    strides = _triple(op, attrs["strides"], "strides", 1)
    pads = _pads3(op, attrs["paddings"])
    if attrs["global_pooling"]:
        return tuple(in_size), (1, 1, 1), ((0, 0),) * 3, (1, 1, 1)
    ksize = _triple(op, attrs["ksize"], "ksize", 1)
    if attrs["adaptive"]:
        return ksize, strides, ((0, 0),) * 3, ksize
    if attrs["padding_algorithm"] == "VALID":
        pads = ((0, 0),) * 3
    elif attrs["padding_algorithm"] == "SAME" and min(in_size) >= 0:
        pads = tuple(_same(n, k, s) for n, k, s in zip(in_size, ksize, strides))
    out, grown = [], []
    for d in range(3):
        size, k, s, (p0, p1) = in_size[d], ksize[d], strides[d], pads[d]
        if size < 0:
            out.append(-1)
            grown.append((p0, p1))
            continue
        if k > size + p0 + p1:
            raise ShapeError(
                f"{op}: the window {list(ksize)} is larger than the padded input in spatial "
                f"dim {d}: {size} + {p0} + {p1} < {k}"
            )
        n_out = (size + p0 + p1 - k + (s - 1 if attrs["ceil_mode"] else 0)) // s + 1
        if k <= p0 or (n_out - 1) * s - p0 >= size:
            raise ShapeError(
                f"{op}: a window lies wholly in the padding in spatial dim {d}: size {size}, "
                f"window {k}, stride {s}, paddings {p0}, {p1}"
            )
        out.append(n_out)
        grown.append((p0, max(p1, (n_out - 1) * s + k - p0 - size)))
    return ksize, strides, tuple(grown), tuple(out)


def _infer_pool3d(X: VarInfo, **attrs) -> VarInfo:
    op = "pool3d"
    channel_last = _channel_last(op, attrs["data_format"])
    _require_rank(op, X, "X", 5, attrs["data_format"])
    _require_float(op, X, "X")
    in_size = X.shape[1:4] if channel_last else X.shape[2:]
    *_, out = _pool3d_geometry(in_size, attrs)
    c = X.shape[4] if channel_last else X.shape[1]
    return VarInfo((X.shape[0], *out, c) if channel_last else (X.shape[0], c, *out), X.dtype)


def _adaptive_cells(in_size, out_size):
    """Per output cell, its input box (Fluid's adaptive bounds: floor start, ceil end)."""
    bounds = [
        [((i * n) // o, -((-(i + 1) * n) // o)) for i in range(o)]
        for n, o in zip(in_size, out_size)
    ]
    for index in itertools.product(*(range(o) for o in out_size)):
        box = tuple(slice(*bounds[d][i]) for d, i in enumerate(index))
        yield (slice(None), slice(None)) + index, (slice(None), slice(None)) + box


def _avg_divisor(xp, in_size, ksize, strides, pads, out, exclusive: bool, dtype):
    if not exclusive:
        return float(math.prod(ksize))
    counts = []
    for n, k, s, (p0, _), o in zip(in_size, ksize, strides, pads, out):
        starts = xp.arange(o) * s - p0
        counts.append(xp.minimum(starts + k, n) - xp.maximum(starts, 0))
    return (counts[0][:, None, None] * counts[1][:, None] * counts[2]).astype(dtype)


@register_op
class pool3d:
    """Out = max or average over windows of X [N, C, D, H, W]: ksize windows every `strides`,
    paddings [d, h, w] or [front, back, top, bottom, left, right] (padding_algorithm
    "SAME"/"VALID" as Fluid), OD = (D + pads - kd) // stride + 1 (rounded up with ceil_mode).
    Average pooling divides by the window's input elements (`exclusive`, the default) or by
    kd * kh * kw; global_pooling takes the whole input; adaptive makes an output of size
    ksize. Max pooling's gradient goes to the first maximum of each window (row-major)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {
        "pooling_type": Required(str),
        "ksize": Required(list),
        "global_pooling": False,
        "strides": [1, 1, 1],
        "paddings": [0, 0, 0],
        "exclusive": True,
        "adaptive": False,
        "ceil_mode": False,
        "data_format": "NCDHW",
        "padding_algorithm": "EXPLICIT",
        "use_quantizer": False,
        "mkldnn_data_type": "float32",
        **_HINTS,
    }
    infer = _infer_pool3d

    def forward(X, xp, **attrs):
        channel_last = _channel_last("pool3d", attrs["data_format"])
        x = _to_first(X, channel_last)
        ksize, strides, pads, out = _pool3d_geometry(x.shape[2:], attrs)
        is_max = attrs["pooling_type"] == "max"
        if attrs["adaptive"]:
            y = xp.empty(x.shape[:2] + out, x.dtype)
            for cell, box in _adaptive_cells(x.shape[2:], out):
                part = x[box]
                y[cell] = part.max(axis=(2, 3, 4)) if is_max else part.mean(axis=(2, 3, 4))
            return _to_last(y, channel_last)
        fill = -np.inf if is_max else 0.0
        padded = xp.pad(x, ((0, 0), (0, 0)) + pads, constant_values=fill)
        y = None
        for o in _offsets(ksize):
            view = padded[_slices(o, (1, 1, 1), strides, out)]
            if y is None:
                y = view.copy()
            elif is_max:
                y = xp.maximum(y, view, out=y)
            else:
                y = xp.add(y, view, out=y)
        if not is_max:
            exclusive = attrs["exclusive"]
            y = y / _avg_divisor(xp, x.shape[2:], ksize, strides, pads, out, exclusive, x.dtype)
        return _to_last(y, channel_last)

    def backward(X, Out, Out_grad, xp, **attrs):
        channel_last = _channel_last("pool3d", attrs["data_format"])
        x, y, dy = (_to_first(a, channel_last) for a in (X, Out, Out_grad))
        ksize, strides, pads, out = _pool3d_geometry(x.shape[2:], attrs)
        is_max = attrs["pooling_type"] == "max"
        if attrs["adaptive"]:
            dx = xp.zeros(x.shape, dy.dtype)
            n, c = x.shape[:2]
            for cell, box in _adaptive_cells(x.shape[2:], out):
                part, g = x[box], dy[cell]
                if not is_max:
                    dx[box] += (g / math.prod(part.shape[2:]))[:, :, None, None, None]
                    continue
                first = part.reshape(n, c, math.prod(part.shape[2:])).argmax(axis=-1)
                hit = xp.arange(math.prod(part.shape[2:])) == first[:, :, None]
                dx[box] += (hit * g[:, :, None]).reshape(part.shape)
            return (_to_last(dx, channel_last),)
        fill = -np.inf if is_max else 0.0
        padded = xp.pad(x, ((0, 0), (0, 0)) + pads, constant_values=fill)
        dpadded = xp.zeros(padded.shape, dy.dtype)
        if is_max:
            unclaimed = xp.ones(y.shape, bool)
            for o in _offsets(ksize):
                where = _slices(o, (1, 1, 1), strides, out)
                hit = (padded[where] == y) & unclaimed
                unclaimed &= ~hit
                dpadded[where] += dy * hit
        else:
            exclusive = attrs["exclusive"]
            share = dy / _avg_divisor(
                xp, x.shape[2:], ksize, strides, pads, out, exclusive, dy.dtype
            )
            for o in _offsets(ksize):
                dpadded[_slices(o, (1, 1, 1), strides, out)] += share
        inner = tuple(slice(lo, lo + size) for (lo, _), size in zip(pads, x.shape[2:]))
        return (_to_last(dpadded[(slice(None), slice(None)) + inner], channel_last),)


# ---- bilinear_interp, nearest_interp ----


def _interp_size(op: str, X: VarInfo, out_h: int, out_w: int, scale: float, channel_last: bool):
    in_hw = X.shape[1:3] if channel_last else X.shape[2:]
    if out_h > 0 and out_w > 0:
        return out_h, out_w
    if scale > 0:
        return tuple(-1 if n < 0 else int(n * scale) for n in in_hw)
    raise AttrError(
        f"{op}: give out_h and out_w (> 0) or scale (> 0); got {out_h}, {out_w}, {scale}"
    )


def _interp_layout(op: str, data_layout: str) -> bool:
    if data_layout not in ("NCHW", "NHWC", "AnyLayout"):
        raise AttrError(f"{op}: data_layout must be 'NCHW' or 'NHWC', got '{data_layout}'")
    return data_layout == "NHWC"


def _infer_interp(op: str):
    def infer(X: VarInfo, **attrs) -> VarInfo:
        channel_last = _interp_layout(op, attrs["data_layout"])
        _require_rank(op, X, "X", 4, attrs["data_layout"])
        _require_float(op, X, "X")
        if attrs["align_mode"] not in (0, 1):
            raise AttrError(f"{op}: align_mode must be 0 or 1, got {attrs['align_mode']}")
        oh, ow = _interp_size(op, X, attrs["out_h"], attrs["out_w"], attrs["scale"], channel_last)
        if min(oh, ow) == 0:
            raise ShapeError(f"{op}: output size [{oh}, {ow}] of X {list(X.shape)} is empty")
        n = X.shape[0]
        c = X.shape[3] if channel_last else X.shape[1]
        return VarInfo((n, oh, ow, c) if channel_last else (n, c, oh, ow), X.dtype)

    return infer


def _interp_matrix(
    xp, method: str, n_in: int, n_out: int, align_corners: bool, align_mode: int, dtype
):
    """[n_out, n_in]: row k holds the weights output position k takes from the input (Fluid's
    interpolation kernels, axis by axis)."""
    k = xp.arange(n_out, dtype=np.float64)
    cols = xp.arange(n_in)[None, :]
    if align_corners:
        ratio = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        ratio = n_in / n_out
    if method == "nearest":
        src = (ratio * k + 0.5) if align_corners else ratio * k
        index = xp.minimum(src.astype(np.int64), n_in - 1)
        return (cols == index[:, None]).astype(dtype)
    half_pixel = align_mode == 0 and not align_corners
    src = xp.maximum(ratio * (k + 0.5) - 0.5, 0.0) if half_pixel else ratio * k
    low = xp.minimum(src.astype(np.int64), n_in - 1)
    high = xp.minimum(low + 1, n_in - 1)
    frac = (src - low)[:, None]
    weights = (cols == low[:, None]) * (1.0 - frac) + (cols == high[:, None]) * frac
    return weights.astype(dtype)


def _interp(method: str, X, attrs, xp):
    op = f"{method}_interp"
    channel_last = _interp_layout(op, attrs["data_layout"])
    x = X.transpose(0, 3, 1, 2) if channel_last else X
    info = VarInfo(x.shape, str(x.dtype))
    oh, ow = _interp_size(op, info, attrs["out_h"], attrs["out_w"], attrs["scale"], False)
    args = (attrs["align_corners"], attrs["align_mode"], x.dtype)
    rows = _interp_matrix(xp, method, x.shape[2], oh, *args)
    cols = _interp_matrix(xp, method, x.shape[3], ow, *args)
    return x, rows, cols, channel_last


def _interp_forward(method: str, X, attrs, xp):
    x, rows, cols, channel_last = _interp(method, X, attrs, xp)
    y = xp.einsum("oh,nchw,pw->ncop", rows, x, cols)
    return xp.ascontiguousarray(y.transpose(0, 2, 3, 1)) if channel_last else y


def _interp_backward(method: str, X, Out_grad, attrs, xp):
    x, rows, cols, channel_last = _interp(method, X, attrs, xp)
    dy = Out_grad.transpose(0, 3, 1, 2) if channel_last else Out_grad
    dx = xp.einsum("oh,ncop,pw->nchw", rows, dy, cols)
    return (xp.ascontiguousarray(dx.transpose(0, 2, 3, 1)) if channel_last else dx,)


_INTERP_ATTRS = {
    "out_d": -1,
    "out_h": -1,
    "out_w": -1,
    "scale": 0.0,
    "align_corners": True,
    "align_mode": 1,
    "data_layout": "NCHW",
}


def _interp_kernels(method: str):
    """The kernels of the 2-D resize op of `method`: forward and backward over the shared
    interpolation (out_d belongs to the 3-D form, interp_method is the op's own)."""

    def forward(
        X, out_d, out_h, out_w, scale, align_corners, align_mode, data_layout, interp_method, xp
    ):
        attrs = dict(
            out_h=out_h,
            out_w=out_w,
            scale=scale,
            align_corners=align_corners,
            align_mode=align_mode,
            data_layout=data_layout,
        )
        return _interp_forward(method, X, attrs, xp)

    def backward(
        X,
        Out,
        Out_grad,
        out_d,
        out_h,
        out_w,
        scale,
        align_corners,
        align_mode,
        data_layout,
        interp_method,
        xp,
    ):
        attrs = dict(
            out_h=out_h,
            out_w=out_w,
            scale=scale,
            align_corners=align_corners,
            align_mode=align_mode,
            data_layout=data_layout,
        )
        return _interp_backward(method, X, Out_grad, attrs, xp)

    return forward, backward


@register_op
class bilinear_interp:
    """Out = X [N, C, H, W] resized to [out_h, out_w] (or by `scale`, out = int(in * scale))
    by bilinear interpolation, as Fluid 1.8: align_corners (default) maps the corner pixels
    onto each other (src = k * (in - 1) / (out - 1)); otherwise align_mode 0 takes half-pixel
    centres (src = (k + 0.5) * in / out - 0.5, PyTorch's align_corners=False) and align_mode 1
    src = k * in / out. data_layout "NHWC" for channel-last data."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {**_INTERP_ATTRS, "interp_method": "bilinear"}
    grad_no_need_buffer = ("X",)
    infer = _infer_interp("bilinear_interp")

    forward, backward = _interp_kernels("bilinear")


@register_op
class nearest_interp:
    """Out = X [N, C, H, W] resized to [out_h, out_w] (or by `scale`) taking the nearest
    pixel, as Fluid 1.8: src = int(k * in / out) (PyTorch's mode="nearest") without
    align_corners, src = int(k * (in - 1) / (out - 1) + 0.5) with it (the default). The
    gradient adds each output's gradient into the pixel it copied."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {**_INTERP_ATTRS, "interp_method": "nearest"}
    grad_no_need_buffer = ("X",)
    infer = _infer_interp("nearest_interp")

    forward, backward = _interp_kernels("nearest")


# ---- pixel_shuffle ----


@register_op
class pixel_shuffle:
    """Out [N, C, H * r, W * r] from X [N, C * r * r, H, W], r = upscale_factor: channel
    c * r * r + i * r + j moves to pixel (h * r + i, w * r + j) of channel c (PyTorch's
    pixel_shuffle). data_format "NHWC" for channel-last data. ShapeError when X's channels do
    not divide by r * r."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"upscale_factor": 1, "data_format": "NCHW"}
    grad_no_need_buffer = ("X",)

    def infer(X, upscale_factor, data_format):
        op = "pixel_shuffle"
        if data_format not in ("NCHW", "NHWC"):
            raise AttrError(f"{op}: data_format must be 'NCHW' or 'NHWC', got '{data_format}'")
        _require_rank(op, X, "X", 4, data_format)
        r = upscale_factor
        if r < 1:
            raise AttrError(f"{op}: upscale_factor must be >= 1, got {r}")
        n, c, h, w = X.shape if data_format == "NCHW" else (X.shape[0], X.shape[3], *X.shape[1:3])
        if c >= 0 and c % (r * r):
            raise ShapeError(
                f"{op}: X {list(X.shape)} has {c} channels, which do not divide by "
                f"upscale_factor^2 = {r * r}"
            )
        c = c // (r * r) if c >= 0 else -1
        h, w = (-1 if h < 0 else h * r), (-1 if w < 0 else w * r)
        return VarInfo((n, c, h, w) if data_format == "NCHW" else (n, h, w, c), X.dtype)

    def forward(X, upscale_factor, data_format, xp):
        r = upscale_factor
        x = X if data_format == "NCHW" else X.transpose(0, 3, 1, 2)
        n, c, h, w = x.shape
        y = x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
        y = y.reshape(n, c // (r * r), h * r, w * r)
        return xp.ascontiguousarray(y if data_format == "NCHW" else y.transpose(0, 2, 3, 1))

    def backward(X, Out, Out_grad, upscale_factor, data_format, xp):
        r = upscale_factor
        dy = Out_grad if data_format == "NCHW" else Out_grad.transpose(0, 3, 1, 2)
        n, c, hr, wr = dy.shape
        dx = dy.reshape(n, c, hr // r, r, wr // r, r).transpose(0, 1, 3, 5, 2, 4)
        dx = dx.reshape(n, c * r * r, hr // r, wr // r)
        return (xp.ascontiguousarray(dx if data_format == "NCHW" else dx.transpose(0, 2, 3, 1)),)
