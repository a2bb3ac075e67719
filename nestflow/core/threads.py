"""The BLAS thread pool behind NumPy's matrix products (threadpoolctl, imported on first use).

On a machine shared by several processes, each process's BLAS starting one thread per core
oversubscribes the cores and makes every process slower; `nf.set_num_threads(1)` (or
OMP_NUM_THREADS=1 before start) avoids it. See the README's performance notes.
"""

from __future__ import annotations

import numpy as np

from nestflow.errors import AttrError

__all__ = ["get_num_threads", "set_num_threads", "threads_summary"]


def set_num_threads(n: int) -> None:
    """Limit the BLAS and OpenMP thread pools of the libraries loaded so far (NumPy's BLAS is
    loaded by `import nestflow`) to `n` threads, for the rest of the process. n < 1 or not an
    int -> AttrError.

    >>> import nestflow as nf
    >>> nf.set_num_threads(1); nf.get_num_threads()
    1
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise AttrError(f"set_num_threads: n must be an int >= 1, got {n!r}")
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=int(n))


def get_num_threads() -> int:
    """The number of threads BLAS uses for a matrix product (the largest over the BLAS
    libraries loaded; the OpenMP pools' if no BLAS is loaded; 1 if neither is).

    >>> n = nf.get_num_threads()
    >>> isinstance(n, int) and n >= 1
    True
    """
    from threadpoolctl import threadpool_info

    pools = threadpool_info()
    blas = [p for p in pools if p["user_api"] == "blas"] or pools
    return max((p["num_threads"] for p in blas), default=1)


def threads_summary() -> str:
    """One line for a program's start: how many threads BLAS uses and how to change that."""
    from threadpoolctl import threadpool_info

    names = sorted({p["internal_api"] for p in threadpool_info() if p["user_api"] == "blas"})
    return (
        f"BLAS threads: {get_num_threads()} ({', '.join(names) or 'no BLAS loaded'}; "
        "nf.set_num_threads(n) or OMP_NUM_THREADS=n changes it)"
    )
