"""Matrix products laid out for OpenBLAS's single-threaded sgemm, whose speed on some shapes
depends on more than the arithmetic:

- a product whose output has few rows runs up to 2.5x slower than its transpose (matmul_nt
  computes the wider orientation);
- under OpenBLAS's AVX-512 kernels a skinny product runs fastest in blocks that fit its small
  kernel (in_small_products);
- products are split across the intra-op pool by output rows or stack entries
  (pooled_matmul), never by their summed axis.

Until 2026-11-28 the weight gradients X^T @ dOut (matmul_tn) and the long sums of matmul_nt
were summed over pieces of their summed axis (128 rows; 512 terms under the non-AVX-512
kernels), measured then as up to 2x faster in a process that had run no large GEMM. With NumPy
2.4 and OpenBLAS 0.3.31 that state no longer showed, and one call won on every shape measured
(the 2-vCPU EPYC, one BLAS thread unless said, ms, pieces against one call): [1024, 128]^T @
[1024, 128] in a fresh process 0.306 / 0.278 (Haswell kernels), 0.185 / 0.163 (SkylakeX);
[2048, 256]^T @ [2048, 1024] 5.41 / 5.04 and at 2 BLAS threads 4.30 / 2.62 (a piece is too
small to thread); W9's Winograd filter gradient [36, 64, 1568] x [36, 64, 1568]^T 3.36 / 2.41
(Haswell). Train steps with one call instead: W15 (Transformer) 54.6 -> 52.8 ms at 1 thread and
43.5 -> 40.4 at 2, W3 1.32 -> 1.28, W10 6.77 -> 6.70 (SkylakeX; Haswell alike). So matmul_tn is
one call, and matmul_tn_blocks stacks a loop's blocks into pieces only to keep each stack in
cache.

The functions take arrays of any place (`array_module`); device arrays (cuBLAS) get one product.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from nestflow.core.device_context import array_module, chunk_grain, device_context

# Rows a loop's blocks are stacked into before each BLAS call in matmul_tn_blocks (each stack
# made just before its call, while it is in cache; a stack of every step would copy them all).
TN_PIECE_ROWS = 128


def matmul_tn(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """x [K, M] transposed times g [K, N]: [M, N], the weight gradient of a product x @ W
    (K: the rows of a batch), in one BLAS call (see the module docstring)."""
    return array_module(x, g).matmul(x.T, g)


def matmul_tn_blocks(xs: Sequence[np.ndarray], gs: Sequence[np.ndarray]) -> np.ndarray:
    """The sum of xs[i]^T @ gs[i] over 2-D blocks with one column count each (a loop's steps):
    consecutive blocks are stacked into pieces of at least TN_PIECE_ROWS rows, one BLAS call
    each, each piece stacked just before its call (while it is in cache). Device arrays: one
    product of the whole stacks."""
    xp = array_module(*xs[:1], *gs[:1])
    piece_rows = TN_PIECE_ROWS if xp is np else float("inf")

    def pieces():
        start, rows = 0, 0
        for stop, x in enumerate(xs, 1):
            rows += x.shape[0]
            if rows >= piece_rows or stop == len(xs):
                yield _stacked(xs[start:stop]), _stacked(gs[start:stop])
                start, rows = stop, 0

    return _summed(pieces())


def _stacked(blocks: Sequence[np.ndarray]) -> np.ndarray:
    return blocks[0] if len(blocks) == 1 else array_module(blocks[0]).concatenate(blocks)


def _summed(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    total = None
    for x, g in pairs:
        product = array_module(x).matmul(x.T, g)
        if total is None:
            total = product
        else:
            total += product
    return total


# OpenBLAS's kernel families for AVX-512 CPUs (its "core" names, as threadpoolctl reports them).
_AVX512_KERNELS = frozenset({"skylakex", "cooperlake", "sapphirerapids"})
_blas_kernels: list[str] = []


def avx512_kernels() -> bool:
    """Whether NumPy's OpenBLAS runs its AVX-512 kernels (where in_small_products splits skinny
    products for its small-product kernel). Asked of threadpoolctl once per process."""
    if not _blas_kernels:
        _blas_kernels.append(_numpy_openblas_kernels())
    return _blas_kernels[0] in _AVX512_KERNELS


def _numpy_openblas_kernels() -> str:
    """The kernel family of the OpenBLAS NumPy calls, lower case ("" when NumPy's BLAS is
    another library, or threadpoolctl cannot tell)."""
    import warnings

    try:
        from threadpoolctl import threadpool_info

        with warnings.catch_warnings():  # e.g. its note on mixed OpenMP runtimes
            warnings.simplefilter("ignore")
            infos = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    except Exception:  # a failing probe must not fail a product
        return ""
    # NumPy's own copy where several are loaded (SciPy's or PyTorch's may differ)
    infos.sort(key=lambda i: "numpy" not in str(i.get("filepath", "")).lower())
    return str(infos[0].get("architecture") or "").lower() if infos else ""


# OpenBLAS's AVX-512 kernels run a product of at most SMALL_PRODUCT multiply-adds (M * N * K)
# by a kernel that reads its operands in place, where larger ones pack them first. On skinny
# products the small kernel is 1.3-3.5x faster, so a product with at most SMALL_NARROW output
# rows (or columns), or summing at most SMALL_NARROW terms, whose fixed operand (the one not
# split) has at most SMALL_FIXED_SIDE elements, runs in blocks of at most SMALL_PRODUCT, each
# at least SMALL_MIN_BLOCK long; a long K into an output of at most SMALL_FIXED_SIDE elements
# runs in pieces of K. Measured on the 2-vCPU EPYC (SkylakeX kernels, 1 thread): LeNet's
# convolutions [6, 25] x [25, 36864] 237 -> 117 us, [6, 36864] x [25, 36864]^T 488 -> 110,
# [16, 150] x [150, 4096] 278 -> 148, [150, 16] x [16, 4096] 339 -> 114; ResNet's stem filter
# gradient [27, 32768] x [32768, 64] 882 -> 559. In blocks of columns of a [K, 8192]: 8 rows
# 1.7-2.8x faster, 16 rows 1.1-1.7x, 32 to 256 rows by K = 6 3.1-3.5x, 32 to 150 rows by
# K = 16 1.4-1.7x; but 64 rows by K = 27 (the stem's forward, [64, 27] x [27, 32768]) 0.8x, and 64
# rows by 64 0.7x.
SMALL_PRODUCT = 10**6
SMALL_FIXED_SIDE = 2400
SMALL_NARROW = 16
SMALL_MIN_BLOCK = 256


def _small_block(fixed: int, narrow: int) -> int:
    """Block length for a product split along one axis, whose fixed operand has `fixed`
    elements and whose narrowest other side is `narrow` long; 0 where it stays one call."""
    block = SMALL_PRODUCT // max(fixed, 1)
    if narrow > SMALL_NARROW or fixed > SMALL_FIXED_SIDE or block < SMALL_MIN_BLOCK:
        return 0
    return block


def in_small_products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for 2-D NumPy float32 a [M, K] and b [K, N], run as OpenBLAS's small-product
    kernel runs it fastest under its AVX-512 kernels: a wide or tall product in blocks of
    output columns or rows (no element summed across blocks), a long K in pieces summed in
    order (fixed by the shapes). One call elsewhere, and for products no block of which fits
    the small kernel."""
    m, k = a.shape
    n = b.shape[1]
    float32 = a.dtype == b.dtype == np.float32  # (the blocks were measured on sgemm only)
    if not float32 or m * n * k <= SMALL_PRODUCT or not avx512_kernels():
        return np.matmul(a, b)
    if block := _small_block(m * k, min(m, k)):  # wide: blocks of columns
        out = np.empty((m, n), np.result_type(a, b))
        for start in range(0, n, block):
            np.matmul(a, b[:, start : start + block], out=out[:, start : start + block])
        return out
    if block := _small_block(k * n, min(k, n)):  # tall: blocks of rows
        out = np.empty((m, n), np.result_type(a, b))
        for start in range(0, m, block):
            np.matmul(a[start : start + block], b, out=out[start : start + block])
        return out
    if block := _small_block(m * n, 0):  # a long K into a small output
        total = np.matmul(a[:, :block], b[:block])
        for start in range(block, k, block):
            total += np.matmul(a[:, start : start + block], b[start : start + block])
        return total
    return np.matmul(a, b)


