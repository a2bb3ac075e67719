"""W18: what mixed precision costs on the CPU: one training step of the digits MLP (64-128-10,
batch 32, Adam, cross entropy) in float32, and with nf.amp.decorate in float16 and bfloat16,
against PyTorch's step in float32 and under torch.autocast("cpu", dtype) in the same process.

NumPy has no float16 or bfloat16 BLAS: a low-precision matmul converts its operands, and the
elementwise ops run through slow conversion loops; on a GPU the same program runs the fast
path. Measured at 1 and 2 threads (nestflow, BLAS and PyTorch alike); the machine's 2 cores
are shared, so the figures are noisy: medians of interleaved rounds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import interleaved, main, row, setup_torch
from w16_word2vec import _threads

import nestflow as nf
from nestflow.cli.demo_mlp import mlp

BATCH = 32


def make_nestflow_step(dtype: str | None, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    main_p, startup = nf.Program(), nf.Program()
    with nf.program_guard(main_p, startup), nf.unique_name.guard():
        xs = nf.data("x", [-1, 64])
        label = nf.data("label", [-1, 1], dtype="int64")
        loss = nf.layers.mean(nf.layers.cross_entropy(mlp(xs), label))
        opt = nf.optimizer.Adam(1e-3)
        if dtype is not None:
            opt = nf.amp.decorate(opt, dtype=dtype)
        opt.minimize(loss)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    feed = {"x": x, "label": y}
    return lambda: exe.run(main_p, feed, [], scope)


def make_torch_step(dtype: str | None, x, y, torch) -> Callable[[], None]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y.ravel())
    low = getattr(torch, dtype) if dtype else None

    def step() -> None:
        opt.zero_grad()
        if low is None:
            loss = torch.nn.functional.cross_entropy(model(tx), ty)
        else:
            with torch.autocast("cpu", dtype=low):
                loss = torch.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()

    step()
    return step


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 64)).astype("float32")
    y = rng.integers(0, 10, (BATCH, 1)).astype("int64")
    dtypes = {"float32": None, "float16": "float16", "bfloat16": "bfloat16"}
    cases: dict[str, Callable[[], None]] = {}
    notes = []
    for name, dtype in dtypes.items():
        cases[f"nestflow {name}"] = make_nestflow_step(dtype, x, y)
        if torch is not None:
            try:
                cases[f"torch {name}"] = make_torch_step(dtype, x, y, torch)
            except Exception as exc:  # an autocast dtype this torch build lacks
                notes.append(f"torch {name}: {type(exc).__name__}: {exc}")
    rows = []
    for n in (1, 2):
        with _threads(n, torch):
            times = interleaved(cases, rounds=rounds, budget_s=0.2)
        ms = {name: t * 1e3 for name, t in times.items()}
        base = ms["nestflow float32"]
        for name in dtypes:
            rows.append(
                row(
                    f"{name} step, {n} thread{'s' if n > 1 else ''}",
                    "ms",
                    ms[f"nestflow {name}"],
                    torch=ms.get(f"torch {name}", "n/a"),
                )
            )
            if name != "float32":
                notes.append(
                    f"{n} thread(s): nestflow {name} / float32 = {ms[f'nestflow {name}'] / base:.2f}x"
                )
    return {
        "workload": "W18 mixed precision on the CPU: digits MLP 64-128-10 step, batch 32, Adam",
        "rows": rows,
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
