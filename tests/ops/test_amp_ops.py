"""check_finite_and_unscale and update_loss_scaling (nf.amp's ops) through the op harness:
NumPy references, edge shapes (no gradients, an empty gradient, one element, odd sizes),
inf and NaN, float16 and bfloat16 gradients; neither op has a gradient."""

from __future__ import annotations

import numpy as np
import pytest

from nestflow.core.dtype import BFLOAT16
from nestflow.errors import AttrError, DTypeError
from nestflow.framework.program import Program
from nestflow.ops.registry import get_op_def
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(5)


def grads(*shapes, dtype="float32"):
    return [R.standard_normal(s).astype(dtype) for s in shapes]


def _unscale_ref(X, Scale):
    found = any(not np.isfinite(x.astype(np.float64)).all() for x in X)
    outs = [(x.astype(np.float64) / float(Scale.reshape(-1)[0])).astype(x.dtype) for x in X]
    return {"Out": outs, "FoundInfinite": np.array([found])}


def _with(values, where, value):
    values = [v.copy() for v in values]
    values[0].reshape(-1)[where] = value
    return values


SCALE = np.array([1024.0], "float32")

UNSCALE_CASES = [
    OpCase(
        "check_finite_and_unscale",
        {"X": grads((3, 5), (7,)), "Scale": SCALE},
        _unscale_ref,
        id="unscale-clean",
    ),
    OpCase(
        "check_finite_and_unscale",
        {"X": _with(grads((3, 5), (1,)), 4, np.inf), "Scale": SCALE},
        _unscale_ref,
        outputs=("FoundInfinite",),
        id="unscale-inf",
    ),
    OpCase(
        "check_finite_and_unscale",
        {"X": _with(grads((1,), (0, 3)), 0, np.nan), "Scale": SCALE},
        _unscale_ref,
        outputs=("FoundInfinite",),
        id="unscale-nan-and-empty",
    ),
    OpCase(
        "check_finite_and_unscale",
        {"X": grads((0, 4)), "Scale": SCALE},
        _unscale_ref,
        id="unscale-empty",
    ),
    OpCase(
        "check_finite_and_unscale",
        {"X": grads((5, 3), dtype="float16"), "Scale": SCALE},
        _unscale_ref,
        atol=1e-3,
        rtol=1e-3,
        id="unscale-float16",
    ),
    OpCase(
        "check_finite_and_unscale",
        {"X": grads((3, 1), dtype=BFLOAT16), "Scale": SCALE},
        lambda X, Scale: {"FoundInfinite": _unscale_ref(X, Scale)["FoundInfinite"]},
        id="unscale-bfloat16",
    ),
]


def _update_ref(X, FoundInfinite, PrevLossScaling, InGoodSteps, InBadSteps, **attrs):
    found = bool(FoundInfinite[0])
    scale, good, bad = float(PrevLossScaling[0]), int(InGoodSteps[0]), int(InBadSteps[0])
    if found:
        good, bad = 0, bad + 1
        if bad == attrs["decr_every_n_nan_or_inf"]:
            scale, bad = max(scale * attrs["decr_ratio"], 1.0), 0
    else:
        good, bad = good + 1, 0
        if good == attrs["incr_every_n_steps"]:
            raised = np.float32(scale) * np.float32(attrs["incr_ratio"])
            scale, good = (float(raised) if np.isfinite(raised) else scale), 0
    return {
        "Out": [np.zeros_like(x) if found else x for x in X],
        "LossScaling": np.array([scale], "float32"),
        "OutGoodSteps": np.array([good], "int32"),
        "OutBadSteps": np.array([bad], "int32"),
    }


def _update(found, scale, good, bad, shapes=((2, 3), (5,)), **attrs):
    attrs = {
        "incr_every_n_steps": 3,
        "decr_every_n_nan_or_inf": 2,
        "incr_ratio": 2.0,
        "decr_ratio": 0.5,
    } | attrs
    inputs = {
        "X": grads(*shapes),
        "FoundInfinite": np.array([found]),
        "PrevLossScaling": np.array([scale], "float32"),
        "InGoodSteps": np.array([good], "int32"),
        "InBadSteps": np.array([bad], "int32"),
    }
    tag = f"update-{'bad' if found else 'good'}-{scale:g}-{good}-{bad}-{len(shapes)}"
    return OpCase("update_loss_scaling", inputs, _update_ref, attrs, id=tag)


UPDATE_CASES = [
    _update(False, 1024.0, 0, 0),  # a clean step counts
    _update(False, 1024.0, 2, 0),  # the third clean step raises the scale
    _update(True, 1024.0, 5, 0),  # a first bad step counts
    _update(True, 1024.0, 0, 1),  # the second lowers the scale
    _update(True, 1.5, 0, 1),  # never below 1
    _update(False, 3e38, 2, 0),  # a raise to inf keeps the scale
    _update(True, 8.0, 0, 0, shapes=((0, 2), (1,)), decr_every_n_nan_or_inf=1),
    _update(False, 8.0, 0, 0, shapes=(), incr_every_n_steps=1),
]


@pytest.mark.parametrize("case", UNSCALE_CASES + UPDATE_CASES, ids=case_id)
def test_amp_op(case):
    case.check()


def test_the_amp_ops_have_no_gradient():
    for op in ("check_finite_and_unscale", "update_loss_scaling"):
        assert not get_op_def(op).has_gradient


def test_stop_update_keeps_the_scale_and_counters():
    case = _update(True, 64.0, 0, 1, stop_update=True)
    case.reference = lambda X, FoundInfinite, PrevLossScaling, InGoodSteps, InBadSteps, **a: {
        "Out": [np.zeros_like(x) for x in X],
        "LossScaling": PrevLossScaling,
        "OutGoodSteps": InGoodSteps,
        "OutBadSteps": InBadSteps,
    }
    case.check()


def _append(op_type, dtypes, attrs=None):
    block = Program().global_block()
    names = {}
    for slot, (shape, dtype) in dtypes.items():
        block.create_var(slot.lower(), shape, dtype)
        names[slot] = [slot.lower()]
    outs = {"Out": ["out"], "FoundInfinite": ["found"]}
    if op_type == "update_loss_scaling":
        outs = {"Out": ["out"], "LossScaling": ["s"], "OutGoodSteps": ["g"], "OutBadSteps": ["b"]}
    block.append_op(op_type, names, outs, attrs or {})


def test_bad_inputs_name_the_op_and_the_variable():
    with pytest.raises(DTypeError, match="check_finite_and_unscale") as info:
        _append("check_finite_and_unscale", {"X": ([3], "int32"), "Scale": ([1], "float32")})
    assert "X[0]" in str(info.value)
    update = {
        "X": ([3], "float32"),
        "FoundInfinite": ([1], "bool"),
        "PrevLossScaling": ([1], "float32"),
        "InGoodSteps": ([1], "int64"),
        "InBadSteps": ([1], "int32"),
    }
    with pytest.raises(DTypeError, match="InGoodSteps must be int32"):
        _append("update_loss_scaling", update)
    update["InGoodSteps"] = ([1], "int32")
    with pytest.raises(AttrError, match="decr_ratio"):
        _append("update_loss_scaling", update, {"decr_ratio": 1.5})
