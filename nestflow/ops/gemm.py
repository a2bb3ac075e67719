"""Matrix products laid out for OpenBLAS's single-threaded sgemm, whose speed on some shapes
depends on more than the arithmetic. Measured on the benchmarks' shapes (one BLAS thread, the
project's 2-vCPU AMD EPYC machine, OpenBLAS 0.3.31's Haswell kernels):

- a product whose output has few rows runs up to 2.5x slower than its transpose;
- a weight gradient X^T @ dOut summed over many rows has two speeds in one process. Until the
  process has run some large GEMM, one call over 1,024 rows ([1024, 128]^T @ [1024, 128])
  took 2.3 ms and the same sum in pieces of 128 rows 1.1 ms; after one (a float32 512x512
  product, say), one call took 0.97 ms and the pieces 1.07 ms. The pieces are kept: 2x where
  the slow state holds (a process of small and medium products, such as an RNN's), 10% where
  it does not.

Summing in pieces changes the order of the additions, not the result's accuracy; the order is
fixed by the shapes, so results stay deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# Rows of X and dOut per BLAS call in matmul_tn: of 64, 128 and 256, 128 was fastest on every
# weight-gradient shape measured (outputs 64x128 to 784x256, 256 to 4,096 rows).
TN_PIECE_ROWS = 128

# The longest summed axis one BLAS call gets in matmul_nt (tuned on the conv benchmarks W8, W9).
NT_PIECE = 512


def matmul_tn(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """x [K, M] transposed times g [K, N]: [M, N], the weight gradient of a product x @ W
    (K: the rows of a batch). Summed over pieces of TN_PIECE_ROWS rows when K is long (2-D
    arrays; anything else is one np.matmul)."""
    rows = x.shape[0]
    if rows < 2 * TN_PIECE_ROWS or x.ndim != 2 or g.ndim != 2:
        return np.matmul(x.T, g)
    pieces = range(0, rows, TN_PIECE_ROWS)
    return _summed((x[i : i + TN_PIECE_ROWS], g[i : i + TN_PIECE_ROWS]) for i in pieces)


def matmul_tn_blocks(xs: Sequence[np.ndarray], gs: Sequence[np.ndarray]) -> np.ndarray:
    """The sum of xs[i]^T @ gs[i] over 2-D blocks with one column count each (a loop's steps):
    consecutive blocks are stacked into pieces of at least TN_PIECE_ROWS rows, one BLAS call
    each, each piece stacked just before its call (while it is in cache)."""

    def pieces():
        start, rows = 0, 0
        for stop, x in enumerate(xs, 1):
            rows += x.shape[0]
            if rows >= TN_PIECE_ROWS or stop == len(xs):
                yield _stacked(xs[start:stop]), _stacked(gs[start:stop])
                start, rows = stop, 0

    return _summed(pieces())


def _stacked(blocks: Sequence[np.ndarray]) -> np.ndarray:
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def _summed(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    total = None
    for x, g in pairs:
        product = np.matmul(x.T, g)
        if total is None:
            total = product
        else:
            total += product
    return total


def matmul_nt(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [..., M, K] times b [..., N, K] transposed: [..., M, N] (a transposed view when
    M < N, so the larger of M, N becomes the rows). A long K into a small output (a filter
    gradient's 64x64 summed over 25,088 pixels) is summed in pieces of at most NT_PIECE."""
    if a.shape[-2] < b.shape[-2]:
        return np.swapaxes(matmul_nt(b, a), -1, -2)
    k = a.shape[-1]
    # only a long K into a small output; with N < 16 the calls' overhead outweighs the gain
    chunked = b.shape[-2] >= 16 and k > 4 * a.shape[-2]
    pieces = max(1, -(-k // NT_PIECE)) if chunked else 1
    size = max(1, -(-k // pieces))
    total = np.matmul(a[..., :size], np.swapaxes(b[..., :size], -1, -2))
    for start in range(size, k, size):
        part = slice(start, start + size)
        total += np.matmul(a[..., part], np.swapaxes(b[..., part], -1, -2))
    return total
