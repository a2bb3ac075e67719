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


def distinct(*shape, dtype="float64"):
    """Values with no ties (orderings, and so gradients, are stable under small moves)."""
    size = int(np.prod(shape))
    return (R.permutation(size) * 0.31 - size * 0.1).reshape(shape).astype(dtype)


def ids(high, *shape, dtype="int64"):
    return R.integers(0, high, shape).astype(dtype)


# ---- arg_max / arg_min / top_k ----


def arg_ref(find):
    def ref(X, axis, keepdims=False, dtype="int64", flatten=False):
        if flatten:
            return {"Out": np.asarray([find(X)], dtype)}
        return {"Out": np.asarray(find(X, axis=axis, keepdims=keepdims), dtype)}

    return ref


def top_k_ref(X, k=1, K=None):
    k = int(K[0]) if K is not None else k
    order = np.argsort(-X, axis=-1, kind="stable")[..., :k]
    return {"Out": np.take_along_axis(X, order, -1), "Indices": order.astype(np.int64)}


SEARCH_CASES = [
    OpCase("arg_max", {"X": normal(3, 4)}, arg_ref(np.argmax), {"axis": 1}, id="arg_max-axis1"),
    OpCase("arg_max", {"X": normal(3, 4, 5)}, arg_ref(np.argmax), {"axis": -2, "keepdims": True},
           id="arg_max-negative_axis_keepdims"),
    OpCase("arg_max", {"X": normal(2, 3)}, arg_ref(np.argmax), {"axis": 0, "flatten": True},
           id="arg_max-flatten"),
    OpCase("arg_max", {"X": normal(0, 3)}, arg_ref(np.argmax), {"axis": 1},
           id="arg_max-empty_batch"),
    OpCase("arg_max", {"X": normal(5)}, arg_ref(np.argmax), {"axis": 0, "dtype": "int32"},
           id="arg_max-int32_out"),
    OpCase("arg_max", {"X": np.array([[1, 3, 3], [2, 2, 0]], np.int32)}, arg_ref(np.argmax),
           {"axis": 1}, id="arg_max-ties_first_wins"),
    OpCase("arg_min", {"X": normal(4, 3)}, arg_ref(np.argmin), {"axis": 0}, id="arg_min-axis0"),
    OpCase("arg_min", {"X": normal(1, 7)}, arg_ref(np.argmin), {"axis": -1, "keepdims": True},
           id="arg_min-size1"),
    OpCase("arg_min", {"X": normal(0, 5)}, arg_ref(np.argmin), {"axis": 1},
           id="arg_min-empty_batch"),
    OpCase("arg_min", {"X": normal(3, 5, 7)}, arg_ref(np.argmin), {"axis": 2},
           id="arg_min-odd_3d"),
    OpCase("top_k", {"X": distinct(3, 6)}, top_k_ref, {"k": 2}, grad=("X",), id="top_k"),
    OpCase("top_k", {"X": distinct(2, 3, 5)}, top_k_ref, {"k": 5}, grad=("X",),
           id="top_k-all_3d"),
    OpCase("top_k", {"X": distinct(7)}, top_k_ref, grad=("X",), id="top_k-default_k1_vector"),
    OpCase("top_k", {"X": distinct(0, 4)}, top_k_ref, {"k": 3}, grad=("X",),
           id="top_k-empty_batch"),
    OpCase("top_k", {"X": distinct(4, 5), "K": np.array([3], np.int32)}, top_k_ref, grad=("X",),
           id="top_k-K_tensor"),
    OpCase("top_k", {"X": np.array([[1.0, 4.0, 4.0, 2.0, 4.0]])}, top_k_ref, {"k": 3},
           id="top_k-ties_smaller_index_first"),
    OpCase("top_k", {"X": R.integers(0, 4, (3, 6)).astype("int32")}, top_k_ref, {"k": 4},
           id="top_k-int32"),
    # k well below the row length: the argpartition path, and its fallback when values equal
    # to the k-th largest straddle the cut
    OpCase("top_k", {"X": distinct(3, 80)}, top_k_ref, {"k": 5}, grad=("X",),
           id="top_k-partitioned"),
    OpCase("top_k", {"X": R.integers(0, 6, (4, 70)).astype("int64")}, top_k_ref, {"k": 9},
           id="top_k-partitioned_ties_at_the_cut"),
]  # fmt: skip


