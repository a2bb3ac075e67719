"""W7: memory over 1,000 training steps of the RNN example (`nestflow demo --model rnn`).

Issue 4's acceptance: after 1,000 training steps the number of live scopes and the process's
RSS do not grow. A fresh child process builds the demo's model (nf.rnn with per-row lengths,
Adam), trains on its synthetic data batch after batch and reads, after step 100 (warm: plans
compiled, allocator pools filled) and after step 1,000, its current RSS (VmRSS) and
nestflow's live scope count. The rows report the growth between the two; the targets allow
1 MiB for allocator noise and no scope at all.

Run the child by hand: `python bench/w7_rnn_memory.py --child`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from timing import error_line, main, row, unavailable

STEPS, WARM = 1000, 100


def current_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no /proc/self/status: RSS is read on Linux only")


def child(steps: int) -> None:
    import numpy as np

    import nestflow as nf
    from nestflow.cli import demo_rnn
    from nestflow.core.scope import live_scope_count

    model = demo_rnn.build_model()
    data = demo_rnn.make_sequences(demo_rnn.TRAIN_SIZE, np.random.default_rng(0))
    exe, scope = nf.Executor(), nf.Scope()
    nf.seed(0)
    exe.run(model.startup, scope=scope)
    order = np.random.default_rng(1).permutation(len(data.lengths))
    batches = [
        order[i : i + demo_rnn.BATCH_SIZE] for i in range(0, len(order), demo_rnn.BATCH_SIZE)
    ]
    seen = {}
    for step in range(1, steps + 1):
        rows = batches[step % len(batches)]
        exe.run(model.main, feed=demo_rnn._feed(data, rows), fetch_list=[model.loss], scope=scope)
        if step in (WARM, steps):
            seen[step] = {"rss_mib": current_rss_mib(), "scopes": live_scope_count()}
    print(json.dumps(seen))


def run(steps: int = STEPS) -> dict:
    done = subprocess.run(
        [sys.executable, str(Path(__file__)), "--child", "--steps", str(steps)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        failed = unavailable(RuntimeError(error_line(done.stderr)))
        rss_growth = scope_growth = rss_warm = failed
    else:
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        warm, last = seen[str(WARM)], seen[str(steps)]
        rss_warm = warm["rss_mib"]
        rss_growth = last["rss_mib"] - warm["rss_mib"]
        scope_growth = float(last["scopes"] - warm["scopes"])
    return {
        "workload": "W7 RNN example, 1000 train steps",
        "rows": [
            row(f"RSS after step {WARM}", "MiB", rss_warm),
            row(f"RSS growth, step {WARM} to {steps}", "MiB", rss_growth, targets=[("abs", 1)]),
            row(
                f"live scopes growth, step {WARM} to {steps}",
                "scopes",
                scope_growth,
                targets=[("abs", 0)],
            ),
        ],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    if args.child:
        child(args.steps)
    else:
        main(lambda: run(steps=args.steps))
