"""Tensor ops: NumPy-reference forward and float64 gradient checks, shape inference, errors."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from nestflow.ops.registry import get_op_def, place_args
from tests.ops.harness import OpCase, case_id

L = nf.layers

R = np.random.default_rng(42)


def rand(*shape, dtype="float32"):
    return R.standard_normal(shape).astype(dtype)


def _dropout_ref(X, dropout_prob=0.5, is_test=False, seed=0,
                 dropout_implementation="downgrade_in_infer"):  # fmt: skip
    """A fixed seed draws the keep mask from np.random.default_rng(seed) (uniform >= p);
    Fluid's downgrade_in_infer scales at inference, upscale_in_train in training."""
    upscale = dropout_implementation == "upscale_in_train"
    if is_test:
        out = X if upscale else (X * (1 - dropout_prob)).astype(X.dtype)
        return {"Out": out, "Mask": np.ones(X.shape, np.uint8)}
    mask = (np.random.default_rng(seed).random(X.shape) >= dropout_prob).astype(np.uint8)
    scale = 1 / (1 - dropout_prob) if upscale else 1.0
    return {"Out": (X * mask * scale).astype(X.dtype), "Mask": mask}


def _split_ref(X, num=0, sections=(), axis=-1):
    if num:
        return {"Out": np.split(X, num, axis=axis)}
    sizes = list(sections)
    if -1 in sizes:
        sizes[sizes.index(-1)] = X.shape[axis] - (sum(sizes) + 1)
    return {"Out": np.split(X, np.cumsum(sizes)[:-1], axis=axis)}


def _slice_ref(Input, axes, starts, ends):
    index = [builtins.slice(None)] * Input.ndim
    for ax, s, e in zip(axes, starts, ends):
        index[ax] = builtins.slice(s, e)
    return {"Out": Input[tuple(index)]}


def _lookup_ref(W, Ids, padding_idx=-1):
    ids = Ids[..., 0] if Ids.ndim >= 2 and Ids.shape[-1] == 1 else Ids
    out = W[ids]
    out[ids == padding_idx] = 0
    return {"Out": out}


X234 = rand(2, 3, 4)
IDS = np.array([[1], [3], [1], [0], [3]], np.int64)  # repeated ids accumulate gradients


def _uniform_ref(shape, dtype, min, max, seed):
    """A fixed seed draws from np.random.default_rng(seed), then casts to dtype."""
    return {"Out": np.random.default_rng(seed).uniform(min, max, size=shape).astype(dtype)}


def _gaussian_ref(shape, dtype, mean, std, seed):
    return {"Out": np.random.default_rng(seed).normal(mean, std, size=shape).astype(dtype)}


# Ops with no inputs: the tensor is made from attrs alone (issue 2's fill/random ops).
CREATION_CASES = [
    OpCase(
        "fill_constant",
        {},
        lambda shape, dtype, value: {"Out": np.full(shape, value, dtype)},
        {"shape": [2, 3], "dtype": "float32", "value": 1.5},
        id="fill_constant-2d",
    ),
    OpCase(
        "fill_constant",
        {},
        lambda shape, dtype, value: {"Out": np.full(shape, value, dtype)},
        {"shape": [1], "dtype": "int64", "value": 7.0},
        id="fill_constant-size1-int64",
    ),
    OpCase(
        "fill_constant",
        {},
        lambda shape, dtype, value: {"Out": np.full(shape, value, dtype)},
        {"shape": [0, 4], "dtype": "float64", "value": -2.0},
        id="fill_constant-empty",
    ),
    OpCase(
        "fill_constant",
        {},
        lambda shape, dtype, value: {"Out": np.full((), value, dtype)},
        {"shape": [], "dtype": "float32", "value": 3.0},
        id="fill_constant-0d",
    ),
    OpCase(
        "uniform_random",
        {},
        _uniform_ref,
        {"shape": [4, 3], "dtype": "float32", "min": -0.5, "max": 2.0, "seed": 9},
        id="uniform_random-seeded",
    ),
    OpCase(
        "uniform_random",
        {},
        _uniform_ref,
        {"shape": [0, 3], "dtype": "float64", "min": -1.0, "max": 1.0, "seed": 9},
        id="uniform_random-empty",
    ),
    OpCase(
        "gaussian_random",
        {},
        _gaussian_ref,
        {"shape": [3, 1, 2], "dtype": "float32", "mean": 1.0, "std": 0.5, "seed": 4},
        id="gaussian_random-seeded-size1",
    ),
    OpCase(
        "gaussian_random",
        {},
        _gaussian_ref,
        {"shape": [0], "dtype": "float64", "mean": 0.0, "std": 1.0, "seed": 4},
        id="gaussian_random-empty",
    ),
    OpCase(
        "assign_value",
        {},
        lambda shape, dtype, values: {"Out": np.array(values, dtype).reshape(shape)},
        {"shape": [3, 1], "dtype": "int64", "values": [10, 20, 30]},
        id="assign_value-column",
    ),
]


