"""The copy from NCHW into the batch-innermost layout ([C, H, W, N]) that the im2col and
Winograd kernels read.

One copy of the whole transposed view walks the output in order and so reads one element from
each of the N images in turn: N lines, an image apart (4 KiB-aliased in L1 where an image's
size is a power of two), of which it uses a single float before they are evicted. Copied
BATCH_BLOCK images at a time, the lines it reads stay in L1 while the next output elements use
them. Measured on the 2-vCPU EPYC (one thread), whole against blocks of 4 / 8 / 16 images:
[64, 16, 8, 8] (LeNet's second conv gradient) 89 against 48 / 29 / 36 us; [32, 64, 28, 28]
(W9) 1216 against 974 / 593 / 758; [32, 64, 32, 32] 1553 against 1302 / 806 / 1019; [32, 512,
4, 4] 216 against 165 / 103 / 139; [64, 6, 12, 12] (an image of 864 floats) 12 against 42 /
25 / 18, where the whole copy wins (PAGE_ALIASED_MIN below). The reverse copy, back to NCHW,
gained nothing from blocks (NumPy already walks it in the input's order).
"""

from __future__ import annotations

import numpy as np

from nestflow.core.device_context import array_module

BATCH_BLOCK = 8
# Images of fewer elements than this sit close enough that one copy of the whole batch keeps
# its lines in cache: the blocks' extra calls cost more than they save.
PAGE_ALIASED_MIN = 1024


def batch_last_into(out: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x [N, C, H, W] written into out [C, H, W, N] (a view, e.g. the window of a padded
    array): out[..., n] = x[n]. Returns out."""
    image = x[:1].size
    if array_module(x) is not np or image < PAGE_ALIASED_MIN or len(x) <= BATCH_BLOCK:
        out[...] = x.transpose(1, 2, 3, 0)
        return out
    for start in range(0, len(x), BATCH_BLOCK):
        stop = start + BATCH_BLOCK
        out[..., start:stop] = x[start:stop].transpose(1, 2, 3, 0)
    return out
