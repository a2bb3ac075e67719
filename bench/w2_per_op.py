"""W2: per-op cost of a chain of 1000 elementwise adds on shape [4], forward only.

nestflow's per-op cost is (T(1001 ops) - T(1 op)) / 1000, which cancels the per-run fixed cost
of Executor.run (feeds, fetch, plan lookup); that fixed cost, T(1 op) - one op, is reported as a
second row. (A program of zero ops cannot fetch its own feed, so one op is the empty run.)
PyTorch and NumPy run the same chain as a Python loop of `h = h + y` / `np.add(h, y)`.
"""

from __future__ import annotations

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable

import nestflow as nf

CHAIN = 1000
SHAPE = [4]


def build_chain(n_ops: int):
    """A program adding y to x n_ops times; returns (program, output var)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", SHAPE)
        y = nf.data("y", SHAPE)
        h = x
        for _ in range(n_ops):
            h = nf.layers.elementwise_add(h, y)
    return main, h


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(SHAPE).astype("float32")
    ys = rng.standard_normal(SHAPE).astype("float32")
    feed = {"x": xs, "y": ys}

    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    long_prog, long_out = build_chain(CHAIN + 1)
    short_prog, short_out = build_chain(1)

    def nf_long():
        return exe.run(long_prog, feed=feed, fetch_list=[long_out], scope=scope)

    def nf_short():
        return exe.run(short_prog, feed=feed, fetch_list=[short_out], scope=scope)

    (got,) = nf_long()
    np.testing.assert_allclose(got, xs + (CHAIN + 1) * ys, rtol=1e-4)

    def np_chain():
        h = xs
        for _ in range(CHAIN):
            h = np.add(h, ys)
        return h

    cases = {"nf_long": nf_long, "nf_short": nf_short, "numpy": np_chain}
    if torch is not None:
        tx, ty = torch.from_numpy(xs), torch.from_numpy(ys)

        def torch_chain():
            h = tx
            for _ in range(CHAIN):
                h = h + ty
            return h

        cases["torch"] = torch_chain
    times = interleaved(cases, rounds=rounds)

    per_op = (times["nf_long"] - times["nf_short"]) / CHAIN
    fixed = times["nf_short"] - per_op
    torch_per_op = (
        times["torch"] / CHAIN * 1e6
        if "torch" in times
        else unavailable(ImportError("torch not installed"))
    )
    return {
        "workload": "W2 chain of 1000 elementwise adds, shape [4]",
        "rows": [
            row(
                "per-op cost",
                "µs",
                per_op * 1e6,
                torch=torch_per_op,
                numpy=times["numpy"] / CHAIN * 1e6,
                targets=[("torch", 0.6)],
            ),
            row("per-run fixed cost (1-op program)", "µs", fixed * 1e6, targets=[("abs", 20.0)]),
        ],
    }


if __name__ == "__main__":
    main(run)
