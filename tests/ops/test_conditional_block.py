"""select_input / select_output (the ops nf.layers.cond merges its branches with) against NumPy,
with float64 central-difference gradients; conditional_block itself is checked through
nf.layers.cond in tests/layers/test_cond.py."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import ControlFlowError, DTypeError, ShapeError
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(11)


def normal(*shape):
    return R.standard_normal(shape)


def mask(index, dtype="int32"):
    return np.array([index], dtype)


def select_input_ref(X, Mask):
    return {"Out": X[int(Mask[0])]}


def select_output_ref(X, Mask, count):
    return {"Out": [X if i == int(Mask[0]) else np.zeros_like(X) for i in range(count)]}


CASES = [
    OpCase("select_input", {"X": [normal(3, 2), normal(3, 2)], "Mask": mask(0)},
           select_input_ref, grad=("X",), id="select_input-first"),
    OpCase("select_input", {"X": [normal(3, 2), normal(3, 2), normal(3, 2)], "Mask": mask(2)},
           select_input_ref, grad=("X",), id="select_input-third_of_three"),
    OpCase("select_input", {"X": [normal(1), normal(1)], "Mask": mask(1, "int64")},
           select_input_ref, grad=("X",), id="select_input-size1_int64_mask"),
    OpCase("select_input", {"X": [normal(0, 4), normal(0, 4)], "Mask": mask(1)},
           select_input_ref, grad=("X",), id="select_input-empty_batch"),
    OpCase("select_input", {"X": [np.arange(4), np.arange(4) * 2], "Mask": mask(1)},
           select_input_ref, id="select_input-int64_values"),
    OpCase("select_output", {"X": normal(2, 3), "Mask": mask(1)},
           lambda X, Mask: select_output_ref(X, Mask, 2), grad=("X",), id="select_output-second"),
    OpCase("select_output", {"X": normal(5), "Mask": mask(0)},
           lambda X, Mask: select_output_ref(X, Mask, 3), grad=("X",), id="select_output-of_three"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_select_ops(case):
    case.check()


def test_select_output_then_select_input_round_trip_with_gradients(rng):
    """Fluid's test: x routed to one of several outputs by the mask and picked back."""
    L = nf.layers
    program = nf.default_main_program()
    block = program.global_block()
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    which = L.data("mask", [1], "int32")
    outs = [block.create_var(f"branch_{i}", dtype="float64") for i in range(4)]
    block.append_op("select_output", {"X": [x], "Mask": [which]}, {"Out": outs})
    y = block.create_var("y")
    block.append_op("select_input", {"X": outs, "Mask": [which]}, {"Out": [y]})
    loss = L.mean(y)
    nf.append_backward(loss)
    exe = nf.Executor()
    xs = rng.normal(size=(3, 2))
    for index in range(4):
        got, grad = exe.run(
            feed={"x": xs, "mask": mask(index)}, fetch_list=[y, "x@GRAD"], scope=nf.Scope()
        )
        np.testing.assert_array_equal(got, xs)
        np.testing.assert_allclose(grad, np.full_like(xs, 1 / xs.size))


def test_bad_masks_and_values_are_errors():
    L = nf.layers
    block = nf.default_main_program().global_block()
    a = L.data("a", [-1, 2], "float32")
    b = L.data("b", [-1, 2], "int64")
    c = L.data("c", [-1, 2, 1], "float32")
    m = L.data("m", [1], "int32")
    fm = L.data("fm", [1], "float32")
    many = L.data("many", [2], "int32")
    out = block.create_var("out")
    with pytest.raises(DTypeError, match=r"different dtypes \['float32', 'int64'\]"):
        block.append_op("select_input", {"X": [a, b], "Mask": [m]}, {"Out": [out]})
    with pytest.raises(ShapeError, match="different ranks"):
        block.append_op("select_input", {"X": [a, c], "Mask": [m]}, {"Out": [out]})
    with pytest.raises(DTypeError, match="Mask must be an integer"):
        block.append_op("select_input", {"X": [a, a], "Mask": [fm]}, {"Out": [out]})
    with pytest.raises(ShapeError, match=r"Mask must hold one integer \(shape \[1\]\), got \[2\]"):
        block.append_op("select_input", {"X": [a, a], "Mask": [many]}, {"Out": [out]})
    block.append_op("select_input", {"X": [a, a], "Mask": [m]}, {"Out": [out]})
    exe = nf.Executor()
    feed = {"a": np.ones((1, 2), np.float32), "m": mask(2)}
    with pytest.raises(ControlFlowError, match="Mask is 2, but there are 2 branches"):
        exe.run(feed=feed, fetch_list=[out], scope=nf.Scope())
