"""Reductions against NumPy: mean (0-d), reduce_sum and reduce_mean over dims, keep_dim and
reduce_all, empty inputs, dtypes; numeric gradients."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(11)


def normal(*shape, dtype="float64"):
    return rng.standard_normal(shape).astype(dtype)


def mean_ref(X):
    with np.errstate(invalid="ignore"):
        return {"Out": np.asarray(X.sum() / X.size if X.size else np.nan, X.dtype)}


def _axes(X, dim, reduce_all):
    return None if reduce_all or not dim else tuple(dim)


def reduce_sum_ref(X, dim=(0,), keep_dim=False, reduce_all=False):
    axes = _axes(X, dim, reduce_all)
    return {"Out": np.asarray(np.sum(X, axis=axes, keepdims=keep_dim, dtype=X.dtype))}


def reduce_mean_ref(X, dim=(0,), keep_dim=False, reduce_all=False):
    axes = _axes(X, dim, reduce_all)
    total = np.sum(X.astype("float64"), axis=axes, keepdims=keep_dim)
    count = int(np.prod([X.shape[a] for a in (axes or range(X.ndim))]))
    with np.errstate(invalid="ignore"):  # a mean over no elements is NaN, as in NumPy
        return {"Out": np.asarray(total / count, X.dtype)}


REDUCE_CASES = [
    OpCase("mean", {"X": normal(3, 4)}, mean_ref, grad=("X",)),
    OpCase("mean", {"X": normal(1)}, mean_ref, grad=("X",), id="mean-size1"),
    OpCase("mean", {"X": np.asarray(2.5)}, mean_ref, grad=("X",), id="mean-0d"),
    OpCase("mean", {"X": normal(2, 3, 2)}, mean_ref, grad=("X",), id="mean-3d"),
    OpCase("mean", {"X": normal(0, 4)}, mean_ref, grad=("X",), id="mean-empty_is_nan"),
    OpCase("mean", {"X": normal(5, 7, dtype="float32")}, mean_ref, id="mean-float32"),
]

# (id, X shape, attrs)
REDUCTIONS = [
    ("default_dim_is_0", (3, 4), {}),  # Fluid's ReduceOpMaker default
    ("all_by_empty_dim", (3, 4), {"dim": []}),
    ("reduce_all", (2, 3, 4), {"dim": [1], "reduce_all": True}),
    ("dim0", (3, 4), {"dim": [0]}),
    ("dim_last_negative", (2, 3, 4), {"dim": [-1]}),
    ("two_dims", (2, 3, 4), {"dim": [0, 2]}),
    ("keep_dim", (2, 3, 4), {"dim": [1], "keep_dim": True}),
    ("keep_dim_all", (2, 3), {"reduce_all": True, "keep_dim": True}),
    ("size1_dim", (3, 1, 2), {"dim": [1]}),
    ("empty_batch_kept_rows", (0, 3), {"dim": [1]}),
    ("empty_batch_reduced", (0, 3), {"dim": [0]}),
    ("vector", (5,), {"dim": [0]}),
]

for op, ref in (("reduce_sum", reduce_sum_ref), ("reduce_mean", reduce_mean_ref)):
    REDUCE_CASES += [
        OpCase(op, {"X": normal(*shape)}, ref, attrs, grad=("X",), id=f"{op}-{name}")
        for name, shape, attrs in REDUCTIONS
    ]
    REDUCE_CASES.append(
        OpCase(op, {"X": normal(4, 3, dtype="float32")}, ref, {"dim": [1]}, id=f"{op}-float32")
    )

REDUCE_CASES += [
    OpCase(
        "reduce_sum",
        {"X": rng.integers(-5, 5, (3, 4)).astype("int32")},
        reduce_sum_ref,
        {"dim": [0]},
        id="reduce_sum-int32_stays_int32",
    ),
]


@pytest.mark.parametrize("case", REDUCE_CASES, ids=case_id)
def test_op(case):
    case.check()


L = nf.layers


def test_mean_layer_gives_a_0d_variable_and_value():
    x = L.data("x", [-1, 3], "float32")
    m = L.mean(x)
    assert m.shape == ()
    (value,) = nf.Executor().run(feed={"x": np.ones((2, 3), "float32")}, fetch_list=[m])
    assert value.shape == () and value.dtype == np.float32 and value == 1.0


def test_reduce_layers_infer_shapes_with_unknown_batch():
    x = L.data("x", [-1, 3, 4], "float32")
    assert L.reduce_sum(x, dim=1).shape == (-1, 4)
    assert L.reduce_mean(x, dim=[1, 2], keep_dim=True).shape == (-1, 1, 1)
    assert L.reduce_sum(x).shape == ()


def test_reduce_dim_out_of_range_names_the_rank():
    x = L.data("x", [2, 3], "float32")
    with pytest.raises(ShapeError, match=r"dim 2 is out of range for X of rank 2"):
        L.reduce_sum(x, dim=2)


def test_reduce_dim_repeated():
    x = L.data("x", [2, 3], "float32")
    with pytest.raises(ShapeError, match=r"names an axis twice"):
        L.reduce_mean(x, dim=[1, -1])


def test_mean_of_integers_is_a_dtype_error():
    x = L.data("x", [2, 3], "int64")
    with pytest.raises(DTypeError, match="mean needs a floating-point X, got int64"):
        L.mean(x)


def test_mean_gradient_is_one_read_only_value_that_no_op_writes_into():
    # mean's gradient is a broadcast view of one value: ops after it whose gradient kernels
    # may take their input gradient's buffer (tanh's, an add's) get a new array instead, and
    # the fetched gradient is the user's own writeable copy.
    xs = normal(4, 3)
    (view,) = nf.ops.registry.get_op_def("mean").backward(
        xs, np.asarray(0.0), np.asarray(2.0), xp=np
    )
    assert view.shape == xs.shape and not view.flags.writeable and view.strides == (0, 0)
    np.testing.assert_array_equal(view, np.full(xs.shape, 2.0 / xs.size))
    w = L.create_parameter([4, 3], "float64", name="w")
    y = L.tanh(L.elementwise_add(w, w))
    loss = L.mean(L.tanh(y))
    nf.append_backward(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    w_value = scope.find_var("w").get(nf.Tensor).numpy()
    got, y_grad = exe.run(fetch_list=["w@GRAD", y.name + "@GRAD"], scope=scope)
    y_value = np.tanh(2 * w_value)
    want_y = (1 - np.tanh(y_value) ** 2) / w_value.size
    np.testing.assert_allclose(y_grad, want_y, rtol=1e-12)
    np.testing.assert_allclose(got, 2 * want_y * (1 - y_value**2), rtol=1e-12)
    y_grad[...] = 0  # a fetch is a copy the user may write
