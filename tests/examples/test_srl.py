"""examples/srl.py (issue 30 item 3) runs as a user runs it, in a fresh Python: training with
the per-epoch chunk_eval scoring through the cloned test program, then the saved and reloaded
decoder tagging held-out sentences. The full run is `nestflow demo --model srl`
(tests/cli/test_demo_srl.py), which checks the F1; here 1 epoch on 600 sentences checks that
the script runs through, as quickly as it can."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "srl.py"


def test_srl_script_trains_scores_and_reloads():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "1", "600"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    epochs = re.findall(
        r"^epoch (\d+): cost ([\d.]+), held-out precision ([\d.]+), recall ([\d.]+), "
        r"F1 ([\d.]+)$",
        done.stdout,
        re.M,
    )
    assert [int(e[0]) for e in epochs] == [0]
    assert all(0.0 <= float(v) <= 1.0 for v in epochs[0][2:])
    decoded = re.findall(r"^decoded (\[.*\])$", done.stdout, re.M)
    labels = re.findall(r"^labels  (\[.*\])$", done.stdout, re.M)
    assert len(decoded) == len(labels) == 3
    for path, tags in zip(decoded, labels):
        assert len(ast.literal_eval(path)) == len(ast.literal_eval(tags))