# ---- gather / gather_nd / scatter ----


def gather_ref(X, Index, overwrite=True):
    return {"Out": X[Index.reshape(-1)]}


def gather_nd_ref(X, Index):
    depth = Index.shape[-1]
    out = np.empty(Index.shape[:-1] + X.shape[depth:], X.dtype)
    for pos in np.ndindex(Index.shape[:-1]):
        out[pos] = X[tuple(Index[pos])]
    return {"Out": out}


def scatter_ref(X, Ids, Updates, overwrite=True):
    out = X.copy()
    ids_ = Ids.reshape(-1)
    if overwrite:
        for i, row in enumerate(ids_):
            out[row] = Updates[i]
    else:
        out[ids_] = 0
        for i, row in enumerate(ids_):
            out[row] += Updates[i]
    return {"Out": out}


PICK_CASES = [
    OpCase("gather", {"X": normal(5, 3), "Index": np.array([4, 0, 2])}, gather_ref,
           grad=("X",), id="gather-unique"),
    OpCase("gather", {"X": normal(4, 2, 3), "Index": np.array([[1], [3], [1], [1]], np.int32)},
           gather_ref, {"overwrite": False}, grad=("X",), id="gather-repeats_accumulate_int32"),
    OpCase("gather", {"X": normal(3), "Index": np.zeros(0, np.int64)}, gather_ref,
           grad=("X",), id="gather-empty_index"),
    OpCase("gather", {"X": normal(1, 4), "Index": np.array([0])}, gather_ref, grad=("X",),
           id="gather-size1"),
    OpCase("gather_nd", {"X": normal(3, 4, 2), "Index": np.array([[0, 1], [2, 3], [0, 1]])},
           gather_nd_ref, grad=("X",), id="gather_nd-rows_repeated"),
    OpCase("gather_nd", {"X": normal(3, 4), "Index": ids(3, 2, 2, 1, dtype="int32")},
           gather_nd_ref, grad=("X",), id="gather_nd-depth1_batched"),
    OpCase("gather_nd", {"X": normal(2, 3), "Index": np.array([[1, 2], [0, 0], [1, 0]])},
           gather_nd_ref, grad=("X",), id="gather_nd-full_depth"),
    OpCase("gather_nd", {"X": normal(2, 3), "Index": np.zeros((4, 0), np.int64)},
           lambda X, Index: {"Out": np.broadcast_to(X, (4, 2, 3))}, grad=("X",),
           id="gather_nd-depth0_repeats_X"),
    OpCase("gather_nd", {"X": normal(3, 2), "Index": np.zeros((0, 1), np.int64)},
           gather_nd_ref, grad=("X",), id="gather_nd-empty"),
    OpCase("scatter", {"X": normal(5, 3), "Ids": np.array([3, 0]), "Updates": normal(2, 3)},
           scatter_ref, grad=("X", "Updates"), id="scatter-unique"),
    OpCase("scatter", {"X": normal(4, 2), "Ids": np.array([1, 3, 1, 1]),
                       "Updates": normal(4, 2)},
           scatter_ref, grad=("X", "Updates"), id="scatter-repeats_last_wins"),
    OpCase("scatter", {"X": normal(4, 2), "Ids": np.array([[2], [0], [2]], np.int32),
                       "Updates": normal(3, 2)},
           scatter_ref, {"overwrite": False}, grad=("X", "Updates"),
           id="scatter-repeats_accumulate"),
    OpCase("scatter", {"X": normal(3), "Ids": np.zeros(0, np.int64), "Updates": normal(0)},
           scatter_ref, grad=("X", "Updates"), id="scatter-empty_ids"),
    OpCase("scatter", {"X": ids(9, 4, 2), "Ids": np.array([1]), "Updates": ids(9, 1, 2)},
           scatter_ref, id="scatter-int64"),
]  # fmt: skip