def _one_call(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b on the calling thread; a single 2-D product (leading axes of size 1 included) by
    in_small_products."""
    if a.shape[:-2] == b.shape[:-2] and math.prod(a.shape[:-2]) == 1:
        product = in_small_products(a.reshape(a.shape[-2:]), b.reshape(b.shape[-2:]))
        return product.reshape(a.shape[:-2] + product.shape)
    return np.matmul(a, b)


# A product is split across the CPU's intra-op pool into chunks of at least this many
# multiply-adds (about 0.15 ms of single-threaded sgemm), at most POOLED_MAX_CHUNKS of them.
POOLED_MIN_WORK = 1 << 24
POOLED_MAX_CHUNKS = 4
# A product summing fewer terms than this writes more than it computes (Winograd's filter
# gradient on 4x4 images: [36, 512, 32] x [36, 32, 512]); split, it ran slower at 2 threads
# than whole at 1 (16.4 ms against 7.4), so it stays one call.
POOLED_MIN_DEPTH = 64


def _product_shape(a_shape: tuple, b_shape: tuple) -> tuple:
    """The shape of a @ b for a, b of at least 2 dims. The stacks of a conv's chunks agree (or
    one side has none) and skip np.broadcast_shapes: its 3 us of Python hold the GIL, which a
    pool thread's chunk then waits for."""
    if a_shape[:-2] == b_shape[:-2] or len(b_shape) == 2:
        stack = a_shape[:-2]
    elif len(a_shape) == 2:
        stack = b_shape[:-2]
    else:
        stack = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return stack + (a_shape[-2], b_shape[-1])