@pytest.mark.parametrize("op_type", ["uniform_random", "gaussian_random"])
def test_random_fill_draws_within_its_distribution(op_type):
    """uniform_random stays in [min, max); gaussian_random has the asked mean and std."""
    attrs = {"min": 2.0, "max": 3.0} if op_type == "uniform_random" else {"mean": 5.0, "std": 0.25}
    prog = nf.Program()
    prog.global_block().append_op(
        op_type, {}, {"Out": ["out"]}, {"shape": [200, 50], "dtype": "float64", **attrs}
    )
    nf.seed(1)
    (out,) = nf.Executor().run(prog, fetch_list=["out"], scope=nf.Scope())
    assert out.shape == (200, 50) and out.dtype == np.float64
    if op_type == "uniform_random":
        assert out.min() >= 2.0 and out.max() < 3.0
        assert abs(out.mean() - 2.5) < 0.02
    else:
        assert abs(out.mean() - 5.0) < 0.01 and abs(out.std() - 0.25) < 0.01


CASES = [
    OpCase("assign", {"X": X234}, lambda X: {"Out": X}, grad=("X",)),
    OpCase("assign", {"X": rand(0, 3)}, lambda X: {"Out": X}, id="assign-empty"),
    OpCase("assign", {"X": np.array([1, 2], np.int32)}, lambda X: {"Out": X}, id="assign-int"),
    OpCase(
        "cast",
        {"X": rand(3, 2)},
        lambda X, out_dtype: {"Out": X.astype(out_dtype)},
        {"out_dtype": "float64"},
        grad=("X",),
        id="cast-float32-float64",
    ),
    OpCase(
        "cast",
        {"X": np.array([-1.7, 0.2, 2.9], np.float32)},
        lambda X, out_dtype: {"Out": X.astype(out_dtype)},
        {"out_dtype": "int64"},
        id="cast-float-int",
    ),
    OpCase(
        "cast",
        {"X": np.array([True, False])},
        lambda X, out_dtype: {"Out": X.astype(out_dtype)},
        {"out_dtype": "float32"},
        id="cast-bool-float",
    ),
    OpCase(
        "reshape",
        {"X": X234},
        lambda X, shape: {"Out": X.reshape(2, 12)},
        {"shape": [0, -1]},
        grad=("X",),
        id="reshape-copy-and-infer",
    ),
    OpCase(
        "reshape",
        {"X": X234},
        lambda X, shape: {"Out": X.reshape(4, 1, 6)},
        {"shape": [4, 1, -1]},
        id="reshape-size-1-dim",
    ),
    OpCase(
        "reshape",
        {"X": rand(0, 4)},
        lambda X, shape: {"Out": X.reshape(0, 2, 2)},
        {"shape": [0, 2, 2]},
        id="reshape-empty",
    ),
    OpCase(
        "reshape",
        {"X": rand(1, 1)},
        lambda X, shape: {"Out": X.reshape(())},
        {"shape": []},
        id="reshape-to-0d",
    ),
    OpCase(
        "transpose",
        {"X": X234},
        lambda X, axis: {"Out": X.transpose(axis)},
        {"axis": [2, 0, 1]},
        grad=("X",),
    ),
    OpCase(
        "transpose",
        {"X": X234},
        lambda X, axis: {"Out": X.transpose(1, 0, 2)},
        {"axis": [-2, 0, -1]},
        id="transpose-negative-axes",
    ),
    OpCase(
        "transpose",
        {"X": rand(0, 3)},
        lambda X, axis: {"Out": X.T},
        {"axis": [1, 0]},
        id="transpose-empty",
    ),
    OpCase(
        "concat",
        {"X": [rand(2, 1), rand(2, 3), rand(2, 2)]},
        lambda X, axis: {"Out": np.concatenate(X, axis=1)},
        {"axis": 1},
        grad=("X",),
    ),
    OpCase(
        "concat",
        {"X": [rand(2, 3), rand(0, 3), rand(1, 3)]},
        lambda X, axis: {"Out": np.concatenate(X, axis=0)},
        {"axis": -2},
        grad=("X",),
        id="concat-negative-axis-empty-part",
    ),
    OpCase(
        "split",
        {"X": rand(2, 6)},
        _split_ref,
        {"num": 3, "axis": 1},
        grad=("X",),
        id="split-num",
    ),
    OpCase(
        "split",
        {"X": rand(7, 2)},
        _split_ref,
        {"sections": [2, -1, 0, 1], "axis": -2},
        grad=("X",),
        id="split-sections-with-rest-and-empty",
    ),
    OpCase(
        "slice",
        {"Input": X234},
        _slice_ref,
        {"axes": [1, 2], "starts": [-2, 1], "ends": [100, -1]},
        grad=("Input",),
        id="slice-negative-and-clamped",
    ),
    OpCase(
        "slice",
        {"Input": X234},
        _slice_ref,
        {"axes": [-1], "starts": [3], "ends": [1]},
        id="slice-empty-result",
    ),
    OpCase(
        "slice",
        {"Input": X234},
        _slice_ref,
        {"axes": [0], "starts": [-100], "ends": [1]},
        id="slice-start-before-begin",
    ),
    OpCase(
        "lookup_table",
        {"W": rand(4, 3), "Ids": IDS},
        _lookup_ref,
        grad=("W",),
        id="lookup-ids-column",
    ),
    OpCase(
        "lookup_table",
        {"W": rand(5, 2), "Ids": np.array([[0, 4, 2], [2, 2, 1]], np.int64)},
        _lookup_ref,
        {"padding_idx": 2},
        grad=("W",),
        id="lookup-2d-ids-padding",
    ),
    OpCase(
        "lookup_table",
        {"W": rand(3, 2), "Ids": np.zeros((0,), np.int64)},
        _lookup_ref,
        id="lookup-no-ids",
    ),
    *[
        OpCase(
            "dropout",
            {"X": rand(3, 4)},
            _dropout_ref,
            {"dropout_prob": 0.4, "seed": 11, "dropout_implementation": kind},
            grad=("X",),
            id=f"dropout-train-seeded-{kind}",
        )
        for kind in ("downgrade_in_infer", "upscale_in_train")
    ],
    *[
        OpCase(
            "dropout",
            {"X": rand(3, 5)},
            _dropout_ref,
            {"dropout_prob": 0.4, "is_test": True, "dropout_implementation": kind},
            grad=("X",),
            id=f"dropout-test-{kind}",
        )
        for kind in ("downgrade_in_infer", "upscale_in_train")
    ],
    OpCase(
        "dropout",
        {"X": rand(2, 0)},
        _dropout_ref,
        {"dropout_prob": 0.5, "seed": 3},
        id="dropout-empty",
    ),
    OpCase(
        "dropout",
        {"X": rand(1, 1)},
        _dropout_ref,
        {"dropout_prob": 1.0, "is_test": True},
        id="dropout-test-p1-downgrade",
    ),
    OpCase(
        "increment",
        {"X": np.array([3], np.int64)},
        lambda X, step: {"Out": X + 2},
        {"step": 2.0},
        id="increment-int",
    ),
    OpCase(
        "increment",
        {"X": np.array([0.5], np.float32)},
        lambda X, step: {"Out": X - np.float32(1.5)},
        {"step": -1.5},
        id="increment-float",
    ),
    OpCase(
        "increment",
        {"X": rand(2, 3)},
        lambda X, step: {"Out": X + 0.25},
        {"step": 0.25},
        grad=("X",),
        id="increment-grad",
    ),
    OpCase("fill_zeros_like", {"X": X234}, lambda X: {"Out": np.zeros_like(X)}),
    OpCase(
        "fill_any_like",
        {"X": np.zeros((2, 1), np.float32)},
        lambda X, value, dtype: {"Out": np.full((2, 1), 7, np.int32)},
        {"value": 7.0, "dtype": "int32"},
    ),
    # edge shapes: empty batch and size-1 dims for the layout ops
    OpCase(
        "cast",
        {"X": rand(0, 3)},
        lambda X, out_dtype: {"Out": X.astype(out_dtype)},
        {"out_dtype": "float64"},
        grad=("X",),
        id="cast-empty",
    ),
    OpCase(
        "transpose",
        {"X": rand(3, 1, 2)},
        lambda X, axis: {"Out": X.transpose(1, 2, 0)},
        {"axis": [1, 2, 0]},
        grad=("X",),
        id="transpose-size1",
    ),
    OpCase(
        "concat",
        {"X": [rand(0, 2), rand(0, 3)]},
        lambda X, axis: {"Out": np.concatenate(X, axis=1)},
        {"axis": 1},
        grad=("X",),
        id="concat-empty-batch",
    ),
    OpCase(
        "split",
        {"X": rand(0, 4)},
        _split_ref,
        {"num": 2, "axis": 1},
        grad=("X",),
        id="split-empty-batch",
    ),
    OpCase(
        "split",
        {"X": rand(3, 1)},
        _split_ref,
        {"num": 1, "axis": 1},
        grad=("X",),
        id="split-size1",
    ),
    OpCase(
        "slice",
        {"Input": rand(0, 3, 4)},
        _slice_ref,
        {"axes": [2], "starts": [1], "ends": [3]},
        grad=("Input",),
        id="slice-empty-batch",
    ),
    OpCase(
        "slice",
        {"Input": rand(2, 1, 4)},
        _slice_ref,
        {"axes": [1, 2], "starts": [0, -1], "ends": [1, 4]},
        grad=("Input",),
        id="slice-size1",
    ),
    OpCase(
        "reshape",
        {"X": rand(0, 3)},
        lambda X, shape: {"Out": X.reshape(0, 3, 1)},
        {"shape": [0, 3, 1]},
        grad=("X",),
        id="reshape-empty-grad",
    ),
]


