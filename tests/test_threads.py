"""nf.set_num_threads / nf.get_num_threads (threadpoolctl), and the demos printing the count."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError

threadpoolctl = pytest.importorskip("threadpoolctl")


@pytest.fixture
def restore_threads():
    """The suite runs in one process: put every pool back as it was."""
    before = nf.get_num_threads()
    with threadpoolctl.threadpool_limits(limits=None):  # restores the limits on exit
        yield
    nf.device_context().num_threads = before


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]


def test_set_num_threads_limits_the_blas_pool(restore_threads):
    original = nf.get_num_threads()
    assert original == max(_blas_threads())
    nf.set_num_threads(1)
    assert nf.get_num_threads() == 1 and _blas_threads() == [1] * len(_blas_threads())
    a = np.arange(64.0).reshape(8, 8)
    np.testing.assert_allclose(a @ a, np.einsum("ij,jk->ik", a, a))  # BLAS still works
    nf.set_num_threads(np.int64(original))
    assert nf.get_num_threads() == original


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_bad_thread_counts_are_attr_errors(bad, restore_threads):
    before = nf.get_num_threads()
    with pytest.raises(AttrError, match="n must be an int >= 1"):
        nf.set_num_threads(bad)
    assert nf.get_num_threads() == before


_CHILD = """
import sys
import nestflow as nf
print("threadpoolctl" in sys.modules)
print(nf.get_num_threads())
"""


def test_omp_num_threads_is_seen_and_import_leaves_threadpoolctl_alone():
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    assert out == ["False", "1"]


def test_threads_summary_names_the_count_and_the_remedy(restore_threads):
    nf.set_num_threads(1)
    from nestflow.core.threads import threads_summary

    line = threads_summary()
    assert line.startswith("threads: 1 (") and "OMP_NUM_THREADS" in line


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--epochs", "1", "--limit", "100", "--min-accuracy", "0"],
        ["demo", "--model", "rnn", "--epochs", "1", "--limit", "40"],
    ],
)
def test_demos_print_the_blas_thread_count_first(args, tmp_path, capsys):
    from nestflow.cli.main import main

    main([*args, "--out", str(tmp_path / "m"), "--no-progress"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"threads: {nf.get_num_threads()} (")
