import numpy as np
import pytest

import nestflow as nf


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
    """The count of op types the op harness ran on the device places (DESIGN Places: every
    registered op runs on the stand-in device equal to CPUPlace)."""
    import sys

    harness = sys.modules.get("tests.ops.harness")
    if harness is None or not harness.DEVICE_CHECKED:
        return
    from nestflow.ops.registry import registered_ops

    ops = registered_ops()
    run = sorted(harness.DEVICE_CHECKED & set(ops))
    left = sorted(set(ops) - harness.DEVICE_CHECKED)
    places = ", ".join(map(repr, harness.DEVICE_PLACES))
    terminalreporter.write_line(
        f"op harness on {places}: {len(run)} of {len(ops)} registered op types (gradient ops "
        f"included) ran equal to CPUPlace; not run there by a one-op case ({len(left)}): "
        + ", ".join(left)
    )
