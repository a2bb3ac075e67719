"""W10: one SGD train step of an LSTM, T=32, batch 32, 64 -> 128, 1 layer, float32, loss = mean
of all outputs, one BLAS/OpenMP thread for everyone (as W8/W9).

nestflow: nf.layers.lstm (an nf.layers.rnn of an LSTMCell: the input projection of all steps one
GEMM, per step one product and one lstm_unit op, the recurrent weight's gradient one product
over all steps) + mean + optimizer.SGD. PyTorch: nn.LSTM (its fused C++ loop) and a Python loop
of nn.LSTMCell steps, each with autograd and torch.optim.SGD. All three start from the same
weights (nestflow's initial parameters, copied by their PyTorch names) and batch; their losses
are checked to agree before timing. Target: nestflow <= 1.0x the LSTMCell loop; the nn.LSTM
ratio is reported too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable
from w9_conv import single_threaded

T, BATCH, N_IN, N_HID = 32, 32, 64, 128
LR = 1.0  # large enough that a wrong gradient shows in the checked losses
TORCH_NAMES = {"w_ih_l0": "weight_ih", "w_hh_l0": "weight_hh", "b_ih_l0": "bias_ih",
               "b_hh_l0": "bias_hh"}  # fmt: skip


def batch(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, T, N_IN)).astype("float32")


def make_nestflow_step(
    xs: np.ndarray, place=None
) -> tuple[Callable[[], float], dict[str, np.ndarray]]:
    """The train step (returns the loss) and the initial parameters by PyTorch-style key, on
    `place` (default CPUPlace)."""
    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, T, N_IN])
        out, _h, _c = nf.layers.lstm(x, N_HID, name="lstm")
        loss = nf.layers.mean(out)
        nf.optimizer.SGD(learning_rate=LR).minimize(loss)
    exe, scope = nf.Executor(place or nf.CPUPlace()), nf.Scope()
    nf.seed(0)
    exe.run(startup, scope=scope)
    params = {k: scope.find_var(f"lstm.{k}").get(nf.Tensor).numpy().copy() for k in TORCH_NAMES}
    feed = {"x": xs}

    def step() -> float:
        (value,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        return float(value)

    return step, params


def make_torch_lstm_step(xs, params, torch, device="cpu") -> Callable[[], float]:
    module = torch.nn.LSTM(N_IN, N_HID, batch_first=True)
    with torch.no_grad():
        for key, name in TORCH_NAMES.items():
            getattr(module, f"{name}_l0").copy_(torch.from_numpy(params[key]))
    module = module.to(device)
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    tx = torch.from_numpy(xs).to(device)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        out, _ = module(tx)
        loss = out.mean()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def make_torch_cell_step(xs, params, torch, device="cpu") -> Callable[[], float]:
    cell = torch.nn.LSTMCell(N_IN, N_HID)
    with torch.no_grad():
        for key, name in TORCH_NAMES.items():
            getattr(cell, name).copy_(torch.from_numpy(params[key]))
    cell = cell.to(device)
    opt = torch.optim.SGD(cell.parameters(), lr=LR)
    tx = torch.from_numpy(xs).to(device)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        h = c = torch.zeros(BATCH, N_HID, device=device)
        outs = []
        for t in range(T):
            h, c = cell(tx[:, t], (h, c))
            outs.append(h)
        loss = torch.stack(outs, 1).mean()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    xs = batch()
    notes: list[str] = []
    cases: dict[str, Callable[[], float]] = {}
    nf_entry = None
    with single_threaded(torch):
        try:
            nf_step, params = make_nestflow_step(xs)
            cases["nestflow"] = nf_step
        except Exception as exc:  # never fake a figure: say why there is none
            nf_entry, params = unavailable(exc), None
        if torch is not None and params is not None:
            cases["lstm"] = make_torch_lstm_step(xs, params, torch)
            cases["cell"] = make_torch_cell_step(xs, params, torch)
        losses = {name: [fn() for _ in range(3)] for name, fn in cases.items()}
        for name, values in losses.items():
            if not np.allclose(values, losses.get("cell", values), rtol=1e-4, atol=1e-6):
                notes.append(f"{name} losses {values} differ from the LSTMCell loop's")
        times = interleaved(cases, rounds=rounds, budget_s=0.2) if cases else {}
    ms = {name: t * 1e3 for name, t in times.items()}
    missing = "n/a (torch not installed)" if torch is None else "n/a (no nestflow weights)"
    return {
        "workload": "W10 LSTM T=32, batch 32, 64->128, 1 layer, train step, 1 thread",
        "rows": [
            row(
                "train step vs torch LSTMCell loop",
                "ms",
                ms.get("nestflow", nf_entry),
                torch=ms.get("cell", missing),
                targets=[("torch", 1.0)],
            ),
            row(
                "train step vs torch nn.LSTM (no target)",
                "ms",
                ms.get("nestflow", nf_entry),
                torch=ms.get("lstm", missing),
            ),
        ],
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
