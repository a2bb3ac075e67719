"""What a parallel region of the intra-op pool costs, against the size of LeNet's (W8) kernels.

    python bench/region_cost.py [--threads 2] [--repeats 2000]

Prints, medians of `repeats` calls, nestflow at `--threads`, BLAS at one thread:

- an empty region (parallel_for over two chunks of no work), and a Python lock handed back and
  forth between two threads pinned to two CPUs (a round trip: the least a hand-over costs);
- LeNet's conv products (its two convs' forward products and their gradients' products, as
  in_small_products runs them at 1 thread) whole on the calling thread and split in two
  chunks on the pool: by their output's columns, and the first conv's filter gradient by its
  summed axis (the two partial products added).

Where a region costs about as much as the work it splits, no split of W8's kernels makes its
step faster at 2 threads (docs/performance.md, "Where the 2-thread targets stop").
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

# LeNet's conv products, (a, b) shapes, as nestflow's im2col kernels run them for W8's batch
# of 64: forward filters x columns, the first conv's filter gradient (gradient x columns^T),
# the second conv's input gradient (filters^T x gradient).
PRODUCTS = {
    "conv1 forward [6, 25] x [25, 36864]": ((6, 25), (25, 36864)),
    "conv1 filter gradient [6, 36864] x [36864, 25]": ((6, 36864), (36864, 25)),
    "conv2 forward [16, 150] x [150, 4096]": ((16, 150), (150, 4096)),
    "conv2 input gradient [150, 16] x [16, 4096]": ((150, 16), (16, 4096)),
}


def median_us(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def lock_round_trip(repeats: int) -> float | None:
    """us per round trip of a lock pair between two pinned threads (None off Linux or on one
    CPU)."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()
    rounds = repeats + 20

    def partner() -> None:
        os.sched_setaffinity(0, {cpus[1]})
        for _ in range(rounds):
            ping.acquire()
            pong.release()

    had = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    thread = threading.Thread(target=partner)
    thread.start()

    def round_trip() -> None:
        ping.release()
        pong.acquire()

    try:
        return median_us(round_trip, repeats)
    finally:
        thread.join()
        os.sched_setaffinity(0, had)


def split_in_two(a: np.ndarray, b: np.ndarray, device, product) -> Callable[[], np.ndarray]:
    """a @ b in two chunks on the pool: by b's columns, or, for a long summed axis into a small
    output (the filter gradient), by that axis, the partial products added."""
    if a.shape[1] > b.shape[1]:
        k = a.shape[1]

        def by_depth() -> np.ndarray:
            parts = device.parallel_for(k, lambda s, e: product(a[:, s:e], b[s:e]), -(-k // 2))
            return parts[0] + parts[1]

        return by_depth
    n = b.shape[1]
    out = np.empty((a.shape[0], n), np.float32)

    def by_columns() -> np.ndarray:
        def body(s: int, e: int) -> None:
            out[:, s:e] = product(a, b[:, s:e])

        device.parallel_for(n, body, -(-n // 2))
        return out

    return by_columns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    import nestflow as nf
    from nestflow.core.memory import keep_freed_memory
    from nestflow.ops.gemm import in_small_products

    keep_freed_memory()
    nf.set_num_threads(args.threads)
    device = nf.device_context(nf.CPUPlace())
    with threadpool_limits(1, user_api="blas"):
        empty = median_us(lambda: device.parallel_for(2, lambda s, e: None, 1), args.repeats)
        trip = lock_round_trip(args.repeats)
        print(f"nestflow at {args.threads} threads")
        print(f"empty parallel region: {empty:.1f} us")
        print(
            "lock round trip, two pinned threads: " + ("n/a" if trip is None else f"{trip:.1f} us")
        )
        print("| LeNet product | whole (us) | split in two on the pool (us) |")
        print("|---|---|---|")
        rng = np.random.default_rng(0)
        for name, (a_shape, b_shape) in PRODUCTS.items():
            a = rng.standard_normal(a_shape, dtype=np.float32)
            # the filter gradient's columns^T is a transposed view, as the kernel passes it
            b = rng.standard_normal(b_shape[::-1], dtype=np.float32).T
            if b_shape[0] < b_shape[1]:
                b = np.ascontiguousarray(b)
            whole = median_us(functools.partial(in_small_products, a, b), args.repeats // 4)
            split = median_us(split_in_two(a, b, device, in_small_products), args.repeats // 4)
            print(f"| {name} | {whole:.0f} | {split:.0f} |")


if __name__ == "__main__":
    main()