@pytest.mark.parametrize("case", CREATION_CASES + CASES, ids=case_id)
def test_op(case):
    case.check()


def test_cast_gradient_returns_to_the_input_dtype():
    x = np.array([1.0, 2.0], np.float32)
    cast_grad = get_op_def("cast_grad").forward
    (grad,) = cast_grad(
        x, x.astype(np.float64), np.ones(2), out_dtype="float64", **place_args(cast_grad)
    )
    assert grad.dtype == np.float32
    (none,) = cast_grad(
        np.array([1, 2]), x, np.ones(2, np.float32), out_dtype="float32", **place_args(cast_grad)
    )
    assert none is None


# ---- build-time shape inference and errors ----


def _shape_error(build, *fragments):
    with pytest.raises(ShapeError) as info:
        build()
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, text
    return text


def test_reshape_infers_with_an_unknown_batch_dim():
    x = L.data("x", [-1, 3, 4], "float32")
    assert L.reshape(x, [0, -1]).shape == (-1, 12)
    assert L.reshape(x, [-1, 6]).shape == (-1, 6)
    assert L.reshape(x, [0, 0, 2, -1]).shape == (-1, 3, 2, 2)
    assert L.reshape(L.data("y", [2, 3, 4]), [4, -1]).shape == (4, 6)


