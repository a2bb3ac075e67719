"""W5: the fixed cost of one Executor.run on a trivial program (feed x [4], one scale op, fetch).

There is no PyTorch counterpart (eager has no run call); the NumPy column is the scale itself,
`x * 2.0 + 1.0`, so the difference is what the executor adds around one kernel.
"""

from __future__ import annotations

import numpy as np
from timing import interleaved, main, row

import nestflow as nf


def run(rounds: int = 7) -> dict:
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [4])
        out = nf.layers.scale(x, scale=2.0, bias=1.0)
    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    xs = np.arange(4, dtype="float32")
    feed = {"x": xs}

    def nf_run():
        return exe.run(main, feed=feed, fetch_list=[out], scope=scope)

    def np_scale():
        return xs * 2.0 + 1.0

    (got,) = nf_run()
    np.testing.assert_allclose(got, np_scale())
    times = interleaved({"nestflow": nf_run, "numpy": np_scale}, rounds=rounds)
    return {
        "workload": "W5 one Executor.run (feed, 1 scale op, fetch)",
        "rows": [
            row(
                "fixed cost per run",
                "µs",
                times["nestflow"] * 1e6,
                numpy=times["numpy"] * 1e6,
                targets=[("abs", 20.0)],
            )
        ],
    }


if __name__ == "__main__":
    main(run)
