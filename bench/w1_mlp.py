"""W1: one SGD train step of an MLP 784-512-512-10 (relu), batch 128, softmax cross-entropy.

nestflow: layers.fc x3 + softmax_with_cross_entropy + mean + optimizer.SGD.minimize, one
Executor.run per step fetching the loss. PyTorch: nn.Linear x3, F.cross_entropy, backward,
torch.optim.SGD. NumPy by hand: the forward, the 8 GEMMs of the backward and the update written
out. All three start from nestflow's initial parameters and see the same batch, and their losses
are checked to agree before timing, so the three measure the same computation.

The step builders are importable without torch (W6 runs each in its own process).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable

SIZES = (784, 512, 512, 10)
BATCH = 128
LR = 0.01

Params = dict[str, np.ndarray]


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((BATCH, SIZES[0])).astype("float32")
    ys = rng.integers(0, SIZES[-1], size=(BATCH, 1)).astype("int64")
    return xs, ys


def initial_params(seed: int = 0) -> Params:
    """Xavier-uniform weights and zero biases, for when nestflow cannot build the model."""
    rng = np.random.default_rng(seed)
    params = {}
    for i, (n_in, n_out) in enumerate(zip(SIZES[:-1], SIZES[1:]), start=1):
        limit = np.sqrt(6.0 / (n_in + n_out))
        params[f"fc{i}.w"] = rng.uniform(-limit, limit, (n_in, n_out)).astype("float32")
        params[f"fc{i}.b"] = np.zeros(n_out, "float32")
    return params


def make_nestflow_step(
    xs, ys, place=None, cuda_graph: bool = False
) -> tuple[Callable[[], float], Params]:
    """The nestflow train step and its initial parameters (raises if nestflow can't train);
    on `place` (default CPUPlace), the batch fed from the device there (as the PyTorch step
    keeps it), with `cuda_graph` replays on CUDAPlace."""
    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, SIZES[0]])
        y = nf.data("y", [-1, 1], "int64")
        h = nf.layers.fc(x, SIZES[1], act="relu", name="fc1")
        h = nf.layers.fc(h, SIZES[2], act="relu", name="fc2")
        logits = nf.layers.fc(h, SIZES[3], name="fc3")
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, y))
        nf.optimizer.SGD(learning_rate=LR).minimize(loss)
    exe = nf.Executor(place or nf.CPUPlace(), cuda_graph=cuda_graph)
    scope = nf.Scope()
    exe.run(startup, scope=scope)
    params = {
        name: np.array(scope.find_var(name).get(nf.Tensor).numpy()) for name in initial_params()
    }
    feed = {"x": xs, "y": ys}
    if place is not None and place.is_device:
        device = nf.device_context(place)
        feed = {name: device.to_device(value) for name, value in feed.items()}

    def step() -> float:
        (value,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        return float(value)

    step.why_not_captured = lambda: exe.why_not_captured(main)  # (gpu_check reports it)
    return step, params


def make_numpy_step(xs, ys, params: Params) -> Callable[[], float]:
    w1, b1, w2, b2, w3, b3 = (
        params[k].copy() for k in ("fc1.w", "fc1.b", "fc2.w", "fc2.b", "fc3.w", "fc3.b")
    )
    labels = ys[:, 0]
    rows = np.arange(len(xs))
    scale = np.float32(1.0 / len(xs))

    def step() -> float:
        nonlocal w1, b1, w2, b2, w3, b3  # updated in place, as torch.optim.SGD does
        z1 = xs @ w1 + b1
        a1 = np.maximum(z1, 0)
        z2 = a1 @ w2 + b2
        a2 = np.maximum(z2, 0)
        z3 = a2 @ w3 + b3
        z3 -= z3.max(axis=1, keepdims=True)
        e = np.exp(z3)
        p = e / e.sum(axis=1, keepdims=True)
        loss = -np.log(p[rows, labels]).mean()
        p[rows, labels] -= 1
        d3 = p * scale
        gw3 = a2.T @ d3
        d2 = d3 @ w3.T
        d2 *= z2 > 0
        gw2 = a1.T @ d2
        d1 = d2 @ w2.T
        d1 *= z1 > 0
        gw1 = xs.T @ d1
        w3 -= LR * gw3
        b3 -= LR * d3.sum(axis=0)
        w2 -= LR * gw2
        b2 -= LR * d2.sum(axis=0)
        w1 -= LR * gw1
        b1 -= LR * d1.sum(axis=0)
        return float(loss)

    return step


def make_torch_step(xs, ys, params: Params, torch, wrap=None, device="cpu") -> Callable[[], float]:
    """The PyTorch train step on `device`; `wrap(model)` (say DistributedDataParallel) wraps the
    model the step runs, its optimizer updating the same parameters."""
    layers = []
    for i, (n_in, n_out) in enumerate(zip(SIZES[:-1], SIZES[1:]), start=1):
        linear = torch.nn.Linear(n_in, n_out)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(params[f"fc{i}.w"].T.copy()))
            linear.bias.copy_(torch.from_numpy(params[f"fc{i}.b"]))
        layers += [linear, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if wrap is not None:
        model = wrap(model)
    tx, ty = torch.from_numpy(xs).to(device), torch.from_numpy(ys[:, 0]).to(device)
    cross_entropy = torch.nn.functional.cross_entropy

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    xs, ys = batch()
    nf_entry = None
    try:
        nf_step, params = make_nestflow_step(xs, ys)
    except Exception as exc:  # a missing layer/op/optimizer: report it, never fake a number
        nf_step, params, nf_entry = None, initial_params(), unavailable(exc)
    cases = {"numpy": make_numpy_step(xs, ys, params)}
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
    for name, values in losses.items():
        if not np.allclose(values, losses["numpy"], rtol=1e-3, atol=1e-4):
            notes.append(f"{name} losses {values} differ from NumPy's {losses['numpy']}")
    times = interleaved(cases, rounds=rounds, budget_s=0.15)
    ms = {name: t * 1e3 for name, t in times.items()}
    return {
        "workload": "W1 MLP 784-512-512-10, batch 128, SGD",
        "rows": [
            row(
                "train step",
                "ms",
                ms.get("nestflow", nf_entry),
                torch=ms.get("torch", "n/a (torch not installed)"),
                numpy=ms["numpy"],
                targets=[("torch", 1.1), ("numpy", 1.1)],
            )
        ],
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
