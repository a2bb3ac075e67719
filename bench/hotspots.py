"""Profile the nestflow side of one workload with cProfile and print where the time goes.

    python bench/hotspots.py w2 [--calls N] [--sort tottime] [--limit 25]

Only nestflow runs (no PyTorch), so the profile shows the executor and kernels alone. cProfile
inflates per-call costs of small Python functions; read it for shares, not absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections.abc import Callable

import numpy as np


def w1() -> Callable[[], object]:
    import w1_mlp

    step, _ = w1_mlp.make_nestflow_step(*w1_mlp.batch())
    return step


def w2() -> Callable[[], object]:
    import w2_per_op

    import nestflow as nf

    prog, out = w2_per_op.build_chain(w2_per_op.CHAIN)
    exe, scope = nf.Executor(), nf.Scope()
    feed = {"x": np.ones(w2_per_op.SHAPE, "float32"), "y": np.ones(w2_per_op.SHAPE, "float32")}
    return lambda: exe.run(prog, feed=feed, fetch_list=[out], scope=scope)


def w3() -> Callable[[], object]:
    import w3_rnn

    return w3_rnn.make_nestflow_step(*w3_rnn.data())


def w3f() -> Callable[[], object]:
    import w3_rnn

    return w3_rnn.make_nestflow_step(*w3_rnn.data(), train=False)


def w4() -> Callable[[], object]:
    import w4_ifelse

    return w4_ifelse.make_nestflow_forward(*w4_ifelse.data())


def w5() -> Callable[[], object]:
    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [4])
        out = nf.layers.scale(x, scale=2.0, bias=1.0)
    exe, scope = nf.Executor(), nf.Scope()
    feed = {"x": np.arange(4, dtype="float32")}
    return lambda: exe.run(main, feed=feed, fetch_list=[out], scope=scope)


WORKLOADS = {
    "w1": (w1, 300),
    "w2": (w2, 300),
    "w3": (w3, 100),
    "w3f": (w3f, 200),
    "w4": (w4, 1000),
    "w5": (w5, 50000),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--calls", type=int, help="how many runs to profile")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--limit", type=int, default=25)
    args = parser.parse_args()
    make, calls = WORKLOADS[args.workload]
    fn = make()
    fn()
    calls = args.calls or calls
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    print(f"{args.workload}: {calls} runs of the nestflow side")
    pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.limit)


if __name__ == "__main__":
    main()
