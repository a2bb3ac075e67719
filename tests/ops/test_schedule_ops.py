"""The learning-rate schedule ops and rnn_memory_boot one at a time against their formulas
(tests/ops/harness.py: on CPUPlace and on the device places), at steps on either side of each
schedule's turning points."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.ops.harness import OpCase, case_id


def step(value, dtype="int64"):
    return np.array([value], dtype)


def rate(value):
    return {"Out": np.array([value], "float32")}


def _decay(kind, n, lr=0.5, steps=4.0, decay=0.8, staircase=False, base=None):
    ratio = n / steps
    ratio = math.floor(ratio) if staircase else ratio
    lr = lr if base is None else base
    return {
        "exponential_decay": lr * decay**ratio,
        "natural_exp_decay": lr * math.exp(-decay * ratio),
        "inverse_time_decay": lr / (1.0 + decay * ratio),
    }[kind]


DECAY_CASES = [
    OpCase(
        kind,
        {"Step": step(n)}
        if base is None
        else {"Step": step(n), "LearningRate": step(base, "float32")},
        lambda Step, kind=kind, n=n, staircase=staircase, base=base, **_: rate(
            _decay(kind, n, staircase=staircase, base=None if base is None else np.float32(base))
        ),
        attrs={"learning_rate": 0.5, "decay_steps": 4.0, "decay_rate": 0.8, "staircase": staircase},
        id=f"{kind}-{n}-{'stair' if staircase else 'smooth'}{'' if base is None else '-tensor'}",
    )
    for kind in ("exponential_decay", "natural_exp_decay", "inverse_time_decay")
    for n, staircase, base in (
        (0, False, None),
        (6, True, None),
        (6, False, None),
        (3, False, 0.25),
    )
]

OTHER_CASES = (
    [
        OpCase(
            "polynomial_decay",
            {"Step": step(n)},
            lambda Step, n=n, cycle=cycle, **_: rate(
                (0.5 - 0.01)
                * (
                    1.0
                    - (min(n, 4.0) if not cycle else n)
                    / (4.0 if not cycle else 4.0 * (math.ceil(n / 4.0) if n > 0 else 1.0))
                )
                ** 2.0
                + 0.01
            ),
            attrs={
                "learning_rate": 0.5,
                "decay_steps": 4.0,
                "end_learning_rate": 0.01,
                "power": 2.0,
                "cycle": cycle,
            },
            id=f"polynomial_decay-{n}-{'cycle' if cycle else 'once'}",
        )
        for n, cycle in ((0, False), (3, False), (9, False), (9, True))
    ]
    + [
        OpCase(
            "piecewise_decay",
            {"Step": step(n)},
            lambda Step, value=value, **_: rate(value),
            attrs={"boundaries": [2, 5], "values": [1.0, 0.5, 0.1]},
            id=f"piecewise_decay-{n}",
        )
        for n, value in ((0, 1.0), (2, 0.5), (4, 0.5), (5, 0.1))
    ]
    + [
        OpCase(
            "cosine_decay",
            {"Step": step(n)},
            lambda Step, n=n, **_: rate(
                0.5 * 0.5 * (math.cos(math.floor(n / 3.0) * math.pi / 5.0) + 1)
            ),
            attrs={"learning_rate": 0.5, "step_each_epoch": 3.0, "epochs": 5.0},
            id=f"cosine_decay-{n}",
        )
        for n in (0, 4, 14)
    ]
    + [
        OpCase(
            "noam_decay",
            {"Step": step(n)},
            lambda Step, n=n, **_: rate(
                2.0 * 16.0**-0.5 * min((n + 1.0) ** -0.5, 3.0**-1.5 * (n + 1.0))
            ),
            attrs={"d_model": 16.0, "warmup_steps": 3.0, "learning_rate": 2.0},
            id=f"noam_decay-{n}",
        )
        for n in (0, 2, 10)
    ]
    + [
        OpCase(
            "linear_lr_warmup",
            {"Step": step(n)},
            lambda Step, n=n, **_: rate(0.0 + (0.4 - 0.0) * n / 4.0 if n < 4 else 0.3),
            attrs={"learning_rate": 0.3, "warmup_steps": 4.0, "start_lr": 0.0, "end_lr": 0.4},
            id=f"linear_lr_warmup-{n}",
        )
        for n in (0, 2, 4, 7)
    ]
    + [
        OpCase(
            "rnn_memory_boot",
            {"Ref": np.zeros((batch, 3), "float32")},
            lambda Ref, shape, value, dtype: {"Out": np.full((Ref.shape[0], *shape), value, dtype)},
            attrs={"shape": [2, 5], "value": 0.5, "dtype": "float64"},
            id=f"rnn_memory_boot-batch{batch}",
        )
        for batch in (0, 1, 3)
    ]
)


@pytest.mark.parametrize("case", DECAY_CASES + OTHER_CASES, ids=case_id)
def test_op(case):
    case.check()
