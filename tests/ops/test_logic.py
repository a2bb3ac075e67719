"""Comparison and logical ops: NumPy-reference cases with broadcasting, shape inference, errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from nestflow.ops.registry import get_op_def
from tests.ops.harness import OpCase, case_id

L = nf.layers

R = np.random.default_rng(3)


def ints(*shape):
    return R.integers(-2, 3, size=shape).astype(np.float32)


def bools(*shape):
    return R.integers(0, 2, size=shape).astype(bool)


COMPARE = {
    "greater_than": np.greater,
    "less_than": np.less,
    "greater_equal": np.greater_equal,
    "less_equal": np.less_equal,
    "equal": np.equal,
    "not_equal": np.not_equal,
}


def _compare_ref(fn):
    def reference(X, Y, axis=-1):
        if axis >= 0 and Y.ndim < X.ndim:
            Y = Y.reshape(Y.shape + (1,) * (X.ndim - axis - Y.ndim))
        return {"Out": fn(X, Y)}

    return reference


# Small integer-valued floats, so equal and not_equal see both outcomes.
COMPARE_INPUTS = [
    ("same-shape", {"X": ints(3, 4), "Y": ints(3, 4)}, {}),
    ("broadcast-trailing", {"X": ints(2, 3, 4), "Y": ints(4)}, {}),
    ("broadcast-both", {"X": ints(3, 1), "Y": ints(1, 4)}, {}),
    ("axis-1", {"X": ints(2, 3, 4), "Y": ints(3)}, {"axis": 1}),
    ("scalar-y", {"X": ints(5), "Y": np.array([0.0], np.float32)}, {}),
    ("empty", {"X": ints(0, 3), "Y": ints(3)}, {}),
    ("int64", {"X": np.array([1, 5, -3]), "Y": np.array([1, 2, 3])}, {}),
]

LOGICAL = {
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}
LOGICAL_INPUTS = [
    ("same-shape", {"X": bools(3, 4), "Y": bools(3, 4)}),
    ("broadcast", {"X": bools(2, 1, 3), "Y": bools(4, 1)}),
    ("empty", {"X": bools(0, 2), "Y": bools(2)}),
]

CASES = (
    [
        OpCase(op, inputs, _compare_ref(fn), attrs, id=f"{op}-{name}")
        for op, fn in COMPARE.items()
        for name, inputs, attrs in COMPARE_INPUTS
    ]
    + [
        OpCase(op, inputs, lambda X, Y, fn=fn: {"Out": fn(X, Y)}, id=f"{op}-{name}")
        for op, fn in LOGICAL.items()
        for name, inputs in LOGICAL_INPUTS
    ]
    + [
        OpCase("logical_not", {"X": bools(3, 2)}, lambda X: {"Out": ~X}),
        OpCase("logical_not", {"X": bools(0)}, lambda X: {"Out": ~X}, id="logical_not-empty"),
        OpCase(
            "logical_not",
            {"X": np.array([0.0, 2.5], np.float32)},
            lambda X: {"Out": X == 0},
            id="logical_not-float-truthiness",
        ),
    ]
)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


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
