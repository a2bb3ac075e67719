"""Vision ops (NCHW): conv2d, depthwise_conv2d, conv2d_transpose, pool2d, lrn, flatten/flatten2.

Slots, attrs and defaults are Fluid 1.8's. Convolutions run on three primitives shared by both
directions: `_conv`, `_conv_input_grad` and `_conv_filter_grad`; conv2d_transpose is conv2d's
data gradient run forwards, so it reuses them with the roles swapped. Each picks its kernels by
`_kernel`: Winograd F(4x4, 3x3) for 3x3 stride-1 filters over enough output blocks
(nestflow/ops/winograd.py), one GEMM per image for 1x1 filters on large images, and otherwise
im2col (each kernel offset's strided view of the padded input copied into one
[C/g*kh*kw, OH*OW*N] array per group, then one GEMM; its gradient's col2im adds each offset's
columns back into a strided slice). im2col keeps the batch innermost ([C, H, W, N]) for stride
1 and second ([C, N, H, W]) for larger strides (`_Layout`). The forward's columns are kept for
the filter gradient (`_ColumnsMemo`). Pooling loops over the kh*kw kernel
offsets, each a vectorised operation on a strided view; no kernel loops over batch, channels or
pixels in Python.

The kernels run on any place: the helpers take their array module from the arrays they get
(`array_module`), and each path is one body over it.
On CUDAPlace the convs and pool2d run nestflow/ops/conv_cuda.py's kernels instead
(`forward_cuda` / `backward_cuda`: im2col + cuBLAS, a gather col2im), NCHW float32/float64;
the bodies here remain the reference and run for everything else.

Attrs that only steer Fluid's hardware back ends (use_cudnn, use_mkldnn, workspace_size_MB, ...)
are accepted so Fluid programs load, and have no effect.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from nestflow.core.device_context import (
    ROW_CHUNK_ELEMENTS,
    array_module,
    chunk_grain,
    device_context,
    thread_grain,
)
from nestflow.core.dtype import in_float32, is_floating, is_low_precision, rounded_to
from nestflow.core.place import place_of
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.ops import conv_cuda, winograd
from nestflow.ops.activation import shared_zeros
from nestflow.ops.gemm import matmul_nt, matmul_nt_contiguous, pooled_matmul
from nestflow.ops.layout import batch_last_into
from nestflow.ops.registry import Required, VarInfo, bilinear_double, fail, register_op

__all__: list[str] = []

# Fluid attrs that select a back end or a fused kernel there; accepted, without effect here.
_CONV_HINTS = {
    "use_cudnn": False,
    "use_mkldnn": False,
    "use_quantizer": False,
    "mkldnn_data_type": "float32",
    "fuse_relu": False,
    "fuse_brelu": False,
    "fuse_brelu_threshold": 6.0,
    "fuse_activation": "",
    "fuse_alpha": 0.0,
    "fuse_beta": 0.0,
    "fuse_residual_connection": False,
    "Scale_in": 1.0,
    "Scale_out": 1.0,
    "Scale_in_eltwise": 1.0,
    "Scale_weights": [1.0],
    "force_fp32_output": False,
    "workspace_size_MB": 512,
    "exhaustive_search": False,
    "is_test": False,
}

_LAYOUTS = ("NCHW", "NHWC", "AnyLayout")
_PADDING_ALGORITHMS = ("EXPLICIT", "SAME", "VALID")


# ---- attribute checks shared by the ops ----


def _require_float(info: VarInfo, slot: str) -> None:
    if not is_floating(info.dtype):
        raise DTypeError(
            f"{slot} {list(info.shape)} is {info.dtype}; this op computes in floating point "
            "(float16, float32, float64): cast it first"
        )


def _require_4d(info: VarInfo, slot: str, layout: str = "NCHW") -> None:
    if info.ndim != 4:
        fail(f"{slot} must be a 4-D {layout} tensor, got shape {list(info.shape)}")


def _pair(values: list, name: str, low: int) -> tuple[int, int]:
    """A 2-element int attr (height, width), each >= low."""
    if len(values) != 2 or any(not isinstance(v, int) or v < low for v in values):
        raise AttrError(f"{name} must be 2 ints >= {low} (height, width), got {values}")
    return values[0], values[1]


def _four_paddings(paddings: list) -> tuple[int, int, int, int]:
    """Fluid's paddings: [h, w] (both sides alike) or [top, bottom, left, right], each >= 0."""
    if len(paddings) not in (2, 4) or any(not isinstance(p, int) or p < 0 for p in paddings):
        raise AttrError(
            f"paddings must be 2 ints [pad_h, pad_w] or 4 [top, bottom, left, right], "
            f"each >= 0; got {paddings}"
        )
    if len(paddings) == 2:
        return paddings[0], paddings[0], paddings[1], paddings[1]
    return tuple(paddings)


def _check_layout(data_format: str) -> bool:
    """True for channel-last (NHWC) data."""
    if data_format not in _LAYOUTS:
        raise AttrError(f"data_format must be one of {list(_LAYOUTS)}, got '{data_format}'")
    return data_format == "NHWC"


def _check_algorithm(padding_algorithm: str) -> None:
    if padding_algorithm not in _PADDING_ALGORITHMS:
        raise AttrError(
            f"padding_algorithm must be one of {list(_PADDING_ALGORITHMS)}, "
            f"got '{padding_algorithm}'"
        )


def _same_pads(size: int, k: int, stride: int) -> tuple[int, int]:
    """ "SAME" padding of one dim: the output has ceil(size / stride) positions."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def _nchw(x: np.ndarray, channel_last: bool) -> np.ndarray:
    return x.transpose(0, 3, 1, 2) if channel_last else x


def _from_nchw(y: np.ndarray, channel_last: bool) -> np.ndarray:
    return array_module(y).ascontiguousarray(y.transpose(0, 2, 3, 1)) if channel_last else y


def _spatial(shape: tuple[int, ...], channel_last: bool) -> tuple[int, int]:
    return (shape[1], shape[2]) if channel_last else (shape[2], shape[3])


def _channels(shape: tuple[int, ...], channel_last: bool) -> int:
    return shape[3] if channel_last else shape[1]


def _with_chw(n: int, c: int, hw: tuple[int, int], channel_last: bool) -> tuple[int, ...]:
    return (n, hw[0], hw[1], c) if channel_last else (n, c, hw[0], hw[1])


# ---- im2col / col2im on NCHW arrays ----


def _window(x: np.ndarray, top: int, left: int, strides, out_hw) -> np.ndarray:
    """The strided view x[:, :, top + s_h*i, left + s_w*j] for i < out_h, j < out_w."""
    (sh, sw), (oh, ow) = strides, out_hw
    return x[:, :, top : top + sh * (oh - 1) + 1 : sh, left : left + sw * (ow - 1) + 1 : sw]


def _padded(x: np.ndarray, pads, value: float = 0.0) -> np.ndarray:
    top, bottom, left, right = pads
    if not (top or bottom or left or right):
        return x
    n, c, h, w = x.shape
    out = array_module(x).full((n, c, h + top + bottom, w + left + right), value, x.dtype)
    out[:, :, top : top + h, left : left + w] = x
    return out


@dataclass(frozen=True)
class _Layout:
    """Where the im2col kernels keep the batch axis: [C, H, W, N] (batch_last) or
    [C, N, H, W]. With the batch innermost a stride-1 kernel offset's strided copy or sum
    moves runs of OW * N contiguous elements, where NCHW gives runs of OW (a few elements on
    small images); with a stride above 1 those runs shrink to N elements (single ones at
    batch 1), so strided convs keep the batch second, where the copies move runs of OW and
    the GEMM's [M, N, OH, OW] output goes back to NCHW in runs of OH * OW."""

    batch_last: bool

    def shape(self, n: int, hw) -> tuple[int, ...]:
        """The axes after the channels: (H, W, N) or (N, H, W)."""
        return tuple(hw) + (n,) if self.batch_last else (n,) + tuple(hw)

    def arrange(self, x: np.ndarray, pads) -> np.ndarray:
        """x [N, C, H, W] in this layout, zero-padded by pads (top, bottom, left, right)."""
        top, bottom, left, right = pads
        n, c, h, w = x.shape
        shape = (c,) + self.shape(n, (h + top + bottom, w + left + right))
        out = array_module(x).zeros(shape, x.dtype)
        window = self.window(out, top, left, (1, 1), (h, w))
        if self.batch_last:
            batch_last_into(window, x)
        else:
            window[...] = self.from_nchw(x)
        return out

    def window(self, a: np.ndarray, top: int, left: int, strides, out_hw) -> np.ndarray:
        """The strided view of a's pixels (top + s_h * i, left + s_w * j), i < OH, j < OW."""
        (sh, sw), (oh, ow) = strides, out_hw
        rows = slice(top, top + sh * (oh - 1) + 1, sh)
        cols = slice(left, left + sw * (ow - 1) + 1, sw)
        return a[:, rows, cols] if self.batch_last else a[:, :, rows, cols]

    def from_nchw(self, a: np.ndarray) -> np.ndarray:
        """[N, C, H, W] as a view in this layout."""
        return a.transpose(1, 2, 3, 0) if self.batch_last else a.transpose(1, 0, 2, 3)

    def to_nchw(self, a: np.ndarray) -> np.ndarray:
        """[C, ...] in this layout as a contiguous [N, C, H, W]."""
        return array_module(a).ascontiguousarray(
            a.transpose(3, 0, 1, 2) if self.batch_last else a.transpose(1, 0, 2, 3)
        )


def _layout(geo: _ConvGeometry) -> _Layout:
    """Batch last for a stride-1 conv, unless its product sums few terms (_FEW_TERMS: 25 for
    LeNet's 1-channel 5x5, 27 for an RGB 3x3): then the product is cheap beside the copies,
    and images first copies less. Measured on the 2-vCPU EPYC, fwd+bwd at 1 thread, batch
    last against images first: 3->64 3x3 on [32, 3, 32, 32] (ResNet's stem, no input
    gradient) 5.03 / 4.15 ms; 1->32 3x3 on [64, 1, 28, 28] 4.18 / 2.30; LeNet's 1->6 5x5
    0.851 / 0.794; but 4->16 5x5 on [32, 4, 20, 20] (100 terms) 1.50 / 1.75, and 6->16 5x5
    on [64, 6, 12, 12] 1.27 / 1.82. At 2 threads the stem 4.61 / 4.30, 1->32 4.57 / 2.52,
    LeNet's 0.787 / 0.764."""
    return _Layout(batch_last=geo.strides == (1, 1) and not geo.few_terms)