def test_gather_overwrite_gives_a_repeated_row_its_last_picks_gradient():
    """Fluid's overwrite mode (the default): repeated picks do not add up."""
    x = L.data("x", [3, 2], "float64")
    x.stop_gradient = False
    index = L.data("index", [3], "int64")
    out = L.gather(x, index)
    upstream = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    nf.append_backward(L.reduce_sum(out * L.assign(upstream.astype("float64"))))
    (grad,) = nf.Executor().run(
        feed={"x": np.zeros((3, 2)), "index": np.array([2, 0, 2])}, fetch_list=["x@GRAD"]
    )
    np.testing.assert_array_equal(grad, [[10, 20], [0, 0], [100, 200]])


# ---- one_hot ----


def one_hot_ref(X, depth=-1, dtype="float32", allow_out_of_range=False, drop_last=False):
    ids_ = X[..., 0] if drop_last else X
    eye = np.eye(depth, dtype=dtype)
    inside = (ids_ >= 0) & (ids_ < depth)
    return {"Out": np.where(inside[..., None], eye[np.where(inside, ids_, 0)], 0).astype(dtype)}


ONE_HOT_CASES = [
    OpCase("one_hot_v2", {"X": ids(5, 4)}, one_hot_ref, {"depth": 5}, id="one_hot_v2"),
    OpCase("one_hot_v2", {"X": ids(3, 2, 3, dtype="int32")}, one_hot_ref,
           {"depth": 4, "dtype": "float64"}, id="one_hot_v2-2d_float64"),
    OpCase("one_hot_v2", {"X": np.array([0, 7, -1, 2])}, one_hot_ref,
           {"depth": 3, "allow_out_of_range": True}, id="one_hot_v2-out_of_range_rows_zero"),
    OpCase("one_hot_v2", {"X": np.zeros(0, np.int64)}, one_hot_ref, {"depth": 2},
           id="one_hot_v2-empty"),
    OpCase("one_hot_v2", {"X": ids(6, 3), "depth_tensor": np.array([6], np.int32)},
           lambda X, depth_tensor: one_hot_ref(X, 6), id="one_hot_v2-depth_tensor"),
    OpCase("one_hot", {"X": ids(4, 5, 1)},
           lambda X, depth: one_hot_ref(X, depth, drop_last=True), {"depth": 4}, id="one_hot"),
    OpCase("one_hot", {"X": ids(4, 0, 1)},
           lambda X, depth: one_hot_ref(X, depth, drop_last=True), {"depth": 4},
           id="one_hot-empty_batch"),
    OpCase("one_hot", {"X": ids(1, 1, 1)},
           lambda X, depth: one_hot_ref(X, depth, drop_last=True), {"depth": 1},
           id="one_hot-size1"),
]  # fmt: skip


# ---- layout: pad, expand, squeeze, unsqueeze, stack, unstack ----


def pad_ref(X, paddings, pad_value=0.0):
    pairs = [(paddings[2 * i], paddings[2 * i + 1]) for i in range(X.ndim)]
    return {"Out": np.pad(X, pairs, constant_values=pad_value)}


def squeeze_ref(with_xshape):
    def ref(X, axes=()):
        ax = [a % X.ndim for a in axes] if axes else [i for i, d in enumerate(X.shape) if d == 1]
        out = {"Out": np.squeeze(X, tuple(a for a in ax if X.shape[a] == 1))}
        if with_xshape:
            out["XShape"] = np.zeros((0,) + X.shape, X.dtype)
        return out

    return ref


def unsqueeze_ref(with_xshape):
    def ref(X, axes=()):
        out = X
        for a in axes:
            out = np.expand_dims(out, a if a >= 0 else a + out.ndim + 1)
        result = {"Out": out}
        if with_xshape:
            result["XShape"] = np.zeros((0,) + X.shape, X.dtype)
        return result

    return ref


