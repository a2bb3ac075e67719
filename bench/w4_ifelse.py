"""W4: per-row IfElse forward, x [1024, 64]: rows whose condition holds go through one fc
(64->64), the others through another, and the rows are merged back in their original order.

The condition (x[:, 0] > 0, a bool [1024, 1] column) is an input to all three contenders, so the
workload is the branching itself. nestflow: nf.ifelse() with an fc in each branch. PyTorch
(no_grad): nonzero + index_select + index_copy_. NumPy by hand: boolean masks. All use the same
weights; outputs are checked to agree before timing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable

ROWS, FEATURES = 1024, 64


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((ROWS, FEATURES)).astype("float32")
    cond = xs[:, :1] > 0
    scale = 1 / np.sqrt(FEATURES)
    params = {
        "true_fc.w": (rng.standard_normal((FEATURES, FEATURES)) * scale).astype("float32"),
        "true_fc.b": rng.standard_normal(FEATURES).astype("float32"),
        "false_fc.w": (rng.standard_normal((FEATURES, FEATURES)) * scale).astype("float32"),
        "false_fc.b": rng.standard_normal(FEATURES).astype("float32"),
    }
    return xs, cond, params


def make_nestflow_forward(xs, conds, params) -> Callable[[], np.ndarray]:
    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, FEATURES])
        cond = nf.data("cond", [-1, 1], "bool")
        ie = nf.ifelse()
        with ie.true_block():
            ie.output(nf.layers.fc(x, FEATURES, name="true_fc"))
        with ie.false_block():
            ie.output(nf.layers.fc(x, FEATURES, name="false_fc"))
        out = ie(cond)
        out = out[0] if isinstance(out, list | tuple) else out
    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    exe.run(startup, scope=scope)
    for name, value in params.items():
        scope.find_var(name).get(nf.Tensor).set(value.copy())
    feed = {"x": xs, "cond": conds}

    def forward() -> np.ndarray:
        (value,) = exe.run(main, feed=feed, fetch_list=[out], scope=scope)
        return value

    return forward


def make_numpy_forward(xs, conds, params) -> Callable[[], np.ndarray]:
    wt, bt, wf, bf = (params[k] for k in ("true_fc.w", "true_fc.b", "false_fc.w", "false_fc.b"))
    mask = conds[:, 0]

    def forward() -> np.ndarray:
        out = np.empty((ROWS, FEATURES), "float32")
        out[mask] = xs[mask] @ wt + bt
        rest = ~mask
        out[rest] = xs[rest] @ wf + bf
        return out

    return forward


def make_torch_forward(xs, conds, params, torch) -> Callable[[], np.ndarray]:
    def linear(prefix):
        layer = torch.nn.Linear(FEATURES, FEATURES)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(params[f"{prefix}.w"].T.copy()))
            layer.bias.copy_(torch.from_numpy(params[f"{prefix}.b"]))
        return layer

    true_fc, false_fc = linear("true_fc"), linear("false_fc")
    tx = torch.from_numpy(xs)
    mask = torch.from_numpy(conds[:, 0].copy())

    def forward():
        with torch.no_grad():
            idx_t = mask.nonzero().squeeze(1)
            idx_f = (~mask).nonzero().squeeze(1)
            out = torch.empty(ROWS, FEATURES)
            out.index_copy_(0, idx_t, true_fc(tx.index_select(0, idx_t)))
            out.index_copy_(0, idx_f, false_fc(tx.index_select(0, idx_f)))
            return out

    return forward


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    xs, conds, params = data()
    cases = {"numpy": make_numpy_forward(xs, conds, params)}
    if torch is not None:
        cases["torch"] = make_torch_forward(xs, conds, params, torch)
    outputs = {name: np.asarray(fn()) for name, fn in cases.items()}
    nf_entry = None
    try:
        nf_forward = make_nestflow_forward(xs, conds, params)
        outputs["nestflow"] = nf_forward()
        cases["nestflow"] = nf_forward
    except Exception as exc:  # IfElse not there yet: say so, never fake a number
        nf_entry = unavailable(exc)
    notes = []
    for name, value in outputs.items():
        if value.shape != outputs["numpy"].shape or not np.allclose(
            value, outputs["numpy"], rtol=1e-4, atol=1e-5
        ):
            notes.append(f"{name} output differs from NumPy's")
    times = interleaved(cases, rounds=rounds, budget_s=0.1)
    ms = {name: t * 1e3 for name, t in times.items()}
    return {
        "workload": "W4 per-row IfElse 1024x64, two fc branches, forward",
        "rows": [
            row(
                "forward",
                "ms",
                ms.get("nestflow", nf_entry),
                torch=ms.get("torch", "n/a (torch not installed)"),
                numpy=ms["numpy"],
                targets=[("torch", 1.5)],
            )
        ],
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
