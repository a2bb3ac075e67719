"""W9: conv2d forward + backward alone, 64 -> 64 channels on [32, 64, 28, 28] float32, for a
3x3 filter (padding 1) and a 1x1 filter.

nestflow: one conv2d op (no bias) and the gradient ops nf.gradients appends for the input and the
filter, seeded with a fixed upstream gradient; one Executor.run fetching the output and both
gradients. PyTorch: F.conv2d, then backward with the same upstream gradient. Both run with one
BLAS/OpenMP thread (the issue's setting for W9), restored afterwards; the outputs and gradients
are checked to agree before timing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable

BATCH, CHANNELS, SIZE = 32, 64, 28
FILTERS = ((3, 1), (1, 0))  # (filter size, padding)


def data(k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, CHANNELS, SIZE, SIZE)).astype("float32")
    w = (rng.standard_normal((CHANNELS, CHANNELS, k, k)) / np.sqrt(CHANNELS * k * k)).astype(
        "float32"
    )
    upstream = rng.standard_normal((BATCH, CHANNELS, SIZE, SIZE)).astype("float32")
    return x, w, upstream


def make_nestflow(x, w, upstream, padding: int) -> Callable[[], list]:
    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        xv = nf.data("x", [-1, CHANNELS, SIZE, SIZE])
        seed = nf.data("seed", [-1, CHANNELS, SIZE, SIZE])
        out = nf.layers.conv2d(
            xv, CHANNELS, w.shape[2], padding=padding, bias_attr=False, name="conv"
        )
        filt = main.global_block().var("conv.w")
        dx, dw = nf.gradients([out], [xv, filt], target_gradients=[seed])
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    scope.find_var("conv.w").get(nf.Tensor).set(w.copy())
    feed = {"x": x, "seed": upstream}
    return lambda: exe.run(main, feed=feed, fetch_list=[out, dx, dw], scope=scope)


def make_torch(x, w, upstream, padding: int, torch) -> Callable[[], list]:
    tx = torch.from_numpy(x).requires_grad_()
    tw = torch.from_numpy(w.copy()).requires_grad_()
    tg = torch.from_numpy(upstream)
    conv2d = torch.nn.functional.conv2d

    def step():
        tx.grad = tw.grad = None
        out = conv2d(tx, tw, padding=padding)
        out.backward(tg)
        return [out, tx.grad, tw.grad]

    return step


def agree(got: list, want: list) -> bool:
    """Each result within 1e-4 of the other's largest magnitude (float32 sums over 25088
    products, rounded differently by each algorithm)."""
    for a, b in zip(got, want):
        b = b.detach().numpy()
        if np.abs(np.asarray(a) - b).max() > 1e-4 * np.abs(b).max():
            return False
    return True


@contextmanager
def single_threaded(torch):
    """One BLAS/OpenMP thread for NumPy and PyTorch inside the block, restored afterwards."""
    from threadpoolctl import threadpool_limits

    torch_threads = torch.get_num_threads() if torch is not None else None
    try:
        if torch is not None:
            torch.set_num_threads(1)
        with threadpool_limits(limits=1):
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(torch_threads)


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    rows, notes = [], []
    with single_threaded(torch):
        for k, padding in FILTERS:
            rows.append(conv_row(k, padding, torch, rounds, notes))
    return {
        "workload": "W9 conv2d fwd+bwd, 64->64 on [32, 64, 28, 28], 1 thread",
        "rows": rows,
        "notes": notes,
    }


def conv_row(k: int, padding: int, torch, rounds: int, notes: list[str]) -> dict:
    x, w, upstream = data(k)
    cases, nf_entry = {}, None
    try:
        cases["nestflow"] = make_nestflow(x, w, upstream, padding)
    except Exception as exc:  # a missing layer/op: report it, never fake a number
        nf_entry = unavailable(exc)
    if torch is not None:
        cases["torch"] = make_torch(x, w, upstream, padding, torch)
    if "nestflow" in cases and torch is not None:
        if not agree(cases["nestflow"](), cases["torch"]()):
            notes.append(f"{k}x{k}: nestflow's output or gradients differ from PyTorch's")
    times = interleaved(cases, rounds=rounds, budget_s=0.3)
    ms = {name: t * 1e3 for name, t in times.items()}
    return row(
        f"{k}x{k} conv, padding {padding}: forward + input and filter gradients",
        "ms",
        ms.get("nestflow", nf_entry),
        torch=ms.get("torch", "n/a (torch not installed)"),
        targets=[("torch", 1.2)],
    )


if __name__ == "__main__":
    main(run)