LAYOUT_CASES = [
    OpCase("pad", {"X": normal(2, 3)}, pad_ref, {"paddings": [1, 0, 2, 3], "pad_value": 0.5},
           grad=("X",), id="pad"),
    OpCase("pad", {"X": normal(0, 2)}, pad_ref, {"paddings": [1, 1, 0, 0]}, grad=("X",),
           id="pad-empty_batch"),
    OpCase("pad", {"X": normal(3)}, pad_ref, {"paddings": [0, 0]}, grad=("X",),
           id="pad-nothing"),
    OpCase("pad", {"X": ids(5, 1, 2)}, pad_ref, {"paddings": [2, 1, 0, 1]}, id="pad-int64"),
    OpCase("expand", {"X": normal(2, 3)}, lambda X, expand_times: {"Out": np.tile(X, expand_times)},
           {"expand_times": [3, 2]}, grad=("X",), id="expand"),
    OpCase("expand", {"X": normal(1, 3, 1)},
           lambda X, expand_times: {"Out": np.tile(X, expand_times)},
           {"expand_times": [2, 1, 5]}, grad=("X",), id="expand-size1_dims"),
    OpCase("expand", {"X": normal(0, 2)},
           lambda X, expand_times: {"Out": np.tile(X, expand_times)},
           {"expand_times": [4, 3]}, grad=("X",), id="expand-empty_batch"),
    OpCase("squeeze2", {"X": normal(1, 3, 1, 5)}, squeeze_ref(True), {"axes": [0, 2]},
           grad=("X",), id="squeeze2"),
    OpCase("squeeze2", {"X": normal(1, 3, 1, 5)}, squeeze_ref(True), {}, grad=("X",),
           id="squeeze2-all_ones"),
    OpCase("squeeze2", {"X": normal(6, 1, 5, 1)}, squeeze_ref(True), {"axes": [-1, 0]},
           grad=("X",), id="squeeze2-negative_and_kept_non1"),
    OpCase("squeeze2", {"X": normal(0, 1)}, squeeze_ref(True), {"axes": [1]}, grad=("X",),
           id="squeeze2-empty_batch"),
    OpCase("squeeze", {"X": normal(2, 1)}, squeeze_ref(False), {"axes": [1]}, grad=("X",),
           id="squeeze"),
    OpCase("squeeze", {"X": normal(0, 1, 3)}, squeeze_ref(False), {"axes": [1]}, grad=("X",),
           id="squeeze-empty_batch"),
    OpCase("squeeze", {"X": normal(1, 1, 1)}, squeeze_ref(False), {}, grad=("X",),
           id="squeeze-size1_all"),
    OpCase("unsqueeze2", {"X": normal(0, 3)}, unsqueeze_ref(True), {"axes": [1]},
           grad=("X",), id="unsqueeze2-empty_batch"),
    OpCase("unsqueeze2", {"X": normal(1)}, unsqueeze_ref(True), {"axes": [0, 2]},
           grad=("X",), id="unsqueeze2-size1"),
    OpCase("unsqueeze2", {"X": normal(3, 5)}, unsqueeze_ref(True), {"axes": [0, 2]},
           grad=("X",), id="unsqueeze2"),
    OpCase("unsqueeze2", {"X": normal(3, 5)}, unsqueeze_ref(True), {"axes": [-1, 0, -2]},
           grad=("X",), id="unsqueeze2-negative_in_turn"),
    OpCase("unsqueeze2", {"X": np.array(2.5)}, unsqueeze_ref(True), {"axes": [0]},
           grad=("X",), id="unsqueeze2-0d"),
    OpCase("unsqueeze", {"X": normal(0, 2)}, unsqueeze_ref(False), {"axes": [1]},
           grad=("X",), id="unsqueeze-empty_batch"),
    OpCase("stack", {"X": [normal(2, 3), normal(2, 3), normal(2, 3)]},
           lambda X, axis=0: {"Y": np.stack(X, axis)}, grad=("X",), id="stack"),
    OpCase("stack", {"X": [normal(2, 3), normal(2, 3)]},
           lambda X, axis: {"Y": np.stack(X, axis)}, {"axis": -1}, grad=("X",),
           id="stack-last_axis"),
    OpCase("stack", {"X": [normal(0, 2)]}, lambda X, axis: {"Y": np.stack(X, axis)},
           {"axis": 1}, grad=("X",), id="stack-one_empty"),
    OpCase("unstack", {"X": normal(3, 2)}, lambda X, axis, num: {"Y": list(X)},
           {"axis": 0, "num": 3}, grad=("X",), id="unstack"),
    OpCase("unstack", {"X": normal(2, 4, 3)},
           lambda X, axis, num: {"Y": list(np.moveaxis(X, axis, 0))}, {"axis": -2, "num": 4},
           grad=("X",), id="unstack-negative_axis"),
    OpCase("unstack", {"X": normal(1, 0)}, lambda X, axis, num: {"Y": [X[0]]},
           {"axis": 0, "num": 1}, grad=("X",), id="unstack-size1_empty_rows"),
]  # fmt: skip


