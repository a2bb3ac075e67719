"""One thread budget for nestflow's intra-op pool (CPUDeviceContext.parallel_for) and the BLAS
pool behind NumPy's matrix products (threadpoolctl, imported on first use).

The budget starts at the cores the process may use (or OMP_NUM_THREADS). Large kernels split
their work across the intra-op pool and run BLAS single-threaded inside it; everything else
(small tensors, a lone matrix product) runs on the calling thread with BLAS at the budget, so
the two pools never run at once. On a machine shared by several processes
`nf.set_num_threads(1)` (or OMP_NUM_THREADS=1 before start) avoids oversubscribing the cores.
See docs/performance.md.
"""

from __future__ import annotations

import numpy as np

from nestflow.errors import AttrError

__all__ = ["get_num_threads", "set_num_threads", "threads_summary"]


def set_num_threads(n: int) -> None:
    """Give nestflow's intra-op pool `n` threads and limit the BLAS and OpenMP thread pools of
    the libraries loaded so far (NumPy's BLAS is loaded by `import nestflow`) to `n`, for the
    rest of the process. The pool's kernels give the same bits at any `n`; large matrix
    products in threaded BLAS may not (docs/performance.md). n < 1 or not an int ->
    AttrError.

    >>> import nestflow as nf
    >>> nf.set_num_threads(1); nf.get_num_threads()
    1
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise AttrError(f"set_num_threads: n must be an int >= 1, got {n!r}")
    from threadpoolctl import threadpool_limits

    from nestflow.core.device_context import device_context, forget_blas_controllers

    threadpool_limits(limits=int(n))
    forget_blas_controllers()  # a library loaded since the last look gets the limit too
    device_context().num_threads = int(n)


def get_num_threads() -> int:
    """The thread budget: the threads of nestflow's intra-op pool, and of BLAS outside it.

    >>> n = nf.get_num_threads()
    >>> isinstance(n, int) and n >= 1
    True
    """
    from nestflow.core.device_context import device_context

    return device_context().num_threads


def threads_summary() -> str:
    """One line for a program's start: the thread budget and how to change it."""
    from threadpoolctl import threadpool_info

    # the kernels matter as much as the threads: OpenBLAS's AVX2 ones (Haswell) run float32
    # products at about half the speed of its AVX-512 ones (SkylakeX) on a CPU that has both
    names = sorted(
        f"{p['internal_api']} {p['architecture']} kernels"
        if p.get("architecture")
        else p["internal_api"]
        for p in threadpool_info()
        if p["user_api"] == "blas"
    )
    return (
        f"threads: {get_num_threads()} (intra-op pool and BLAS, "
        f"{', '.join(names) or 'no BLAS loaded'}; "
        "nf.set_num_threads(n) or OMP_NUM_THREADS=n changes it)"
    )
