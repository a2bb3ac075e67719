"""Comparison and logical ops: NumPy-reference cases with broadcasting, shape inference, errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from nestflow.ops.registry import get_op_def

L = nf.layers


def test_comparison_with_a_number_runs_the_seed_condition():
    """Seed 002: larger_than(x, 15) on the minibatch [10, 20, 30]."""
    x = nf.minibatch([10, 20, 30])
    cond = L.greater_than(x, 15)
    assert cond.dtype == "bool" and cond.shape == x.shape
    (value,) = nf.Executor().run(fetch_list=[cond], scope=nf.Scope())
    np.testing.assert_array_equal(value.ravel(), [False, True, True])


def test_comparison_infers_broadcast_shapes():
    x = L.data("x", [-1, 3, 4], "float32")
    assert L.less_than(x, L.data("y", [4], "float32")).shape == (-1, 3, 4)
    assert L.equal(x, L.data("z", [-1, 1, 4], "float32")).shape == (-1, 3, 4)
    assert L.logical_and(L.data("a", [2, 1], "bool"), L.data("b", [3], "bool")).shape == (2, 3)


def test_comparison_shape_mismatch_names_the_op_and_both_shapes():
    x, y = L.data("x", [2, 3], "float32"), L.data("y", [4], "float32")
    with pytest.raises(ShapeError) as info:
        L.greater_than(x, y)
    for fragment in ("op 'greater_than'", "[2, 3]", "[4]"):
        assert fragment in str(info.value)


def test_comparison_dtype_mismatch_is_a_dtype_error():
    x, y = L.data("x", [2], "float32"), L.data("y", [2], "int64")
    with pytest.raises(DTypeError, match="X is float32 but Y is int64"):
        L.equal(x, y)


def test_comparison_axis_past_the_end_of_x():
    x, y = L.data("x", [2, 3], "float32"), L.data("y", [3], "float32")
    block = nf.default_main_program().global_block()
    block.create_var("o")
    with pytest.raises(ShapeError, match=r"axis=2 puts Y \[3\] past the end of X \[2, 3\]"):
        block.append_op("less_equal", {"X": [x], "Y": [y]}, {"Out": ["o"]}, {"axis": 2})


def test_logic_ops_have_no_gradient():
    for op_type in ("greater_than", "less_than", "equal", "not_equal", "logical_not"):
        assert not get_op_def(op_type).has_gradient