def pooled_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b split across the CPU's intra-op pool: a stack of products by its leading axis
    (each product whole: the same bits as one call), a single one by its larger output axis
    into blocks of rows or columns (up to POOLED_MAX_CHUNKS of them, or up to MAX_CHUNKS
    where the budget has more threads); no element is summed across blocks, so the bits do
    not depend on the thread count; inside a pool task (a conv already split by its batch)
    the chunks run on the calling thread. Small products and device arrays get one call.
    The products a conv runs on a handful of images (ResNet's 4x4 and 8x8 layers, a batch
    too small to split) are where this gives the pool work."""
    xp = array_module(a, b)
    if xp is not np or a.ndim < 2 or b.ndim < 2:
        return xp.matmul(a, b)
    shape = _product_shape(a.shape, b.shape)
    work = math.prod(shape) * a.shape[-1]
    if work < 2 * POOLED_MIN_WORK or a.shape[-1] < POOLED_MIN_DEPTH:
        return _one_call(a, b)
    out = np.empty(shape, np.result_type(a, b))
    if len(shape) > 2 and shape[0] > 1 and a.shape[:-2] == b.shape[:-2] == shape[:-2]:
        axis_size = shape[0]

        def body(start: int, stop: int) -> None:
            np.matmul(a[start:stop], b[start:stop], out=out[start:stop])

    elif shape[-2] >= shape[-1]:
        axis_size = shape[-2]

        def body(start: int, stop: int) -> None:
            np.matmul(a[..., start:stop, :], b, out=out[..., start:stop, :])

    else:
        axis_size = shape[-1]

        def body(start: int, stop: int) -> None:
            np.matmul(a, b[..., start:stop], out=out[..., start:stop])

    grain = chunk_grain(axis_size, work // axis_size, POOLED_MIN_WORK, POOLED_MAX_CHUNKS)
    if grain >= axis_size:
        return np.matmul(a, b, out=out)
    device_context().parallel_for(axis_size, body, grain)
    return out


def matmul_nt(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [..., M, K] times b [..., N, K] transposed: [..., M, N] (a transposed view when
    M < N, so the larger of M, N becomes the rows), one product split as pooled_matmul splits
    it."""
    xp = array_module(a, b)
    if a.shape[-2] < b.shape[-2]:
        return xp.swapaxes(matmul_nt(b, a), -1, -2)
    return pooled_matmul(a, xp.swapaxes(b, -1, -2))


# The largest output matmul_nt_contiguous copies out of matmul_nt's transposed product; a larger
# one is computed in its own orientation. On the 2-vCPU EPYC (SkylakeX kernels, 1 thread):
# [128, 1152] summed over 2,048: 3.0 ms copied against 3.5 direct; [256, 2304] over 1,024: 6.2
# against 5.7; [512, 4608] over 512: 17.0 against 10.5 (copying a transposed 9 MB array alone
# took 6.3 ms).
TRANSPOSED_COPY_MAX = 1 << 18


def matmul_nt_contiguous(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """matmul_nt(a, b) as a C-contiguous array: what a filter gradient must be, since the
    optimizer updates it elementwise beside the C-contiguous filter, and an elementwise op
    between a transposed and a contiguous array reads one of them across its rows (W13's SGD
    update of a transposed [512, 4608] gradient took 14 ms against 0.8 contiguous)."""
    xp = array_module(a, b)
    rows, cols = a.shape[-2], b.shape[-2]
    if rows < cols and math.prod(a.shape[:-2]) * rows * cols > TRANSPOSED_COPY_MAX:
        return pooled_matmul(a, xp.swapaxes(b, -1, -2))
    return xp.ascontiguousarray(matmul_nt(a, b))
