"""How well two threads run NumPy calls side by side under CPython's GIL, by call length.

    python bench/gil_calls.py [--rounds 5] [--calls-per-size 20000000]

Each case runs the same calls (a float32 multiply into `out=`) once on one thread and once
split over two threads, each pinned to its own CPU where the OS allows, BLAS at one thread;
it prints the 2-thread speed-up (time on one thread / time on two, the best of `rounds`).
Three cases per call length:

- own arrays: each thread reads and writes its own arrays (what the intra-op pool's chunks do:
  each writes its own slice of the output);
- one shared output: both threads write the same array, so its cache lines move between the
  two cores on every call. This measures that traffic, not the GIL;
- own arrays + Python gap: a few microseconds of Python between calls, as a kernel's slicing
  and bookkeeping take. Python holds the GIL, so the other thread, leaving its call then,
  waits.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

SIZES = (4096, 32768, 262144, 2097152)  # float32 elements a call
GAP_STEPS = 200  # a Python loop of this many additions: a few microseconds


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})


def _python_gap(steps: int) -> int:
    total = 0
    for i in range(steps):
        total += i
    return total


def _calls(a: np.ndarray, out: np.ndarray, count: int, gap: int) -> None:
    for _ in range(count):
        np.multiply(a, a, out=out)
        if gap:
            _python_gap(gap)


def speed_up(size: int, count: int, shared: bool, gap: int, rounds: int) -> tuple[float, float]:
    """(time a call on one thread in us, 2-thread speed-up), best of rounds each."""
    rng = np.random.default_rng(0)
    inputs = [rng.random(size, dtype=np.float32) for _ in range(2)]
    outputs = [np.empty(size, np.float32) for _ in range(2)]
    if shared:
        outputs[1] = outputs[0]
    one = two = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        _calls(inputs[0], outputs[0], 2 * count, gap)
        one = min(one, time.perf_counter() - start)

        def half(i: int) -> None:
            _pin(i)
            _calls(inputs[i], outputs[i], count, gap)

        threads = [threading.Thread(target=half, args=(i,)) for i in (0, 1)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        two = min(two, time.perf_counter() - start)
    return one / (2 * count) * 1e6, one / two


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls-per-size", type=int, default=20_000_000)
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")
    gap_start = time.perf_counter()
    for _ in range(1000):
        _python_gap(GAP_STEPS)
    gap_us = (time.perf_counter() - gap_start) / 1000 * 1e6
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"Python gap: {gap_us:.1f} us; CPUs: {cpus}")
    print("| elements | call (us) | own arrays | one shared output | own arrays + Python gap |")
    print("|---|---|---|---|---|")
    for size in SIZES:
        count = max(200, args.calls_per_size // size)
        per_call, own = speed_up(size, count, False, 0, args.rounds)
        _, shared = speed_up(size, count, True, 0, args.rounds)
        _, gapped = speed_up(size, count, False, GAP_STEPS, args.rounds)
        print(f"| {size:,} | {per_call:.1f} | {own:.2f}x | {shared:.2f}x | {gapped:.2f}x |")


if __name__ == "__main__":
    main()
