"""Seed 002's RNN program, run as docs/concepts.md (The seed programs) writes it.

    python examples/seed_rnn.py

One sequence x = [10, 20, 30] (shape [batch=1, time=3, 1]); at each step
a_t = 0.314 x_t, b_t = 0.375 h_{t-1}, h_t = sigmoid(a_t + b_t), h_0 = 0.
o1 stacks a_t and o2 stacks b_t over the steps: both are [batch=1, time=3]. The script prints
them next to the values computed by hand in plain Python.
"""

from __future__ import annotations

import math

import nestflow as pd


def main() -> None:
    x = pd.sequence([10, 20, 30])  # one sequence of 3 steps, 1 feature
    m = pd.var(0)
    W = pd.var(0.314, param=True)
    U = pd.var(0.375, param=True)

    rnn = pd.rnn()
    with rnn.step():
        h = rnn.memory(init=m)
        h_prev = rnn.previous_memory(h)
        a = pd.layers.matmul(x, W)  # x times the given weight
        b = pd.layers.matmul(h_prev, U)
        s = pd.add(a, b)
        act = pd.sigmoid(s)
        rnn.update_memory(h, act)
        rnn.output(a, b)
    o1, o2 = rnn()  # stacked over time steps
    final = rnn.final_memory(h)

    scope = pd.Scope()
    exe = pd.Executor(pd.CPUPlace())
    exe.run(pd.default_startup_program(), scope=scope)
    r1, r2, h3 = exe.run(fetch_list=[o1, o2, final], scope=scope)
    print(pd.default_main_program())
    print(f"o1 (a_t = 0.314 x_t)       shape {list(r1.shape)}: {r1.ravel().tolist()}")
    print(f"o2 (b_t = 0.375 h_(t-1))   shape {list(r2.shape)}: {r2.ravel().tolist()}")
    print(f"h_3 (final memory):        {h3.ravel().tolist()}")

    hand_h, hand_a, hand_b = 0.0, [], []
    for x_t in (10, 20, 30):
        hand_a.append(0.314 * x_t)
        hand_b.append(0.375 * hand_h)
        hand_h = 1 / (1 + math.exp(-(hand_a[-1] + hand_b[-1])))
    print(f"by hand: a = {hand_a}, b = {hand_b}, h_3 = {hand_h}")


if __name__ == "__main__":
    main()