def test_reshape_size_mismatch_names_the_op_and_both_shapes():
    x = L.data("x", [2, 3], "float32")
    _shape_error(lambda: L.reshape(x, [4, 2]), "op 'reshape'", "[2, 3]", "[4, 2]")
    _shape_error(lambda: L.reshape(x, [4, -1]), "op 'reshape'", "[2, 3]", "[4, -1]")
    y = L.data("y", [-1, 3, 4], "float32")
    _shape_error(lambda: L.reshape(y, [5, 7]), "op 'reshape'", "[-1, 3, 4]", "[5, 7]")


def test_reshape_rejects_two_inferred_dims():
    x = L.data("x", [2, 3], "float32")
    _shape_error(lambda: L.reshape(x, [-1, -1]), "more than one -1")


def test_reshape_size_mismatch_at_run_time_names_both_shapes():
    x = L.data("x", [-1, 3], "float32")
    out = L.reshape(x, [-1, 2])
    with pytest.raises(ShapeError, match=r"\[5, 3\].*\[-1, 2\]"):
        nf.Executor().run(feed={"x": np.zeros((5, 3), "float32")}, fetch_list=[out])


def test_transpose_rejects_a_non_permutation():
    x = L.data("x", [2, 3, 4], "float32")
    _shape_error(lambda: L.transpose(x, [0, 0, 1]), "op 'transpose'", "[0, 0, 1]", "[2, 3, 4]")
    assert L.transpose(x, [2, 0, 1]).shape == (4, 2, 3)


