"""examples/transformer.py (issue 30 item 3) runs as a user runs it, in a fresh Python:
training with the per-epoch evaluation through the cloned test program, then the saved and
reloaded inference model classifying held-out sequences. The full run is `nestflow demo
--model transformer` (tests/cli/test_demo_transformer.py), which checks the accuracy; here 2
epochs on 1,000 sequences check that the script runs through, as quickly as it can."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "transformer.py"


def test_transformer_script_trains_evaluates_and_reloads():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "2", "1000"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    epochs = re.findall(
        r"^epoch (\d+): test cost ([\d.]+), test accuracy ([\d.]+)%", done.stdout, re.M
    )
    assert [int(e) for e, _, _ in epochs] == [1, 2]
    assert "and reloaded" in done.stdout
    line = re.search(r"predicted (\[.*?\]), labels (\[.*?\])", done.stdout)
    predicted, labels = ast.literal_eval(line.group(1)), ast.literal_eval(line.group(2))
    assert len(predicted) == len(labels) == 8
