"""examples/machine_translation.py (issue 11 item 6b) runs as a user runs it, in a fresh Python:
training, beam-search and greedy decoding of typed strings, and the saved and reloaded inference
model decoding the same ids. One short epoch keeps it quick (the decodings are then not yet
right); the accuracy bar is checked by `nestflow demo --model translate`
(tests/cli/test_demo_translate.py)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "machine_translation.py"


def test_machine_translation_script_trains_decodes_and_reloads():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # small matrices: one BLAS thread is best
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "1", "320"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^training loss per epoch: [\d.]+$", done.stdout, re.M)
    lines = re.findall(r"^(\d+): greedy (\S*); beams (.*)$", done.stdout, re.M)
    assert [source for source, _, _ in lines] == ["123", "9876543210", "31415926", "271828182845"]
    for _, _, beams in lines:
        scores = [float(s) for s in re.findall(r"\((-?[\d.]+)\)", beams)]
        assert len(scores) == 4 and scores == sorted(scores, reverse=True)
    assert "saved and reloaded: decodes the same ids: True" in done.stdout