def test_concat_mismatch_names_both_shapes():
    a, b = L.data("a", [2, 3], "float32"), L.data("b", [2, 4], "float32")
    _shape_error(lambda: L.concat([a, b], axis=0), "op 'concat'", "[2, 3]", "[2, 4]")
    assert L.concat([a, b], axis=1).shape == (2, 7)
    assert L.concat([a, L.data("c", [-1, 3], "float32")], axis=0).shape == (-1, 3)


def test_split_shapes_and_errors():
    x = L.data("x", [-1, 7], "float32")
    assert [v.shape for v in L.split(x, [2, -1, 1], dim=1)] == [(-1, 2), (-1, 4), (-1, 1)]
    assert [v.shape for v in L.split(x, 2, dim=0)] == [(-1, 7), (-1, 7)]
    _shape_error(lambda: L.split(x, 2, dim=1), "op 'split'", "7", "[-1, 7]")
    _shape_error(lambda: L.split(x, [2, 3], dim=1), "sum to 5", "[-1, 7]")
    _shape_error(lambda: L.split(x, [2], dim=2), "axis 2 is out of range")


def test_slice_infers_clamped_sizes():
    x = L.data("x", [-1, 5, 6], "float32")
    assert L.slice(x, [1, 2], [-2, 1], [100, -1]).shape == (-1, 2, 4)
    assert L.slice(x, [0], [1], [3]).shape == (-1, 5, 6)
    assert L.slice(x, [-1], [4], [2]).shape == (-1, 5, 0)
    with pytest.raises(AttrError, match="differ in length"):
        L.slice(x, [1], [0, 1], [2])


def test_lookup_table_errors():
    ids = L.data("ids", [-1, 1], "int64")
    out = L.embedding(ids, [10, 4])
    assert out.shape == (-1, 4)
    with pytest.raises(DTypeError, match="integer"):
        L.embedding(L.data("f", [-1, 1], "float32"), [10, 4])
    with pytest.raises(AttrError, match="padding_idx 10"):
        L.embedding(ids, [10, 4], padding_idx=10)
    exe = nf.Executor()
    scope = nf.Scope()
    exe.run(nf.default_startup_program(), scope=scope)
    with pytest.raises(ExecutionError, match=r"\[12\] outside the table's rows \[0, 10\)"):
        exe.run(feed={"ids": np.array([[1], [12]])}, fetch_list=[out], scope=scope)


def test_cast_and_dropout_attr_errors():
    x = L.data("x", [2], "float32")
    assert L.cast(x, np.int32).dtype == "int32"
    with pytest.raises(AttrError, match="dropout_prob"):
        L.dropout(x, dropout_prob=1.5)


# ---- dropout's randomness ----


def _dropout(x, **attrs):
    forward = get_op_def("dropout").forward
    attrs = {"is_test": False, "seed": 0, "dropout_implementation": "upscale_in_train", **attrs}
    return forward(x, **attrs, **place_args(forward))


def _dropout_grad(*args, **attrs):
    backward = get_op_def("dropout_grad").forward
    attrs = {"dropout_implementation": "upscale_in_train", **attrs}
    return backward(*args, **attrs, **place_args(backward))


def test_dropout_keeps_about_one_minus_p_and_scales_the_kept():
    x = np.ones((200, 50))
    out, mask = _dropout(x, dropout_prob=0.3)
    assert mask.dtype == np.uint8
    assert abs(mask.mean() - 0.7) < 0.02
    np.testing.assert_allclose(out, mask / 0.7)


def test_dropout_seed_fixes_the_mask_and_seed_zero_follows_nf_seed():
    x = np.ones((10, 10))
    a, b = _dropout(x, dropout_prob=0.5, seed=7), _dropout(x, dropout_prob=0.5, seed=7)
    np.testing.assert_array_equal(a[1], b[1])
    nf.seed(3)
    c = _dropout(x, dropout_prob=0.5)[1]
    d = _dropout(x, dropout_prob=0.5)[1]
    nf.seed(3)
    np.testing.assert_array_equal(_dropout(x, dropout_prob=0.5)[1], c)
    assert not np.array_equal(c, d)


