"""Winograd F(4x4, 3x3) kernels for 3x3, stride-1 convolutions (Lavin & Gray, "Fast Algorithms
for Convolutional Neural Networks", 2016), used by the conv ops in nestflow/ops/nn.py.

Each 4x4 block of outputs is computed from a 6x6 input tile with 36 products per (input,
output) channel pair instead of 144: a tile d becomes V = Bt d Bt', a filter g becomes
U = G g G', the products U * V summed over input channels are 36 GEMMs, and A' (U * V) A gives
the outputs. Every transform over all tiles at once is a product by a Kronecker product
(kron(Bt, Bt) is 36x36), so nothing loops over tiles in Python; on the CPU it runs as its two
factors (_kron_product), one GEMM over each axis of the tiles. Tiles are gathered from a
copy of the data with the batch innermost and the columns split by their phase modulo 4
(_hwn), which keeps the strided gathers' runs long. The filter gradient uses the same
identity transposed: dW = G' (sum over tiles of (A g_out A') * V) G. In float32 the results
differ from direct convolution by about 1e-5 relative (the F(4x4, 3x3) transform's usual
rounding).

The functions take arrays of any place (`array_module`); CuPy has the strided views they use.
"""

from __future__ import annotations

import threading

import numpy as np

from nestflow.core.device_context import (
    ROW_CHUNK_ELEMENTS,
    array_module,
    chunk_grain,
    device_context,
)
from nestflow.core.place import place_of as _place_of
from nestflow.ops.gemm import matmul_nt, pooled_matmul
from nestflow.ops.layout import batch_last_into

