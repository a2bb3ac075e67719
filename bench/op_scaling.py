"""Which ops keep a workload from scaling with threads: a nestflow workload's time per op type
(nf.profiler, top-level ops, the mean of `--rounds` profiled steps) at several thread counts,
with each op type's speed-up from the first count to the last. nestflow alone, no PyTorch.

    PYTHONPATH=.:bench python3 bench/op_scaling.py w13 --threads 1,4,8,16 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from collections import defaultdict
from collections.abc import Callable

from many_cores import workloads

# the command's names for many_cores' workloads
WORKLOADS = {
    "w9": "W9 3x3",
    "w9-1x1": "W9 1x1",
    "w13": "W13",
    "w14": "W14",
    "w1": "W1",
    "w8": "W8",
}


def op_times(step: Callable[[], object], rounds: int) -> tuple[dict[str, float], dict, float]:
    """ms per step by op type, calls per step by op type, and the whole step's ms."""
    import nestflow as nf

    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    whole = 0.0
    for _ in range(rounds):
        step()  # unprofiled, so each profiled step starts as a plain one would
        nf.profiler.start_profiler("CPU")
        start = time.perf_counter()
        step()
        whole += time.perf_counter() - start
        with contextlib.redirect_stdout(io.StringIO()):
            profile = nf.profiler.stop_profiler()
        for op_type, begin, end, _, _, depth, _ in profile.events:
            if depth == 0:
                totals[op_type] += (end - begin) / 1e6 / rounds
                calls[op_type] += 1
    return totals, {k: v // rounds for k, v in calls.items()}, whole / rounds * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=20)
    args = parser.parse_args()
    import nestflow as nf

    counts = [int(n) for n in args.threads.split(",")]
    step = workloads(nf)[WORKLOADS[args.workload]]()
    by_count, wholes, calls = {}, {}, {}
    for n in counts:
        nf.set_num_threads(n)
        step()
        by_count[n], calls, wholes[n] = op_times(step, args.rounds)
    first, last = counts[0], counts[-1]
    print(
        f"{args.workload}: step ms "
        + ", ".join(f"{wholes[n]:.1f} at {n}" for n in counts)
        + f"; speed-up {wholes[first] / wholes[last]:.2f}x from {first} to {last} threads"
    )
    header = f"{'op type':32} {'calls':>5} " + " ".join(f"{f'ms@{n}':>9}" for n in counts)
    print(header + f" {'speed-up':>8}")
    ordered = sorted(by_count[last], key=lambda op: -by_count[last][op])
    for op in ordered[: args.limit]:
        cells = " ".join(f"{by_count[n].get(op, 0.0):9.2f}" for n in counts)
        gain = by_count[first].get(op, 0.0) / max(by_count[last][op], 1e-9)
        print(f"{op:32} {calls.get(op, 0):5d} {cells} {gain:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