def _phases(xt: np.ndarray, strides) -> np.ndarray:
    """xt [C, N, Hp, Wp] split by stride phase: [sh, sw, C, N, ceil(Hp / sh), ceil(Wp / sw)],
    phase (a, b) holding xt's pixels (a + sh * i, b + sw * j). A strided conv's kernel offset
    (p, q) then reads phase (p % sh, q % sw) from (p // sh, q // sw) with stride 1: its copy
    moves contiguous runs of OW, where the strided view reads every sh-th element."""
    (sh, sw), (c, n, hp, wp) = strides, xt.shape
    ph, pw = -(-hp // sh), -(-wp // sw)
    out = array_module(xt).zeros((sh, sw, c, n, ph, pw), xt.dtype)
    for a in range(sh):
        for b in range(sw):
            view = xt[:, :, a::sh, b::sw]
            out[a, b, :, :, : view.shape[2], : view.shape[3]] = view
    return out


def _im2col(xt: np.ndarray, k_hw, geo: _ConvGeometry, out_hw) -> np.ndarray:
    """Columns [C, kh, kw, *layout.shape(N, (OH, OW))] of the padded input xt in
    _layout(geo): one copy per kernel offset (read from _phases for a stride above 1), over
    blocks of channels on the intra-op pool (_by_channels)."""
    (kh, kw), (dh, dw), layout = k_hw, geo.dilations, _layout(geo)
    n = xt.shape[3] if layout.batch_last else xt.shape[1]
    xp = array_module(xt)
    cols = xp.empty(xt.shape[:1] + (kh, kw) + layout.shape(n, out_hw), xt.dtype)
    if geo.strides == (1, 1):
        # every offset's window as one view, copied by one call (25 copies for a 5x5 kernel
        # took longer: LeNet's second conv 0.060 -> 0.035 ms, a 64-channel 5x5 on 28x28 16.0
        # -> 12.2); strided windows copy faster one offset at a time (1.64 against 2.23 ms)
        c_stride, *axes = xt.strides
        if layout.batch_last:  # [C, Hp, Wp, N]
            h_stride, w_stride, n_stride = axes
            shape = (kh, kw) + tuple(out_hw) + (n,)
            strides = (dh * h_stride, dw * w_stride, h_stride, w_stride, n_stride)
        else:  # [C, N, Hp, Wp]
            n_stride, h_stride, w_stride = axes
            shape = (kh, kw, n) + tuple(out_hw)
            strides = (dh * h_stride, dw * w_stride, n_stride, h_stride, w_stride)

        def copied(start: int, stop: int) -> None:
            part = xt[start:stop]
            windows = xp.lib.stride_tricks.as_strided(
                part, part.shape[:1] + shape, (c_stride,) + strides
            )
            cols[start:stop] = windows

        return _by_channels(cols, copied)
    (sh, sw), (oh, ow) = geo.strides, out_hw
    # the phase split costs one copy of the input: worth it when many offsets read it (a 7x7
    # stride-2 conv's im2col takes a third less time; a 3x3 one's gains little)
    split = not layout.batch_last and kh * kw >= 4 * sh * sw
    phases = _phases(xt, geo.strides) if split else None

    def offsets(start: int, stop: int) -> None:
        for i in range(kh):
            for j in range(kw):
                if phases is None:
                    window = layout.window(xt[start:stop], i * dh, j * dw, geo.strides, out_hw)
                    cols[start:stop, i, j] = window
                    continue
                (top, a), (left, b) = divmod(i * dh, sh), divmod(j * dw, sw)
                cols[start:stop, i, j] = phases[
                    a, b, start:stop, :, top : top + oh, left : left + ow
                ]

    return _by_channels(cols, offsets)


def _col2im(cols: np.ndarray, padded_hw, geo: _ConvGeometry, out_hw) -> np.ndarray:
    """The adjoint of _im2col: the columns summed into a zero padded input, over blocks of
    channels on the intra-op pool (_by_channels)."""
    layout = _layout(geo)
    c, kh, kw = cols.shape[:3]
    n = cols.shape[5] if layout.batch_last else cols.shape[3]
    if (kh, kw) == (1, 1) and geo.strides == (1, 1) and tuple(out_hw) == tuple(padded_hw):
        return cols[:, 0, 0]
    out = array_module(cols).empty((c,) + layout.shape(n, padded_hw), cols.dtype)

    def summed(start: int, stop: int) -> None:
        block = out[start:stop]
        block[...] = 0
        for i in range(kh):
            for j in range(kw):
                view = layout.window(
                    block, i * geo.dilations[0], j * geo.dilations[1], geo.strides, out_hw
                )
                view += cols[start:stop, i, j]

    return _by_channels(out, summed, cols[:1].size)


# im2col's copies and col2im's sums split their channels across the intra-op pool in blocks
# of at least this many elements copied or added.
_COPY_CHUNK_ELEMENTS = ROW_CHUNK_ELEMENTS


def _by_channels(out: np.ndarray, body, channel_cost: int | None = None) -> np.ndarray:
    """body(start, stop) over blocks of out's leading (channel) axis on the pool of out's
    place (thread_grain: one call for small work, and on a device); out. channel_cost: the
    elements a channel's work moves (default: its share of out)."""
    c = out.shape[0]
    if c:
        cost = out[:1].size if channel_cost is None else channel_cost
        grain = thread_grain(c, cost, _COPY_CHUNK_ELEMENTS)
        device_context(place_of(out)).parallel_for(c, body, grain)
    return out


class _ColumnsMemo:
    """The im2col columns (or Winograd tiles) of recent conv forwards, kept until the conv's
    gradient takes them: recomputing them costs up to a tenth of a conv's forward and backward.
    An entry is keyed by the op's Input and Output array objects, both held weakly (the entry
    dies with either): the gradient op reads both, so the executor writes into neither before
    it runs, and the forward made Output afresh, so no other op's arrays match. At most
    `limit` bytes are kept, the oldest entries dropped first (their gradients recompute them)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[tuple[int, int], tuple] = {}
        self._bytes = 0
        self._lock = threading.RLock()  # weakref callbacks may run in any thread

    def _drop(self, ident: tuple[int, int]) -> tuple | None:
        entry = self._entries.pop(ident, None)
        if entry is not None:
            self._bytes -= _nbytes(entry[1][1])
        return entry

    def put(self, x: np.ndarray, out: np.ndarray, kept: tuple) -> None:
        """Keep kept = (tag, columns) for the conv that read x and wrote out."""
        ident = (id(x), id(out))

        def forget(_ref, ident=ident):
            with self._lock:
                self._drop(ident)

        size = _nbytes(kept[1])
        with self._lock:
            self._drop(ident)
            if size > self.limit:
                return
            while self._entries and self._bytes + size > self.limit:
                self._drop(next(iter(self._entries)))
            refs = (weakref.ref(x, forget), weakref.ref(out, forget))
            self._entries[ident] = (refs, kept)
            self._bytes += size

    def take(self, x: np.ndarray, out: np.ndarray) -> tuple | None:
        """The (tag, columns) kept for this x and out, removed; None if there are none."""
        with self._lock:
            ident = (id(x), id(out))
            entry = self._entries.get(ident)
            if entry is None or entry[0][0]() is not x or entry[0][1]() is not out:
                return None
            return self._drop(ident)[1]


def _nbytes(kept) -> int:
    """The bytes of a kept array, or of a batch-chunked conv's list of (tag, array) pairs."""
    if isinstance(kept, list):
        return sum(_nbytes(part[1]) for part in kept if part is not None)
    return kept.nbytes


_COLUMNS = _ColumnsMemo(limit=256 << 20)


@dataclass(frozen=True)
class _ConvGeometry:
    """Resolved strides, paddings (top, bottom, left, right), dilations and groups, and
    whether the conv's product sums few terms (_layout)."""

    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilations: tuple[int, int]
    groups: int
    few_terms: bool = False

    def out_hw(self, in_hw, k_hw) -> tuple[int, int]:
        """Output positions of a convolution over `in_hw` (-1 where unknown)."""
        sizes = []
        for d in range(2):
            size = in_hw[d]
            padded = size + self.pads[2 * d] + self.pads[2 * d + 1]
            extent = self.dilations[d] * (k_hw[d] - 1) + 1
            sizes.append(-1 if size < 0 else (padded - extent) // self.strides[d] + 1)
        return sizes[0], sizes[1]

    def transposed_hw(self, in_hw, k_hw) -> tuple[int, int]:
        """Output positions of a transposed convolution over `in_hw` (-1 where unknown)."""
        sizes = []
        for d in range(2):
            size = in_hw[d]
            extent = self.dilations[d] * (k_hw[d] - 1) + 1
            pads = self.pads[2 * d] + self.pads[2 * d + 1]
            sizes.append(-1 if size < 0 else (size - 1) * self.strides[d] - pads + extent)
        return sizes[0], sizes[1]


# A conv whose product sums at most this many terms (input channels a group x kh x kw: a
# grey or RGB image's first conv) arranges im2col's columns images first (_layout).
_FEW_TERMS = 32


def _conv_geometry(attrs: dict, in_hw, k_hw, group_channels: int = 0) -> _ConvGeometry:
    """Fluid's UpdatePaddingAndDilation: "SAME" pads for ceil(size / stride) outputs with
    dilation 1, "VALID" pads nothing, "EXPLICIT" takes `paddings`. group_channels: the
    conv's input channels a group (its filter's axis 1), for _layout."""
    strides = _pair(attrs["strides"], "strides", 1)
    dilations = _pair(attrs["dilations"], "dilations", 1)
    pads = _four_paddings(attrs["paddings"])
    groups = attrs["groups"]
    if groups < 1:
        raise AttrError(f"groups must be >= 1, got {groups}")
    algorithm = attrs["padding_algorithm"]
    _check_algorithm(algorithm)
    if algorithm == "VALID":
        pads = (0, 0, 0, 0)
    elif algorithm == "SAME":
        if in_hw[0] < 0 or in_hw[1] < 0:
            pads = (0, 0, 0, 0)  # resolved when the sizes are known (out_hw gives -1 then)
        else:
            pads = _same_pads(in_hw[0], k_hw[0], strides[0]) + _same_pads(
                in_hw[1], k_hw[1], strides[1]
            )
        dilations = (1, 1)
    few = 0 < group_channels * k_hw[0] * k_hw[1] <= _FEW_TERMS and groups == 1
    return _ConvGeometry(strides, pads, dilations, groups, few)


def _columns(x: np.ndarray, k_hw, geo: _ConvGeometry, out_hw) -> np.ndarray:
    """im2col of x [N, C, H, W]: [groups, C/g * kh * kw, OH * OW * N] (pixels in
    _layout(geo)'s order)."""
    cols = _im2col(_layout(geo).arrange(x, geo.pads), k_hw, geo, out_hw)
    n, c = x.shape[:2]
    return cols.reshape(geo.groups, c // geo.groups * k_hw[0] * k_hw[1], math.prod(out_hw) * n)


def _grouped_grad(grad: np.ndarray, geo: _ConvGeometry) -> np.ndarray:
    """grad [N, M, OH, OW] as [groups, M/g, OH * OW * N], the im2col GEMMs' layout."""
    n, m, oh, ow = grad.shape
    xp = array_module(grad)
    if _layout(geo).batch_last:
        arranged = batch_last_into(xp.empty((m, oh, ow, n), grad.dtype), grad)
    else:
        arranged = xp.ascontiguousarray(grad.transpose(1, 0, 2, 3))
    return arranged.reshape(geo.groups, m // geo.groups, oh * ow * n)


# A 1x1 conv over images at least this large, or whose GEMM per image has at least
# _POINTWISE_MIN_WORK multiply-adds (per group) over at least _POINTWISE_NARROWEST pixels, runs
# one GEMM per image on the data as it lies (no rearranging copies); smaller GEMMs run too
# slowly one image at a time. (ResNet-18's 8x8 -> 4x4 stride-2 shortcut, 512 x 256 filters on
# 16 pixels an image: 5.1 ms per image against 4.3 ms through im2col's one GEMM at 1 thread,
# 5.3 against 2.8 at 2.)
_POINTWISE_MIN_PIXELS = 256
_POINTWISE_MIN_WORK = 1 << 20
_POINTWISE_NARROWEST = 64


# Winograd pays for its filter transform (36 x M x C values a call) and tile copies over enough
# 4x4 output blocks (over the batch): at least _WINOGRAD_MIN_BLOCKS where nearly every
# computed output is used (_WINOGRAD_USED of them: 28x28, 8x8 or 4x4 images), at least
# _WINOGRAD_ANY_BLOCKS where many are cut off (7x7 and 14x14 images compute 8x8 and 16x16:
# 77% used). Measured fwd + both gradients on the 2-vCPU EPYC (OpenBLAS SkylakeX kernels),
# Winograd / im2col ms at 1 thread (2 threads): 512->512 on [32, 512, 4, 4] (32 blocks,
# ResNet-18's last stage) 41.4 / 35.3 (27.1 / 20.3); on [64, 512, 4, 4] 55.8 / 69.5 (36.3 /
# 40.2); 256->256 on [8, 256, 8, 8] (32) 9.0 / 8.9 (6.1 / 5.3), [12, ...] (48) 11.9 / 13.9
# (7.6 / 8.5); 512->512 on [16, 512, 7, 7] (64 blocks) 57.4 / 52.9 (36.7 / 30.0), [32, ...]
# 88.1 / 104.9 (51.8 / 59.4); 256->256 on [4, 256, 14, 14] (64) 14.7 / 14.0 (10.2 / 8.6),
# [8, ...] 22.7 / 28.5 (15.4 / 17.2).
_WINOGRAD_MIN_BLOCKS = 48
_WINOGRAD_ANY_BLOCKS = 128
_WINOGRAD_USED = 0.85


def _winograd_pays(out_hw, batch: int) -> bool:
    """Whether `batch` images of out_hw outputs have enough 4x4 output blocks for Winograd."""
    blocks = -(-out_hw[0] // 4) * -(-out_hw[1] // 4) * batch
    used = out_hw[0] * out_hw[1] * batch / max(1, 16 * blocks)
    return blocks >= _WINOGRAD_ANY_BLOCKS or (
        blocks >= _WINOGRAD_MIN_BLOCKS and used >= _WINOGRAD_USED
    )


def _kernel(w_shape, geo: _ConvGeometry, out_hw, dtype, batch: int) -> str:
    """Which kernels compute a conv of `batch` images with out_hw outputs each: "winograd"
    (3x3, stride 1, enough 4x4 output blocks), "pointwise" (1x1 unpadded, on large images or
    with many channels) or "im2col" (everything else)."""
    if _winograd_pays(out_hw, batch) and winograd.applies(
        w_shape, geo.strides, geo.dilations, geo.groups, dtype
    ):
        return "winograd"
    pixels = out_hw[0] * out_hw[1]
    work = w_shape[0] // geo.groups * w_shape[1] * pixels
    pointwise = tuple(w_shape[2:]) == (1, 1) and not any(geo.pads)
    wide = pixels >= _POINTWISE_NARROWEST and work >= _POINTWISE_MIN_WORK
    if pointwise and (pixels >= _POINTWISE_MIN_PIXELS or wide):
        return "pointwise"
    return "im2col"


def _per_image(a: np.ndarray, groups: int) -> np.ndarray:
    """a [N, C, H, W] as [N, groups, C/g, H * W] (a view of contiguous data)."""
    n, c, h, w = a.shape
    return a.reshape(n, groups, c // groups, h * w)


# The epilogue works on blocks of about this many elements (1 MiB of float32), so that its
# additions and relu pass over data in cache instead of memory.
_EPILOGUE_BLOCK = 1 << 18


@dataclass(frozen=True)
class _Epilogue:
    """What a fused conv adds to its output, in place: + bias per channel (bias [M]), +
    residual (broadcastable to the output, [N or 1, M or 1, OH or 1, OW or 1]), then relu;
    in that order, as Fluid's fused (MKL-DNN) conv does."""

    bias: np.ndarray | None
    residual: np.ndarray | None
    relu: bool

    def apply(self, out: np.ndarray, first: int) -> None:
        """Finish out [n, M, OH, OW], images first..first + n of the batch, block by block."""
        xp = array_module(out)
        n, m = out.shape[:2]
        pixels = max(1, out[:1, :1].size)
        images = max(1, _EPILOGUE_BLOCK // (m * pixels))
        channels = m if images > 1 else max(1, _EPILOGUE_BLOCK // pixels)
        bias = None if self.bias is None else self.bias.reshape(m, 1, 1)
        res = self.residual
        for i in range(0, n, images):
            for c in range(0, m, channels):
                block = out[i : i + images, c : c + channels]
                if bias is not None:
                    block += bias[c : c + channels]
                if res is not None:
                    start = first + i
                    rows = slice(start, start + len(block)) if res.shape[0] > 1 else slice(None)
                    block += res[rows, c : c + channels] if res.shape[1] > 1 else res[rows]
                if self.relu:  # NumPy: shared zeros beat a scalar; CuPy takes the scalar
                    xp.maximum(block, shared_zeros(block) if xp is np else 0, out=block)


def _strided(x: np.ndarray, geo: _ConvGeometry) -> np.ndarray:
    """The pixels an unpadded 1x1 conv reads: every stride-th (a contiguous copy)."""
    if geo.strides == (1, 1):
        return x
    return array_module(x).ascontiguousarray(x[:, :, :: geo.strides[0], :: geo.strides[1]])


def _conv(
    x: np.ndarray,
    w: np.ndarray,
    geo: _ConvGeometry,
    finish: _Epilogue | None = None,
    first: int = 0,
    out: np.ndarray | None = None,
    transforms: winograd.FilterTransforms | None = None,
) -> tuple[np.ndarray, tuple | None]:
    """Convolution of x [N, C, H, W] with w [M, C/g, kh, kw]: ([N, M, OH, OW], what the
    filter gradient can reuse, as (tag, array), or None), `finish` applied to the output.
    Kernels by _kernel; im2col runs one GEMM per group over all images at once, as per-image
    GEMMs are too small on small images. x is images first.. of the op's batch (the
    epilogue's residual rows). out: a C-contiguous [N, M, OH, OW] to write (a chunk's slice
    of the whole output), else a new array. transforms: w's Winograd filters, shared by the
    chunks of one op."""
    xp = array_module(x)
    m, cg, kh, kw = w.shape
    g, n = geo.groups, x.shape[0]
    out_hw = geo.out_hw(x.shape[2:], (kh, kw))
    kernel = _kernel(w.shape, geo, out_hw, x.dtype, n)
    if out is None:
        out = xp.empty((n, m) + out_hw, x.dtype)
    if kernel == "pointwise":
        pixels, filters = _per_image(_strided(x, geo), g), w.reshape(g, m // g, cg)
        if finish is None:
            xp.matmul(filters, pixels, out=out.reshape(n, g, m // g, math.prod(out_hw)))
            return out, None
        # image by image, each finished while its output is in cache
        for i in range(n):
            xp.matmul(filters, pixels[i], out=out[i].reshape(g, m // g, -1))
            finish.apply(out[i : i + 1], first + i)
        return out, None
    kept = _unfinished_conv(x, w, geo, kernel, out_hw, out, transforms)
    if finish is not None:
        finish.apply(out, first)
    return out, kept


# The intra-op pool splits a conv's batch into chunks of at least _CONV_CHUNK_WORK
# multiply-adds (about 0.3 ms of single-threaded GEMM: the pool's ~50 us per call stays small
# beside it) and _CONV_CHUNK_PIXELS output pixels (narrower GEMMs run slower, and Winograd needs
# enough 4x4 blocks per chunk): at most _CONV_FEW_CHUNKS of them, up to _CONV_MAX_CHUNKS where
# each keeps _CONV_WIDE_CHUNK_PIXELS, never more (device_context._chunk_threads says why). The
# chunks depend on the shapes only, so the filter gradient's sum over chunks has the same bits
# whatever the thread count.
#
# Why more chunks where they stay wide: two threads each running a Winograd chunk of 8 of W9's
# images ([8, 64, 28, 28]; its tiles, transforms and products 3.6 MB each) slow each other by
# a third (forward and both gradients, pinned to one vCPU of the 2-vCPU EPYC: 4.85 ms alone,
# 6.58 beside the same chunk), chunks of 4 images by a sixth (2.46 -> 2.87 ms) at the same
# cost per image alone. W9 3x3 at 1 / 2 threads, one process: 4 chunks 22.5 / 14.8 ms, 8
# chunks 22.0 / 13.4. Narrow chunks lose that: ResNet-18's (W13) 128-channel 16x16 convs in 8
# chunks of 1,024 pixels took 11-12 ms for their gradients at 2 threads against 9-9.6 in 4.
#
# A small conv's chunks are mostly Python and small copies that hold the GIL, so the least work
# per chunk is 8M multiply-adds: LeNet's (W8) convs, 5.5M and 9.8M in all, split in chunks of
# 2M made its step 4.9 ms at 2 threads and 4.4 at 1; whole, 3.9 and 4.1 (PyTorch: 2.0 and 3.4).
_CONV_CHUNK_WORK = 1 << 23
_CONV_FEW_CHUNKS, _CONV_MAX_CHUNKS = 4, 8
_CONV_CHUNK_PIXELS, _CONV_WIDE_CHUNK_PIXELS = 1024, 2048


def _conv_grain(w_shape, out_hw, batch: int) -> int:
    """Images per chunk of a conv with filter w_shape [M, C/g, kh, kw] (batch when one)."""
    pixels = out_hw[0] * out_hw[1]
    cost = math.prod(w_shape) * pixels
    narrow = batch * pixels // _CONV_CHUNK_PIXELS
    wide = batch * pixels // _CONV_WIDE_CHUNK_PIXELS
    limit = max(min(narrow, _CONV_FEW_CHUNKS), wide)
    return chunk_grain(batch, cost, _CONV_CHUNK_WORK, _CONV_MAX_CHUNKS, limit)


def _pooled_conv(x, w, geo: _ConvGeometry, finish, out_shape, device) -> tuple:
    """_conv over chunks of the batch on device's pool, each writing its slice of the output;
    the kept columns are the chunks' ((\"chunks\", grain), [(tag, array), ...])."""
    n = x.shape[0]
    if device is None or n == 0:
        return _conv(x, w, geo, finish)
    grain = _conv_grain(w.shape, out_shape[2:], n)
    out = array_module(x).empty(out_shape, x.dtype) if grain < n else None
    transforms = winograd.FilterTransforms(w)

    def body(start: int, stop: int):
        into = None if out is None else out[start:stop]
        part, kept = _conv(x[start:stop], w, geo, finish, start, into, transforms)
        return (part if out is None else None), kept  # one chunk: the whole output

    parts = device.parallel_for(n, body, grain)
    if out is None:
        return parts[0]
    return out, (("chunks", grain), [kept for _, kept in parts])


def _unfinished_conv(x, w, geo: _ConvGeometry, kernel: str, out_hw, out, transforms=None) -> tuple:
    """The conv by `kernel` (im2col or winograd) written into out [N, M, OH, OW]: what the
    filter gradient can reuse, as (tag, array)."""
    m, cg, kh, kw = w.shape
    g = geo.groups
    if kernel == "winograd":
        _, v = winograd.conv(x, w, geo.pads, out, transforms=transforms)
        return ("winograd", geo), v
    n = x.shape[0]
    cols = _columns(x, (kh, kw), geo, out_hw)
    filters = w.reshape(g, m // g, cg * kh * kw)
    # [M/g, pixels] per group, then NCHW. [pixels, M/g] (the filters as the product's columns)
    # ran slower on every shape measured with OpenBLAS 0.3.31's SkylakeX kernels, and its
    # layout change moved runs of M/g: LeNet's 6->16 5x5 0.365 -> 0.235 ms, 64->64 5x5 on
    # [32, 64, 28, 28] 40.2 -> 36.1 ms, 16->64 5x5 on 16x16 2.81 -> 2.17 ms (product + layout)
    # at 1 thread; at 2: 0.239 -> 0.159, 22.4 -> 19.1, 3.01 -> 1.29 ms
    layout = _layout(geo)
    product = pooled_matmul(filters, cols).reshape((g, m // g) + layout.shape(n, out_hw))
    order = (4, 0, 1, 2, 3) if layout.batch_last else (2, 0, 1, 3, 4)
    out.reshape((n, g, m // g) + tuple(out_hw))[...] = product.transpose(order)
    return ((kh, kw), geo), cols


def _conv_input_grad(
    grad, w: np.ndarray, in_hw, geo: _ConvGeometry, grad_g=None, out=None, transforms=None
) -> np.ndarray:
    """d(conv)/d(input) applied to grad [N, M, OH, OW]: [N, C, H, W] for input size in_hw,
    written into `out` (a C-contiguous [N, C, H, W], a chunk's slice of the whole) if given.
    grad_g: grad in _shared_grad's layout, if the caller has it; transforms: w's Winograd
    filters, shared by the chunks of one op."""
    xp = array_module(grad)
    m, cg, kh, kw = w.shape
    g, n = geo.groups, grad.shape[0]
    kernel = _kernel(w.shape, geo, grad.shape[2:], grad.dtype, n)
    if kernel == "winograd":
        dx = winograd.input_grad(grad, w, geo.pads, transforms, grad_g)
        if dx is not None:
            return dx if out is None else _written(out, dx)
    if kernel == "pointwise":
        wt = w.reshape(g, m // g, cg).transpose(0, 2, 1)
        if geo.strides == (1, 1):
            into = None if out is None else out.reshape(n, g, cg, math.prod(grad.shape[2:]))
            dx = xp.matmul(wt, _per_image(grad, g), out=into)
            return dx.reshape((n, g * cg) + grad.shape[2:]) if out is None else out
        full = xp.zeros((n, g * cg) + tuple(in_hw), grad.dtype) if out is None else out
        if out is not None:
            full[...] = 0
        dx = xp.matmul(wt, _per_image(grad, g)).reshape((n, g * cg) + grad.shape[2:])
        full[:, :, :: geo.strides[0], :: geo.strides[1]] = dx
        return full
    grad_g = _grouped_grad(grad, geo) if grad_g is None else grad_g
    wt = w.reshape(g, m // g, cg * kh * kw).transpose(0, 2, 1)
    layout, out_hw = _layout(geo), grad.shape[2:]
    cols = pooled_matmul(wt, grad_g).reshape((g * cg, kh, kw) + layout.shape(n, out_hw))
    top, bottom, left, right = geo.pads
    h, wd = in_hw
    padded = _col2im(cols, (h + top + bottom, wd + left + right), geo, out_hw)
    window = layout.window(padded, top, left, (1, 1), (h, wd))
    if out is None:
        return layout.to_nchw(window)
    return _written(
        out, window.transpose(3, 0, 1, 2) if layout.batch_last else window.swapaxes(0, 1)
    )


def _shared_grad(grad, geo: _ConvGeometry, kernel: str, needs) -> np.ndarray | None:
    """grad in the layout both gradients' kernels read (made once for the two), or None:
    _grouped_grad's for im2col, winograd.padded_grad's when Winograd makes both (needs[0]
    and needs[1]: the input and filter gradients; the op's further entries, bias and
    residual, have no say)."""
    if kernel == "im2col":
        return _grouped_grad(grad, geo)
    if kernel == "winograd" and needs[0] and needs[1]:
        return winograd.padded_grad(grad, geo.pads)
    return None


def _written(out: np.ndarray, value) -> np.ndarray:
    out[...] = value
    return out


def _reused(kept: tuple | None, tag: tuple) -> np.ndarray | None:
    return kept[1] if kept is not None and kept[0] == tag else None


def _conv_filter_grad(x: np.ndarray, grad, w_shape, geo: _ConvGeometry, grad_g=None, kept=None):
    """d(conv)/d(filter) for input x [N, C, H, W] and grad [N, M, OH, OW]: w_shape.
    grad_g: grad in _shared_grad's layout, if the caller has it; kept: what _conv returned
    for reuse, if the caller has it."""
    kernel = _kernel(w_shape, geo, grad.shape[2:], x.dtype, x.shape[0])
    if kernel == "winograd":
        v = _reused(kept, ("winograd", geo))
        if v is None:
            v = winograd.input_transform(x, geo.pads, grad.shape[2:])
        return winograd.filter_grad(v, grad, grad_g, geo.pads)
    if kernel == "pointwise":
        pixels = _per_image(_strided(x, geo), geo.groups)
        per_image = matmul_nt(_per_image(grad, geo.groups), pixels)
        # C-contiguous: matmul_nt_contiguous's docstring says why
        return array_module(x).ascontiguousarray(per_image.sum(axis=0)).reshape(w_shape)
    k_hw = tuple(w_shape[2:])
    cols = _reused(kept, (k_hw, geo))
    if cols is None:
        cols = _columns(x, k_hw, geo, grad.shape[2:])
    grad_g = _grouped_grad(grad, geo) if grad_g is None else grad_g
    return matmul_nt_contiguous(grad_g, cols).reshape(w_shape)


# ---- conv2d and depthwise_conv2d ----


def _conv_operands(Input: VarInfo, Filter: VarInfo, attrs: dict, filter_layout: str):
    """Checks shared by the conv and transposed conv: a 4-D float Input, a 4-D Filter of its
    dtype with positive sizes. Returns (channel_last, Input's spatial size, geometry)."""
    channel_last = _check_layout(attrs["data_format"])
    _require_4d(Input, "Input", "NHWC" if channel_last else "NCHW")
    _require_4d(Filter, "Filter", filter_layout)
    _require_float(Input, "Input")
    if Filter.dtype != Input.dtype:
        raise DTypeError(f"Input is {Input.dtype} but Filter is {Filter.dtype}")
    if min(Filter.shape) < 1:
        fail(f"Filter {list(Filter.shape)} must have positive sizes")
    in_hw = _spatial(Input.shape, channel_last)
    return channel_last, in_hw, _conv_geometry(attrs, in_hw, Filter.shape[2:])


def _fused_relu(attrs: dict) -> bool:
    """Whether the conv's fusion attrs end it with a relu (fuse_relu, or fuse_activation
    'relu'); AttrError for the fused activations nestflow does not compute."""
    if attrs["fuse_activation"] not in ("", "relu"):
        raise AttrError(
            f"fuse_activation '{attrs['fuse_activation']}' is not supported ('' or 'relu'): "
            "apply that activation as its own op after the conv"
        )
    if attrs["fuse_brelu"]:
        raise AttrError("fuse_brelu is not supported: apply brelu as its own op after the conv")
    return attrs["fuse_activation"] == "relu" or attrs["fuse_relu"]


def _broadcasts_into(shape, into) -> bool:
    """Whether `shape` (-1: unknown) can be added into an array of shape `into` in place."""
    return len(shape) == len(into) and all(
        s in (t, 1) or s < 0 or t < 0 for s, t in zip(shape, into)
    )


def _check_fusion(Bias, ResidualData, out: VarInfo, channels: int, attrs: dict) -> None:
    """Bias [M] and ResidualData (broadcastable to Output) of Output's dtype, ResidualData
    given exactly when fuse_residual_connection is set, a supported activation."""
    _fused_relu(attrs)
    for slot, info in (("Bias", Bias), ("ResidualData", ResidualData)):
        if info is not None and info.dtype != out.dtype:
            raise DTypeError(f"{slot} is {info.dtype} but Input is {out.dtype}")
    if Bias is not None and (Bias.ndim != 1 or Bias.shape[0] not in (channels, -1)):
        fail(f"Bias {list(Bias.shape)} must be 1-D with the {channels} output channels")
    if attrs["fuse_residual_connection"] != (ResidualData is not None):
        raise AttrError(
            "fuse_residual_connection and ResidualData go together: ResidualData is "
            f"{'absent' if ResidualData is None else 'given'} but fuse_residual_connection is "
            f"{attrs['fuse_residual_connection']}"
        )
    if ResidualData is not None and not _broadcasts_into(ResidualData.shape, out.shape):
        fail(
            f"ResidualData {list(ResidualData.shape)} does not broadcast to the Output "
            f"{list(out.shape)} it is added to"
        )


def _infer_conv(Input: VarInfo, Filter: VarInfo, Bias=None, ResidualData=None, **attrs):
    out = _infer_unfused_conv(Input, Filter, **attrs)
    _check_fusion(Bias, ResidualData, out, Filter.shape[0], attrs)
    return out


def _infer_unfused_conv(Input: VarInfo, Filter: VarInfo, **attrs) -> VarInfo:
    layout = "[out_channels, in_channels / groups, kh, kw]"
    channel_last, in_hw, geo = _conv_operands(Input, Filter, attrs, layout)
    m, cg, kh, kw = Filter.shape
    c = _channels(Input.shape, channel_last)
    if c >= 0 and c != cg * geo.groups:
        fail(
            f"Input {list(Input.shape)} has {c} channels but Filter {list(Filter.shape)} with "
            f"groups={geo.groups} takes {cg} * {geo.groups} = {cg * geo.groups}: the input "
            "channels must equal Filter's dim 1 times groups"
        )
    if m % geo.groups:
        fail(
            f"Filter {list(Filter.shape)}: its {m} output channels do not divide by "
            f"groups={geo.groups}"
        )
    out_hw = geo.out_hw(in_hw, (kh, kw))
    for d, name in enumerate(("height", "width")):
        if in_hw[d] >= 0 and out_hw[d] < 1:
            extent = geo.dilations[d] * ((kh, kw)[d] - 1) + 1
            padded = in_hw[d] + geo.pads[2 * d] + geo.pads[2 * d + 1]
            fail(
                f"the filter's {name} extent {extent} (size {(kh, kw)[d]}, dilation "
                f"{geo.dilations[d]}) is larger than the padded input {name} {padded} "
                f"(Input {list(Input.shape)}, paddings {list(geo.pads)})"
            )
    return VarInfo(_with_chw(Input.shape[0], m, out_hw, channel_last), Input.dtype)


def _epilogue(Bias, ResidualData, out_shape, channel_last: bool, attrs: dict):
    """The fused conv's _Epilogue (None when it has none) for an NCHW output out_shape."""
    relu = _fused_relu(attrs)
    if Bias is None and ResidualData is None and not relu:
        return None
    residual = None if ResidualData is None else _nchw(ResidualData, channel_last)
    if residual is not None and not _broadcasts_into(residual.shape, out_shape):
        fail(
            f"ResidualData {list(residual.shape)} (as NCHW) does not broadcast to the Output "
            f"{list(out_shape)} (as NCHW) it is added to"
        )
    return _Epilogue(Bias, residual, relu)


def _wide_operands(*arrays) -> tuple:
    """The conv's operands in float32 where they are float16/bfloat16 (None stays None): its
    sums accumulate in float32 and the results are rounded once, on every place."""
    return tuple(None if a is None else in_float32(a) for a in arrays)


def _conv_forward(Input, Filter, Bias, ResidualData, relu_first: bool, attrs: dict, device=None):
    if is_low_precision(Input.dtype):
        wide = _wide_operands(Input, Filter, Bias, ResidualData)
        # (is_test: the float32 columns are not kept; the gradient widens its operands again)
        out = _conv_forward(*wide, relu_first, dict(attrs, is_test=True), device)
        return out.astype(Input.dtype)
    channel_last = _check_layout(attrs["data_format"])
    x = _nchw(Input, channel_last)
    if relu_first:
        x = array_module(x).maximum(x, 0)
    geo = _conv_geometry(attrs, x.shape[2:], Filter.shape[2:], Filter.shape[1])
    out_shape = x.shape[:1] + Filter.shape[:1] + geo.out_hw(x.shape[2:], Filter.shape[2:])
    finish = _epilogue(Bias, ResidualData, out_shape, channel_last, attrs)
    out, kept = _pooled_conv(x, Filter, geo, finish, out_shape, device)
    out = _from_nchw(out, channel_last)
    # an inference program (is_test, as Program.clone(for_test=True) sets) takes no gradient
    if kept is not None and not attrs["is_test"]:
        _COLUMNS.put(Input, out, kept)
    return out


def _unbroadcast(grad: np.ndarray, shape) -> np.ndarray:
    """grad summed over the axes an array of `shape` was broadcast along."""
    axes = tuple(d for d, (s, g) in enumerate(zip(shape, grad.shape)) if s == 1 and g != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def _conv_backward(
    Input, Filter, Bias, ResidualData, Output, Output_grad, relu_first, attrs, needs, device=None
):
    """Gradients of Input, Filter, Bias and ResidualData (None where not needed)."""
    if is_low_precision(Input.dtype):
        wide = _wide_operands(Input, Filter, Bias, ResidualData, Output, Output_grad)
        grads = _conv_backward(*wide, relu_first, attrs, needs, device)
        dtypes = [None if a is None else a.dtype for a in (Input, Filter, Bias, ResidualData)]
        return tuple(rounded_to(g, d) for g, d in zip(grads, dtypes))
    channel_last = _check_layout(attrs["data_format"])
    if _fused_relu(attrs):  # Output is after the relu: positive exactly where the sum was
        Output_grad = Output_grad * (Output > 0)
    db = dres = None
    if Bias is not None and needs[2]:
        db = Output_grad.sum(axis=(0, 1, 2) if channel_last else (0, 2, 3))
    if ResidualData is not None and needs[3]:
        dres = _unbroadcast(Output_grad, ResidualData.shape)
    dx, dw = _unfused_conv_backward(
        Input, Filter, Output, Output_grad, relu_first, attrs, needs, device
    )
    return dx, dw, db, dres


def _unfused_conv_backward(
    Input, Filter, Output, Output_grad, relu_first, attrs, needs, device=None
):
    channel_last = _check_layout(attrs["data_format"])
    x = _nchw(Input, channel_last)
    grad = _nchw(Output_grad, channel_last)
    if relu_first:
        x = array_module(x).maximum(x, 0)
    geo = _conv_geometry(attrs, x.shape[2:], Filter.shape[2:], Filter.shape[1])
    n = x.shape[0]
    grain = _conv_grain(Filter.shape, grad.shape[2:], n)
    if device is not None and n > 0:
        kept = _COLUMNS.take(Input, Output) if needs[1] else None
        dx, dw = _pooled_conv_grads(x, grad, Filter, geo, relu_first, needs, grain, kept, device)
        return (None if dx is None else _from_nchw(dx, channel_last)), dw
    # both gradients read the gradient in one layout: rearrange it once
    kernel = _kernel(Filter.shape, geo, grad.shape[2:], x.dtype, x.shape[0])
    shared = _shared_grad(grad, geo, kernel, needs)
    dx = dw = None
    if needs[0]:
        dx = _conv_input_grad(grad, Filter, x.shape[2:], geo, shared)
        if relu_first:
            dx = dx * (x > 0)
        dx = _from_nchw(dx, channel_last)
    if needs[1]:
        kept = _COLUMNS.take(Input, Output)
        dw = _conv_filter_grad(x, grad, Filter.shape, geo, shared, kept)
    return dx, dw


# the tag of the columns conv_cuda's forward keeps for its gradient (_COLUMNS)
_CUDA_COLUMNS = "cuda_columns"


def _conv_forward_cuda(Input, Filter, Bias, ResidualData, relu_first, attrs, device):
    """_conv_forward through conv_cuda's kernels: NCHW float32/float64 (NotImplemented
    otherwise, and for empty arrays)."""
    if _check_layout(attrs["data_format"]) or not conv_cuda.covers(
        device, Input, Filter, Bias, ResidualData
    ):
        return NotImplemented
    geo = _conv_geometry(attrs, Input.shape[2:], Filter.shape[2:], Filter.shape[1])
    out_shape = Input.shape[:1] + Filter.shape[:1] + geo.out_hw(Input.shape[2:], Filter.shape[2:])
    finish = _epilogue(Bias, ResidualData, out_shape, False, attrs)
    out, cols = conv_cuda.conv(device, Input, Filter, geo, finish, relu_first)
    if cols is not None and not attrs["is_test"]:
        _COLUMNS.put(Input, out, ((_CUDA_COLUMNS, tuple(Filter.shape[2:]), geo), cols))
    return out


def _conv_backward_cuda(
    Input, Filter, Bias, ResidualData, Output, Output_grad, relu_first, attrs, needs, device
):
    """_conv_backward through conv_cuda's kernels (NotImplemented where the forward's is)."""
    operands = (Input, Filter, Bias, ResidualData, Output, Output_grad)
    if _check_layout(attrs["data_format"]) or not conv_cuda.covers(device, *operands):
        return NotImplemented
    if _fused_relu(attrs):
        Output_grad = conv_cuda.relu_grad(device, Output_grad, Output)
    db = dres = None
    if Bias is not None and needs[2]:
        db = Output_grad.sum(axis=(0, 2, 3))
    if ResidualData is not None and needs[3]:
        dres = _unbroadcast(Output_grad, ResidualData.shape)
    geo = _conv_geometry(attrs, Input.shape[2:], Filter.shape[2:], Filter.shape[1])
    kept = _COLUMNS.take(Input, Output) if needs[1] else None
    cols = _reused(kept, (_CUDA_COLUMNS, tuple(Filter.shape[2:]), geo))
    dx, dw = conv_cuda.grads(
        device, Input, Output_grad, Filter, geo, needs[0], needs[1], cols, relu_first
    )
    return dx, dw, db, dres


def _pooled_conv_grads(x, grad, w, geo: _ConvGeometry, relu_first, needs, grain, kept, device):
    """Both conv gradients over chunks of `grain` images on device's pool (NCHW): each chunk
    writes its slice of dx and returns its partial dw, summed in chunk order."""
    xp, n = array_module(x), x.shape[0]
    whole = grain >= n
    chunk_kept = kept[1] if kept is not None and kept[0] == ("chunks", grain) else None
    dx = xp.empty(x.shape, grad.dtype) if needs[0] and not whole else None
    transforms = winograd.FilterTransforms(w)

    def body(start: int, stop: int):
        xs, gs = x[start:stop], grad[start:stop]
        kernel = _kernel(w.shape, geo, gs.shape[2:], xs.dtype, xs.shape[0])
        shared = _shared_grad(gs, geo, kernel, needs)
        part = dw = None
        if needs[0]:
            into = None if whole else dx[start:stop]
            part = _conv_input_grad(gs, w, xs.shape[2:], geo, shared, into, transforms)
            if relu_first:
                part = array_module(part).multiply(part, xs > 0, out=into)
        if needs[1]:
            own = kept if whole else None if chunk_kept is None else chunk_kept[start // grain]
            dw = _conv_filter_grad(xs, gs, w.shape, geo, shared, own)
        return part, dw

    parts = device.parallel_for(n, body, grain)
    if whole:
        return parts[0]
    dw = None
    if needs[1]:
        dw = parts[0][1]
        for _, part in parts[1:]:
            dw += part
    return dx, dw


_CONV_COMMON = {
    "strides": [1, 1],
    "paddings": [0, 0],
    "padding_algorithm": "EXPLICIT",
    "groups": 1,
    "dilations": [1, 1],
    "data_format": "NCHW",
    **_CONV_HINTS,
}
_CONV2D_ATTRS = {**_CONV_COMMON, "fuse_relu_before_depthwise_conv": False}


@register_op
class conv2d:
    """Output = Input (*) Filter: Input [N, C, H, W], Filter [M, C / groups, kh, kw] ->
    Output [N, M, OH, OW], OH = (H + pad_top + pad_bottom - (dilation * (kh - 1) + 1)) //
    stride + 1. `paddings` is [pad_h, pad_w] or [top, bottom, left, right];
    padding_algorithm "SAME"/"VALID" overrides it as Fluid does; data_format "NHWC" takes and
    gives channel-last data. ShapeError when the channels do not fit the filter and groups or
    the filter is larger than the padded input; DTypeError for non-float data.

    Fused form (Fluid's MKL-DNN conv): Output = act(conv + Bias + ResidualData), Bias [M] per
    channel, ResidualData (with fuse_residual_connection) of Output's shape or broadcastable
    to it, act relu when fuse_relu or fuse_activation='relu'; the epilogue runs in
    cache-sized blocks. Other fused activations (fuse_activation, fuse_brelu) -> AttrError."""

    inputs, outputs = ("Input", "Filter", "Bias?", "ResidualData?"), ("Output",)
    attrs = _CONV2D_ATTRS
    infer = _infer_conv

    def forward(Input, Filter, Bias=None, ResidualData=None, device=None, **attrs):
        return _conv_forward(Input, Filter, Bias, ResidualData, False, attrs, device)

    def backward(
        Input,
        Filter,
        Bias,
        ResidualData,
        Output,
        Output_grad,
        needs=(True,) * 4,
        device=None,
        **attrs,
    ):
        args = (Input, Filter, Bias, ResidualData, Output, Output_grad)
        return _conv_backward(*args, False, attrs, needs, device)

    def forward_cuda(Input, Filter, Bias=None, ResidualData=None, device=None, **attrs):
        return _conv_forward_cuda(Input, Filter, Bias, ResidualData, False, attrs, device)

    def backward_cuda(
        Input,
        Filter,
        Bias,
        ResidualData,
        Output,
        Output_grad,
        needs=(True,) * 4,
        device=None,
        **attrs,
    ):
        args = (Input, Filter, Bias, ResidualData, Output, Output_grad)
        return _conv_backward_cuda(*args, False, attrs, needs, device)

    double_grad = ("Input", "Filter", "Output@GRAD")

    def double_unsupported(attrs):
        return "a conv2d with a fused relu" if _fused_relu(attrs) else None

    def double_backward(
        Input,
        Filter,
        Bias,
        ResidualData,
        Output,
        Output_grad,
        dInput,
        dFilter,
        dBias,
        dResidualData,
        ddInput,
        ddFilter,
        ddBias,
        ddResidualData,
        xp,
        device,
        needs=(True,) * 3,
        **attrs,
    ):
        def product(a, b):
            return _conv_forward(a, b, None, None, False, attrs, device)

        def grads(a, b, g, wanted):
            return _conv_backward(a, b, None, None, None, g, False, attrs, wanted + (False,) * 2)

        d_input, d_filter, dd_output = bilinear_double(
            product, grads, Input, Filter, Output_grad, ddInput, ddFilter, needs, xp
        )
        # Bias and ResidualData enter Output linearly: their gradients' JVPs add to dd_output.
        if dd_output is not None and ddBias is not None:
            channel_last = _check_layout(attrs["data_format"])
            dd_output = dd_output + ddBias.reshape((1, 1, 1, -1) if channel_last else (1, -1, 1, 1))
        if dd_output is not None and ddResidualData is not None:
            dd_output = dd_output + ddResidualData
        return d_input, d_filter, dd_output


@register_op
class depthwise_conv2d:
    """conv2d with groups == input channels (the op Fluid's conv2d layer appends then when
    use_cudnn is False). Same slots, attrs and results as conv2d; `fuse_relu_before_depthwise_
    conv` applies relu to Input first, as Fluid's depthwise kernel does."""

    inputs, outputs = ("Input", "Filter", "Bias?", "ResidualData?"), ("Output",)
    attrs = _CONV2D_ATTRS
    infer = _infer_conv

    def forward(Input, Filter, Bias=None, ResidualData=None, device=None, **attrs):
        relu_first = attrs["fuse_relu_before_depthwise_conv"]
        return _conv_forward(Input, Filter, Bias, ResidualData, relu_first, attrs, device)

    def backward(
        Input,
        Filter,
        Bias,
        ResidualData,
        Output,
        Output_grad,
        needs=(True,) * 4,
        device=None,
        **attrs,
    ):
        args = (Input, Filter, Bias, ResidualData, Output, Output_grad)
        relu_first = attrs["fuse_relu_before_depthwise_conv"]
        return _conv_backward(*args, relu_first, attrs, needs, device)

    def forward_cuda(Input, Filter, Bias=None, ResidualData=None, device=None, **attrs):
        relu_first = attrs["fuse_relu_before_depthwise_conv"]
        return _conv_forward_cuda(Input, Filter, Bias, ResidualData, relu_first, attrs, device)

    def backward_cuda(
        Input,
        Filter,
        Bias,
        ResidualData,
        Output,
        Output_grad,
        needs=(True,) * 4,
        device=None,
        **attrs,
    ):
        args = (Input, Filter, Bias, ResidualData, Output, Output_grad)
        relu_first = attrs["fuse_relu_before_depthwise_conv"]
        return _conv_backward_cuda(*args, relu_first, attrs, needs, device)


# ---- conv2d_transpose ----


def _transposed_out_hw(geo: _ConvGeometry, in_hw, k_hw, output_size: list) -> tuple[int, int]:
    """The output size: the smallest the transposed conv gives, or `output_size` within
    [that, that + stride) as Fluid allows (the extra rows and columns are the far edge)."""
    smallest = geo.transposed_hw(in_hw, k_hw)
    if not output_size:
        return smallest
    wanted = _pair(output_size, "output_size", 1)
    for d in range(2):
        if smallest[d] >= 0 and not smallest[d] <= wanted[d] < smallest[d] + geo.strides[d]:
            fail(
                f"output_size {list(wanted)} must lie in [{smallest[d]}, "
                f"{smallest[d] + geo.strides[d]}) in dim {d} (the input size {in_hw[d]}, "
                f"stride {geo.strides[d]}, paddings {list(geo.pads)} and filter {list(k_hw)} "
                f"give {smallest[d]})"
            )
    return wanted


def _infer_conv_transpose(Input: VarInfo, Filter: VarInfo, **attrs) -> VarInfo:
    layout = "[in_channels, out_channels / groups, kh, kw]"
    channel_last, in_hw, geo = _conv_operands(Input, Filter, attrs, layout)
    c, mg, kh, kw = Filter.shape
    channels = _channels(Input.shape, channel_last)
    if channels >= 0 and channels != c:
        fail(
            f"Input {list(Input.shape)} has {channels} channels but Filter "
            f"{list(Filter.shape)} takes {c} (Filter's dim 0)"
        )
    if c % geo.groups:
        fail(
            f"Filter {list(Filter.shape)}: its {c} input channels do not divide by groups={geo.groups}"
        )
    smallest = geo.transposed_hw(in_hw, (kh, kw))
    for d in range(2):
        if in_hw[d] >= 0 and smallest[d] < 1:
            fail(
                f"paddings {list(geo.pads)} remove the whole output of Input "
                f"{list(Input.shape)} with Filter {list(Filter.shape)} (size {smallest[d]})"
            )
    out_hw = _transposed_out_hw(geo, in_hw, (kh, kw), attrs["output_size"])
    return VarInfo(_with_chw(Input.shape[0], mg * geo.groups, out_hw, channel_last), Input.dtype)


_CONV2D_TRANSPOSE_ATTRS = {"output_size": [], **_CONV_COMMON}


def _transpose_setup(Input, Filter, attrs):
    channel_last = _check_layout(attrs["data_format"])
    x = _nchw(Input, channel_last)
    k_hw = Filter.shape[2:]
    geo = _conv_geometry(attrs, x.shape[2:], k_hw, Filter.shape[1])
    return channel_last, x, geo, _transposed_out_hw(geo, x.shape[2:], k_hw, attrs["output_size"])


@register_op
class conv2d_transpose:
    """Output = the transposed convolution (the data gradient of conv2d) of Input
    [N, C, H, W] with Filter [C, M / groups, kh, kw]: [N, M, OH, OW], OH = (H - 1) * stride -
    pad_top - pad_bottom + dilation * (kh - 1) + 1, or `output_size` (which may add up to
    stride - 1 rows and columns at the far edge). Errors as conv2d's."""

    inputs, outputs = ("Input", "Filter"), ("Output",)
    attrs = _CONV2D_TRANSPOSE_ATTRS
    infer = _infer_conv_transpose

    def forward(Input, Filter, **attrs):
        channel_last, x, geo, out_hw = _transpose_setup(Input, Filter, attrs)
        x, w = _wide_operands(x, Filter)
        out = _from_nchw(_conv_input_grad(x, w, out_hw, geo), channel_last)
        return rounded_to(out, Input.dtype)

    def backward(Input, Filter, Output, Output_grad, needs=(True, True), **attrs):
        channel_last, x, geo, _ = _transpose_setup(Input, Filter, attrs)
        x, w, grad = _wide_operands(x, Filter, _nchw(Output_grad, channel_last))
        dx = _from_nchw(_conv(grad, w, geo)[0], channel_last) if needs[0] else None
        dw = _conv_filter_grad(grad, x, Filter.shape, geo) if needs[1] else None
        return rounded_to(dx, Input.dtype), rounded_to(dw, Filter.dtype)

    def forward_cuda(Input, Filter, device=None, **attrs):
        channel_last, x, geo, out_hw = _transpose_setup(Input, Filter, attrs)
        if channel_last or not conv_cuda.covers(device, Input, Filter):
            return NotImplemented
        return conv_cuda.input_grad(device, Input, Filter, out_hw, geo)

    def backward_cuda(Input, Filter, Output, Output_grad, needs=(True, True), device=None, **attrs):
        channel_last, x, geo, _ = _transpose_setup(Input, Filter, attrs)
        if channel_last or not conv_cuda.covers(device, Input, Filter, Output_grad):
            return NotImplemented
        # the transposed conv's gradients are the conv of Output_grad and its filter gradient
        dx = conv_cuda.conv(device, Output_grad, Filter, geo)[0] if needs[0] else None
        dw = None
        if needs[1]:
            dw = conv_cuda.grads(device, Output_grad, Input, Filter, geo, False, True)[1]
        return dx, dw


@register_op
class depthwise_conv2d_transpose:
    """conv2d_transpose with groups == input channels == output channels (the op Fluid's
    conv2d_transpose layer appends then when use_cudnn is False). Same slots, attrs and
    results as conv2d_transpose."""

    inputs, outputs = ("Input", "Filter"), ("Output",)
    attrs = _CONV2D_TRANSPOSE_ATTRS
    infer = _infer_conv_transpose
    forward = conv2d_transpose.forward
    backward = conv2d_transpose.backward
    forward_cuda = conv2d_transpose.forward_cuda
    backward_cuda = conv2d_transpose.backward_cuda


# ---- pool2d ----


@dataclass(frozen=True)
class _PoolGeometry:
    ksize: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    out_hw: tuple[int, int]
    adaptive: bool


def _pool_geometry(in_hw, attrs: dict) -> _PoolGeometry:
    """Fluid's pool2d InferShape: paddings by padding_algorithm, none for global or adaptive
    pooling; global pooling's window is the whole input, adaptive's output size is ksize."""
    _check_algorithm(attrs["padding_algorithm"])
    if attrs["pooling_type"] not in ("max", "avg"):
        raise AttrError(f"pooling_type must be 'max' or 'avg', got '{attrs['pooling_type']}'")
    ksize = _pair(attrs["ksize"], "ksize", 1) if not attrs["global_pooling"] else None
    strides = _pair(attrs["strides"], "strides", 1)
    pads = _four_paddings(attrs["paddings"])
    if attrs["global_pooling"]:
        ksize = tuple(in_hw)
        pads = (0, 0, 0, 0)
    elif attrs["adaptive"] or attrs["padding_algorithm"] == "VALID":
        pads = (0, 0, 0, 0)
    elif attrs["padding_algorithm"] == "SAME" and min(in_hw) >= 0:
        pads = _same_pads(in_hw[0], ksize[0], strides[0]) + _same_pads(
            in_hw[1], ksize[1], strides[1]
        )
    if attrs["adaptive"]:
        return _PoolGeometry(ksize, strides, pads, ksize, True)
    out = []
    for d in range(2):
        size, k, s = in_hw[d], ksize[d], strides[d]
        if size < 0:
            out.append(1 if attrs["global_pooling"] else -1)
            continue
        p0, p1 = pads[2 * d], pads[2 * d + 1]
        if k > size + p0 + p1:
            raise ShapeError(
                f"the pool window {list(ksize)} is larger than the padded input: dim {d} has "
                f"size {size} + paddings {p0} + {p1} = {size + p0 + p1} < {k}"
            )
        span = size + p0 + p1 - k + (s - 1 if attrs["ceil_mode"] else 0)
        n_out = span // s + 1
        if k <= p0 or (n_out - 1) * s - p0 >= size:
            raise ShapeError(
                f"a pool window lies wholly in the padding in dim {d}: size {size}, window {k}, "
                f"stride {s}, paddings {p0}, {p1}, ceil_mode {attrs['ceil_mode']}"
            )
        out.append(n_out)
    return _PoolGeometry(ksize, strides, pads, (out[0], out[1]), False)


def _infer_pool(X: VarInfo, **attrs) -> VarInfo:
    channel_last = _check_layout(attrs["data_format"])
    _require_4d(X, "X", "NHWC" if channel_last else "NCHW")
    _require_float(X, "X")
    geo = _pool_geometry(_spatial(X.shape, channel_last), attrs)
    return VarInfo(
        _with_chw(X.shape[0], _channels(X.shape, channel_last), geo.out_hw, channel_last), X.dtype
    )


def _pool_pads(x_hw, geo: _PoolGeometry) -> tuple[int, int, int, int]:
    """geo.pads, grown at the far edges to what ceil_mode's last window reaches."""
    top, bottom, left, right = geo.pads
    reach_h = (geo.out_hw[0] - 1) * geo.strides[0] + geo.ksize[0]
    reach_w = (geo.out_hw[1] - 1) * geo.strides[1] + geo.ksize[1]
    return top, max(bottom, reach_h - top - x_hw[0]), left, max(right, reach_w - left - x_hw[1])


def _pool_offsets(geo: _PoolGeometry):
    return [(i, j) for i in range(geo.ksize[0]) for j in range(geo.ksize[1])]


def _window_counts(xp, size: int, k: int, s: int, pad: int, n_out: int) -> np.ndarray:
    """Per output position, how many input (not padding) elements its window covers."""
    starts = xp.arange(n_out) * s - pad
    return xp.minimum(starts + k, size) - xp.maximum(starts, 0)


def _avg_divisor(xp, x_hw, geo: _PoolGeometry, exclusive: bool, dtype) -> np.ndarray | float:
    if not exclusive:
        return float(geo.ksize[0] * geo.ksize[1])
    ks, ss, pads, out_hw = geo.ksize, geo.strides, geo.pads, geo.out_hw
    rows = _window_counts(xp, x_hw[0], ks[0], ss[0], pads[0], out_hw[0])
    cols = _window_counts(xp, x_hw[1], ks[1], ss[1], pads[2], out_hw[1])
    return (rows[:, None] * cols).astype(dtype)


def _adaptive_bounds(size: int, n_out: int) -> list[tuple[int, int]]:
    return [((i * size) // n_out, -((-(i + 1) * size) // n_out)) for i in range(n_out)]


def _adaptive_pool(x: np.ndarray, geo: _PoolGeometry, pooling_type: str) -> np.ndarray:
    xp = array_module(x)
    n, c, h, w = x.shape
    out = xp.empty((n, c) + geo.out_hw, x.dtype)
    reduce = xp.max if pooling_type == "max" else xp.mean
    for a, (h0, h1) in enumerate(_adaptive_bounds(h, geo.out_hw[0])):
        for b, (w0, w1) in enumerate(_adaptive_bounds(w, geo.out_hw[1])):
            out[:, :, a, b] = reduce(x[:, :, h0:h1, w0:w1], axis=(2, 3))
    return out


def _adaptive_pool_grad(x, grad, geo: _PoolGeometry, pooling_type: str) -> np.ndarray:
    xp = array_module(x)
    n, c, h, w = x.shape
    dx = xp.zeros_like(x, dtype=grad.dtype)
    rows, chans = xp.indices((n, c))
    for a, (h0, h1) in enumerate(_adaptive_bounds(h, geo.out_hw[0])):
        for b, (w0, w1) in enumerate(_adaptive_bounds(w, geo.out_hw[1])):
            g = grad[:, :, a, b]
            if pooling_type == "avg":
                dx[:, :, h0:h1, w0:w1] += (g / ((h1 - h0) * (w1 - w0)))[:, :, None, None]
                continue
            # the first maximum of the cell (row-major) takes the gradient, as Fluid's does
            first = x[:, :, h0:h1, w0:w1].reshape(n, c, (h1 - h0) * (w1 - w0)).argmax(axis=-1)
            dx[rows, chans, h0 + first // (w1 - w0), w0 + first % (w1 - w0)] += g
    return dx


def _pool(x: np.ndarray, geo: _PoolGeometry, pooling_type: str, exclusive: bool, out=None):
    """Pooled x [N, C, H, W], into `out` [N, C, OH, OW] when given."""
    if geo.adaptive:
        pooled = _adaptive_pool(x, geo, pooling_type)
        if out is not None:
            out[...] = pooled
        return pooled if out is None else out
    xp = array_module(x)
    if out is None:
        out = xp.empty(x.shape[:2] + tuple(geo.out_hw), x.dtype)
    combine = xp.maximum if pooling_type == "max" else xp.add
    padded = _padded(x, _pool_pads(x.shape[2:], geo), -np.inf if pooling_type == "max" else 0.0)
    for k, (i, j) in enumerate(_pool_offsets(geo)):
        view = _window(padded, i, j, geo.strides, geo.out_hw)
        if k == 0:
            out[...] = view
        else:
            combine(out, view, out=out)
    if pooling_type != "max":
        out /= _avg_divisor(xp, x.shape[2:], geo, exclusive, x.dtype)
    return out


def _tiled_max_pool_grad(x, out, grad, geo: _PoolGeometry):
    """The max pool gradient where the windows tile x exactly (stride = window, no padding,
    nothing left over): every element is in one window, so each offset's share is written
    once (no zeroed buffer, no sums, no crop)."""
    xp = array_module(x)
    n, c, h, w = x.shape
    (kh, kw), (oh, ow) = geo.ksize, geo.out_hw
    x6 = xp.ascontiguousarray(x).reshape(n, c, oh, kh, ow, kw)
    dx = xp.empty((n, c, oh, kh, ow, kw), grad.dtype)
    unclaimed = xp.ones(out.shape, bool)
    hit = xp.empty(out.shape, bool)
    for i, j in _pool_offsets(geo):
        xp.equal(x6[:, :, :, i, :, j], out, out=hit)
        hit &= unclaimed
        unclaimed ^= hit
        xp.multiply(grad, hit, out=dx[:, :, :, i, :, j])
    return dx.reshape(n, c, h, w)


def _max_pool_pick(x, out, dd, geo: _PoolGeometry):
    """`dd` read where max pooling's gradient routes (each window's first maximum, row-major,
    as _pool_grad): the gradient op is that routing, linear in Out's gradient, so the
    gradient of <dX, dd> with respect to Out's gradient is this pick."""
    xp = array_module(x)
    n, c, h, w = x.shape
    picked = xp.zeros(out.shape, dd.dtype)
    if geo.adaptive:
        rows, chans = xp.indices((n, c))
        for a, (h0, h1) in enumerate(_adaptive_bounds(h, geo.out_hw[0])):
            for b, (w0, w1) in enumerate(_adaptive_bounds(w, geo.out_hw[1])):
                first = x[:, :, h0:h1, w0:w1].reshape(n, c, (h1 - h0) * (w1 - w0)).argmax(axis=-1)
                picked[:, :, a, b] = dd[
                    rows, chans, h0 + first // (w1 - w0), w0 + first % (w1 - w0)
                ]
        return picked
    pads = _pool_pads(x.shape[2:], geo)
    padded, dd_padded = _padded(x, pads, -np.inf), _padded(dd, pads)
    unclaimed = xp.ones(out.shape, bool)
    for i, j in _pool_offsets(geo):
        hit = _window(padded, i, j, geo.strides, geo.out_hw) == out
        hit &= unclaimed
        unclaimed &= ~hit
        picked += xp.where(hit, _window(dd_padded, i, j, geo.strides, geo.out_hw), 0)
    return picked


# The intra-op pool splits pool2d's batch into chunks of at least this many input elements.
_POOL_CHUNK_ELEMENTS = 1 << 17


def _pool_grad(x, out, grad, geo: _PoolGeometry, pooling_type: str, exclusive: bool):
    if geo.adaptive:
        return _adaptive_pool_grad(x, grad, geo, pooling_type)
    xp = array_module(x)
    top, left = geo.pads[0], geo.pads[2]
    h, w = x.shape[2:]
    tiled = geo.ksize == geo.strides and not any(geo.pads)
    exact = tuple(geo.out_hw) == (h // geo.ksize[0], w // geo.ksize[1])
    if pooling_type == "max" and tiled and exact and h % geo.ksize[0] == w % geo.ksize[1] == 0:
        return _tiled_max_pool_grad(x, out, grad, geo)
    if pooling_type == "max":
        # Each window's gradient goes to its first maximum in row-major order (Fluid's rule).
        padded = _padded(x, _pool_pads(x.shape[2:], geo), -np.inf)
        dxp = xp.zeros(padded.shape, grad.dtype)
        unclaimed = xp.ones(out.shape, bool)
        for i, j in _pool_offsets(geo):
            hit = _window(padded, i, j, geo.strides, geo.out_hw) == out
            hit &= unclaimed
            unclaimed &= ~hit
            view = _window(dxp, i, j, geo.strides, geo.out_hw)
            view += grad * hit
    else:
        share = grad / _avg_divisor(xp, x.shape[2:], geo, exclusive, grad.dtype)
        top, bottom, left, right = _pool_pads((h, w), geo)
        dxp = xp.zeros(x.shape[:2] + (h + top + bottom, w + left + right), grad.dtype)
        for i, j in _pool_offsets(geo):
            view = _window(dxp, i, j, geo.strides, geo.out_hw)
            view += share
    return dxp[:, :, top : top + h, left : left + w]


@register_op
class pool2d:
    """Out = max or average over windows of X [N, C, H, W]: ksize windows every `strides`,
    paddings [pad_h, pad_w] or [top, bottom, left, right] (padding_algorithm "SAME"/"VALID"
    as Fluid), OH = (H + pads - kh) // stride + 1 (rounded up with ceil_mode).

    Average pooling divides by the window's input elements (`exclusive`, the default) or by
    kh * kw; global_pooling takes the whole input, adaptive makes an output of size ksize.
    Max pooling's gradient goes to the first maximum of each window. ShapeError when the
    window is larger than the padded input or a window lies wholly in the padding."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {
        "pooling_type": Required(str),
        "ksize": Required(list),
        "global_pooling": False,
        "strides": [1, 1],
        "paddings": [0, 0],
        "exclusive": True,
        "adaptive": False,
        "ceil_mode": False,
        "data_format": "NCHW",
        "padding_algorithm": "EXPLICIT",
        "use_cudnn": False,
        "use_mkldnn": False,
        "use_quantizer": False,
        "mkldnn_data_type": "float32",
        "is_test": False,
    }
    infer = _infer_pool

    def forward(X, device=None, **attrs):
        channel_last = _check_layout(attrs["data_format"])
        x = _nchw(X, channel_last)
        geo = _pool_geometry(x.shape[2:], attrs)
        kind, exclusive, n = attrs["pooling_type"], attrs["exclusive"], x.shape[0]
        grain = thread_grain(n, x[:1].size, _POOL_CHUNK_ELEMENTS)
        if device is None or grain >= n:
            return _from_nchw(_pool(x, geo, kind, exclusive), channel_last)
        out = array_module(x).empty(x.shape[:2] + tuple(geo.out_hw), x.dtype)

        def body(start: int, stop: int) -> None:
            _pool(x[start:stop], geo, kind, exclusive, out[start:stop])

        device.parallel_for(n, body, grain)
        return _from_nchw(out, channel_last)

    def backward(X, Out, Out_grad, device=None, **attrs):
        channel_last = _check_layout(attrs["data_format"])
        x = _nchw(X, channel_last)
        geo = _pool_geometry(x.shape[2:], attrs)
        out, grad = _nchw(Out, channel_last), _nchw(Out_grad, channel_last)
        kind, exclusive, n = attrs["pooling_type"], attrs["exclusive"], x.shape[0]
        grain = thread_grain(n, x[:1].size, _POOL_CHUNK_ELEMENTS)
        if device is None or grain >= n:
            return (_from_nchw(_pool_grad(x, out, grad, geo, kind, exclusive), channel_last),)
        dx = array_module(x).empty(x.shape, grad.dtype)

        def body(start: int, stop: int) -> None:
            part = slice(start, stop)
            dx[part] = _pool_grad(x[part], out[part], grad[part], geo, kind, exclusive)

        device.parallel_for(n, body, grain)
        return (_from_nchw(dx, channel_last),)

    def forward_cuda(X, device=None, **attrs):
        if _check_layout(attrs["data_format"]) or not conv_cuda.covers(device, X):
            return NotImplemented
        geo = _pool_geometry(X.shape[2:], attrs)
        return conv_cuda.pool(device, X, geo, attrs["pooling_type"] == "max", attrs["exclusive"])

    def backward_cuda(X, Out, Out_grad, device=None, **attrs):
        if _check_layout(attrs["data_format"]) or not conv_cuda.covers(device, X, Out, Out_grad):
            return NotImplemented
        geo = _pool_geometry(X.shape[2:], attrs)
        is_max, exclusive = attrs["pooling_type"] == "max", attrs["exclusive"]
        return (conv_cuda.pool_grad(device, X, Out, Out_grad, geo, is_max, exclusive),)

    def double_backward(X, Out, Out_grad, dX, ddX, xp, device=None, **attrs):
        if ddX is None:
            return (xp.zeros_like(Out_grad),)
        if attrs["pooling_type"] == "avg":
            return (pool2d.forward(ddX, device, **attrs),)
        channel_last = _check_layout(attrs["data_format"])
        x, out, dd = (_nchw(v, channel_last) for v in (X, Out, ddX))
        geo = _pool_geometry(x.shape[2:], attrs)
        return (_from_nchw(_max_pool_pick(x, out, dd, geo), channel_last),)


# ---- lrn ----


def _channel_window_sum(v: np.ndarray, n: int, before: int) -> np.ndarray:
    """sum_{t < n} v[:, c - before + t] per channel c (zeros outside [0, C))."""
    c = v.shape[1]
    padded = array_module(v).zeros((v.shape[0], c + n - 1) + v.shape[2:], v.dtype)
    padded[:, before : before + c] = v
    total = padded[:, 0:c].copy()
    for t in range(1, n):
        total += padded[:, t : t + c]
    return total


@register_op
class lrn:
    """Local response normalisation across channels of X [N, C, H, W]:
    MidOut = k + alpha * sum of X^2 over channels c - (n-1)//2 .. c - (n-1)//2 + n - 1,
    Out = X * MidOut^-beta (Fluid's lrn: alpha is not divided by n)."""

    inputs, outputs = ("X",), ("Out", "MidOut")
    attrs = {
        "n": 5,
        "k": 2.0,
        "alpha": 1e-4,
        "beta": 0.75,
        "data_format": "AnyLayout",
        "use_mkldnn": False,
        "is_test": False,
    }

    def infer(X, n, k, alpha, beta, data_format, **_hints):
        channel_last = _check_layout(data_format)
        _require_4d(X, "X", "NHWC" if channel_last else "NCHW")
        _require_float(X, "X")
        if n < 1 or k <= 0 or alpha <= 0 or beta <= 0:
            raise AttrError(
                f"lrn needs n >= 1 and k, alpha, beta > 0; got {n}, {k}, {alpha}, {beta}"
            )
        return X, X

    def forward(X, n, k, alpha, beta, data_format, **_hints):
        channel_last = _check_layout(data_format)
        x = _nchw(X, channel_last)
        mid = _channel_window_sum(x * x, n, (n - 1) // 2)
        mid *= alpha
        mid += k
        out = x * mid ** x.dtype.type(-beta)
        return _from_nchw(out, channel_last), _from_nchw(mid, channel_last)

    def backward(
        X, Out, MidOut, Out_grad, MidOut_grad, n, k, alpha, beta, data_format, xp, **_hints
    ):
        # dX_i = g_i mid_i^-beta + 2 alpha X_i sum_{j: i in window(j)} (gm_j - beta g_j Out_j / mid_j)
        channel_last = _check_layout(data_format)
        x, out, mid = (_nchw(v, channel_last) for v in (X, Out, MidOut))
        terms = xp.zeros_like(x)
        if Out_grad is not None:
            g = _nchw(Out_grad, channel_last)
            terms -= beta * g * out / mid
        if MidOut_grad is not None:
            terms += _nchw(MidOut_grad, channel_last)
        before = (n - 1) // 2
        dx = _channel_window_sum(terms, n, n - 1 - before)
        dx *= 2 * alpha * x
        if Out_grad is not None:
            dx += g * mid ** x.dtype.type(-beta)
        return (_from_nchw(dx, channel_last),)


# ---- flatten ----


def _infer_flatten(X: VarInfo, axis: int) -> VarInfo:
    if not 0 <= axis <= X.ndim:
        raise AttrError(f"axis must lie in [0, {X.ndim}] for X {list(X.shape)}, got {axis}")
    lead, rest = X.shape[:axis], X.shape[axis:]
    rows = -1 if -1 in lead else math.prod(lead)
    cols = -1 if -1 in rest else math.prod(rest)
    return VarInfo((rows, cols), X.dtype)


def _flattened(X: np.ndarray, axis: int) -> np.ndarray:
    return X.reshape(math.prod(X.shape[:axis]), math.prod(X.shape[axis:]))


@register_op
class flatten:
    """Out = X as a matrix [prod(X.shape[:axis]), prod(X.shape[axis:])] (axis in [0, rank])."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"axis": 1}
    infer = _infer_flatten

    def forward(X, axis):
        return _flattened(X, axis)

    def backward(X, Out, Out_grad, axis):
        return (Out_grad.reshape(X.shape),)


@register_op
class flatten2:
    """flatten, plus XShape: an empty [0, *X.shape] array recording X's shape (Fluid's
    flatten2, which fluid.layers.flatten appends)."""

    inputs, outputs = ("X",), ("Out", "XShape")
    attrs = {"axis": 1}

    def infer(X, axis):
        return _infer_flatten(X, axis), VarInfo((0,) + X.shape, X.dtype)

    def forward(X, axis, xp):
        return _flattened(X, axis), xp.empty((0,) + X.shape, X.dtype)

    def backward(X, Out, XShape, Out_grad, XShape_grad, axis):
        return (Out_grad.reshape(X.shape),)
