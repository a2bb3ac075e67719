"""lstm_unit (Fluid 1.8's op: gates [i, f, o, g]) and gru_cell (PyTorch's GRU step) against
NumPy references: values, inferred shapes, float64 central-difference gradients, errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(5)


def normal(*shape, dtype="float64"):
    return R.standard_normal(shape).astype(dtype)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_unit_ref(X, C_prev, forget_bias=0.0):
    i, f, o, g = np.split(X, 4, axis=-1)
    c = C_prev * sigmoid(f + forget_bias) + sigmoid(i) * np.tanh(g)
    return {"C": c, "H": np.tanh(c) * sigmoid(o)}


def gru_cell_ref(X, HiddenProj, HiddenPrev, Bias=None):
    p = HiddenProj if Bias is None else HiddenProj + Bias
    x_r, x_z, x_n = np.split(X, 3, axis=-1)
    p_r, p_z, p_n = np.split(p, 3, axis=-1)
    r, z = sigmoid(x_r + p_r), sigmoid(x_z + p_z)
    n = np.tanh(x_n + r * p_n)
    return {"Hidden": (1 - z) * n + z * HiddenPrev}


CASES = [
    OpCase("lstm_unit", {"X": normal(5, 16), "C_prev": normal(5, 4)}, lstm_unit_ref,
           grad=("X", "C_prev"), id="lstm_unit-fluid_shape"),
    OpCase("lstm_unit", {"X": normal(3, 8), "C_prev": normal(3, 2)}, lstm_unit_ref,
           attrs={"forget_bias": 1.0}, grad=("X", "C_prev"), id="lstm_unit-forget_bias"),
    OpCase("lstm_unit", {"X": normal(2, 3, 12), "C_prev": normal(2, 3, 3)}, lstm_unit_ref,
           attrs={"forget_bias": -0.5}, grad=("X", "C_prev"), id="lstm_unit-3d"),
    OpCase("lstm_unit", {"X": normal(1, 4), "C_prev": normal(1, 1)}, lstm_unit_ref,
           grad=("X", "C_prev"), id="lstm_unit-size1"),
    OpCase("lstm_unit", {"X": normal(0, 8), "C_prev": normal(0, 2)}, lstm_unit_ref,
           grad=("X", "C_prev"), id="lstm_unit-empty_batch"),
    OpCase("lstm_unit", {"X": normal(4, 20, dtype="float32"), "C_prev": normal(4, 5, dtype="float32")},
           lstm_unit_ref, id="lstm_unit-float32", atol=1e-6),
    OpCase("lstm_unit", {"X": normal(3, 8) * 30, "C_prev": normal(3, 2)}, lstm_unit_ref,
           id="lstm_unit-saturated"),
    OpCase("gru_cell", {"X": normal(4, 9), "HiddenProj": normal(4, 9), "HiddenPrev": normal(4, 3),
                        "Bias": normal(9)}, gru_cell_ref,
           grad=("X", "HiddenProj", "HiddenPrev", "Bias"), id="gru_cell-bias"),
    OpCase("gru_cell", {"X": normal(2, 6), "HiddenProj": normal(2, 6), "HiddenPrev": normal(2, 2)},
           gru_cell_ref, grad=("X", "HiddenProj", "HiddenPrev"), id="gru_cell-no_bias"),
    OpCase("gru_cell", {"X": normal(2, 3, 6), "HiddenProj": normal(2, 3, 6),
                        "HiddenPrev": normal(2, 3, 2), "Bias": normal(6)}, gru_cell_ref,
           grad=("X", "HiddenProj", "HiddenPrev", "Bias"), id="gru_cell-3d"),
    OpCase("gru_cell", {"X": normal(1, 3), "HiddenProj": normal(1, 3), "HiddenPrev": normal(1, 1)},
           gru_cell_ref, grad=("X", "HiddenPrev"), id="gru_cell-size1-some_grads"),
    OpCase("gru_cell", {"X": normal(0, 6), "HiddenProj": normal(0, 6), "HiddenPrev": normal(0, 2),
                        "Bias": normal(6)}, gru_cell_ref, grad=("X", "Bias"),
           id="gru_cell-empty_batch"),
    OpCase("gru_cell", {"X": normal(3, 12, dtype="float32"), "HiddenProj": normal(3, 12, dtype="float32"),
                        "HiddenPrev": normal(3, 4, dtype="float32")}, gru_cell_ref,
           id="gru_cell-float32", atol=1e-6),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


def test_lstm_unit_gradient_of_h_alone_and_of_c_alone():
    """Each output's gradient on its own (the other's slot absent), against NumPy's chain."""
    x, c_prev = normal(3, 8), normal(3, 2)
    for fetched in ("H", "C"):
        main = nf.Program()
        with nf.program_guard(main, nf.Program()):
            xv = nf.data("x", [3, 8], "float64", stop_gradient=False)
            cv = nf.data("c", [3, 2], "float64", stop_gradient=False)
            c, h = nf.layers.helper.append_op(
                "lstm_unit", {"X": xv, "C_prev": cv}, outputs=("C", "H")
            )
            nf.append_backward(nf.layers.reduce_sum({"H": h, "C": c}[fetched]))
        got = nf.Executor().run(main, feed={"x": x, "c": c_prev}, fetch_list=["x@GRAD", "c@GRAD"])
        eps = 1e-6
        for value, analytic in zip((x, c_prev), got):
            numeric = np.zeros_like(value)
            for index in np.ndindex(value.shape):
                moved = []
                for sign in (1, -1):
                    shifted = value.copy()
                    shifted[index] += sign * eps
                    args = (shifted, c_prev) if value is x else (x, shifted)
                    moved.append(lstm_unit_ref(*args)[fetched].sum())
                numeric[index] = (moved[0] - moved[1]) / (2 * eps)
            np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


def _append(op_type, feeds, outputs):
    block = nf.Program().global_block()
    inputs = {
        slot: [block.create_var(f"in_{slot}", shape, dtype)]
        for slot, (shape, dtype) in feeds.items()
    }
    block.append_op(op_type, inputs, {s: [block.create_var(f"out_{s}")] for s in outputs})


def test_build_time_errors_name_the_shapes():
    with pytest.raises(ShapeError, match=r"X \[3, 10\]: its last dim holds 4 gates"):
        _append("lstm_unit", {"X": ([3, 10], "float64"), "C_prev": ([3, 2], "float64")}, "CH")
    with pytest.raises(ShapeError, match=r"must have 4 \* 3 columns"):
        _append("lstm_unit", {"X": ([3, 8], "float64"), "C_prev": ([3, 3], "float64")}, "CH")
    with pytest.raises(DTypeError, match="one floating-point dtype"):
        _append("lstm_unit", {"X": ([3, 8], "float32"), "C_prev": ([3, 2], "float64")}, "CH")
    with pytest.raises(ShapeError, match=r"HiddenProj \[3, 8\] must have 3 \* 2 columns"):
        _append(
            "gru_cell",
            {"X": ([3, 6], "float64"), "HiddenProj": ([3, 8], "float64"),
             "HiddenPrev": ([3, 2], "float64")},
            ("Hidden",),
        )  # fmt: skip
    with pytest.raises(ShapeError, match=r"Bias \[5\] must be \[6\]"):
        _append(
            "gru_cell",
            {"X": ([3, 6], "float64"), "HiddenProj": ([3, 6], "float64"),
             "HiddenPrev": ([3, 2], "float64"), "Bias": ([5], "float64")},
            ("Hidden",),
        )  # fmt: skip
