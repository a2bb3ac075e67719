"""W17: one WGAN-GP critic step (issue 31): an MLP critic 2-512-512-512-1 (relu), batch 256,
loss D(fake) - D(real) + 10 * (||dD/dx(x_hat)|| - 1)^2, Adam.

nestflow: nf.gradients for the penalty's gradient, Adam.minimize differentiating it again, one
Executor.run per step. PyTorch: torch.autograd.grad(create_graph=True), backward, torch.optim.Adam.
Both start from nestflow's initial parameters and see the same batch; their first losses are
checked to agree before timing. Measured at 1 and 2 threads (nestflow, BLAS and PyTorch alike);
the machine's 2 cores are shared, so the figures are noisy: medians of interleaved rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable

SIZES = (2, 512, 512, 512, 1)
BATCH = 256
LAMBDA = 10.0
LR = 1e-4


def batch(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "real": rng.standard_normal((BATCH, 2)).astype("float32"),
        "fake": (rng.standard_normal((BATCH, 2)) + 2).astype("float32"),
        "alpha": rng.uniform(size=(BATCH, 1)).astype("float32"),
    }


@contextmanager
def _threads(n: int, torch):
    """n threads for nestflow, NumPy's BLAS and PyTorch inside the block."""
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


def make_nestflow_step(data) -> tuple[Callable[[], float], dict[str, np.ndarray]]:
    import nestflow as nf

    L = nf.layers

    def critic(x):
        for i in range(len(SIZES) - 1):
            last = i == len(SIZES) - 2
            x = L.fc(
                x,
                SIZES[i + 1],
                act=None if last else "relu",
                param_attr=nf.ParamAttr(f"d{i}.w"),
                bias_attr=nf.ParamAttr(f"d{i}.b"),
            )
        return x

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        real, fake = nf.data("real", [-1, 2]), nf.data("fake", [-1, 2])
        alpha = nf.data("alpha", [-1, 1])
        x_hat = real * alpha + fake * (1.0 - alpha)
        x_hat.stop_gradient = False
        (grad,) = nf.gradients(critic(x_hat), x_hat)
        norm = L.sqrt(L.reduce_sum(L.square(grad), dim=[1]))
        penalty = L.reduce_mean(L.square(norm - 1.0))
        loss = L.mean(critic(fake)) - L.mean(critic(real)) + LAMBDA * penalty
        nf.optimizer.Adam(LR).minimize(loss)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    params = {
        p.name: np.array(scope.find_var(p.name).get(nf.Tensor).numpy())
        for p in main.all_parameters()
    }

    def step() -> float:
        (value,) = exe.run(main, feed=data, fetch_list=[loss], scope=scope)
        return float(value)

    return step, params


def make_torch_step(data, params, torch) -> Callable[[], float]:
    layers = []
    for i in range(len(SIZES) - 1):
        linear = torch.nn.Linear(SIZES[i], SIZES[i + 1])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(params[f"d{i}.w"].T.copy()))
            linear.bias.copy_(torch.from_numpy(params[f"d{i}.b"]))
        layers += [linear, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    real, fake = torch.from_numpy(data["real"]), torch.from_numpy(data["fake"])
    alpha = torch.from_numpy(data["alpha"])

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        x_hat = (real * alpha + fake * (1 - alpha)).requires_grad_(True)
        (grad,) = torch.autograd.grad(model(x_hat).sum(), x_hat, create_graph=True)
        penalty = ((grad.square().sum(1).sqrt() - 1) ** 2).mean()
        loss = model(fake).mean() - model(real).mean() + LAMBDA * penalty
        loss.backward()
        opt.step()
        return loss.item()

    return step


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    data = batch()
    cases: dict[str, Callable[[], float]] = {}
    entry = None
    try:
        cases["nestflow"], params = make_nestflow_step(data)
    except Exception as exc:  # report it, never fake a number
        entry = unavailable(exc)
    if torch is not None and entry is None:
        cases["torch"] = make_torch_step(data, params, torch)
    notes = []
    first = {name: [fn() for _ in range(3)] for name, fn in cases.items()}
    if "torch" in first and not np.allclose(first["nestflow"], first["torch"], rtol=1e-3):
        notes.append(f"first losses differ: {first}")
    rows = []
    for n in (1, 2):
        with _threads(n, torch):
            times = interleaved(cases, rounds=rounds, budget_s=0.3)
        ms = {name: t * 1e3 for name, t in times.items()}
        rows.append(
            row(
                f"critic step, {n} thread{'s' if n > 1 else ''}",
                "ms",
                ms.get("nestflow", entry),
                torch=ms.get("torch", "n/a (torch not installed)"),
                targets=[("torch", 1.5)],
            )
        )
    return {
        "workload": "W17 WGAN-GP critic step, MLP 2-512-512-512-1, batch 256, Adam",
        "rows": rows,
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
