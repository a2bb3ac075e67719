"""Where a many-core host's threads go: nestflow's issue-29 CPU workloads (W9 3x3 and 1x1,
W13, W14, W1, W8) at several thread counts, each under variants of the pool's and OpenBLAS's
settings, each variant in a process of its own (OpenBLAS reads its settings when it loads).
nestflow alone, no PyTorch: `make gpu-check` has PyTorch's figures at the same counts.

The variants ask why a 16-core host ran nestflow slower at 16 threads than at 8 (the third
H200 run in bench/gpu_runs, when a kernel split in a chunk per thread past its cap): "a chunk
per thread" (the chunk counts follow the whole budget, not at most MAX_CHUNKS), OpenBLAS's
idle workers spinning beside the pool's ("BLAS sleeps": OPENBLAS_THREAD_TIMEOUT=4, which puts
them to sleep at once; "BLAS 1 thread": products outside the pool single-threaded too), or
the pinning ("unpinned": NF_PIN_THREADS=0). "as is" runs first and last: their gap is the
run's noise. (bench/gpu_runs/2026-11-28-h200-many-cores.md ran the script's first version,
whose "as is" had a chunk per thread and "8 chunks" what the pool does now.)

    PYTHONPATH=.:bench python3 bench/many_cores.py --threads 8,12,16 --report many_cores.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent

VARIANTS = {
    "as is": {},
    "a chunk per thread": {"NF_DIAG_CHUNK_PER_THREAD": "1"},
    "BLAS sleeps": {"OPENBLAS_THREAD_TIMEOUT": "4"},
    "BLAS 1 thread": {"NF_DIAG_BLAS_ONE": "1"},
    "unpinned": {"NF_PIN_THREADS": "0"},
    "as is, again": {},
}
# (warm-up steps, timed steps) per workload
STEPS = {
    "W9 3x3": (3, 15),
    "W9 1x1": (3, 15),
    "W13": (2, 4),
    "W14": (3, 15),
    "W1": (5, 40),
    "W8": (5, 30),
    "empty region": (200, 2000),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="8,16")
    parser.add_argument("--report", default="many_cores.md")
    parser.add_argument("--child-timeout-s", type=int, default=90)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    counts = [int(n) for n in args.threads.split(",")]
    if args.child:
        print(json.dumps(measure(counts)))
        return 0
    results: dict[str, dict] = {}
    lines = [f"load average at the start: {os.getloadavg()}; {os.cpu_count()} CPUs"]
    for name, extra in VARIANTS.items():
        env = dict(os.environ, **extra)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), str(ROOT / "bench"), os.environ.get("PYTHONPATH")])
        )
        started, stderr = time.perf_counter(), ""
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--threads", args.threads],
                env=env,
                capture_output=True,
                text=True,
                timeout=args.child_timeout_s,
            )
            stderr = done.stderr
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            lines.append(f"{name}: {time.perf_counter() - started:.0f} s")
        except subprocess.TimeoutExpired:
            lines.append(f"{name}: cut at {args.child_timeout_s} s")
        except (IndexError, json.JSONDecodeError) as exc:
            lines.append(f"{name}: FAILED {type(exc).__name__} {stderr[-500:]}")
        print(lines[-1], file=sys.stderr, flush=True)
    lines.append(f"load average at the end: {os.getloadavg()}")
    table = ["", "ms per step (empty region: us), median", ""]
    header = "| workload | threads | " + " | ".join(results) + " |"
    table += [header, "|" + "---|" * (2 + len(results))]
    for workload in STEPS:
        for n in counts:
            cells = [results[v].get(f"{workload}@{n}") for v in results]
            table.append(
                f"| {workload} | {n} | "
                + " | ".join("–" if c is None else f"{c:.3f}" for c in cells)
                + " |"
            )
    text = "# many_cores\n\n" + "\n".join(lines + table) + "\n"
    Path(args.report).write_text(text)
    print(text)
    return 0


def measure(counts: list[int]) -> dict[str, float]:
    import importlib

    import nestflow as nf

    if os.environ.get("NF_DIAG_CHUNK_PER_THREAD"):  # chunk counts follow the whole budget
        dc = importlib.import_module("nestflow.core.device_context")
        dc._chunk_threads = lambda: dc.device_context().num_threads
    builders = workloads(nf)
    times: dict[str, float] = {}
    for n in counts:
        nf.set_num_threads(n)
        if os.environ.get("NF_DIAG_BLAS_ONE"):
            from threadpoolctl import threadpool_limits

            threadpool_limits(1)
        for name, make in builders.items():
            warm, timed = STEPS[name]
            step = make()
            for _ in range(warm):
                step()
            samples = []
            for _ in range(timed):
                start = time.perf_counter()
                step()
                samples.append(time.perf_counter() - start)
            scale = 1e6 if name == "empty region" else 1e3
            times[f"{name}@{n}"] = median(samples) * scale
            print(f"{name}@{n} {times[f'{name}@{n}']:.3f}", file=sys.stderr, flush=True)
    return times


def workloads(nf) -> dict:
    """Each workload's maker: a function making its nestflow step (a fresh program)."""
    import w1_mlp
    import w8_lenet
    import w9_conv
    import w13_resnet18
    import w14_bn_pool

    def w9(k: int, padding: int):
        x, w, upstream = w9_conv.data(k)
        return lambda: w9_conv.make_nestflow(x, w, upstream, padding)

    def first(made):
        return made[0]

    xs1, ys1 = w1_mlp.batch()
    xs8, ys8 = w8_lenet.batch()
    xs13, ys13 = w13_resnet18.batch()
    x14, up14 = w14_bn_pool.data()
    context = nf.device_context(nf.CPUPlace())
    return {
        "W9 3x3": w9(3, 1),
        "W9 1x1": w9(1, 0),
        "W13": lambda: w13_resnet18.make_nestflow_step(xs13, ys13),
        "W14": lambda: w14_bn_pool.make_nestflow(x14, up14),
        "W1": lambda: first(w1_mlp.make_nestflow_step(xs1, ys1)),
        "W8": lambda: first(w8_lenet.make_nestflow_step(xs8, ys8)),
        "empty region": lambda: lambda: context.parallel_for(64, lambda a, b: None, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
