"""The process's malloc keeps freed memory for the next train step (nestflow.core.memory): with
glibc, arrays freed and allocated again reuse their pages instead of faulting in new ones;
NESTFLOW_KEEP_FREED_MEMORY=0 or the user's own glibc settings leave malloc alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
pytestmark = pytest.mark.skipif(not GLIBC, reason="the tuning is for glibc's malloc")

# A fresh process: make an Executor (which tunes malloc), then run "steps" that fill ten 4 MB
# arrays, all alive at once as a step's activations are, and free them; prints whether malloc
# was tuned and the minor page faults per step after warm-up (a step touches 10,240 pages).
_CHILD = """
import json, resource
import numpy as np
import nestflow as nf
from nestflow.core.memory import keep_freed_memory
nf.Executor()
def step():
    alive = [np.ones(1 << 20, np.float32) for _ in range(10)]
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
print(json.dumps({"tuned": keep_freed_memory(), "faults": faults}))
"""


def _child(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("NESTFLOW_KEEP_FREED_MEMORY", None)
    clean.pop("GLIBC_TUNABLES", None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _transparent_huge_pages_always() -> bool:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[always]" in text


def test_an_executor_makes_freed_arrays_reuse_their_pages():
    tuned = _child()
    assert tuned["tuned"] is True
    assert tuned["faults"] < 100  # of the step's 10,240 pages, none faulted in anew
    untuned = _child(NESTFLOW_KEEP_FREED_MEMORY="0")
    assert untuned["tuned"] is False
    if not _transparent_huge_pages_always():  # with huge pages a fault maps 512 pages
        assert untuned["faults"] > 1000  # 5,098 of 10,240 on glibc 2.36


@pytest.mark.parametrize(
    "variable, value",
    [
        ("MALLOC_TRIM_THRESHOLD_", str(64 << 20)),
        ("MALLOC_MMAP_THRESHOLD_", str(64 << 20)),
        ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576"),
    ],
)
def test_the_users_own_glibc_settings_win(variable, value):
    assert _child(**{variable: value})["tuned"] is False
