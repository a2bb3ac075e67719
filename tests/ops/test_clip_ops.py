"""clip_by_norm, clip_by_global_norm and sign, one op each (on CPUPlace and the stand-in
device); the training-level checks against torch are tests/optimizer/test_clip.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(11)


def _by_norm(X, max_norm):
    norm = np.sqrt(np.sum(X.astype(np.float64) ** 2))
    return {"Out": X if norm <= max_norm else (X * (max_norm / norm)).astype(X.dtype)}


def _by_global_norm(X, max_global_norm):
    total = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in X))
    scale = max_global_norm / max(total, max_global_norm)
    return {"Out": [(x * scale).astype(x.dtype) for x in X]}


X = R.standard_normal((3, 4))
CASES = [
    OpCase("clip_by_norm", {"X": X}, _by_norm, {"max_norm": 1.0}, id="by_norm-clipped"),
    OpCase("clip_by_norm", {"X": X}, _by_norm, {"max_norm": 100.0}, id="by_norm-kept"),
    OpCase(
        "clip_by_norm",
        {"X": X.astype(np.float32)},
        _by_norm,
        {"max_norm": 0.5},
        id="by_norm-float32",
    ),
    OpCase(
        "clip_by_norm", {"X": np.zeros((2, 0))}, _by_norm, {"max_norm": 1.0}, id="by_norm-empty"
    ),
    OpCase(
        "clip_by_global_norm",
        {"X": [X, R.standard_normal(5)]},
        _by_global_norm,
        {"max_global_norm": 1.0},
        id="by_global_norm-clipped",
    ),
    OpCase(
        "clip_by_global_norm",
        {"X": [X.astype(np.float32)]},
        _by_global_norm,
        {"max_global_norm": 50.0},
        id="by_global_norm-kept",
    ),
    OpCase("sign", {"X": np.array([-2.0, 0.0, 3.5, -0.0])}, lambda X: {"Out": np.sign(X)}),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()
