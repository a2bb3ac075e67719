"""nf.layers' reduction, indexing and shape layers: Fluid 1.8 signatures and defaults, the ops
and attrs they append, shapes inferred with unknown batch, values run end to end against
NumPy, gradients through composed layers, and errors for bad arguments."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, ShapeError
from tests.gradcheck import assert_gradients_match

L = nf.layers

# Fluid 1.8's signatures (the names of the design contract): parameter names and defaults.
SIGNATURES = {
    "argmax": "(x, axis=0)",
    "argmin": "(x, axis=0)",
    "topk": "(input, k, name=None)",
    "where": "(condition, x=None, y=None, name=None)",
    "gather": "(input, index, overwrite=True)",
    "gather_nd": "(input, index, name=None)",
    "scatter": "(input, index, updates, name=None, overwrite=True)",
    "one_hot": "(input, depth, allow_out_of_range=False)",
    "pad": "(x, paddings, pad_value=0.0, name=None)",
    "expand": "(x, expand_times, name=None)",
    "squeeze": "(input, axes, name=None)",
    "unsqueeze": "(input, axes, name=None)",
    "stack": "(x, axis=0, name=None)",
    "unstack": "(x, axis=0, num=None)",
    "cumsum": "(x, axis=None, exclusive=None, reverse=None)",
    "range": "(start, end, step, dtype, name=None)",
    "shape": "(input)",
    "fill_constant_batch_size_like": (
        "(input, shape, dtype, value, input_dim_idx=0, output_dim_idx=0, force_cpu=False)"
    ),
    **{
        f"reduce_{kind}": "(input, dim=None, keep_dim=False, name=None)"
        for kind in ("sum", "mean", "max", "min", "prod", "all", "any")
    },
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature_is_fluids(name):
    params = inspect.signature(getattr(L, name)).parameters.values()
    shown = ", ".join(
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in params
    )
    assert f"({shown})" == SIGNATURES[name]
    assert name in L.__all__


def _run(fetch, feed):
    return nf.Executor().run(feed=feed, fetch_list=fetch)


def _ops():
    return nf.default_main_program().global_block().ops


def test_argmax_for_greedy_decoding_of_softmax_rows():
    logits = L.data("logits", [-1, 5], "float32")
    best = L.argmax(L.softmax(logits), axis=1)
    assert best.shape == (-1,) and best.dtype == "int64" and best.stop_gradient
    op = _ops()[-1]
    assert op.type == "arg_max"
    assert op.attrs["keepdims"] is False and op.attrs["flatten"] is False
    assert op.attrs["dtype"] == "int64"
    value = np.random.default_rng(0).standard_normal((4, 5)).astype("float32")
    (got,) = _run([best, L.argmin(logits, axis=0)], {"logits": value})[:1]
    np.testing.assert_array_equal(got, value.argmax(axis=1))


def test_topk_values_take_gradients_and_indices_do_not():
    x = L.data("x", [-1, 6], "float64")
    x.stop_gradient = False
    values, indices = L.topk(x, k=2)
    assert (values.shape, indices.shape) == ((-1, 2), (-1, 2))
    assert indices.stop_gradient and not values.stop_gradient
    loss = L.reduce_sum(L.square(values))
    nf.append_backward(loss)
    feed = {"x": np.random.default_rng(1).permutation(18).reshape(3, 6) * 0.5}
    assert_gradients_match(nf.Executor(), None, nf.Scope(), feed, loss, ["x"])


def test_topk_with_a_variable_k():
    x = L.data("x", [2, 5], "float32")
    k = L.data("k", [1], "int32")
    values, indices = L.topk(x, k)
    assert values.shape == (2, -1)
    rows = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], "float32")
    got = _run([values, indices], {"x": rows, "k": np.array([3], "int32")})
    np.testing.assert_array_equal(got[0], [[5, 4, 3], [9, 6, 5]])
    np.testing.assert_array_equal(got[1], [[4, 2, 0], [0, 2, 3]])


def test_where_with_numbers_and_the_one_argument_form():
    c = L.data("c", [-1, 3], "bool")
    x = L.data("x", [-1, 3], "float64")
    relu_like = L.where(c, x, 0.0)
    flipped = L.where(c, -1, x)
    coords = L.where(c)
    assert relu_like.dtype == flipped.dtype == "float64"
    assert coords.shape == (-1, 2) and coords.dtype == "int64"
    cond = np.array([[True, False, True], [False, False, True]])
    xv = np.arange(6.0).reshape(2, 3)
    got = _run([relu_like, flipped, coords], {"c": cond, "x": xv})
    np.testing.assert_array_equal(got[0], np.where(cond, xv, 0))
    np.testing.assert_array_equal(got[1], np.where(cond, -1, xv))
    np.testing.assert_array_equal(got[2], np.argwhere(cond))


def test_gather_scatter_gather_nd_one_hot_end_to_end():
    table = L.data("table", [5, 2], "float32")
    idx = L.data("idx", [-1], "int64")
    pairs = L.data("pairs", [-1, 2], "int64")
    rows = L.gather(table, idx)
    updated = L.scatter(table, idx, rows * 10.0)
    picked = L.gather_nd(table, pairs)
    hot = nf.one_hot(idx, depth=5)
    assert rows.shape == (-1, 2) and updated.shape == (5, 2) and picked.shape == (-1,)
    assert hot.shape == (-1, 5) and hot.dtype == "float32" and hot.stop_gradient
    tv = np.arange(10, dtype="float32").reshape(5, 2)
    iv, pv = np.array([3, 0]), np.array([[4, 1], [0, 0]])
    got = _run([rows, updated, picked, hot], {"table": tv, "idx": iv, "pairs": pv})
    np.testing.assert_array_equal(got[0], tv[iv])
    want = tv.copy()
    want[iv] = tv[iv] * 10
    np.testing.assert_array_equal(got[1], want)
    np.testing.assert_array_equal(got[2], tv[pv[:, 0], pv[:, 1]])
    np.testing.assert_array_equal(got[3], np.eye(5, dtype="float32")[iv])


def test_one_hot_with_a_depth_variable():
    ids = L.data("ids", [3], "int64")
    depth = L.fill_constant([1], "int32", 4)
    hot = nf.one_hot(ids, depth)
    assert hot.shape == (3, -1)
    (got,) = _run([hot], {"ids": np.array([0, 3, 1])})
    np.testing.assert_array_equal(got, np.eye(4, dtype="float32")[[0, 3, 1]])


def test_layout_layers_infer_shapes_with_unknown_batch():
    x = L.data("x", [-1, 1, 3], "float32")
    assert L.pad(x, [0, 0, 1, 1, 2, 0]).shape == (-1, 3, 5)
    assert L.expand(x, [2, 4, 1]).shape == (-1, 4, 3)
    assert L.squeeze(x, [1]).shape == (-1, 3)
    assert L.squeeze(x, []).shape == (-1, 3)  # no axes: only dims known to be 1
    assert L.unsqueeze(x, 0).shape == (1, -1, 1, 3)
    assert L.unsqueeze(x, [-1, 1]).shape == (-1, 1, 1, 3, 1)
    assert L.stack([x, x], axis=-1).shape == (-1, 1, 3, 2)
    parts = L.unstack(x, axis=2)
    assert len(parts) == 3 and all(p.shape == (-1, 1) for p in parts)
    assert L.cumsum(x, axis=2).shape == (-1, 1, 3)
    assert L.shape(x).shape == (3,) and L.shape(x).dtype == "int32"
    ones = L.fill_constant_batch_size_like(x, [1, 7], "int64", 1)
    assert ones.shape == (-1, 7) and ones.dtype == "int64"
    assert L.strided_slice(x, [2], [0], [3], [2]).shape == (-1, 1, 2)


def test_layout_layers_run_against_numpy():
    x = L.data("x", [-1, 1, 3], "float64")
    xv = np.arange(6.0).reshape(2, 1, 3)
    outs = [
        L.pad(x, [0, 0, 1, 1, 2, 0], pad_value=-1.0),
        L.expand(x, [1, 2, 2]),
        L.squeeze(x, [1]),
        L.unsqueeze(x, [0, 3]),
        L.stack([x, x * 2.0], axis=1),
        *L.unstack(x, axis=0, num=2),
        L.cumsum(x),
        L.cumsum(x, axis=0, exclusive=True, reverse=True),
        L.shape(x),
        L.fill_constant_batch_size_like(x, [-1, 2], "float32", 0.5),
    ]
    got = _run(outs, {"x": xv})
    want = [
        np.pad(xv, [(0, 0), (1, 1), (2, 0)], constant_values=-1.0),
        np.tile(xv, (1, 2, 2)),
        xv[:, 0],
        xv[None, :, :, None],
        np.stack([xv, xv * 2], axis=1),
        xv[0],
        xv[1],
        np.cumsum(xv, axis=-1),
        np.array([xv[1], np.zeros((1, 3))]),
        np.array([2, 1, 3], np.int32),
        np.full((2, 2), 0.5, "float32"),
    ]
    for g, w in zip(got, want):
        assert g.dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(g, w)


def test_cumsum_layer_sets_only_the_attrs_given():
    x = L.data("x", [2, 3], "float32")
    L.cumsum(x)
    L.cumsum(x, axis=0, exclusive=True, reverse=False)
    first, second = _ops()
    assert first.attrs["axis"] == -1 and first.attrs["exclusive"] is False
    assert second.attrs["axis"] == 0 and second.attrs["exclusive"] is True


def test_range_with_numbers_knows_its_length_and_with_variables_casts():
    r = L.range(0, 10, 3, "int64")
    assert r.shape == (4,) and r.dtype == "int64" and r.stop_gradient
    down = L.range(1.0, -1.0, -0.5, "float32")
    assert down.shape == (4,)
    end = L.data("end", [1], "int32")
    dynamic = L.range(0, end, 2, "int64")
    assert dynamic.shape == (-1,) and dynamic.dtype == "int64"
    assert "cast" in [op.type for op in _ops()]
    got = _run([r, down, dynamic], {"end": np.array([7], "int32")})
    np.testing.assert_array_equal(got[0], np.arange(0, 10, 3))
    np.testing.assert_array_equal(got[1], np.arange(1.0, -1.0, -0.5, dtype="float32"))
    np.testing.assert_array_equal(got[2], [0, 2, 4, 6])
    with pytest.raises(AttrError, match="step is 0"):
        L.range(0, 3, 0, "int64")


def test_fill_constant_batch_size_like_follows_the_batch():
    x = L.data("x", [-1, 4], "float32")
    zeros = L.fill_constant_batch_size_like(x, [1, 3], "float32", 0.0)
    for batch in (1, 5):
        (got,) = _run([zeros], {"x": np.ones((batch, 4), "float32")})
        assert got.shape == (batch, 3) and not got.any()


def test_gradients_through_composed_layers():
    """pad, expand, squeeze/unsqueeze, stack/unstack, cumsum, gather, scatter, where,
    reduce_max/prod in one loss: every path checked against central differences."""
    rng = np.random.default_rng(3)
    x = L.data("x", [3, 1, 2], "float64")
    u = L.data("u", [2, 2], "float64")
    for v in (x, u):
        v.stop_gradient = False
    sq = L.squeeze(x, [1])  # [3, 2]
    parts = L.unstack(sq, axis=0)
    stacked = L.stack(parts[::-1], axis=1)  # [2, 3]
    idx = L.assign(np.array([2, 0]))
    terms = [
        L.pad(stacked, [1, 0, 0, 2], pad_value=3.0),
        L.expand(L.unsqueeze(L.cumsum(sq, axis=0, reverse=True), [0]), [2, 1, 1]),
        L.gather(sq, idx),
        L.scatter(sq, idx, u, overwrite=False),
        L.where(L.greater_than(sq, 0.0), sq, L.square(sq)),
        L.reduce_max(sq, dim=1),
        L.reduce_prod(stacked, dim=[0, 1]),
    ]
    loss = None
    for term in terms:
        weight = L.assign(rng.standard_normal([d for d in term.shape]))
        part = L.reduce_sum(term * weight)
        loss = part if loss is None else loss + part
    nf.append_backward(loss)
    feed = {"x": rng.permutation(6).reshape(3, 1, 2) * 0.3 - 0.8, "u": rng.standard_normal((2, 2))}
    assert_gradients_match(nf.Executor(), None, nf.Scope(), feed, loss, ["x", "u"])


def test_bad_layer_arguments():
    x = L.data("x", [-1, 3], "float32")
    with pytest.raises(AttrError, match="argmax: axis must be an int"):
        L.argmax(x, axis=1.0)
    with pytest.raises(AttrError, match="topk: k must be an int"):
        L.topk(x, k="2")
    with pytest.raises(AttrError, match="reduce_sum: dim must be an int"):
        L.reduce_sum(x, dim=[0.5])
    with pytest.raises(ShapeError, match="unstack: dim 0 of 'x' .* is unknown; give num"):
        L.unstack(x)
    with pytest.raises(ShapeError, match="unstack: axis 2 is out of range"):
        L.unstack(x, axis=2)
    with pytest.raises(AttrError, match="pad: paddings must be an int or a list"):
        L.pad(x, "1, 1")
    with pytest.raises(AttrError, match=r"output_dim_idx 2 is outside shape \[1, 3\]"):
        L.fill_constant_batch_size_like(x, [1, 3], "float32", 0.0, output_dim_idx=2)
    with pytest.raises(ShapeError, match="num=4 differs from dim 1"):
        L.unstack(x, axis=1, num=4)


def test_unstack_gradient_with_only_some_parts_used():
    x = L.data("x", [3, 2], "float64")
    x.stop_gradient = False
    _, middle, _ = L.unstack(x)
    nf.append_backward(L.reduce_sum(middle * 3.0))
    (grad,) = _run(["x@GRAD"], {"x": np.ones((3, 2))})
    np.testing.assert_array_equal(grad, [[0, 0], [3, 3], [0, 0]])
