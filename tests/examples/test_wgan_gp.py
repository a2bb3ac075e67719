"""examples/wgan_gp.py (issue 31) runs as a user runs it, in a fresh Python: 60 generator
steps (300 critic steps) of WGAN-GP on the 8-Gaussian ring; the critic's gradient norm at the
interpolates, printed as it trains, ends within 0.25 of 1."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "wgan_gp.py"


def test_wgan_gp_script_drives_the_critic_gradient_norm_to_one():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "60"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    norms = [float(v) for v in re.findall(r"gradient norm at interpolates ([\d.]+)", done.stdout)]
    assert len(norms) >= 5, done.stdout
    assert norms[0] < 0.8, done.stdout  # far from 1 at the start
    assert abs(norms[-1] - 1.0) < 0.25, done.stdout
