"""W9: conv2d forward + backward alone, 64 -> 64 channels on [32, 64, 28, 28] float32, for a
3x3 filter (padding 1) and a 1x1 filter.

nestflow: one conv2d op (no bias) and the gradient ops nf.gradients appends for the input and the
filter, seeded with a fixed upstream gradient; one Executor.run fetching the output and both
gradients. PyTorch: F.conv2d, then backward with the same upstream gradient. Each runs at 1 and
at 2 threads (nf.set_num_threads / torch.set_num_threads), the four contenders' rounds
interleaved, and the rows give each side's 2-thread speed-up; the outputs and gradients are
checked to agree before timing. Issue 29's targets: 3x3 <= 1.0x PyTorch at 1 thread and <= 1.2x
at 2, 1x1 <= 1.0x at both, nestflow's 3x3 speed-up >= 1.7x.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
from timing import load_note, main, scaling_rows, setup_torch

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


def make_nestflow(
    x, w, upstream, padding: int, place=None, return_numpy: bool = True
) -> Callable[[], list]:
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
    exe, scope = nf.Executor(place or nf.CPUPlace()), nf.Scope()
    exe.run(startup, scope=scope)
    scope.find_var("conv.w").get(nf.Tensor).set(w.copy())
    feed = {"x": x, "seed": upstream}
    if place is not None and place.is_device:  # fed once, as a GPU user keeps data there
        device = nf.device_context(place)
        feed = {name: device.to_device(value) for name, value in feed.items()}
    fetches = [out, dx, dw]
    return lambda: exe.run(
        main, feed=feed, fetch_list=fetches, scope=scope, return_numpy=return_numpy
    )


def make_torch(x, w, upstream, padding: int, torch, device="cpu") -> Callable[[], list]:
    tx = torch.from_numpy(x).to(device).requires_grad_()
    tw = torch.from_numpy(w.copy()).to(device).requires_grad_()
    tg = torch.from_numpy(upstream).to(device)
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
    """One thread for nestflow (its intra-op pool and NumPy's BLAS, nf.set_num_threads) and
    PyTorch inside the block, restored afterwards."""
    from threadpoolctl import threadpool_limits

    import nestflow as nf

    torch_threads = torch.get_num_threads() if torch is not None else None
    budget = nf.get_num_threads()
    try:
        if torch is not None:
            torch.set_num_threads(1)
        with threadpool_limits(limits=1):
            nf.set_num_threads(1)
            yield
    finally:
        nf.device_context().num_threads = budget
        if torch is not None:
            torch.set_num_threads(torch_threads)


TARGETS = {3: {1: 1.0, 2: 1.2}, 1: {1: 1.0, 2: 1.0}}  # issue 29, by filter size


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    rows, notes = [], [load_note() + " at the start"]
    for k, padding in FILTERS:
        rows.extend(conv_rows(k, padding, torch, rounds, notes))
    notes.append(load_note() + " at the end")
    return {
        "workload": "W9 conv2d fwd+bwd, 64->64 on [32, 64, 28, 28], 1 and 2 threads",
        "rows": rows,
        "notes": notes,
    }


def conv_rows(k: int, padding: int, torch, rounds: int, notes: list[str]) -> list[dict]:
    x, w, upstream = data(k)
    makers = {"nestflow": lambda: make_nestflow(x, w, upstream, padding)}
    if torch is not None:
        makers["torch"] = lambda: make_torch(x, w, upstream, padding, torch)
        try:
            if not agree(makers["nestflow"]()(), makers["torch"]()()):
                notes.append(f"{k}x{k}: nestflow's output or gradients differ from PyTorch's")
        except Exception as exc:
            notes.append(f"{k}x{k}: not compared ({type(exc).__name__}: {exc})")
    metric = f"{k}x{k} conv, padding {padding}: forward + input and filter gradients"
    rows, _ = scaling_rows(metric, makers, torch, rounds, 0.3, TARGETS[k])
    return rows


if __name__ == "__main__":
    main(run)