# ---- cumsum / strided_slice / slice with decrease_axis ----


def cumsum_ref(X, axis=-1, flatten=False, exclusive=False, reverse=False):
    x = X.reshape(-1) if flatten else X
    ax = 0 if flatten else axis
    if reverse:
        x = np.flip(x, ax)
    out = np.cumsum(x, axis=ax, dtype=X.dtype)
    if exclusive:
        out = out - x
    return {"Out": np.flip(out, ax) if reverse else out}


def strided_ref(Input, axes, starts, ends, strides, decrease_axis=(), infer_flags=()):
    index = [slice(None)] * Input.ndim
    for a, s, e, st in zip(axes, starts, ends, strides):
        index[a] = slice(s, None if (st < 0 and e == -1) else e, st)
    out = Input[tuple(index)]
    keep = [d for i, d in enumerate(out.shape) if i not in [a % out.ndim for a in decrease_axis]]
    # Fluid 1.x keeps [1] where every dim is dropped
    return {"Out": out.reshape(keep or ([1] if decrease_axis else []))}


def slice_ref(Input, axes, starts, ends, decrease_axis=(), infer_flags=()):
    ones = [1] * len(axes)
    return strided_ref(Input, axes, starts, ends, ones, decrease_axis)


SCAN_CASES = [
    OpCase("cumsum", {"X": normal(3, 4)}, cumsum_ref, grad=("X",), id="cumsum"),
    OpCase("cumsum", {"X": normal(3, 4, 2)}, cumsum_ref, {"axis": 1, "exclusive": True},
           grad=("X",), id="cumsum-exclusive"),
    OpCase("cumsum", {"X": normal(5, 3)}, cumsum_ref, {"axis": 0, "reverse": True},
           grad=("X",), id="cumsum-reverse"),
    OpCase("cumsum", {"X": normal(4, 3)}, cumsum_ref, {"axis": -2, "exclusive": True,
                                                       "reverse": True},
           grad=("X",), id="cumsum-exclusive_reverse"),
    OpCase("cumsum", {"X": normal(2, 3)}, cumsum_ref, {"flatten": True}, grad=("X",),
           id="cumsum-flatten"),
    OpCase("cumsum", {"X": normal(0, 3)}, cumsum_ref, {"axis": 0, "exclusive": True},
           grad=("X",), id="cumsum-empty_batch"),
    OpCase("cumsum", {"X": ids(9, 6, dtype="int32")}, cumsum_ref, id="cumsum-int32"),
    OpCase("strided_slice", {"Input": normal(7, 4)}, strided_ref,
           {"axes": [0], "starts": [1], "ends": [7], "strides": [2]}, grad=("Input",),
           id="strided_slice"),
    OpCase("strided_slice", {"Input": normal(6, 5)}, strided_ref,
           {"axes": [0, 1], "starts": [-1, 4], "ends": [-1, 0], "strides": [-2, -1]},
           grad=("Input",), id="strided_slice-negative_strides_end_minus1_is_none"),
    OpCase("strided_slice", {"Input": normal(4, 3, 5)}, strided_ref,
           {"axes": [1, 2], "starts": [2, 0], "ends": [3, 100], "strides": [1, 3],
            "decrease_axis": [1]},
           grad=("Input",), id="strided_slice-decrease"),
    OpCase("strided_slice", {"Input": normal(0, 5)}, strided_ref,
           {"axes": [1], "starts": [0], "ends": [5], "strides": [2]}, grad=("Input",),
           id="strided_slice-empty_batch"),
    OpCase("strided_slice", {"Input": normal(5)}, strided_ref,
           {"axes": [0], "starts": [3], "ends": [1], "strides": [1]}, grad=("Input",),
           id="strided_slice-empty_result"),
    OpCase("slice", {"Input": normal(3, 4, 5)}, slice_ref,
           {"axes": [1, 2], "starts": [-1, 1], "ends": [10000, 4], "decrease_axis": [1]},
           grad=("Input",), id="slice-decrease_axis"),
    OpCase("slice", {"Input": normal(3)}, slice_ref,
           {"axes": [0], "starts": [1], "ends": [2], "decrease_axis": [0]}, grad=("Input",),
           id="slice-decrease_every_dim"),
]  # fmt: skip


