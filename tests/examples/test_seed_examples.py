"""examples/seed_ifelse.py and examples/seed_rnn.py (issue 4 item 8: the two seed programs of
docs/concepts.md as scripts): each runs as a user would run it, in a fresh Python, and prints the
hand-computed values."""

from __future__ import annotations

import ast
import math
import pathlib
import re
import subprocess
import sys

import numpy as np

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _run_script(name: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, check=True
    )
    return done.stdout


def _printed_list(stdout: str, label: str) -> list[float]:
    (line,) = [line for line in stdout.splitlines() if line.startswith(label)]
    return ast.literal_eval(re.search(r"(\[[^\[\]]*\])\s*$", line).group(1))  # the last list


def test_seed_ifelse_script_prints_the_hand_computed_rows():
    out = _run_script("seed_ifelse.py")
    assert _printed_list(out, "cond =") == [False, True, True]
    w, b = map(float, re.search(r"fc weight w = (\S+), bias b = (\S+)", out).groups())
    # Rows 20 and 30: x + y = x + 1 and softmax of one column = 1; row 10: fc(z) = 10 w + b.
    np.testing.assert_allclose(_printed_list(out, "o1 ="), [10 * w + b, 21, 31], rtol=1e-5)
    np.testing.assert_allclose(_printed_list(out, "o2 ="), [10 * w + b + 1, 1, 1], rtol=1e-5)
    assert "block 1 (parent 0)" in out and "block 2 (parent 0)" in out


def test_seed_rnn_script_prints_the_hand_computed_recurrence():
    out = _run_script("seed_rnn.py")
    h, want_a, want_b = 0.0, [], []
    for x in (10, 20, 30):  # a_t = 0.314 x_t, b_t = 0.375 h_{t-1}, h_t = sigmoid(a_t + b_t)
        want_a.append(0.314 * x)
        want_b.append(0.375 * h)
        h = 1 / (1 + math.exp(-(want_a[-1] + want_b[-1])))
    np.testing.assert_allclose(_printed_list(out, "o1 "), want_a, rtol=1e-6)
    np.testing.assert_allclose(_printed_list(out, "o2 "), want_b, rtol=1e-6)
    np.testing.assert_allclose(_printed_list(out, "h_3 "), [h], rtol=1e-6)
    assert "shape [1, 3]" in out
