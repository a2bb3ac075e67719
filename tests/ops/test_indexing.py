"""Indexing and shape ops against NumPy (and PyTorch where it has the op): forward values,
inferred shapes, float64 central-difference gradients, build- and run-time errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from tests.ops.harness import OpCase, case_id

L = nf.layers
R = np.random.default_rng(2024)


def normal(*shape, dtype="float64"):
    return R.standard_normal(shape).astype(dtype)


def mask(*shape):
    return R.random(shape) < 0.5


# ---- where ----


def where_ref(Condition, X, Y):
    return {"Out": np.where(Condition, X, Y)}


WHERE_CASES = [
    OpCase("where", {"Condition": mask(3, 4), "X": normal(3, 4), "Y": normal(3, 4)}, where_ref,
           grad=("X", "Y"), id="where-same_shape"),
    OpCase("where", {"Condition": mask(2, 3, 5), "X": normal(3, 1), "Y": normal(5)}, where_ref,
           grad=("X", "Y"), id="where-broadcast_xy"),
    OpCase("where", {"Condition": mask(1, 5), "X": normal(4, 5), "Y": normal(4, 5)}, where_ref,
           grad=("X", "Y"), id="where-broadcast_condition"),
    OpCase("where", {"Condition": mask(0, 3), "X": normal(0, 3), "Y": normal(0, 3)}, where_ref,
           grad=("X", "Y"), id="where-empty_batch"),
    OpCase("where", {"Condition": np.array(True), "X": np.array(1.5), "Y": np.array(-2.0)},
           where_ref, grad=("X", "Y"), id="where-0d"),
    OpCase("where", {"Condition": mask(1), "X": normal(1), "Y": normal(1)}, where_ref,
           grad=("X", "Y"), id="where-size1"),
    OpCase("where", {"Condition": mask(7), "X": R.integers(0, 9, 7), "Y": R.integers(0, 9, 7)},
           where_ref, id="where-int64"),
    OpCase("where", {"Condition": mask(4), "X": normal(4, dtype="float32"),
                     "Y": normal(4, dtype="float32")}, where_ref, id="where-float32"),
    OpCase("where_index", {"Condition": mask(3, 4)},
           lambda Condition: {"Out": np.argwhere(Condition).astype(np.int64)}, id="where_index"),
    OpCase("where_index", {"Condition": np.zeros((2, 0), bool)},
           lambda Condition: {"Out": np.zeros((0, 2), np.int64)}, id="where_index-empty"),
]  # fmt: skip


@pytest.mark.parametrize("case", WHERE_CASES, ids=case_id)
def test_where_ops(case):
    case.check()


def test_where_needs_bool_condition_and_matching_dtypes():
    x = L.data("x", [2, 3], "float32")
    with pytest.raises(DTypeError, match="Condition must be bool, got float32"):
        nf.default_main_program().global_block().append_op(
            "where", {"Condition": x, "X": x, "Y": x}, {"Out": x}
        )
    c = L.data("c", [2, 3], "bool")
    y = L.data("y", [2, 3], "float64")
    with pytest.raises(DTypeError, match="X is float32 but Y is float64"):
        L.where(c, x, y)


def test_where_shapes_that_do_not_broadcast_name_both():
    c = L.data("c", [2, 3], "bool")
    x, y = L.data("x", [2, 3], "float32"), L.data("y", [4], "float32")
    with pytest.raises(ShapeError, match=r"\[2, 3\] and \[4\]"):
        L.where(c, x, y)