def test_dropout_of_everything_is_zeros_without_dividing_by_zero():
    x = np.full((3, 4), 2.0)
    with np.errstate(all="raise"):
        out, mask = _dropout(x, dropout_prob=1.0)
        (grad,) = _dropout_grad(
            x, out, mask, np.ones_like(x), None, dropout_prob=1.0, is_test=False, seed=0
        )
    np.testing.assert_array_equal(out, np.zeros_like(x))
    np.testing.assert_array_equal(mask, np.zeros(x.shape, np.uint8))
    np.testing.assert_array_equal(grad, np.zeros_like(x))


def test_downgrade_in_infer_keeps_unscaled_in_training_and_scales_at_inference():
    x = np.full((100, 40), 2.0)
    out, mask = _dropout(x, dropout_prob=0.25, dropout_implementation="downgrade_in_infer")
    np.testing.assert_array_equal(out, 2.0 * mask)
    (grad,) = _dropout_grad(
        x,
        out,
        mask,
        np.ones_like(x),
        None,
        dropout_prob=0.25,
        is_test=False,
        seed=0,
        dropout_implementation="downgrade_in_infer",
    )
    np.testing.assert_array_equal(grad, mask.astype(float))
    test_out, _ = _dropout(x, dropout_prob=0.25, is_test=True,
                           dropout_implementation="downgrade_in_infer")  # fmt: skip
    np.testing.assert_array_equal(test_out, np.full_like(x, 1.5))
    with pytest.raises(AttrError, match="dropout_implementation must be one of"):
        L.dropout(nf.data("y", [-1, 2]), 0.5, dropout_implementation="scale")


def test_dropout_grad_uses_the_mask():
    x = np.arange(6.0).reshape(2, 3)
    mask = np.array([[1, 0, 1], [0, 0, 1]], np.uint8)
    g = np.full((2, 3), 3.0)
    (grad,) = _dropout_grad(x, x * mask * 2, mask, g, None, dropout_prob=0.5, is_test=False, seed=0)
    np.testing.assert_array_equal(grad, g * mask * 2)


# ---- a gradient op with a missing output gradient (plan regression) ----


def test_split_grad_with_one_missing_part_reads_zeros_for_it():
    """An empty name in a list slot ("" for a part no gradient reached) must read as None,
    not as whatever variable holds the plan's last slot."""
    block = nf.default_main_program().global_block()
    for name, shape in [("x", [4, 2]), ("o0", [2, 2]), ("o1", [2, 2]), ("g0", [2, 2])]:
        block.create_var(name, shape, "float64")
    block.create_var("q", [2, 2], "float64")
    block.create_var("x@GRAD")
    block.append_op(
        "split_grad",
        inputs={"X": ["x"], "Out": ["o0", "o1"], "Out@GRAD": ["g0", ""]},
        outputs={"X@GRAD": ["x@GRAD"]},
        attrs={"num": 2, "axis": 0},
    )
    # A later op makes "q" (fed with 7s) the plan's last slot.
    block.append_op("assign", inputs={"X": ["q"]}, outputs={"Out": ["o0"]})
    feed = {n: np.zeros(s) for n, s in [("x", (4, 2)), ("o0", (2, 2)), ("o1", (2, 2))]}
    feed.update(g0=np.ones((2, 2)), q=np.full((2, 2), 7.0))
    (grad,) = nf.Executor().run(feed=feed, fetch_list=["x@GRAD"], scope=nf.Scope())
    np.testing.assert_array_equal(grad, np.vstack([np.ones((2, 2)), np.zeros((2, 2))]))


def test_increment_passes_the_gradient_through_append_backward():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", shape=[2, 3], dtype="float64")
        x.stop_gradient = False
        block = main.global_block()
        out = block.create_var("x_plus", shape=[2, 3], dtype="float64")
        block.append_op("increment", {"X": [x]}, {"Out": [out]}, {"step": 2.0})
        loss = nf.layers.mean(out)
        nf.append_backward(loss)
    (grad,) = nf.Executor().run(
        main, feed={"x": np.ones((2, 3))}, fetch_list=["x@GRAD"], scope=nf.Scope()
    )
    np.testing.assert_allclose(grad, np.full((2, 3), 1 / 6))
