"""Python indexing of build-time variables (`x[1:3, :, 0]`, `x[:, -1]`, `x[::-2]`, `x[..., 0]`,
`x[None]`) against NumPy, with known and unknown dims; the ops it appends; gradients through
them against central differences; errors for indexes it cannot take."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ShapeError
from tests.gradcheck import assert_gradients_match

L = nf.layers
VALUE = np.arange(2 * 3 * 4, dtype="float64").reshape(2, 3, 4)

# Each a function of x (a VarDesc or an ndarray: both take the same index).
INDEXES = {
    "x[1:3, :, 0]": lambda x: x[1:3, :, 0],
    "x[:, -1]": lambda x: x[:, -1],
    "x[::2]": lambda x: x[::2],
    "x[..., 0]": lambda x: x[..., 0],
    "x[None]": lambda x: x[None],
    "x[..., None]": lambda x: x[..., None],
    "x[:, None, 1, ::-1]": lambda x: x[:, None, 1, ::-1],
    "x[0, 0, 0]": lambda x: x[0, 0, 0],
    "x[:, 2:0:-1, -1:-5:-2]": lambda x: x[:, 2:0:-1, -1:-5:-2],
    "x[-1]": lambda x: x[-1],
    "x[1]": lambda x: x[1],
    "x[:, :, -2:]": lambda x: x[:, :, -2:],
    "x[::-1]": lambda x: x[::-1],
    "x[:, ::-2, 1::2]": lambda x: x[:, ::-2, 1::2],
    "x[:, 1:-1]": lambda x: x[:, 1:-1],
    "x[5:]": lambda x: x[5:],
    "x[:, 3:1]": lambda x: x[:, 3:1],
    "x[:, -1:-1:-1]": lambda x: x[:, -1:-1:-1],
    "x[:, :-10:-1]": lambda x: x[:, :-10:-1],
    "x[np.int64(1), 2]": lambda x: x[np.int64(1), 2],
    "x[...]": lambda x: x[...],
    "x[:]": lambda x: x[:],
}


@pytest.mark.parametrize("batch", [2, -1], ids=["known_dims", "unknown_batch"])
@pytest.mark.parametrize("expr", list(INDEXES))
def test_indexing_matches_numpy(expr, batch):
    x = L.data("x", [batch, 3, 4], "float64")
    out = INDEXES[expr](x)
    want = INDEXES[expr](VALUE)
    if want.ndim == 0:  # Fluid 1.x: integers dropping every dim leave [1] (w[1, 1, 1].shape)
        want = want.reshape(1)
    (got,) = nf.Executor().run(feed={"x": VALUE}, fetch_list=[out])
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # Inference agrees with the result wherever it knows a dim.
    assert len(out.shape) == want.ndim
    assert all(d in (-1, w) for d, w in zip(out.shape, want.shape)), (out.shape, want.shape)
    if batch == 2:
        assert out.shape == want.shape


def _op_types():
    return [(op.type, op.attrs) for op in nf.default_main_program().global_block().ops]


def test_ints_and_unit_steps_append_one_slice_op_dropping_dims():
    x = L.data("x", [-1, 3, 4], "float32")
    x[1:3, :, 0]
    ((kind, attrs),) = _op_types()
    assert kind == "slice"
    assert attrs["axes"] == [0, 2] and attrs["starts"] == [1, 0] and attrs["ends"] == [3, 1]
    assert attrs["decrease_axis"] == [2]


def test_steps_append_strided_slice_and_none_appends_unsqueeze2():
    x = L.data("x", [-1, 3, 4], "float32")
    x[::2, None]
    (kind1, attrs1), (kind2, attrs2) = _op_types()
    assert kind1 == "strided_slice" and attrs1["strides"] == [2]
    assert kind2 == "unsqueeze2" and attrs2["axes"] == [1]


def test_whole_variable_index_appends_nothing():
    x = L.data("x", [-1, 3], "float32")
    assert x[:] is x and x[...] is x and _op_types() == []


GRAD_TERMS = [
    lambda x: x[1:, :, 0],
    lambda x: x[:, -1],
    lambda x: x[::-2, None, 1::2],
    lambda x: x[0, 2, 3],
    lambda x: x[..., 1],
]


def test_gradients_flow_through_indexing():
    rng = np.random.default_rng(5)
    x = L.data("x", [-1, 3, 4], "float64")
    x.stop_gradient = False
    value = rng.standard_normal((3, 3, 4))
    loss = None
    for term in GRAD_TERMS:
        weight = L.assign(rng.standard_normal(term(value).shape))
        part = L.reduce_sum(term(x) * weight)
        loss = part if loss is None else loss + part
    nf.append_backward(loss)
    assert_gradients_match(nf.Executor(), None, nf.Scope(), {"x": value}, loss, ["x"])


def test_gradient_of_a_sliced_row_is_the_upstream_in_place():
    x = L.data("x", [2, 3], "float64")
    x.stop_gradient = False
    nf.append_backward(L.reduce_sum(x[1, ::-1] * L.assign(np.array([1.0, 2.0, 3.0]))))
    (grad,) = nf.Executor().run(feed={"x": np.zeros((2, 3))}, fetch_list=["x@GRAD"])
    np.testing.assert_array_equal(grad, [[0, 0, 0], [3, 2, 1]])


def test_negative_index_on_an_unknown_dim_resolves_at_run_time():
    x = L.data("x", [-1, 2], "float64")
    rows = np.arange(10.0).reshape(5, 2)
    got = nf.Executor().run(feed={"x": rows}, fetch_list=[x[-1], x[-2], x[-3:-1, 0]])
    np.testing.assert_array_equal(got[0], rows[-1])
    np.testing.assert_array_equal(got[1], rows[-2])
    np.testing.assert_array_equal(got[2], rows[-3:-1, 0])


def test_integer_variables_index_too():
    x = L.data("x", [3, 2], "int64")
    (got,) = nf.Executor().run(feed={"x": np.arange(6).reshape(3, 2)}, fetch_list=[x[::-1, 1]])
    assert got.dtype == np.int64 and got.tolist() == [5, 3, 1]


# ---- errors ----


def test_index_out_of_range_on_a_known_dim():
    x = L.data("x", [-1, 3], "float32")
    with pytest.raises(
        ShapeError, match=r"'x' \[-1, 3\]\[:, 3\]: index 3 is out of range for dim 1 of size 3"
    ):  # noqa: E501
        x[:, 3]
    with pytest.raises(ShapeError, match="index -4 is out of range for dim 1 of size 3"):
        x[0, -4]


def test_too_many_indices_and_two_ellipses():
    x = L.data("x", [2, 3], "float32")
    with pytest.raises(ShapeError, match=r"too many indices \(3\) for a variable of rank 2"):
        x[0, 1, 2]
    with pytest.raises(ShapeError, match="only one ellipsis"):
        x[..., 0, ...]


def test_bad_index_types_are_dtype_errors():
    x = L.data("x", [2, 3], "float32")
    with pytest.raises(DTypeError, match=r"index 1.5 is a float; indexes are ints"):
        x[1.5]
    with pytest.raises(DTypeError, match="slice bound 0.5 is not an int"):
        x[0.5:2]
    with pytest.raises(DTypeError, match="index True is a bool"):
        x[True]
    with pytest.raises(DTypeError, match="is a list"):
        x[[0, 1]]
    i = L.data("i", [1], "int64")
    with pytest.raises(DTypeError, match="is a variable.*gather"):
        x[i]
    with pytest.raises(AttrError, match="a slice step cannot be 0"):
        x[::0]


def test_a_variable_is_not_iterable_at_build_time():
    x = L.data("x", [-1, 3], "float32")
    with pytest.raises(DTypeError, match="cannot be iterated"):
        list(x)
    with pytest.raises(TypeError):  # a DTypeError is a TypeError, as Python's own would be
        a, b = x
    assert _op_types() == []
