"""W15: one SGD train step of a Transformer encoder layer, batch 32, T=64, d_model=256, 4 heads,
feed-forward 1024 (relu, post-norm, dropout 0), loss = mean((layer(x) - y)^2), float32, CPU.

nestflow: nf.nets.transformer_encoder_layer + square/mean + optimizer.SGD.minimize, one
Executor.run per step fetching the loss. PyTorch: nn.TransformerEncoderLayer(batch_first=True),
the same loss, backward, torch.optim.SGD. PyTorch starts from nestflow's initial parameters
(weights transposed into its layout) and both see the same batch; their first losses are
checked to agree before timing. Timed at 1 and at 2 threads (NumPy's BLAS through
nf.set_num_threads / threadpoolctl, torch.set_num_threads), the contenders interleaved.

Peak RSS: each framework trains RSS_STEPS steps alone in a fresh child process (this script
with --child), which prints its peak resident set (VmHWM, bench/w6_peak_rss.py); the row holds
the median over interleaved rounds (target: nestflow <= 0.5x PyTorch's).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from timing import error_line, interleaved, main, row, setup_torch, unavailable

BATCH, STEPS, D_MODEL, HEADS, D_FF = 32, 64, 256, 4, 1024
LR = 0.01
RSS_STEPS = 10
FRAMEWORKS = ("torch", "nestflow")

Params = dict[str, np.ndarray]


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((BATCH, STEPS, D_MODEL)).astype("float32")
    ys = rng.standard_normal((BATCH, STEPS, D_MODEL)).astype("float32")
    return xs, ys


def make_nestflow_step(xs, ys) -> tuple[Callable[[], float], Params]:
    """The nestflow train step and its initial parameters (name -> array)."""
    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, STEPS, D_MODEL])
        y = nf.data("y", [-1, STEPS, D_MODEL])
        out = nf.nets.transformer_encoder_layer(
            x, HEADS, D_FF, dropout=0.0, activation="relu", name="enc"
        )
        loss = nf.layers.mean(nf.layers.square(out - y))
        nf.optimizer.SGD(learning_rate=LR).minimize(loss)
    exe, scope = nf.Executor(nf.CPUPlace()), nf.Scope()
    exe.run(startup, scope=scope)
    params = {
        p.name: np.array(scope.find_var(p.name).get(nf.Tensor).numpy())
        for p in main.all_parameters()
    }
    feed = {"x": xs, "y": ys}

    def step() -> float:
        (value,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        return float(value)

    return step, params


def make_torch_step(xs, ys, params: Params | None, torch) -> Callable[[], float]:
    layer = torch.nn.TransformerEncoderLayer(
        D_MODEL, HEADS, D_FF, dropout=0.0, activation="relu", batch_first=True
    )
    if params is not None:
        with torch.no_grad():
            for name, value in layer.named_parameters():
                ours = _ours(name)
                source = params[ours].T if ours.endswith(".w") and value.ndim == 2 else params[ours]
                value.copy_(torch.from_numpy(np.ascontiguousarray(source)))
    opt = torch.optim.SGD(layer.parameters(), lr=LR)
    tx, ty = torch.from_numpy(xs), torch.from_numpy(ys)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = ((layer(tx) - ty) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def _ours(torch_name: str) -> str:
    """nestflow's name for a parameter of nn.TransformerEncoderLayer."""
    module, kind = torch_name.rsplit(".", 1) if "in_proj" not in torch_name else (None, None)
    if module is None:
        part = "w" if torch_name.endswith("weight") else "b"
        return f"enc.self_attn.in_proj.{part}"
    return f"enc.{module}.{'w' if kind == 'weight' else 'b'}"


@contextmanager
def _threads(n: int, torch):
    """n threads for nestflow (nf.set_num_threads), NumPy's BLAS and PyTorch inside the block;
    the previous settings afterwards (run_all times other workloads in this process)."""
    from threadpoolctl import threadpool_limits

    import nestflow as nf

    before = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=n):
        nf.set_num_threads(n)
        if torch is not None:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(before)


def child(framework: str, steps: int) -> None:
    """Train `steps` steps of one framework alone, then print this process's peak RSS (KiB)."""
    from w6_peak_rss import peak_rss_kib

    xs, ys = batch()
    if framework == "nestflow":
        step, _ = make_nestflow_step(xs, ys)
    else:
        step = make_torch_step(xs, ys, None, setup_torch())
    for _ in range(steps):
        step()
    print(peak_rss_kib())


def peak_mib(framework: str, steps: int) -> float | str:
    """One child's peak RSS in MiB, or why it failed."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__)), "--child", framework, "--steps", str(steps)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return unavailable(RuntimeError(error_line(done.stderr)))
    return int(done.stdout.strip().splitlines()[-1]) / 1024.0


def peak_rss_row(rounds: int, steps: int = RSS_STEPS) -> dict:
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


def run(rounds: int = 5, rss_rounds: int = 3) -> dict:
    torch = setup_torch()
    xs, ys = batch()
    nf_entry, params = None, None
    try:
        nf_step, params = make_nestflow_step(xs, ys)
    except Exception as exc:  # a missing layer/op: report it, never fake a number
        nf_step, nf_entry = None, unavailable(exc)
    cases: dict[str, Callable[[], float]] = {}
    if nf_step is not None:
        cases["nestflow"] = nf_step
    if torch is not None:
        cases["torch"] = make_torch_step(xs, ys, params, torch)
    notes = []
    losses = {name: [fn() for _ in range(2)] for name, fn in cases.items()}
    if "nestflow" in losses and "torch" in losses:
        if not np.allclose(losses["nestflow"], losses["torch"], rtol=1e-3, atol=1e-4):
            notes.append(f"losses differ: nestflow {losses['nestflow']}, torch {losses['torch']}")
    rows = []
    for n in (1, 2):
        with _threads(n, torch):
            times = interleaved(cases, rounds=rounds, budget_s=0.5)
        ms = {name: t * 1e3 for name, t in times.items()}
        rows.append(
            row(
                f"train step, {n} thread{'s' if n > 1 else ''}",
                "ms",
                ms.get("nestflow", nf_entry),
                torch=ms.get("torch", "n/a (torch not installed)"),
                targets=[("torch", 1.2)],
            )
        )
    rows.append(peak_rss_row(rss_rounds))
    return {
        "workload": "W15 Transformer encoder layer B=32 T=64 d=256 4 heads ff 1024, SGD",
        "rows": rows,
        "notes": notes,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=FRAMEWORKS)
    parser.add_argument("--steps", type=int, default=RSS_STEPS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
    else:
        main(run)
