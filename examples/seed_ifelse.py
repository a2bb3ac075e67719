"""Seed 002's IfElse program, run as docs/concepts.md (The seed programs) writes it.

    python examples/seed_ifelse.py

Rows of x greater than 15 (20 and 30) take the true branch: x + y and softmax(x + y) (a softmax
over one column is 1). The row 10 takes the false branch: fc(z) and fc(z) + 1, with the fc
weight printed so the value can be checked by hand.
"""

from __future__ import annotations

import nestflow as pd


def main() -> None:
    x = pd.minibatch([10, 20, 30])  # shape=[None, 1]
    y = pd.var(1)  # shape=[1], value=1
    z = pd.minibatch([10, 20, 30])  # shape=[None, 1]
    cond = pd.layers.greater_than(x, 15)  # [False, True, True]

    ie = pd.ifelse()
    with ie.true_block():
        d = pd.layers.add_scalar(x, y)
        ie.output(d, pd.layers.softmax(d))
    with ie.false_block():
        d = pd.layers.fc(z, size=1)
        ie.output(d, d + 1)
    o1, o2 = ie(cond)

    scope = pd.Scope()
    exe = pd.Executor(pd.CPUPlace())
    exe.run(pd.default_startup_program(), scope=scope)
    c, a, b = exe.run(fetch_list=[cond, o1, o2], scope=scope)
    w = scope.find_var("fc_0.w").get(pd.Tensor).numpy()[0, 0]
    bias = scope.find_var("fc_0.b").get(pd.Tensor).numpy()[0]
    print(pd.default_main_program())
    print(f"cond = {c.ravel().tolist()}")
    print(
        f"fc weight w = {w:.6f}, bias b = {bias:.6f}  (false branch: 10*w + b = {10 * w + bias:.6f})"
    )
    print(f"o1 = {a.ravel().tolist()}")
    print(f"o2 = {b.ravel().tolist()}")


if __name__ == "__main__":
    main()
