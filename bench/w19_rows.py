"""W19: the row-wise and elementwise kernels issue 29 puts on the intra-op pool, each alone on
large float32 tensors, at 1 and at 2 threads against PyTorch at the same count.

- softmax_with_cross_entropy (hard labels) forward + gradient on [2048, 8192] logits (a
  language model's 8,192-word vocabulary over 32 x 64 tokens); PyTorch: F.cross_entropy
  with reduction="none", backward with the same upstream gradient.
- layer_norm (Scale and Bias) forward + gradients on [4096, 1024]; PyTorch: F.layer_norm.
- one Adam update of a [2048, 2048] parameter (4M values); PyTorch: torch.optim.Adam
  (foreach=False: the same per-parameter arithmetic).

nestflow: one Executor.run per step of a program holding only those ops (the gradients from
nf.gradients, seeded with a fixed upstream gradient), fetching every result. Each side at 1
and at 2 threads, the four contenders' rounds interleaved; the results are checked to agree
before timing. No target: the rows show what the pool gains on a 2-core machine, where these
kernels stream their tensors from memory.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import load_note, main, scaling_rows, setup_torch

ROWS, CLASSES = 2048, 8192
NORM_ROWS, WIDTH = 4096, 1024
PARAM = (2048, 2048)
LR = 1e-3


def data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = "float32"
    return {
        "logits": rng.standard_normal((ROWS, CLASSES)).astype(f32),
        "label": rng.integers(0, CLASSES, (ROWS, 1)).astype("int64"),
        "loss_seed": rng.standard_normal((ROWS, 1)).astype(f32),
        "x": rng.standard_normal((NORM_ROWS, WIDTH)).astype(f32),
        "y_seed": rng.standard_normal((NORM_ROWS, WIDTH)).astype(f32),
        "scale": (1 + 0.1 * rng.standard_normal(WIDTH)).astype(f32),
        "bias": (0.1 * rng.standard_normal(WIDTH)).astype(f32),
        "param": rng.standard_normal(PARAM).astype(f32),
        "grad": rng.standard_normal(PARAM).astype(f32),
    }


def _run(nf, main_prog, startup, feed, fetches, init=None) -> Callable[[], list]:
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    for name, value in (init or {}).items():
        scope.find_var(name).get(nf.Tensor).set(value.copy())
    return lambda: exe.run(main_prog, feed=feed, fetch_list=fetches, scope=scope)


def nestflow_cross_entropy(d) -> Callable[[], list]:
    import nestflow as nf

    main_prog, startup = nf.Program(), nf.Program()
    with nf.program_guard(main_prog, startup):
        logits = nf.data("logits", [-1, CLASSES])
        label = nf.data("label", [-1, 1], "int64")
        seed = nf.data("loss_seed", [-1, 1])
        loss = nf.layers.softmax_with_cross_entropy(logits, label)
        (dlogits,) = nf.gradients([loss], [logits], target_gradients=[seed])
    feed = {k: d[k] for k in ("logits", "label", "loss_seed")}
    return _run(nf, main_prog, startup, feed, [loss, dlogits])


def torch_cross_entropy(d, torch) -> Callable[[], list]:
    logits = torch.from_numpy(d["logits"]).requires_grad_()
    label = torch.from_numpy(d["label"][:, 0])
    seed = torch.from_numpy(d["loss_seed"][:, 0])
    cross_entropy = torch.nn.functional.cross_entropy

    def step():
        logits.grad = None
        loss = cross_entropy(logits, label, reduction="none")
        loss.backward(seed)
        return [loss[:, None], logits.grad]

    return step


def nestflow_layer_norm(d) -> Callable[[], list]:
    import nestflow as nf

    main_prog, startup = nf.Program(), nf.Program()
    with nf.program_guard(main_prog, startup):
        x = nf.data("x", [-1, WIDTH])
        seed = nf.data("y_seed", [-1, WIDTH])
        y = nf.layers.layer_norm(x, name="ln")
        block = main_prog.global_block()
        scale, bias = block.var("ln.w"), block.var("ln.b")
        grads = nf.gradients([y], [x, scale, bias], target_gradients=[seed])
    feed = {"x": d["x"], "y_seed": d["y_seed"]}
    init = {"ln.w": d["scale"], "ln.b": d["bias"]}
    return _run(nf, main_prog, startup, feed, [y, *grads], init)


def torch_layer_norm(d, torch) -> Callable[[], list]:
    x = torch.from_numpy(d["x"]).requires_grad_()
    scale = torch.from_numpy(d["scale"].copy()).requires_grad_()
    bias = torch.from_numpy(d["bias"].copy()).requires_grad_()
    seed = torch.from_numpy(d["y_seed"])
    layer_norm = torch.nn.functional.layer_norm

    def step():
        x.grad = scale.grad = bias.grad = None
        y = layer_norm(x, (WIDTH,), scale, bias, 1e-5)
        y.backward(seed)
        return [y, x.grad, scale.grad, bias.grad]

    return step


def nestflow_adam(d) -> Callable[[], list]:
    """One adam op on a parameter whose gradient is fed (the update alone)."""
    import nestflow as nf

    main_prog, startup = nf.Program(), nf.Program()
    with nf.program_guard(main_prog, startup):
        block = main_prog.global_block()
        param = nf.layers.create_parameter(list(PARAM), "float32", name="p")
        grad = nf.data("g", list(PARAM))
        optimizer = nf.optimizer.Adam(learning_rate=LR)
        optimizer.apply_gradients([(param, grad)])
        adam_op = next(op for op in block.ops if op.type == "adam")
        fetches = [param, *(block.var(adam_op.output(s)[0]) for s in ("Moment1Out", "Moment2Out"))]
    return _run(nf, main_prog, startup, {"g": d["grad"]}, fetches, {"p": d["param"]})


def torch_adam(d, torch) -> Callable[[], list]:
    param = torch.nn.Parameter(torch.from_numpy(d["param"].copy()))
    param.grad = torch.from_numpy(d["grad"])
    optimizer = torch.optim.Adam([param], lr=LR, foreach=False)

    def step():
        optimizer.step()
        state = optimizer.state[param]
        return [param, state["exp_avg"], state["exp_avg_sq"]]

    return step


CASES = {
    "softmax_with_cross_entropy fwd + grad on [2048, 8192]": (
        nestflow_cross_entropy,
        torch_cross_entropy,
    ),
    "layer_norm fwd + 3 grads on [4096, 1024]": (nestflow_layer_norm, torch_layer_norm),
    "adam update of a [2048, 2048] parameter": (nestflow_adam, torch_adam),
}


def agree(got: list, want: list) -> bool:
    """Each result within 1e-4 of the other's largest magnitude."""
    for a, b in zip(got, want):
        b = b.detach().numpy()
        if np.abs(np.asarray(a) - b).max() > 1e-4 * max(1.0, np.abs(b).max()):
            return False
    return True


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    d = data()
    notes, rows = [load_note() + " at the start"], []
    for metric, (nf_maker, torch_maker) in CASES.items():
        makers = {"nestflow": lambda m=nf_maker: m(d)}
        if torch is not None:
            makers["torch"] = lambda m=torch_maker: m(d, torch)
            try:  # one step each from the same start
                if not agree(makers["nestflow"]()(), makers["torch"]()()):
                    notes.append(f"{metric}: nestflow's results differ from PyTorch's")
            except Exception as exc:
                notes.append(f"{metric}: not compared ({type(exc).__name__}: {exc})")
        metric_rows, _ = scaling_rows(metric, makers, torch, rounds, 0.2, {})
        rows += metric_rows
    notes.append(load_note() + " at the end")
    return {
        "workload": "W19 cross-entropy, layer_norm and Adam on large tensors",
        "rows": rows,
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