# ---- range / shape / fill_constant_batch_size_like ----


def range_ref(Start, End, Step):
    return {"Out": np.arange(Start[0], End[0], Step[0], dtype=Start.dtype)}


def batch_like_ref(Input, shape, dtype="float32", value=0.0, input_dim_idx=0,
                   output_dim_idx=0, **_):  # fmt: skip
    out = list(shape)
    out[output_dim_idx] = Input.shape[input_dim_idx]
    return {"Out": np.full(out, value, dtype)}


def one(value, dtype):
    return np.array([value], dtype)


SHAPE_CASES = [
    OpCase("range", {"Start": one(0, "int64"), "End": one(10, "int64"), "Step": one(3, "int64")},
           range_ref, id="range-int64"),
    OpCase("range", {"Start": one(1.0, "float32"), "End": one(-1.0, "float32"),
                     "Step": one(-0.5, "float32")}, range_ref, id="range-float_descending"),
    OpCase("range", {"Start": one(5, "int32"), "End": one(5, "int32"), "Step": one(1, "int32")},
           range_ref, id="range-empty"),
    OpCase("shape", {"Input": normal(0, 3, 1)},
           lambda Input: {"Out": np.array([0, 3, 1], np.int32)}, id="shape"),
    OpCase("shape", {"Input": np.array(1.0)}, lambda Input: {"Out": np.zeros(0, np.int32)},
           id="shape-0d"),
    OpCase("fill_constant_batch_size_like", {"Input": normal(5, 2)}, batch_like_ref,
           {"shape": [-1, 3], "value": 1.5}, id="fill_constant_batch_size_like"),
    OpCase("fill_constant_batch_size_like", {"Input": normal(2, 7)}, batch_like_ref,
           {"shape": [4, 1, -1], "dtype": "int64", "value": 3.0, "input_dim_idx": 1,
            "output_dim_idx": 2}, id="fill_constant_batch_size_like-dims"),
    OpCase("fill_constant_batch_size_like", {"Input": normal(0, 2)}, batch_like_ref,
           {"shape": [-1, 2]}, id="fill_constant_batch_size_like-empty_batch"),
    OpCase("fill_constant_batch_size_like", {"Input": normal(2, 2)},
           lambda Input, shape, str_value: {"Out": np.full((2, 1), np.inf, "float32")},
           {"shape": [-1, 1], "str_value": "inf"}, id="fill_constant_batch_size_like-str_value"),
]  # fmt: skip


@pytest.mark.parametrize(
    "case",
    SEARCH_CASES + PICK_CASES + ONE_HOT_CASES + LAYOUT_CASES + SCAN_CASES + SHAPE_CASES,
    ids=case_id,
)
def test_op(case):
    case.check()


# ---- PyTorch agrees ----


def _run(fetch, feed):
    return nf.Executor().run(feed=feed, fetch_list=fetch)


def test_topk_argmax_argmin_match_torch():
    torch = pytest.importorskip("torch")
    x = distinct(4, 7)
    xv = L.data("x", [-1, 7], "float64")
    values, indices = L.topk(xv, k=3)
    got = _run([values, indices, L.argmax(xv, axis=1), L.argmin(xv, axis=0)], {"x": x})
    t = torch.tensor(x)
    want = torch.topk(t, 3)
    np.testing.assert_array_equal(got[0], want.values.numpy())
    np.testing.assert_array_equal(got[1], want.indices.numpy())
    np.testing.assert_array_equal(got[2], torch.argmax(t, dim=1).numpy())
    np.testing.assert_array_equal(got[3], torch.argmin(t, dim=0).numpy())


