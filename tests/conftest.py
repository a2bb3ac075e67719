import os
import shutil
import tempfile

import numpy as np
import pytest

import nestflow as nf

# Tests and examples leave nothing in the temp folder (issue 33). The session gets a temp
# folder of its own (TMPDIR too, for the examples and workers run as subprocesses), so what
# other runs on a shared machine make there does not count; what is left in it when the
# session ends fails the run, and the folder is removed either way. pytest's own tmp_path
# folders stay where they were (PYTEST_DEBUG_TEMPROOT), kept and pruned by pytest.
_SESSION_TEMP: list[str] = []
# What other programs keep in TMPDIR: Open MPI's session folder (a job the launch tests kill
# on purpose cannot remove it), PyTorch's compile cache, and the session id file `.ses` that
# importing onnxruntime writes.
_THEIRS = ("ompi.", "torchinductor_", ".ses")


def pytest_configure(config):
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix="nestflow-test-session-")
    _SESSION_TEMP.append(folder)
    os.environ["TMPDIR"] = tempfile.tempdir = folder


def pytest_unconfigure(config):
    for folder in _SESSION_TEMP:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def temp_folder_left_clean():
    """Fails the session's last test (at its teardown) naming what the tests, examples and
    doctests left in the temp folder."""
    yield
    if not _SESSION_TEMP:
        return
    left = sorted(n for n in os.listdir(_SESSION_TEMP[0]) if not n.startswith(_THEIRS))
    if left:
        pytest.fail(
            f"the tests left {len(left)} entr{'y' if len(left) == 1 else 'ies'} in the temp "
            f"folder: {left} (remove what a test or example makes, e.g. with "
            "tempfile.TemporaryDirectory or pytest's tmp_path)"
        )


@pytest.fixture(autouse=True)
def fresh_programs():
    """Each test builds into its own default programs with names starting from 0."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        nf.seed(0)
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_terminal_summary(terminalreporter):
    """The count of python blocks of docs/ run and skipped (tests/test_docs_pages.py), and the
    count of op types the op harness ran on the device places (DESIGN Places: every
    registered op runs on the stand-in device equal to CPUPlace)."""
    import sys

    pages = sys.modules.get("tests.test_docs_pages")
    line = pages.summary_line() if pages is not None else None
    if line:
        terminalreporter.write_line(line)
    harness = sys.modules.get("tests.ops.harness")
    if harness is None or not harness.DEVICE_CHECKED:
        return
    from nestflow.ops.registry import registered_ops

    ops = registered_ops()
    run = sorted(harness.DEVICE_CHECKED & set(ops))
    left = sorted(set(ops) - harness.DEVICE_CHECKED)
    places = ", ".join(map(repr, harness.DEVICE_PLACES))
    # the ops left out are worth a list only when (nearly) every op test ran
    listed = ": " + ", ".join(left) if len(run) > len(ops) // 2 else ""
    terminalreporter.write_line(
        f"op harness on {places}: {len(run)} of {len(ops)} registered op types (gradient ops "
        f"included) ran equal to CPUPlace; not run there by a one-op case: {len(left)}{listed}"
    )
