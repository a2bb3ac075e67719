"""W14: batch_norm (training) then 2x2 max-pool (stride 2), forward and backward, on
[32, 64, 56, 56] float32, at 1 and at 2 threads (issue 29).

nestflow: nf.layers.batch_norm and pool2d, and the gradient ops nf.gradients appends for the
input, Scale and Bias, seeded with a fixed upstream gradient; one Executor.run fetching the
pooled output and the three gradients. PyTorch: F.batch_norm(training=True) and F.max_pool2d,
then backward with the same upstream gradient. Each side at 1 and at 2 threads, the four
contenders' rounds interleaved. Target: <= 1.0x PyTorch at 2 threads.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import load_note, main, scaling_rows, setup_torch

SHAPE = (32, 64, 56, 56)


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE).astype("float32")
    upstream = rng.standard_normal((SHAPE[0], SHAPE[1], SHAPE[2] // 2, SHAPE[3] // 2))
    return x, upstream.astype("float32")


def make_nestflow(x, upstream) -> Callable[[], list]:
    import nestflow as nf

    main_prog, startup = nf.Program(), nf.Program()
    with nf.program_guard(main_prog, startup):
        xv = nf.data("x", [-1, *SHAPE[1:]])
        seed = nf.data("seed", [-1, SHAPE[1], SHAPE[2] // 2, SHAPE[3] // 2])
        h = nf.layers.batch_norm(xv, name="bn")
        out = nf.layers.pool2d(h, 2, "max", 2)
        block = main_prog.global_block()
        params = [p for p in block.all_parameters() if getattr(p, "trainable", True)]
        grads = nf.gradients([out], [xv, *params], target_gradients=[seed])
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    feed = {"x": x, "seed": upstream}
    return lambda: exe.run(main_prog, feed=feed, fetch_list=[out, *grads], scope=scope)


def make_torch(x, upstream, torch) -> Callable[[], list]:
    F = torch.nn.functional
    tx = torch.from_numpy(x).requires_grad_()
    scale = torch.ones(SHAPE[1], requires_grad=True)
    bias = torch.zeros(SHAPE[1], requires_grad=True)
    mean, var = torch.zeros(SHAPE[1]), torch.ones(SHAPE[1])
    tg = torch.from_numpy(upstream)

    def step():
        tx.grad = scale.grad = bias.grad = None
        h = F.batch_norm(tx, mean, var, scale, bias, training=True, momentum=0.1, eps=1e-5)
        out = F.max_pool2d(h, 2, 2)
        out.backward(tg)
        return [out, tx.grad, scale.grad, bias.grad]

    return step


def agree(got: list, want: list) -> bool:
    """The pooled output and the input gradient within 1e-3 of the other's largest value."""
    for a, b in zip(got[:2], want[:2]):
        b = b.detach().numpy()
        if np.abs(np.asarray(a) - b).max() > 1e-3 * np.abs(b).max():
            return False
    return True


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    x, upstream = data()
    makers = {"nestflow": lambda: make_nestflow(x, upstream)}
    notes = [load_note() + " at the start"]
    if torch is not None:
        makers["torch"] = lambda: make_torch(x, upstream, torch)
        try:
            if not agree(makers["nestflow"]()(), makers["torch"]()()):
                notes.append("nestflow's output or input gradient differs from PyTorch's")
        except Exception as exc:
            notes.append(f"not compared ({type(exc).__name__}: {exc})")
    metric = "batch_norm + 2x2 max-pool, forward + gradients"
    rows, _ = scaling_rows(metric, makers, torch, rounds, 0.3, {2: 1.0})
    notes.append(load_note() + " at the end")
    return {
        "workload": "W14 batch_norm + 2x2 max-pool fwd+bwd on [32, 64, 56, 56]",
        "rows": rows,
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
