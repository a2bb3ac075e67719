"""nf.io (safetensors, tempfile) is imported on first use, not by `import nestflow`."""

from __future__ import annotations

import subprocess
import sys

_CHECK = """
import sys
import nestflow as nf
print(sorted(m for m in ("nestflow.io", "safetensors", "tempfile") if m in sys.modules))
print(nf.io.save_params.__module__, "io" in dir(nf))
from nestflow import io
print(io is nf.io)
"""


def test_import_nestflow_leaves_io_until_it_is_used():
    out = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["[]", "nestflow.io.params True", "True"]
