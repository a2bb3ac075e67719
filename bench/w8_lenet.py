"""W8: one SGD train step of LeNet-5 on a synthetic [64, 1, 28, 28] float32 batch, and the peak
resident memory of training it (W6's measurement: one fresh child process per framework).

LeNet-5: conv 5x5 (6) - relu - max pool 2 - conv 5x5 (16) - relu - max pool 2 - fc 120 (relu) -
fc 84 (relu) - fc 10, softmax cross-entropy, SGD. nestflow: nf.layers conv2d/pool2d/fc +
softmax_with_cross_entropy + mean + optimizer.SGD.minimize, one Executor.run per step fetching the
loss. PyTorch eager: nn.Conv2d/MaxPool2d/Linear, F.cross_entropy, backward, torch.optim.SGD. Both
start from nestflow's initial parameters and see the same batch; their losses are checked to
agree before timing. Timed with one BLAS/OpenMP thread each, as W9: LeNet's convolutions are
too small to gain from a second thread, and on a shared 2-core machine a second thread mostly
measures contention.

Run one peak-RSS child by hand: `python bench/w8_lenet.py --child nestflow`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from timing import error_line, interleaved, main, row, setup_torch, unavailable
from w9_conv import single_threaded

BATCH, CLASSES = 64, 10
LR = 0.05
STEPS = 30  # train steps of a peak-RSS child
FRAMEWORKS = ("torch", "nestflow")

Params = dict[str, np.ndarray]
# name -> shape, in nestflow's layout (conv filters [out, in, kh, kw], fc weights [in, out])
SHAPES = {
    "conv1.w": (6, 1, 5, 5),
    "conv1.b": (6,),
    "conv2.w": (16, 6, 5, 5),
    "conv2.b": (16,),
    "fc1.w": (256, 120),
    "fc1.b": (120,),
    "fc2.w": (120, 84),
    "fc2.b": (84,),
    "fc3.w": (84, 10),
    "fc3.b": (10,),
}


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((BATCH, 1, 28, 28)).astype("float32")
    ys = rng.integers(0, CLASSES, size=(BATCH, 1)).astype("int64")
    return xs, ys


def initial_params(seed: int = 0) -> Params:
    """Scaled normal weights and zero biases, for when nestflow cannot build the model."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in SHAPES.items():
        if name.endswith(".b"):
            params[name] = np.zeros(shape, "float32")
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
            params[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype("float32")
    return params


def make_nestflow_step(xs, ys, place=None) -> tuple[Callable[[], float], Params]:
    """The nestflow train step and its initial parameters (raises if nestflow can't train);
    on `place` (default CPUPlace)."""
    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 1, 28, 28])
        y = nf.data("y", [-1, 1], "int64")
        h = nf.layers.conv2d(x, 6, 5, act="relu", name="conv1")
        h = nf.layers.pool2d(h, 2, pool_stride=2)
        h = nf.layers.conv2d(h, 16, 5, act="relu", name="conv2")
        h = nf.layers.pool2d(h, 2, pool_stride=2)
        h = nf.layers.fc(h, 120, act="relu", name="fc1")
        h = nf.layers.fc(h, 84, act="relu", name="fc2")
        logits = nf.layers.fc(h, CLASSES, name="fc3")
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, y))
        nf.optimizer.SGD(learning_rate=LR).minimize(loss)
    exe = nf.Executor(place or nf.CPUPlace())
    scope = nf.Scope()
    exe.run(startup, scope=scope)
    params = {name: np.array(scope.find_var(name).get(nf.Tensor).numpy()) for name in SHAPES}
    feed = {"x": xs, "y": ys}

    def step() -> float:
        (value,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        return float(value)

    return step, params


def make_torch_step(xs, ys, params: Params, torch, device="cpu") -> Callable[[], float]:
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(256, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, CLASSES),
    )
    layers = {"conv1": model[0], "conv2": model[3], "fc1": model[7], "fc2": model[9]}
    layers["fc3"] = model[11]
    with torch.no_grad():
        for name, layer in layers.items():
            w = params[f"{name}.w"]
            layer.weight.copy_(torch.from_numpy(w if w.ndim == 4 else w.T.copy()))
            layer.bias.copy_(torch.from_numpy(params[f"{name}.b"]))
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    tx, ty = torch.from_numpy(xs).to(device), torch.from_numpy(ys[:, 0]).to(device)
    cross_entropy = torch.nn.functional.cross_entropy

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def child(framework: str, steps: int) -> None:
    """Train `steps` steps of one framework alone, then print this process's peak RSS."""
    from w6_peak_rss import peak_rss_kib

    xs, ys = batch()
    if framework == "nestflow":
        step, _ = make_nestflow_step(xs, ys)
    else:
        step = make_torch_step(xs, ys, initial_params(), setup_torch())
    for _ in range(steps):
        step()
    print(peak_rss_kib())


def peak_mib(framework: str, steps: int) -> float | str:
    """One child's peak RSS in MiB (this script with --child), or why it failed."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__)), "--child", framework, "--steps", str(steps)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return unavailable(RuntimeError(error_line(done.stderr)))
    return int(done.stdout.strip().splitlines()[-1]) / 1024.0


def peak_rss_row(rounds: int, steps: int) -> dict:
    samples: dict[str, list] = {f: [] for f in FRAMEWORKS}
    for _ in range(rounds):
        for framework in FRAMEWORKS:
            samples[framework].append(peak_mib(framework, steps))

    def median(values):
        failed = [v for v in values if isinstance(v, str)]
        return failed[0] if failed else statistics.median(values)

    return row(
        f"peak RSS over {steps} train steps",
        "MiB",
        median(samples["nestflow"]),
        torch=median(samples["torch"]),
        targets=[("torch", 0.5)],
    )


def run(rounds: int = 7, rss_rounds: int = 3, steps: int = STEPS) -> dict:
    torch = setup_torch()
    xs, ys = batch()
    nf_entry = None
    try:
        nf_step, params = make_nestflow_step(xs, ys)
    except Exception as exc:  # a missing layer/op/optimizer: report it, never fake a number
        nf_step, params, nf_entry = None, initial_params(), unavailable(exc)
    cases = {}
    if torch is not None:
        cases["torch"] = make_torch_step(xs, ys, params, torch)
    # Same start, same batch: the first steps must give the same losses (float32 tolerance).
    losses = {name: [fn() for _ in range(3)] for name, fn in cases.items()}
    if nf_step is not None:
        try:
            losses["nestflow"] = [nf_step() for _ in range(3)]
            cases["nestflow"] = nf_step
        except Exception as exc:
            nf_entry = unavailable(exc)
    notes = []
    if len(losses) == 2 and not np.allclose(losses["nestflow"], losses["torch"], rtol=1e-3):
        notes.append(
            f"nestflow losses {losses['nestflow']} differ from PyTorch's {losses['torch']}"
        )
    with single_threaded(torch):
        times = interleaved(cases, rounds=rounds, budget_s=0.15) if cases else {}
    ms = {name: t * 1e3 for name, t in times.items()}
    return {
        "workload": "W8 LeNet-5 train step, [64, 1, 28, 28], SGD, 1 thread",
        "rows": [
            row(
                "train step",
                "ms",
                ms.get("nestflow", nf_entry),
                torch=ms.get("torch", "n/a (torch not installed)"),
                targets=[("torch", 1.0)],
            ),
            peak_rss_row(rss_rounds, steps),
        ],
        "notes": notes,
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
