"""The generated protobuf code is reproducible from framework.proto (`make proto`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import nestflow.framework

FRAMEWORK_DIR = Path(nestflow.framework.__file__).parent


@pytest.mark.parametrize("generated", ["framework_pb2.py", "framework_pb2.pyi"])
def test_generated_protobuf_code_is_not_stale(tmp_path, generated):
    """Regenerating from framework.proto gives exactly the committed file; if this fails, run
    `make proto` and commit the result."""
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed (pip install -e '.[proto]'), cannot regenerate")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{FRAMEWORK_DIR}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(FRAMEWORK_DIR / "framework.proto"),
        ],
        check=True,
        capture_output=True,
    )
    fresh = (tmp_path / generated).read_text()
    committed = (FRAMEWORK_DIR / generated).read_text()
    assert fresh == committed, f"{generated} is stale: run `make proto`"
