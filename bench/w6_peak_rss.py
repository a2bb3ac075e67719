"""W6: peak resident memory while training W1, one fresh child process per framework.

Each child imports only its own framework, builds the W1 model, runs STEPS train steps and
prints its peak RSS in KiB. Children are interleaved (numpy, torch, nestflow, numpy, ...) and the
median per framework is reported.

The peak is VmHWM from /proc/self/status where it exists, and resource.getrusage(RUSAGE_SELF)
.ru_maxrss elsewhere: on Linux ru_maxrss survives execve, and subprocess spawns with vfork, so a
child of a big parent (run_all has torch loaded) reports the *parent's* peak (measured: a bare
`python -c` child of a torch-importing parent says 218 MiB by ru_maxrss, 11 MiB by VmHWM).

Run one child by hand: `python bench/w6_peak_rss.py --child nestflow`.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from timing import error_line, main, row, unavailable

STEPS = 30
FRAMEWORKS = ("numpy", "torch", "nestflow")


def child(framework: str, steps: int) -> None:
    import w1_mlp

    xs, ys = w1_mlp.batch()
    if framework == "nestflow":
        step, _ = w1_mlp.make_nestflow_step(xs, ys)
    elif framework == "torch":
        from timing import setup_torch

        step = w1_mlp.make_torch_step(xs, ys, w1_mlp.initial_params(), setup_torch())
    else:
        step = w1_mlp.make_numpy_step(xs, ys, w1_mlp.initial_params())
    for _ in range(steps):
        step()
    print(peak_rss_kib())


def peak_rss_kib() -> int:
    """This process's peak RSS since its execve, in KiB."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_mib(framework: str, steps: int) -> float | str:
    done = subprocess.run(
        [sys.executable, str(Path(__file__)), "--child", framework, "--steps", str(steps)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return unavailable(RuntimeError(error_line(done.stderr)))
    return int(done.stdout.strip().splitlines()[-1]) / 1024.0


def run(rounds: int = 3, steps: int = STEPS) -> dict:
    samples: dict[str, list] = {f: [] for f in FRAMEWORKS}
    for _ in range(rounds):
        for framework in FRAMEWORKS:
            samples[framework].append(peak_mib(framework, steps))

    def median(values):
        failed = [v for v in values if isinstance(v, str)]
        return failed[0] if failed else statistics.median(values)

    got = {f: median(v) for f, v in samples.items()}
    return {
        "workload": "W6 peak RSS of W1 training",
        "rows": [
            row(
                f"peak RSS over {steps} steps",
                "MiB",
                got["nestflow"],
                torch=got["torch"],
                numpy=got["numpy"],
                targets=[("torch", 0.5)],
            )
        ],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=FRAMEWORKS)
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
    else:
        main(lambda: run(steps=args.steps))
