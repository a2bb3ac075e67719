"""reduce_max/min/prod/all/any against NumPy (and PyTorch's amax/amin/prod gradients), Fluid's
attr defaults (dim [0]) for every reduce op, tie and zero gradients, dtype and shape errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from nestflow.ops.registry import get_op_def
from tests.ops.harness import OpCase, case_id

L = nf.layers
R = np.random.default_rng(77)


def distinct(*shape, dtype="float64"):
    """Values far apart (no ties, so max/min are differentiable for central differences)."""
    size = int(np.prod(shape))
    return (R.permutation(size) * 0.37 - size * 0.15).reshape(shape).astype(dtype)


def _axes(X, dim, reduce_all):
    return None if reduce_all or not dim else tuple(dim)


def reference(fn):
    def ref(X, dim=(0,), keep_dim=False, reduce_all=False):
        out = fn(X, axis=_axes(X, dim, reduce_all), keepdims=keep_dim)
        return {"Out": np.asarray(out, X.dtype)}

    return ref


def moderate(*shape, dtype="float64"):
    """Magnitudes in [0.5, 1.5] with random signs: products stay well scaled."""
    signs = R.choice([-1.0, 1.0], shape)
    return (R.uniform(0.5, 1.5, shape) * signs).astype(dtype)


REFS = {
    "reduce_max": reference(np.max),
    "reduce_min": reference(np.min),
    "reduce_prod": reference(np.prod),
    "reduce_all": reference(np.all),
    "reduce_any": reference(np.any),
}

# (id, X shape, attrs)
REDUCTIONS = [
    ("default_dim_is_0", (3, 4), {}),
    ("empty_dim_is_all", (3, 4), {"dim": []}),
    ("reduce_all", (2, 3, 4), {"dim": [1], "reduce_all": True}),
    ("reduce_all_keep_dim", (2, 3), {"reduce_all": True, "keep_dim": True}),
    ("dim1", (3, 5), {"dim": [1]}),
    ("negative_dim", (2, 3, 4), {"dim": [-1]}),
    ("two_dims", (2, 3, 5), {"dim": [0, 2]}),
    ("keep_dim", (2, 3, 4), {"dim": [1], "keep_dim": True}),
    ("size1_dim", (3, 1, 2), {"dim": [1]}),
    ("empty_batch_kept", (0, 3), {"dim": [1]}),
    ("vector", (5,), {"dim": [0]}),
    ("odd_sizes", (3, 5, 7), {"dim": [1, 2]}),
]

CASES = []
for op in ("reduce_max", "reduce_min", "reduce_prod"):
    values = moderate if op == "reduce_prod" else distinct
    CASES += [
        OpCase(op, {"X": values(*shape)}, REFS[op], attrs, grad=("X",), id=f"{op}-{name}")
        for name, shape, attrs in REDUCTIONS
    ]
    CASES.append(
        OpCase(
            op, {"X": distinct(4, 3, dtype="float32")}, REFS[op], {"dim": [1]}, id=f"{op}-float32"
        )  # fmt: skip
    )
    CASES.append(
        OpCase(
            op,
            {"X": R.integers(-4, 5, (3, 4)).astype("int32")},
            REFS[op],
            {"dim": [0]},
            id=f"{op}-int32",
        )  # fmt: skip
    )
for op in ("reduce_all", "reduce_any"):
    CASES += [
        OpCase(op, {"X": R.random(shape) < 0.7}, REFS[op], attrs, id=f"{op}-{name}")
        for name, shape, attrs in REDUCTIONS
    ]

CASES += [
    # Products over groups holding one zero and two zeros: the gradient is still exact.
    OpCase("reduce_prod", {"X": np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.5, 2.0, -1.0]])},
           REFS["reduce_prod"], {"dim": [1]}, grad=("X",), id="reduce_prod-zeros"),
    OpCase("reduce_prod", {"X": np.array([[0.5, 0.0], [4.0, 0.0]])}, REFS["reduce_prod"],
           {"reduce_all": True}, grad=("X",), id="reduce_prod-zeros_all"),
    OpCase("reduce_prod", {"X": distinct(0, 3)}, REFS["reduce_prod"], {"dim": [0]},
           grad=("X",), id="reduce_prod-empty_group_is_1"),
    OpCase("reduce_all", {"X": np.zeros((0, 2), bool)}, REFS["reduce_all"], {"dim": [0]},
           id="reduce_all-empty_is_true"),
    OpCase("reduce_any", {"X": np.zeros((0, 2), bool)}, REFS["reduce_any"], {"dim": [0]},
           id="reduce_any-empty_is_false"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


@pytest.mark.parametrize(
    "op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_all"]
)
def test_attr_defaults_are_fluids(op):
    attrs = get_op_def(op).attrs
    assert {k: a.default for k, a in attrs.items()} == {
        "dim": [0],
        "keep_dim": False,
        "reduce_all": False,
    }


def _grad_of(op, x, dim=None):
    """d sum(op(x)) / dx through the layer and append_backward, in a program of its own."""
    with nf.program_guard(nf.Program(), nf.Program()):
        xv = L.data("x", list(x.shape), "float64")
        xv.stop_gradient = False
        nf.append_backward(L.reduce_sum(getattr(L, op)(xv, dim=dim)))
        (grad,) = nf.Executor().run(feed={"x": x}, fetch_list=["x@GRAD"])
    return grad


def test_max_and_min_split_the_gradient_between_ties_like_torch_amax():
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, -1.0], [5.0, -4.0, 0.5, 5.0]])
    for op, fn in (("reduce_max", torch.amax), ("reduce_min", torch.amin)):
        for dim in (1, 0, None):
            t = torch.tensor(x, requires_grad=True)
            (fn(t, dim=dim) if dim is not None else fn(t)).sum().backward()
            got = _grad_of(op, x, dim=dim)
            np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, err_msg=f"{op} {dim}")


def test_prod_gradient_with_zeros_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.array([[2.0, 0.0, 3.0, 1.0], [0.0, 0.0, 5.0, 2.0], [1.5, 2.0, -1.0, 0.25]])
    for dim in (1, 0):
        t = torch.tensor(x, requires_grad=True)
        torch.prod(t, dim=dim).sum().backward()
        np.testing.assert_allclose(_grad_of("reduce_prod", x, dim=dim), t.grad.numpy())


def test_max_values_match_torch_over_dims_and_keep_dim():
    torch = pytest.importorskip("torch")
    x = R.standard_normal((3, 4, 5))
    xv = L.data("x", [-1, 4, 5], "float64")
    layers = [L.reduce_max(xv, dim=[1, 2], keep_dim=True), L.reduce_min(xv, dim=-1)]
    layers += [L.reduce_prod(xv, dim=0)]
    got = nf.Executor().run(feed={"x": x}, fetch_list=layers)
    t = torch.tensor(x)
    wants = [torch.amax(t, dim=(1, 2), keepdim=True), torch.amin(t, dim=-1), torch.prod(t, 0)]
    for g, w in zip(got, wants):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12)


def test_nan_is_the_maximum_and_takes_the_gradient():
    x = np.array([[1.0, np.nan, 2.0], [3.0, 1.0, 0.0]])
    xv = L.data("x", [2, 3], "float64")
    xv.stop_gradient = False
    out = L.reduce_max(xv, dim=1)
    nf.append_backward(L.reduce_sum(out))
    value, grad = nf.Executor().run(feed={"x": x}, fetch_list=[out, "x@GRAD"])
    assert np.isnan(value[0]) and value[1] == 3.0
    np.testing.assert_array_equal(grad, [[0, 1, 0], [1, 0, 0]])


def test_layers_follow_fluids_dim_rule():
    x = L.data("x", [-1, 3, 4], "float32")
    b = L.data("b", [-1, 3], "bool")
    assert L.reduce_max(x).shape == ()
    assert L.reduce_min(x, dim=[]).shape == ()
    assert L.reduce_prod(x, dim=2, keep_dim=True).shape == (-1, 3, 1)
    assert L.reduce_all(b, dim=1).shape == (-1,) and L.reduce_any(b).shape == ()
    ops = nf.default_main_program().global_block().ops
    assert ops[0].attrs["dim"] == [0] and ops[0].attrs["reduce_all"] is True
    assert ops[2].attrs["dim"] == [2] and ops[2].attrs["reduce_all"] is False


def test_max_of_an_empty_dim_is_a_shape_error_at_build_time():
    x = L.data("x", [0, 3], "float32")
    with pytest.raises(ShapeError, match=r"dim 0 of X \[0, 3\] is empty"):
        L.reduce_max(x, dim=0)


def test_max_of_an_empty_batch_is_a_shape_error_at_run_time_naming_the_op():
    x = L.data("x", [-1, 3], "float32")
    out = L.reduce_min(x, dim=0)
    with pytest.raises(ShapeError, match=r"reduce_min(.|\n)*has no elements along dims \[0\]"):
        nf.Executor().run(feed={"x": np.zeros((0, 3), "float32")}, fetch_list=[out])


def test_reduce_all_needs_bool_and_reduce_max_refuses_bool():
    x = L.data("x", [2, 3], "float32")
    with pytest.raises(DTypeError, match="X must be bool, got float32"):
        L.reduce_all(x)
    b = L.data("b", [2, 3], "bool")
    with pytest.raises(DTypeError, match="use reduce_all/reduce_any"):
        L.reduce_max(b)


def test_dim_out_of_range_is_a_shape_error():
    x = L.data("x", [2, 3], "float32")
    with pytest.raises(ShapeError, match=r"dim 3 is out of range for X of rank 2"):
        L.reduce_prod(x, dim=[0, 3])
