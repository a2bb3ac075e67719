"""examples/understand_sentiment.py (issue 11 item 6a) runs as a user runs it, in a fresh
Python: training with the per-epoch evaluation through the cloned test program, then the saved
and reloaded inference model classifying held-out reviews. One epoch on 1,500 reviews keeps it
quick; the full run is `nestflow demo --model sentiment` (tests/cli/test_demo_sentiment.py)."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "understand_sentiment.py"


def test_understand_sentiment_script_trains_evaluates_and_reloads():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "1", "1500"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    epochs = re.findall(
        r"^epoch (\d+): test cost ([\d.]+), test accuracy ([\d.]+)%", done.stdout, re.M
    )
    assert [int(e) for e, _, _ in epochs] == [1]
    assert float(epochs[0][2]) >= 95.0
    assert "and reloaded" in done.stdout
    line = re.search(r"predicted (\[.*?\]), labels (\[.*?\])", done.stdout)
    predicted, labels = ast.literal_eval(line.group(1)), ast.literal_eval(line.group(2))
    assert len(predicted) == len(labels) == 8
    assert sum(p == t for p, t in zip(predicted, labels)) >= 7
