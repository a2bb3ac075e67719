"""Activations against NumPy: relu, sigmoid, tanh, softmax (any axis), with numeric gradients."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import ShapeError
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(7)


def normal(*shape, dtype="float64"):
    return rng.standard_normal(shape).astype(dtype)


def away_from_kink(*shape):
    """Inputs of relu: |x| >= 0.1, so central differences never straddle 0."""
    return rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def relu_ref(X):
    return {"Out": np.where(X > 0, X, np.zeros_like(X))}


def sigmoid_ref(X):
    with np.errstate(over="ignore"):  # exp(800) = inf gives exactly 0, as it should
        return {"Out": (1 / (1 + np.exp(-X.astype("float64")))).astype(X.dtype)}


def tanh_ref(X):
    return {"Out": np.tanh(X)}


def softmax_ref(X, axis=-1):
    e = np.exp(X.astype("float64") - X.max(axis=axis, keepdims=True))
    return {"Out": (e / e.sum(axis=axis, keepdims=True)).astype(X.dtype)}


ACTIVATION_CASES = []
for op, ref, make in (
    ("relu", relu_ref, away_from_kink),
    ("sigmoid", sigmoid_ref, normal),
    ("tanh", tanh_ref, normal),
):
    ACTIVATION_CASES += [
        OpCase(op, {"X": make(3, 4)}, ref, grad=("X",), id=f"{op}-2d"),
        OpCase(op, {"X": make(2, 1, 3)}, ref, grad=("X",), id=f"{op}-size1"),
        OpCase(op, {"X": make(0, 3)}, ref, grad=("X",), id=f"{op}-empty"),
        OpCase(op, {"X": np.asarray(make(1)[0])}, ref, grad=("X",), id=f"{op}-0d"),
        OpCase(op, {"X": make(4, 5).astype("float32")}, ref, id=f"{op}-float32"),
    ]

ACTIVATION_CASES += [
    OpCase(
        "sigmoid",
        {"X": np.array([-800.0, -30.0, 0.0, 30.0, 800.0])},
        sigmoid_ref,
        id="sigmoid-saturates_without_overflow",
    ),
    OpCase("softmax", {"X": normal(3, 5)}, softmax_ref, grad=("X",), id="softmax-last"),
    OpCase("softmax", {"X": normal(3, 4)}, softmax_ref, {"axis": 0}, grad=("X",), id="softmax-0"),
    OpCase(
        "softmax", {"X": normal(2, 3, 4)}, softmax_ref, {"axis": 1}, grad=("X",), id="softmax-mid"
    ),
    OpCase("softmax", {"X": normal(0, 4)}, softmax_ref, grad=("X",), id="softmax-empty"),
    OpCase("softmax", {"X": normal(3, 1)}, softmax_ref, grad=("X",), id="softmax-one_class"),
    OpCase(
        "softmax",
        {"X": np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1000.0]])},
        softmax_ref,
        id="softmax-large_logits",
    ),
    OpCase("softmax", {"X": normal(4, 6, dtype="float32")}, softmax_ref, id="softmax-float32"),
]


@pytest.mark.parametrize("case", ACTIVATION_CASES, ids=case_id)
def test_op(case):
    case.check()


def test_softmax_axis_out_of_range_fails_when_built():
    x = nf.layers.data("x", [2, 3], "float32")
    with pytest.raises(ShapeError, match=r"axis 2 is out of range for X \[2, 3\]"):
        nf.layers.softmax(x, axis=2)


@pytest.mark.parametrize("op", ["sigmoid", "tanh", "softmax"])
@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_float_only_activations_refuse_other_dtypes_when_built(op, dtype):
    """sigmoid/tanh/softmax of integers would give floats where X's dtype is inferred: like
    mean, they refuse a non-float X when the op is appended, naming the op and dtype."""
    x = nf.layers.data("x", [-1, 3], dtype)
    with pytest.raises(nf.errors.DTypeError, match=f"{op}.*{dtype}") as info:
        getattr(nf.layers, op)(x)  # marker: int-activation
    assert info.value.location.op_type == op
    assert "test_activation.py" in str(info.value)
    assert nf.default_main_program().global_block().ops == []


def test_relu_of_integers_keeps_their_dtype():
    x = nf.layers.data("x", [-1, 2], "int64")
    out = nf.layers.relu(x)
    (got,) = nf.Executor().run(feed={"x": np.array([[-2, 3]])}, fetch_list=[out], scope=nf.Scope())
    assert out.dtype == "int64" and got.dtype == np.int64 and got.tolist() == [[0, 3]]


@pytest.mark.parametrize("op", ["relu", "square"])
def test_relu_and_square_refuse_bool_when_built(op):
    """Their arithmetic turns bool into an integer type, so a bool Out could not be kept."""
    x = nf.layers.data("x", [-1, 3], "bool")
    with pytest.raises(nf.errors.DTypeError, match="bool") as info:
        getattr(nf.layers, op)(x)
    assert info.value.location.op_type == op
    assert nf.default_main_program().global_block().ops == []
