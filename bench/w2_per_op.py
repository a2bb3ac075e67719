"""W2: per-op cost of cheap ops on shape [4], forward only, one row per op type.

For each op type (add, scale with bias, relu, tanh, exp, reshape, slice, where) a program
chains 1000 of that op; nestflow's per-op cost is (T(1001 ops) - T(1 op)) / 1000, which cancels
the per-run fixed cost of Executor.run (feeds, fetch, plan lookup); that fixed cost, T(1 op)
less one add, is the last row. PyTorch and NumPy run the same chain as a Python loop written
the way one would by hand (`h = h * 0.5 + 1.0`, `h = np.maximum(h, 0)`, `h = h[0:4]`, ...),
on the same float32 arrays. The reshape and slice are the no-op ones ([4] -> [4], [0:4]) that
keep the chain going; exp's chain overflows to inf after a few steps, for every contender.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable

import nestflow as nf

CHAIN = 1000
SHAPE = [4]
L = nf.layers


@dataclass(frozen=True)
class OpType:
    """One op type: its nestflow layer call (h, y, c) -> var, and the same step written by
    hand as an expression of h, y and c in NumPy and in PyTorch."""

    name: str
    layer: Callable
    numpy: str
    torch: str


OP_TYPES = [
    OpType("add", lambda h, y, c: L.elementwise_add(h, y), "h + y", "h + y"),
    OpType(
        "scale with bias", lambda h, y, c: L.scale(h, 0.5, 1.0), "h * 0.5 + 1.0", "h * 0.5 + 1.0"
    ),
    OpType("relu", lambda h, y, c: L.relu(h), "np.maximum(h, 0)", "torch.relu(h)"),
    OpType("tanh", lambda h, y, c: L.tanh(h), "np.tanh(h)", "torch.tanh(h)"),
    OpType("exp", lambda h, y, c: L.exp(h), "np.exp(h)", "torch.exp(h)"),
    OpType("reshape", lambda h, y, c: L.reshape(h, SHAPE), "h.reshape(4)", "h.reshape(4)"),
    OpType("slice", lambda h, y, c: L.slice(h, axes=[0], starts=[0], ends=[4]), "h[0:4]", "h[0:4]"),
    OpType("where", lambda h, y, c: L.where(c, h, y), "np.where(c, h, y)", "torch.where(c, h, y)"),
]


def by_hand(expr: str, torch=None, steps: int = CHAIN) -> Callable:
    """The chain as one would write it: a loop of `steps` steps `h = <expr>`, no call per step."""
    source = (
        f"def chain(h, y, c):\n    for _ in range({steps}):\n        h = {expr}\n    return h\n"
    )
    namespace = {"np": np, "torch": torch}
    exec(compile(source, f"<by hand: {expr}>", "exec"), namespace)  # noqa: S102
    return namespace["chain"]


def build_chain(op: OpType, n_ops: int):
    """A program applying `op` n_ops times to x; returns (program, output var)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", SHAPE)
        y = nf.data("y", SHAPE)
        c = nf.data("c", SHAPE, "bool")
        h = x
        for _ in range(n_ops):
            h = op.layer(h, y, c)
    return main, h


def run(rounds: int = 7) -> dict:
    torch = setup_torch()
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(SHAPE).astype("float32")
    ys = rng.standard_normal(SHAPE).astype("float32")
    cs = xs > 0
    feed = {"x": xs, "y": ys, "c": cs}
    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    if torch is not None:
        torch_inputs = [torch.from_numpy(a) for a in (xs, ys, cs)]

    cases: dict[str, Callable[[], object]] = {}
    for op in OP_TYPES:
        long_prog, long_out = build_chain(op, CHAIN + 1)
        short_prog, short_out = build_chain(op, 1)

        def nf_long(p=long_prog, o=long_out):
            return exe.run(p, feed=feed, fetch_list=[o], scope=scope)[0]

        def nf_short(p=short_prog, o=short_out):
            return exe.run(p, feed=feed, fetch_list=[o], scope=scope)[0]

        numpy_chain = by_hand(op.numpy)
        with np.errstate(over="ignore"):
            want = by_hand(op.numpy, steps=CHAIN + 1)(xs, ys, cs)
            np.testing.assert_allclose(nf_long(), want, rtol=1e-5, err_msg=op.name)
        cases[f"{op.name}/nf_long"] = nf_long
        cases[f"{op.name}/nf_short"] = nf_short
        cases[f"{op.name}/numpy"] = lambda f=numpy_chain: f(xs, ys, cs)
        if torch is not None:
            torch_chain = by_hand(op.torch, torch)
            cases[f"{op.name}/torch"] = lambda f=torch_chain: f(*torch_inputs)

    # No BLAS and no worker threads here: a short settle between batches is enough.
    with np.errstate(over="ignore"):
        times = interleaved(cases, rounds=rounds, settle_s=0.05)

    rows = []
    for op in OP_TYPES:
        per_op = (times[f"{op.name}/nf_long"] - times[f"{op.name}/nf_short"]) / CHAIN
        torch_time = times.get(f"{op.name}/torch")
        rows.append(
            row(
                f"{op.name}: per-op cost",
                "µs",
                per_op * 1e6,
                torch=torch_time / CHAIN * 1e6
                if torch_time is not None
                else unavailable(ImportError("torch not installed")),
                numpy=times[f"{op.name}/numpy"] / CHAIN * 1e6,
                targets=[("torch", 0.6), ("numpy", 1.5)],
            )
        )
    add_per_op = (times["add/nf_long"] - times["add/nf_short"]) / CHAIN
    fixed = times["add/nf_short"] - add_per_op
    rows.append(
        row("per-run fixed cost (1-op program)", "µs", fixed * 1e6, targets=[("abs", 20.0)])
    )
    return {"workload": "W2 per-op cost of cheap ops, chains of 1000 on shape [4]", "rows": rows}


if __name__ == "__main__":
    main(run)