_BT = np.array(
    [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    dtype=np.float64,
)
_G = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ]
)
_AT = np.array(
    [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    dtype=np.float64,
)
_TILE, _OUT = 6, 4  # input tile and output block sizes
_PHASES = _OUT  # _hwn splits the columns by their phase modulo the tiles' step
_INPUT = np.kron(_BT, _BT)  # [36, 36]: vec(Bt d Bt') = _INPUT @ vec(d)
_OUTPUT = np.kron(_AT, _AT)  # [16, 36]
# the filter gradient's transform of the output gradient's tiles, kron(A, A) = _OUTPUT'
_A, _GRAD_INPUT = _AT.T.copy(), _OUTPUT.T.copy()
_FILTER = np.kron(_G, _G)  # [36, 9]
# a filter rotated by 180 degrees has its 9 taps reversed: the same transform, columns reversed
_FLIPPED_FILTER = np.ascontiguousarray(_FILTER[:, ::-1])

# Below this many input or output channels the transforms cost more than they save.
MIN_CHANNELS = 16


def applies(w_shape, strides, dilations, groups, dtype) -> bool:
    """Whether the Winograd kernels compute a conv with filter w_shape [M, C, kh, kw]: 3x3,
    stride 1, no dilation, one group, float32/64, at least MIN_CHANNELS channels in and out."""
    return (
        tuple(w_shape[2:]) == (3, 3)
        and tuple(strides) == (1, 1)
        and tuple(dilations) == (1, 1)
        and groups == 1
        and min(w_shape[0], w_shape[1]) >= MIN_CHANNELS
        and np.dtype(dtype) in (np.float32, np.float64)
    )


_CONSTANTS: dict[tuple, object] = {}


def _constant(matrix: np.ndarray, like):
    """A transform matrix in like's dtype on like's place (read-only on the host). Kept per
    matrix, dtype and device: a device copy would be a host-to-device transfer each call, a
    host one a conversion (Python that holds the GIL, many times a conv)."""
    xp = array_module(like)
    key = (id(matrix), like.dtype.str, None if xp is np else str(like.device))
    made = _CONSTANTS.get(key)
    if made is None:
        made = xp.asarray(matrix, like.dtype)
        if xp is np:
            made = made.view()  # (the module's own matrix where the dtype is already its own)
            made.flags.writeable = False
        _CONSTANTS[key] = made
    return made


# A Kronecker transform kron(T, T) @ data runs on NumPy arrays as two passes of T, one over
# each axis of the tiles (6x6 -> 6x6: 432 multiply-adds a tile and channel against 1,296), each
# pass one call of 6 stacked products per block of _KRON_COLUMNS columns, which keeps each
# product under OpenBLAS's small-product bound (gemm.SMALL_PRODUCT). Measured on the 2-vCPU
# EPYC, [36, 36] x [36, N] as one GEMM against the two passes, alone / beside a second
# (unpinned) thread doing the same: SkylakeX kernels, N = 25,088 (W9's 8-image chunk) 0.44 /
# 0.46 ms against 0.19 / 0.30, N = 50,176 1.33 / 1.40 against 0.76 / 0.94; Haswell kernels
# 0.61 / 0.63 against 0.42 / 0.50, and 1.37 / 1.50 against 1.13 / 1.20. Much smaller blocks
# make many short calls: 2,048 columns ran 0.20 ms alone and 0.44 beside an unpinned thread
# (0.28 beside a pinned one).
_KRON_COLUMNS = 16384


def _kron_product(t: np.ndarray, data: np.ndarray, kron: np.ndarray) -> np.ndarray:
    """kron(t, t) @ data for t [r, s] and data [s * s, cols] (kron: that Kronecker product):
    [r * r, cols]. Device arrays: one product by kron. NumPy: the two passes in column blocks,
    on the intra-op pool where there are several (no element is summed across blocks, so the
    bits do not depend on the thread count)."""
    xp = array_module(data)
    if xp is not np:
        return pooled_matmul(_constant(kron, data), data)
    t = _constant(t, data)
    r, s = t.shape
    cols = data.shape[1]
    out = np.empty((r * r, cols), np.result_type(t, data))
    within, into = data.reshape(s, s, cols), out.reshape(r, r, cols)

    def body(first: int, last: int) -> None:
        for a in range(first * _KRON_COLUMNS, min(cols, last * _KRON_COLUMNS), _KRON_COLUMNS):
            b = min(cols, a + _KRON_COLUMNS)
            rows = np.matmul(t, within[:, :, a:b])  # along each tile row: [s, r, B]
            # then along each column, into out's [r, r, B] block
            np.matmul(t, rows.transpose(1, 0, 2), out=into[:, :, a:b].transpose(1, 0, 2))

    blocks = -(-cols // _KRON_COLUMNS)
    grain = chunk_grain(blocks, s * s * _KRON_COLUMNS, ROW_CHUNK_ELEMENTS, 4)
    device_context().parallel_for(blocks, body, grain)
    return out


def _blocks(out_hw) -> tuple[int, int]:
    return -(-out_hw[0] // _OUT), -(-out_hw[1] // _OUT)


def _hwn(x: np.ndarray, top: int, left: int, size_hw) -> np.ndarray:
    """x [N, C, H, W] zero-padded to size_hw with x at (top, left) (its far edge cropped where
    it reaches past size_hw), in the layout the tiles are read from: [C, size_h, 4,
    ceil(size_w / 4), N], the padded image's column w at [:, :, w % 4, w // 4]. A tile's
    column reads every 4th column of the image; split by phase, those columns lie side by
    side, so each copy in _tiles moves runs of (blocks x N) elements where [C, H, W, N] gave
    runs of N: W9's 8-image chunk, [64, 30, 30, 8], 449 -> 145 us a tiles copy."""
    n, c, h, w = x.shape
    xp = array_module(x)
    out = xp.zeros((c, size_hw[0], _PHASES, -(-size_hw[1] // _PHASES), n), x.dtype)
    rows, cols = min(h, size_hw[0] - top), min(w, size_hw[1] - left)
    for phase in range(_PHASES):
        first = (phase - left) % _PHASES  # x's first column in this phase of the padded image
        if first >= cols:
            continue
        part = x[:, :, :rows, first:cols:_PHASES]
        quad = (left + first) // _PHASES
        batch_last_into(out[:, top : top + rows, phase, quad : quad + part.shape[3]], part)
    return out


def _tiles(padded: np.ndarray, size: int, blocks, top: int = 0, left: int = 0) -> np.ndarray:
    """The size x size tiles every 4 rows and columns of _hwn's `padded`, from (top, left):
    [size * size, C * bh * bw * N]."""
    xp = array_module(padded)
    c, _, _, _, n = padded.shape
    sc, sh, sp, sq, sn = padded.strides
    tiles = xp.empty((size, size, c) + tuple(blocks) + (n,), padded.dtype)
    shape, strides = (size, c, blocks[0], blocks[1], n), (sh, sc, _OUT * sh, sq, sn)
    # NumPy's ndarray constructor makes the overlapping view in 0.3 us, as_strided in 2 (Python
    # that holds the GIL, 16 calls a W9 chunk); it also checks the view lies inside `padded`
    direct = xp is np and padded.flags.c_contiguous
    for j in range(size):
        quad, phase = divmod(left + j, _PHASES)
        if direct:
            start = top * sh + phase * sp + quad * sq  # tile column j's first element, in bytes
            tiles[:, j] = np.ndarray(shape, padded.dtype, padded, start, strides)
            continue
        column = padded[:, top:, phase, quad:]  # [C, rows, quads, N]: tile column j's start
        tiles[:, j] = xp.lib.stride_tricks.as_strided(column, shape, strides)
    return tiles.reshape(size * size, c * blocks[0] * blocks[1] * n)


def _out_hw(in_hw, pads) -> tuple[int, int]:
    return in_hw[0] + pads[0] + pads[1] - 2, in_hw[1] + pads[2] + pads[3] - 2


def _padded_input(x: np.ndarray, pads, out_hw) -> np.ndarray:
    """x [N, C, H, W] padded by pads to 4 * bh + 2 rows and 4 * bw + 2 columns, in _hwn's
    layout."""
    bh, bw = _blocks(out_hw)
    return _hwn(x, pads[0], pads[2], (_OUT * bh + 2, _OUT * bw + 2))


def _grad_pads(pads) -> tuple[int, ...]:
    """The input gradient's pads: the correlation of grad padded by 2 - pads."""
    return tuple(2 - p for p in pads)


def padded_grad(grad: np.ndarray, pads) -> np.ndarray | None:
    """grad [N, M, OH, OW] padded as input_grad pads it, which filter_grad reads too: made
    once for both gradients (a layout change of the whole gradient, 0.2 ms a chunk of W9's
    [8, 64, 28, 28]). None where input_grad does not apply (a padding above 2)."""
    if max(pads) > 2:
        return None
    flipped = _grad_pads(pads)
    return _padded_input(grad, flipped, _out_hw(grad.shape[2:], flipped))


def input_transform(x: np.ndarray, pads, out_hw, padded: np.ndarray | None = None) -> np.ndarray:
    """V = Bt d Bt' of every input tile of x [N, C, H, W] padded by pads (top, bottom, left,
    right): [36, C, bh * bw * N]. padded: _padded_input's layout of x, if the caller has it."""
    bh, bw = _blocks(out_hw)
    if padded is None:
        padded = _padded_input(x, pads, out_hw)
    d = _tiles(padded, _TILE, (bh, bw))
    return _kron_product(_BT, d, _INPUT).reshape(_TILE * _TILE, x.shape[1], bh * bw * x.shape[0])


# A layer with at least this many filter weights (M * C: 256 x 256 channels) is computed a
# block of filters at a time, each block on the intra-op pool: its transformed filters
# ([36, M, C], 38 MB for 512 x 512 in float32) and products then stay under glibc's 32 MiB
# mmap threshold (a fresh mapping every step costs a page fault per page: 5.9 ms for 38 MB
# against 1.1 ms for 30 MB reused), and the transforms, one thread's work whole, are split.
FILTER_BLOCKS_FROM = 1 << 16
FILTER_BLOCKS = 4


def _filter_blocks(m: int, c: int) -> int:
    """Filters per block of a layer of M filters of C channels (M: one block)."""
    return m if m * c < FILTER_BLOCKS_FROM else -(-m // FILTER_BLOCKS)


def transformed_filters(w: np.ndarray, flipped: bool = False) -> np.ndarray:
    """U = G g G' of every 3x3 filter g of w [M, C, 3, 3]: [36, M, C]. flipped: of the
    filters the input gradient correlates with (each rotated by 180 degrees, in and out
    channels swapped), [36, C, M]: the rotation reverses the 9 taps, so the transform's
    columns are reversed instead and no rotated copy of w is made."""
    m, c = w.shape[:2]
    transform = _constant(_FLIPPED_FILTER if flipped else _FILTER, w)
    # in the data's dtype: a float64 transform of a 512x512 filter costs more than the
    # products on a batch of 7x7 images, and float32 rounds it to ~3e-8 relative
    u = (transform @ w.reshape(m * c, 9).T).reshape(_TILE * _TILE, m, c)
    return u.swapaxes(1, 2) if flipped else u


class FilterTransforms:
    """The transformed filters of one weight array, made once for all the chunks of one op's
    batch (each chunk's conv would transform the same filters again: 0.29 ms for 128 x 128
    channels, four times a step for a batch in four chunks). A layer blocked by
    _filter_blocks gets None: its blocks transform their own filters, a block at a time."""

    def __init__(self, w: np.ndarray):
        self.w = w
        self._made: dict[bool, np.ndarray] = {}
        self._making = threading.Lock()

    def get(self, flipped: bool = False) -> np.ndarray | None:
        m, c = self.w.shape[:2]
        if _filter_blocks(m, c) < m:
            return None
        with self._making:  # the chunks ask at once, from the pool's threads
            if flipped not in self._made:
                self._made[flipped] = transformed_filters(self.w, flipped)
            return self._made[flipped]


def conv(
    x: np.ndarray,
    w: np.ndarray,
    pads,
    out=None,
    *,
    flipped: bool = False,
    transforms: FilterTransforms | None = None,
    padded: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The 3x3 stride-1 correlation of x [N, C, H, W] with w [M, C, 3, 3], x padded by pads:
    ([N, M, OH, OW], written into `out` if given; V for filter_grad). flipped: with w's
    filters rotated by 180 degrees and its channels swapped (w [C, M, 3, 3] then: the input
    gradient of a conv by w). transforms: w's, shared by the chunks of one op; padded:
    _padded_input's layout of x, if the caller has it."""
    xp = array_module(x)
    n, c = x.shape[:2]
    m = w.shape[1] if flipped else w.shape[0]
    out_hw = _out_hw(x.shape[2:], pads)
    bh, bw = _blocks(out_hw)
    v = input_transform(x, pads, out_hw, padded)
    out = xp.empty((n, m) + out_hw, x.dtype) if out is None else out
    whole = None if transforms is None else transforms.get(flipped)

    def filters(start: int, stop: int) -> None:
        k = stop - start
        if whole is not None:
            u = whole[:, start:stop]
        else:
            u = transformed_filters(w[:, start:stop] if flipped else w[start:stop], flipped)
        products = pooled_matmul(u, v)  # [36, k, bh * bw * N]
        y = _kron_product(_AT, products.reshape(_TILE * _TILE, -1), _OUTPUT)
        y = y.reshape(_OUT, _OUT, k, bh, bw, n).transpose(5, 2, 3, 0, 4, 1)
        if out_hw == (_OUT * bh, _OUT * bw):  # whole blocks: one copy, into out's blocks
            out[:, start:stop].reshape(n, k, bh, _OUT, bw, _OUT)[...] = y
            return
        y = y.reshape(n, k, _OUT * bh, _OUT * bw)
        out[:, start:stop] = y[:, :, : out_hw[0], : out_hw[1]]

    device_context(_place_of(x)).parallel_for(m, filters, _filter_blocks(m, c))
    return out, v


def input_grad(
    grad: np.ndarray,
    w: np.ndarray,
    pads,
    transforms: FilterTransforms | None = None,
    padded: np.ndarray | None = None,
) -> np.ndarray | None:
    """d(conv)/d(input) for grad [N, M, OH, OW]: the correlation of grad, padded by 2 - pads,
    with the rotated filter. None when a padding exceeds 2 (the caller's general kernel).
    padded: padded_grad(grad, pads), if the caller has it."""
    if max(pads) > 2:
        return None
    flipped = _grad_pads(pads)
    return conv(grad, w, flipped, flipped=True, transforms=transforms, padded=padded)[0]


def _grad_blocks(grad: np.ndarray, padded: np.ndarray | None, pads) -> tuple:
    """grad [N, M, OH, OW] as filter_grad's tiles read it, zero-padded to [M, 4 * bh, 4 * bw,
    N] in _hwn's layout: (array, top, left), a window of padded_grad's array where that holds
    it, else a new array (at 0, 0)."""
    bh, bw = _blocks(grad.shape[2:])
    size = (_OUT * bh, _OUT * bw)
    if padded is not None:
        top, _, left, _ = _grad_pads(pads)
        width = padded.shape[2] * padded.shape[3]  # (its columns past the padded grad's are 0)
        if top + size[0] <= padded.shape[1] and left + size[1] <= width:
            return padded, top, left
    return _hwn(grad, 0, 0, size), 0, 0


def filter_grad(
    v: np.ndarray, grad: np.ndarray, padded: np.ndarray | None = None, pads=None
) -> np.ndarray:
    """d(conv)/d(filter) [M, C, 3, 3] from the forward's V and grad [N, M, OH, OW].
    padded: padded_grad(grad, pads), if the caller has it."""
    xp = array_module(grad)
    n, m, oh, ow = grad.shape
    c = v.shape[1]
    bh, bw = _blocks((oh, ow))
    blocks, top, left = _grad_blocks(grad, padded, pads)
    tiles = _tiles(blocks, _OUT, (bh, bw), top, left)
    transformed = _kron_product(_A, tiles, _GRAD_INPUT).reshape(_TILE * _TILE, m, bh * bw * n)
    dw = xp.empty((m, c, 3, 3), grad.dtype)

    def filters(start: int, stop: int) -> None:
        z = matmul_nt(transformed[:, start:stop], v)  # [36, k, C]
        k = stop - start
        block = (_constant(_FILTER, grad).T @ z.reshape(_TILE * _TILE, k * c)).reshape(3, 3, k, c)
        dw[start:stop] = block.transpose(2, 3, 0, 1)

    device_context(_place_of(grad)).parallel_for(m, filters, _filter_blocks(m, c))
    return dw
