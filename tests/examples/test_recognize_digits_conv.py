"""examples/recognize_digits_conv.py (issue 10 item 6) runs as a user runs it, in a fresh
Python: the per-epoch test evaluation through the cloned inference program, then the saved and
reloaded inference model classifying held-out digits. Two epochs keep it quick; the full run is
`nestflow demo --model conv` (tests/cli/test_demo_conv.py)."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "recognize_digits_conv.py"


def test_recognize_digits_conv_script_trains_evaluates_and_reloads():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "2"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    epochs = re.findall(
        r"^epoch +(\d+): test loss ([\d.]+), test accuracy ([\d.]+)%", done.stdout, re.M
    )
    assert [int(e) for e, _, _ in epochs] == [1, 2]
    assert float(epochs[1][1]) < float(epochs[0][1])  # the test loss falls
    assert float(epochs[1][2]) >= 95.0
    assert "and reloaded" in done.stdout
    line = re.search(r"predicted (\[.*?\]), labels (\[.*?\])", done.stdout)
    predicted, labels = ast.literal_eval(line.group(1)), ast.literal_eval(line.group(2))
    assert len(predicted) == len(labels) == 8
    assert sum(p == t for p, t in zip(predicted, labels)) >= 7
