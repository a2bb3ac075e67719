"""The cost of Model.fit's NaN guard (terminate_on_nan) on W1's MLP (784-512-512-10, relu,
batch 128, SGD): one process, one BLAS thread, one Model fitting one epoch of STEPS batches
with the guard on and off in turn (ABBA order each round, so a drift of the machine's speed
weighs on both alike); prints each round's seconds per step and the medians.

    .venv/bin/python bench/w1_nan_guard.py [rounds]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import numpy as np
from w1_mlp import BATCH, LR, SIZES

import nestflow as nf

STEPS = 16


def mlp(x):
    h = nf.layers.fc(x, SIZES[1], act="relu", name="fc1")
    h = nf.layers.fc(h, SIZES[2], act="relu", name="fc2")
    return nf.layers.fc(h, SIZES[3], name="fc3")


def run(rounds: int) -> None:
    nf.set_num_threads(1)
    model = nf.Model(
        mlp,
        inputs=nf.InputSpec([None, SIZES[0]], "float32", "x"),
        labels=nf.InputSpec([None, 1], "int64", "y"),
    )
    model.prepare(nf.optimizer.SGD(LR), loss=nf.layers.softmax_with_cross_entropy)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((STEPS * BATCH, SIZES[0])).astype("float32")
    ys = rng.integers(0, SIZES[-1], (STEPS * BATCH, 1))

    def per_step(guard: bool) -> float:
        gc.collect()
        start = time.perf_counter()
        model.fit((xs, ys), batch_size=BATCH, shuffle=False, verbose=0, terminate_on_nan=guard)
        return (time.perf_counter() - start) / STEPS

    for guard in (True, False):  # warm-up: plans compiled, memory touched
        per_step(guard)
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        order = (True, False, False, True) if r % 2 == 0 else (False, True, True, False)
        seen = {True: [], False: []}
        for guard in order:
            seen[guard].append(per_step(guard))
        for guard in (True, False):
            times[guard].append(statistics.mean(seen[guard]))
        on, off = times[True][-1], times[False][-1]
        print(
            f"round {r + 1}: guard on {on * 1e3:.3f} ms/step, off {off * 1e3:.3f} ms/step, "
            f"on/off {on / off:.4f}"
        )
    on, off = statistics.median(times[True]), statistics.median(times[False])
    ratios = [a / b for a, b in zip(times[True], times[False])]
    print(
        f"median over {rounds} rounds of {STEPS} steps x 4 fits: guard on {on * 1e3:.3f} "
        f"ms/step, off {off * 1e3:.3f} ms/step; on/off {on / off:.4f} (median of the "
        f"rounds' ratios {statistics.median(ratios):.4f}, range {min(ratios):.4f}-"
        f"{max(ratios):.4f})"
    )


if __name__ == "__main__":
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
