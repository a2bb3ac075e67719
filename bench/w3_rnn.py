"""W3: one SGD train step of a tanh RNN, T=32, batch 32, 64 -> 128, loss = mean of all outputs.

h_t = tanh(x_t @ Wx + h_{t-1} @ Wh), h_0 = 0. nestflow: the RNN layer (nf.rnn(): step_input,
memory, update_memory, output) with backward through time and optimizer.SGD. PyTorch: a Python
loop over time steps, autograd, torch.optim.SGD. NumPy by hand: the loop forward and the
backward through time written out. All start from the same weights and batch; their losses
are checked to agree before timing. One BLAS/OpenMP thread for everyone (as W8-W11): on the
shared 2-core machine a second thread mostly measures the other work.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable
from w9_conv import single_threaded

T, BATCH, N_IN, N_HID = 32, 32, 64, 128
LR = 1.0  # large enough that a wrong gradient shows in the checked losses


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((BATCH, T, N_IN)).astype("float32")
    wx = (rng.standard_normal((N_IN, N_HID)) / np.sqrt(N_IN)).astype("float32")
    wh = (rng.standard_normal((N_HID, N_HID)) / np.sqrt(N_HID)).astype("float32")
    return xs, wx, wh


def make_nestflow_step(xs, wx, wh, train: bool = True, place=None) -> Callable[[], object]:
    """The train step (returns the loss), or with train=False the forward alone (returns the
    stacked outputs); on `place` (default CPUPlace)."""
    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, T, N_IN])
        w_x = nf.layers.create_parameter([N_IN, N_HID], "float32", name="rnn.wx")
        w_h = nf.layers.create_parameter([N_HID, N_HID], "float32", name="rnn.wh")
        h0 = nf.layers.fill_constant([BATCH, N_HID], "float32", 0.0)
        rnn = nf.rnn()
        with rnn.step():
            x_t = rnn.step_input(x)
            h = rnn.memory(init=h0)
            h_prev = rnn.previous_memory(h)
            act = nf.layers.tanh(nf.layers.matmul(x_t, w_x) + nf.layers.matmul(h_prev, w_h))
            rnn.update_memory(h, act)
            rnn.output(act)
        out = rnn()
        out = out[0] if isinstance(out, list | tuple) else out
        if train:
            loss = nf.layers.mean(out)
            nf.optimizer.SGD(learning_rate=LR).minimize(loss)
    exe = nf.Executor(place or nf.CPUPlace())
    scope = nf.Scope()
    exe.run(startup, scope=scope)
    for name, value in (("rnn.wx", wx), ("rnn.wh", wh)):
        scope.find_var(name).get(nf.Tensor).set(value.copy())
    feed = {"x": xs}
    if not train:
        return lambda: exe.run(main, feed=feed, fetch_list=[out], scope=scope)[0]

    def step() -> float:
        (value,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        return float(value)

    return step


def make_numpy_forward(xs, wx, wh) -> Callable[[], np.ndarray]:
    x_flat = np.ascontiguousarray(xs.transpose(1, 0, 2)).reshape(T * BATCH, N_IN)

    def forward() -> np.ndarray:
        xw = (x_flat @ wx).reshape(T, BATCH, N_HID)
        out = np.empty((BATCH, T, N_HID), "float32")
        h = np.zeros((BATCH, N_HID), "float32")
        for t in range(T):
            h = out[:, t] = np.tanh(xw[t] + h @ wh)
        return out

    return forward


def make_torch_forward(xs, wx, wh, torch) -> Callable[[], np.ndarray]:
    w_x, w_h, tx = torch.from_numpy(wx), torch.from_numpy(wh), torch.from_numpy(xs)

    def forward():
        with torch.no_grad():
            h = torch.zeros(BATCH, N_HID)
            outs = []
            for t in range(T):
                h = torch.tanh(tx[:, t] @ w_x + h @ w_h)
                outs.append(h)
            return torch.stack(outs, 1)

    return forward


def forward_row(xs, wx, wh, torch, rounds: int, notes: list[str]) -> dict:
    """The forward pass alone (no gradient), to tell forward from backward costs apart."""
    cases = {"numpy": make_numpy_forward(xs, wx, wh)}
    if torch is not None:
        cases["torch"] = make_torch_forward(xs, wx, wh, torch)
    outputs = {name: np.asarray(fn()) for name, fn in cases.items()}
    nf_entry = None
    try:
        nf_forward = make_nestflow_step(xs, wx, wh, train=False)
        outputs["nestflow"] = np.asarray(nf_forward())
        cases["nestflow"] = nf_forward
    except Exception as exc:
        nf_entry = unavailable(exc)
    for name, value in outputs.items():
        if value.shape != outputs["numpy"].shape or not np.allclose(
            value, outputs["numpy"], rtol=1e-4, atol=1e-5
        ):
            notes.append(f"{name} forward output differs from NumPy's")
    times = interleaved(cases, rounds=rounds, budget_s=0.1)
    ms = {name: t * 1e3 for name, t in times.items()}
    return row(
        "forward only (no target; for the profile)",
        "ms",
        ms.get("nestflow", nf_entry),
        torch=ms.get("torch", "n/a (torch not installed)"),
        numpy=ms["numpy"],
    )


def make_numpy_step(xs, wx, wh) -> Callable[[], float]:
    wx, wh = wx.copy(), wh.copy()
    x_tm = np.ascontiguousarray(xs.transpose(1, 0, 2))  # [T, B, in]
    x_flat = x_tm.reshape(T * BATCH, N_IN)
    grad_out = np.float32(1.0 / (T * BATCH * N_HID))

    def step() -> float:
        hs = np.empty((T + 1, BATCH, N_HID), "float32")
        hs[0] = 0
        xw = (x_flat @ wx).reshape(T, BATCH, N_HID)  # all input products in one GEMM
        for t in range(T):
            hs[t + 1] = np.tanh(xw[t] + hs[t] @ wh)
        loss = hs[1:].mean()
        dz = np.empty((T, BATCH, N_HID), "float32")
        dh = np.zeros((BATCH, N_HID), "float32")
        for t in range(T - 1, -1, -1):
            dh += grad_out
            dz[t] = dh * (1 - hs[t + 1] ** 2)
            dh = dz[t] @ wh.T
        dz_flat = dz.reshape(T * BATCH, N_HID)
        gwx = x_flat.T @ dz_flat
        gwh = hs[:-1].reshape(T * BATCH, N_HID).T @ dz_flat
        wx[...] -= LR * gwx
        wh[...] -= LR * gwh
        return float(loss)

    return step


def make_torch_step(xs, wx, wh, torch, device="cpu") -> Callable[[], float]:
    w_x = torch.nn.Parameter(torch.from_numpy(wx.copy()).to(device))
    w_h = torch.nn.Parameter(torch.from_numpy(wh.copy()).to(device))
    opt = torch.optim.SGD([w_x, w_h], lr=LR)
    tx = torch.from_numpy(xs).to(device)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        h = torch.zeros(BATCH, N_HID, device=device)
        outs = []
        for t in range(T):
            h = torch.tanh(tx[:, t] @ w_x + h @ w_h)
            outs.append(h)
        loss = torch.stack(outs, 1).mean()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def blas_state_note() -> str:
    """Which of OpenBLAS's two speeds this process's weight-gradient GEMMs run at. A process
    whose GEMMs have all been small-to-medium runs X^T @ dOut over 1,024 rows about 2x slower
    in one call than in pieces of 128 rows; once the process has run a large GEMM (make bench
    runs W1 first), one call is about 10% faster than pieces. The NumPy-by-hand step makes two
    such calls; nestflow sums in pieces (nestflow/ops/gemm.py), so the ratio moves with it."""
    import time

    from nestflow.ops.gemm import matmul_tn

    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((2, T * BATCH, N_HID), dtype=np.float32)

    def best(fn) -> float:
        times = []
        for _ in range(15):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times) * 1e3

    one, pieces = best(lambda: x.T @ g), best(lambda: matmul_tn(x, g))
    return (
        f"OpenBLAS state: [{T * BATCH}, {N_HID}]^T @ [{T * BATCH}, {N_HID}] took {one:.2f} ms "
        f"in one call (the NumPy-by-hand step's weight gradients) and {pieces:.2f} ms in pieces "
        "of 128 rows (nestflow's): about 2x apart in a process that has run no large GEMM yet, "
        "about 10% the other way once it has (make bench runs W1 first)"
    )


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    with single_threaded(torch):
        return _run(torch, rounds)


def _run(torch, rounds: int) -> dict:
    xs, wx, wh = data()
    cases = {"numpy": make_numpy_step(xs, wx, wh)}
    if torch is not None:
        cases["torch"] = make_torch_step(xs, wx, wh, torch)
    losses = {name: [fn() for _ in range(3)] for name, fn in cases.items()}
    nf_entry = None
    try:
        nf_step = make_nestflow_step(xs, wx, wh)
        losses["nestflow"] = [nf_step() for _ in range(3)]
        cases["nestflow"] = nf_step
    except Exception as exc:  # RNN layer or its backward not there yet: say so, never fake
        nf_entry = unavailable(exc)
    notes = []
    for name, values in losses.items():
        if not np.allclose(values, losses["numpy"], rtol=1e-3, atol=1e-6):
            notes.append(f"{name} losses {values} differ from NumPy's {losses['numpy']}")
    times = interleaved(cases, rounds=rounds, budget_s=0.15)
    ms = {name: t * 1e3 for name, t in times.items()}
    notes.append(blas_state_note())
    return {
        "workload": "W3 tanh RNN T=32, batch 32, 64->128, train step, 1 thread",
        "rows": [
            row(
                "train step",
                "ms",
                ms.get("nestflow", nf_entry),
                torch=ms.get("torch", "n/a (torch not installed)"),
                numpy=ms["numpy"],
                targets=[("torch", 1.0), ("numpy", 1.3)],
            ),
            forward_row(xs, wx, wh, torch, rounds, notes),
        ],
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
