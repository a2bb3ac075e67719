"""nf.set_flags / nf.get_flags (issue 32 item 8): the check_nan_inf flag turns the executor's
NaN/Inf check on for every executor that was not told otherwise."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, NanInfError


@pytest.fixture(autouse=True)
def flags_restored():
    yield
    nf.set_flags({"check_nan_inf": False})


def _program():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 2])
        out = nf.layers.mean(nf.layers.sqrt(x))  # NaN for a negative x
    return main, out


def test_the_flag_checks_every_executor_not_told_otherwise():
    main, out = _program()
    feed = {"x": np.array([[-1.0, 4.0]], "float32")}
    exe = nf.Executor()
    with np.errstate(invalid="ignore"):
        assert np.isnan(exe.run(main, feed=feed, fetch_list=[out])[0])
        nf.set_flags({"FLAGS_check_nan_inf": True})
        assert exe.check_nan_inf and nf.get_flags("check_nan_inf") == {"check_nan_inf": True}
        with pytest.raises(NanInfError, match=r"op 'sqrt'(.|\n)*test_flags.py:\d+ in _program"):
            exe.run(main, feed=feed, fetch_list=[out])
        # An executor or a run told False explicitly stays unchecked.
        assert np.isnan(nf.Executor(check_nan_inf=False).run(main, feed=feed, fetch_list=[out])[0])
        assert np.isnan(exe.run(main, feed=feed, fetch_list=[out], check_nan_inf=False)[0])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: nf.set_flags({"check_nan": True}), "unknown flag 'check_nan'.*check_nan_inf"),
        (lambda: nf.set_flags({"check_nan_inf": 1}), "must be True or False, got 1"),
        (lambda: nf.set_flags(["check_nan_inf"]), "takes a dict"),
        (lambda: nf.get_flags("FLAGS_nope"), "unknown flag 'FLAGS_nope'"),
        (lambda: nf.get_flags(3), "a flag name or a list"),
    ],
)
def test_bad_flags_are_attr_errors(call, message):
    with pytest.raises(AttrError, match=message):
        call()
    assert nf.get_flags("check_nan_inf") == {"check_nan_inf": False}
