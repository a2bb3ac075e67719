"""Issue 29's scaling rows for the existing workloads: W1 (MLP), W8 (LeNet-5) and W10 (LSTM)
train steps at 1 and at 2 threads against PyTorch at the same count (nf.set_num_threads /
torch.set_num_threads), with each side's 2-thread speed-up. The steps are W1's, W8's and W10's
own (their modules build them; W10 against the LSTMCell loop); W9, W13 and W14 report their
own thread rows. Each workload's four contenders (nestflow and PyTorch at 1 and at 2 threads)
run in interleaved rounds; the notes give the machine's load.
"""

from __future__ import annotations

import w1_mlp
import w8_lenet
import w10_lstm
from timing import load_note, main, scaling_rows, setup_torch

# issue 29's ratio targets by thread count
TARGETS = {"W1": {1: 1.0, 2: 1.0}, "W8": {2: 1.0}, "W10": {1: 1.0, 2: 1.0}}


def _makers(workload: str, torch) -> dict:
    if workload == "W1":
        xs, ys = w1_mlp.batch()
        params = w1_mlp.initial_params()
        made = {"nestflow": lambda: w1_mlp.make_nestflow_step(xs, ys)[0]}
        if torch is not None:
            made["torch"] = lambda: w1_mlp.make_torch_step(xs, ys, params, torch)
        return made
    if workload == "W8":
        xs, ys = w8_lenet.batch()
        params = w8_lenet.initial_params()
        made = {"nestflow": lambda: w8_lenet.make_nestflow_step(xs, ys)[0]}
        if torch is not None:
            made["torch"] = lambda: w8_lenet.make_torch_step(xs, ys, params, torch)
        return made
    xs = w10_lstm.batch()
    made = {"nestflow": lambda: w10_lstm.make_nestflow_step(xs)[0]}
    if torch is not None:

        def cell():
            _, params = w10_lstm.make_nestflow_step(xs)
            return w10_lstm.make_torch_cell_step(xs, params, torch)

        made["torch"] = cell
    return made


METRICS = {
    "W1": "W1 MLP 784-512-512-10 train step",
    "W8": "W8 LeNet-5 train step",
    "W10": "W10 LSTM train step vs torch LSTMCell loop",
}


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    rows, notes = [], [load_note() + " at the start"]
    for workload, metric in METRICS.items():
        found, _ = scaling_rows(
            metric, _makers(workload, torch), torch, rounds, 0.2, TARGETS[workload]
        )
        rows.extend(found)
    notes.append(load_note() + " at the end")
    return {"workload": "W1/W8/W10 at 1 and 2 threads (issue 29)", "rows": rows, "notes": notes}


if __name__ == "__main__":
    main(run)