@pytest.mark.parametrize("width,k", [(4, 2), (90, 3)], ids=["full_sort", "partitioned"])
def test_topk_ranks_nan_first_like_torch(width, k):
    torch = pytest.importorskip("torch")
    x = distinct(2, width)
    x[0, [1, width // 2]] = np.nan
    values, indices = L.topk(L.data("x", [2, width], "float64"), k=k)
    got = _run([values, indices], {"x": x})
    want = torch.topk(torch.tensor(x), k)
    np.testing.assert_array_equal(got[1], want.indices.numpy())
    np.testing.assert_array_equal(got[0], want.values.numpy())


def test_gather_scatter_cumsum_values_and_gradients_match_torch():
    torch = pytest.importorskip("torch")
    x, upd = normal(6, 3), normal(3, 3)
    index = np.array([4, 1, 4])
    xv = L.data("x", [6, 3], "float64")
    uv = L.data("u", [3, 3], "float64")
    iv = L.data("i", [3], "int64")
    for v in (xv, uv):
        v.stop_gradient = False
    g = L.gather(xv, iv, overwrite=False)
    s = L.scatter(xv, iv, uv, overwrite=False)
    c = L.cumsum(xv, axis=0, reverse=True)
    w = [normal(3, 3), normal(6, 3), normal(6, 3)]
    loss = L.reduce_sum(g * L.assign(w[0])) + L.reduce_sum(s * L.assign(w[1]))
    loss = loss + L.reduce_sum(c * L.assign(w[2]))
    nf.append_backward(loss)
    got = _run([g, s, c, "x@GRAD", "u@GRAD"], {"x": x, "u": upd, "i": index})

    tx = torch.tensor(x, requires_grad=True)
    tu = torch.tensor(upd, requires_grad=True)
    ti = torch.tensor(index)
    tg = torch.index_select(tx, 0, ti)
    # scatter with overwrite=False: the named rows are zeroed, then the updates added
    keep = torch.ones(6, 1, dtype=torch.float64).index_fill(0, ti, 0.0)
    ts = (tx * keep).index_add(0, ti, tu)
    tc = torch.flip(torch.cumsum(torch.flip(tx, [0]), 0), [0])
    tw = [torch.tensor(a) for a in w]
    ((tg * tw[0]).sum() + (ts * tw[1]).sum() + (tc * tw[2]).sum()).backward()
    for mine, theirs in zip(got, [tg, ts, tc, tx.grad, tu.grad]):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_one_hot_pad_expand_stack_match_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    labels, x = ids(4, 5), normal(2, 3)
    lv, xv = L.data("l", [-1], "int64"), L.data("x", [2, 3], "float64")
    outs = [
        nf.one_hot(lv, depth=4),
        L.pad(xv, [1, 2, 0, 3], pad_value=-1.0),
        L.expand(xv, [2, 3]),
        L.stack([xv, xv * 2.0], axis=1),
    ]
    got = _run(outs, {"l": labels, "x": x})
    t = torch.tensor(x)
    want = [
        F.one_hot(torch.tensor(labels), 4).float(),
        F.pad(t, (0, 3, 1, 2), value=-1.0),
        t.repeat(2, 3),
        torch.stack([t, t * 2.0], dim=1),
    ]
    for mine, theirs in zip(got, want):
        np.testing.assert_array_equal(mine, theirs.numpy())


# ---- run-time index errors name the index, the op and the line ----


def _index_error(build, feed):
    """The message of the ExecutionError running what `build` appends (a program of its own)."""
    with nf.program_guard(nf.Program(), nf.Program()):
        out = build()
        with pytest.raises(nf.errors.ExecutionError) as info:
            _run([out], feed)
    return str(info.value)


def test_gather_index_out_of_range_names_value_position_op_and_line():
    def build():
        return L.gather(L.data("x", [4, 2], "float32"), L.data("i", [3], "int64"))

    feed = {"x": np.zeros((4, 2), "float32"), "i": np.array([1, 7, -2])}
    message = _index_error(build, feed)
    assert "op 'gather'" in message and "test_indexing.py" in message
    assert "index 7 at position [1] is out of range [0, 4)" in message
    assert "2 of 3 indexes" in message


def test_scatter_and_gather_nd_index_errors():
    def x():
        return L.data("x", [3, 2], "float32")

    def scatter():
        return L.scatter(x(), L.data("i", [2], "int64"), L.data("u", [2, 2], "float32"))

    feed = {"x": np.zeros((3, 2), "float32"), "u": np.ones((2, 2), "float32")}
    message = _index_error(scatter, dict(feed, i=np.array([0, -1])))
    assert "op 'scatter'" in message and "index -1 at position [1]" in message
    message = _index_error(
        lambda: L.gather_nd(x(), L.data("n", [2, 2], "int64")),
        {"x": feed["x"], "n": np.array([[0, 1], [1, 2]])},
    )
    assert "op 'gather_nd'" in message
    assert "index 2 at position [1, 1] is out of range [0, 2)" in message


def test_one_hot_id_out_of_range_unless_allowed():
    feed = {"label": np.array([[0, 1], [5, 2]])}
    message = _index_error(lambda: nf.one_hot(L.data("label", [-1, 2], "int64"), depth=3), feed)
    assert "op 'one_hot_v2'" in message and "index 5 at position [1, 0]" in message
    label = L.data("label", [-1, 2], "int64")
    (out,) = _run([nf.one_hot(label, depth=3, allow_out_of_range=True)], feed)
    want = [[[1, 0, 0], [0, 1, 0]], [[0, 0, 0], [0, 0, 1]]]  # id 5: an all-zero row
    np.testing.assert_array_equal(out, np.array(want, "float32"))


def test_range_step_zero_is_an_execution_error():
    step = L.data("step", [1], "int64")
    out = L.range(0, 5, step, "int64")
    assert out.shape == (-1,)
    with pytest.raises(nf.errors.ExecutionError, match="Step is 0"):
        _run([out], {"step": np.array([0])})


# ---- build-time errors ----


def test_build_time_errors_name_the_problem():
    x = L.data("x", [2, 3], "float32")
    i = L.data("i", [2], "int64")
    with pytest.raises(ShapeError, match=r"axis 2 is out of range for X \[2, 3\] of rank 2"):
        L.argmax(x, axis=2)
    with pytest.raises(ShapeError, match=r"k=4 is larger than the last dim of X \[2, 3\]"):
        L.topk(x, k=4)
    with pytest.raises(DTypeError, match="Index must be int32 or int64, got float32"):
        L.gather(x, x)
    with pytest.raises(ShapeError, match=r"Updates \[3, 3\] must be \[2, 3\]"):
        L.scatter(x, i, L.data("u", [3, 3], "float32"))
    with pytest.raises(nf.errors.AttrError, match="depth must be >= 1"):
        nf.one_hot(i, depth=0)
    with pytest.raises(nf.errors.AttrError, match=r"paddings \[1, 1\] must hold 2 numbers"):
        L.pad(x, [1, 1])
    with pytest.raises(nf.errors.AttrError, match=r"expand_times \[2, 0\] must be >= 1"):
        L.expand(x, [2, 0])
    with pytest.raises(ShapeError, match="axis 4 is out of range for a dim inserted"):
        L.unsqueeze(x, [4])
    with pytest.raises(ShapeError, match=r"X\[1\] \[3, 2\] and X\[0\] \[2, 3\] differ"):
        L.stack([x, L.data("y", [3, 2], "float32")])
    with pytest.raises(ShapeError, match="dim 1 of 'z' .* is unknown"):
        L.unstack(L.data("z", [2, -1], "float32"), axis=1)
    with pytest.raises(nf.errors.AttrError, match="strides .* hold a 0"):
        L.strided_slice(x, [0], [0], [2], [0])
    with pytest.raises(DTypeError, match="Condition must be bool"):
        L.where(x, x, x)


def test_index_columns_unknown_at_build_time_are_checked_at_run_time():
    x = L.data("x", [4, 2], "float32")
    out = L.gather(x, L.data("i", [-1, -1], "int64"))
    feed = {"x": np.zeros((4, 2), "float32"), "i": np.zeros((2, 3), np.int64)}
    with pytest.raises(
        ShapeError, match=r"op 'gather'(.|\n)*Index \[2, 3\] must be \[N\] or \[N, 1\]"
    ):  # noqa: E501
        _run([out], feed)
