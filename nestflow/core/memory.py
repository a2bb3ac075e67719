"""How this process's malloc hands freed array memory back to the system, set once for training
loops (glibc only).

A train step allocates and frees the same large temporaries every time (im2col columns,
Winograd tiles, activations and their gradients). By default glibc serves a block of 128 KiB or
more with a fresh mmap until such blocks have been freed (then the limit follows the freed size
up to 32 MiB), and gives the free memory at the top of its heap back to the kernel once more than
twice that limit is free there. Either way the next step's arrays land on new pages: a page
fault per 4 KiB, each a trip into the kernel that zeroes the page (on a virtual machine, a few
microseconds). Measured on the project's 2-vCPU VM with one BLAS thread, in a fresh process:
LeNet-5's train step (W8) took 12.5 ms with 2,625 faults (5.3 ms of system time) per step, and
6.0 ms with none; W9's 3x3 conv forward and backward 72 ms with 2,446 faults, 66 ms with none.

`keep_freed_memory()`, called when the first Executor is made, sets glibc's M_MMAP_THRESHOLD to
32 MiB (the ceiling of glibc's own moving threshold: smaller blocks come from the heap) and
M_TRIM_THRESHOLD to 256 MiB (up to that much free memory stays mapped at the top of each malloc
arena for the next step): the process then reuses its pages. The price is resident memory
that a finished phase no longer needs: up to 256 MiB per arena (one per thread that allocates,
at most), besides the free blocks below live ones that glibc never returns anyway. NumPy makes
the same kind of process-wide choice for large arrays (transparent huge pages,
NUMPY_MADVISE_HUGEPAGE). Nothing is changed when NESTFLOW_KEEP_FREED_MEMORY=0, when the
environment already tunes glibc's malloc (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
MALLOC_TOP_PAD_, or those settings in GLIBC_TUNABLES), or when the C library is not glibc
(macOS, musl: their allocators differ).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
# glibc's <malloc.h>
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_GLIBC_TUNABLES = (
    "glibc.malloc.mmap_threshold",
    "glibc.malloc.trim_threshold",
    "glibc.malloc.top_pad",
)


@functools.cache
def keep_freed_memory() -> bool:
    """Tune glibc's malloc as the module docstring says, once per process; whether it is
    tuned (False where it is left alone)."""
    if os.environ.get("NESTFLOW_KEEP_FREED_MEMORY", "1").strip() == "0":
        return False
    if any(name in os.environ for name in _GLIBC_VARIABLES) or not sys.platform.startswith("linux"):
        return False
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(name in tunables for name in _GLIBC_TUNABLES):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc's own symbol: musl's mallopt differs
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success. Setting either threshold turns glibc's moving mmap
    # threshold off, so the trim threshold is set only once the mmap one is accepted.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
