"""nf.layers.batch_norm and layer_norm: parameters and running statistics, training and
inference (is_test, Program.clone(for_test=True)), saving the running statistics with an
inference model, and build-time errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ShapeError


def _value(scope, name):
    return scope.find_var(name).get(nf.Tensor).numpy().copy()


def _startup(scope=None):
    scope = scope if scope is not None else nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    return scope


def _normalised(x, mean, var, scale, bias, axis=1, eps=1e-5):
    shape = [1] * x.ndim
    shape[axis] = -1
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(
        shape
    ) + bias.reshape(shape)


def test_batch_norm_makes_parameters_and_untrainable_running_statistics():
    x = nf.data("x", [-1, 3, 4, 4])
    y = nf.layers.batch_norm(x, name="bn")
    assert y.shape == (-1, 3, 4, 4) and y.dtype == "float32"
    glob = nf.default_main_program().global_block()
    for name in ("bn.w", "bn.b", "bn.mean", "bn.variance"):
        var = glob.var(name)
        assert var.shape == (3,) and var.persistable and var.is_parameter
    assert glob.var("bn.w").trainable and glob.var("bn.b").trainable
    for name in ("bn.mean", "bn.variance"):
        assert not glob.var(name).trainable and glob.var(name).stop_gradient
    (op,) = [op for op in glob.ops if op.type == "batch_norm"]
    assert op.output("MeanOut") == ["bn.mean"] and op.output("VarianceOut") == ["bn.variance"]
    scope = _startup()
    np.testing.assert_array_equal(_value(scope, "bn.w"), np.ones(3, "float32"))
    np.testing.assert_array_equal(_value(scope, "bn.b"), np.zeros(3, "float32"))
    np.testing.assert_array_equal(_value(scope, "bn.mean"), np.zeros(3, "float32"))
    np.testing.assert_array_equal(_value(scope, "bn.variance"), np.ones(3, "float32"))


def test_training_moves_running_statistics_and_the_optimizer_only_the_parameters():
    rng = np.random.default_rng(0)
    x = nf.data("x", [-1, 2, 3, 3], "float64")
    y = nf.layers.batch_norm(x, name="bn", momentum=0.8)
    loss = nf.layers.mean(nf.layers.square(y * 1.5 + 0.2))
    _, params_grads = nf.optimizer.SGD(learning_rate=0.5).minimize(loss)
    assert sorted(p.name for p, _ in params_grads) == ["bn.b", "bn.w"]
    glob = nf.default_main_program().global_block()
    assert glob.find_var("bn.mean@GRAD") is None and glob.find_var("bn.variance@GRAD") is None
    scope = _startup()
    exe = nf.Executor()
    mean, var = np.zeros(2), np.ones(2)
    for step in range(3):
        batch = rng.normal(size=(5, 2, 3, 3)) * (step + 2) + step
        before = _value(scope, "bn.w"), _value(scope, "bn.b")
        exe.run(feed={"x": batch}, fetch_list=[loss], scope=scope)
        mean = 0.8 * mean + 0.2 * batch.mean(axis=(0, 2, 3))
        var = 0.8 * var + 0.2 * batch.var(axis=(0, 2, 3))
        np.testing.assert_allclose(_value(scope, "bn.mean"), mean, rtol=1e-12)
        np.testing.assert_allclose(_value(scope, "bn.variance"), var, rtol=1e-12)
        assert not np.array_equal(_value(scope, "bn.w"), before[0])
        assert not np.array_equal(_value(scope, "bn.b"), before[1])


def test_clone_for_test_switches_batch_norm_and_dropout_to_inference():
    rng = np.random.default_rng(1)
    x = nf.data("x", [-1, 4], "float64")
    h = nf.layers.batch_norm(x, name="bn")
    out = nf.layers.dropout(h, dropout_prob=0.5)
    main = nf.default_main_program()
    test = main.clone(for_test=True)
    kinds = {
        op.type: op.attrs["is_test"] for op in test.global_block().ops if "is_test" in op.attrs
    }
    assert kinds == {"batch_norm": True, "dropout": True}
    assert all(not op.attrs["is_test"] for op in main.global_block().ops if "is_test" in op.attrs)
    scope = _startup()
    exe = nf.Executor()
    for _ in range(4):
        exe.run(main, feed={"x": rng.normal(size=(8, 4)) * 3 + 1}, fetch_list=[out], scope=scope)
    mean, var = _value(scope, "bn.mean"), _value(scope, "bn.variance")
    scale, bias = _value(scope, "bn.w"), _value(scope, "bn.b")
    batch = rng.normal(size=(3, 4))
    first = exe.run(test, feed={"x": batch}, fetch_list=[out.name], scope=scope)[0]
    again = exe.run(test, feed={"x": batch}, fetch_list=[out.name], scope=scope)[0]
    # Running statistics normalise, dropout keeps everything scaled by 1 - p (Fluid's default
    # downgrade_in_infer): deterministic, nothing moves.
    want = _normalised(batch, mean, var, scale, bias) * 0.5
    np.testing.assert_allclose(first, want, rtol=1e-12)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(_value(scope, "bn.mean"), mean)
    np.testing.assert_array_equal(_value(scope, "bn.variance"), var)
    # The training program still normalises with the batch (each column has mean 0 before
    # dropout) and moves the statistics.
    (trained,) = exe.run(main, feed={"x": batch}, fetch_list=[h], scope=scope)
    np.testing.assert_allclose(trained.mean(axis=0), bias, atol=1e-12)
    assert not np.array_equal(_value(scope, "bn.mean"), mean)


def test_is_test_and_use_global_stats_normalise_with_the_running_statistics():
    x = nf.data("x", [-1, 3], "float64")
    a = nf.layers.batch_norm(x, is_test=True, name="a")
    b = nf.layers.batch_norm(x, use_global_stats=True, name="b")
    scope = _startup()
    scope.find_var("a.mean").get_mutable(nf.Tensor).set(np.array([1.0, 2.0, 3.0]))
    scope.find_var("a.variance").get_mutable(nf.Tensor).set(np.array([4.0, 1.0, 0.25]))
    batch = np.arange(6.0).reshape(2, 3)
    got_a, got_b = nf.Executor().run(feed={"x": batch}, fetch_list=[a, b], scope=scope)
    ones, zeros = np.ones(3), np.zeros(3)
    want_a = _normalised(batch, np.array([1.0, 2, 3]), np.array([4.0, 1, 0.25]), ones, zeros)
    np.testing.assert_allclose(got_a, want_a, rtol=1e-12)
    np.testing.assert_allclose(got_b, batch / np.sqrt(1 + 1e-5), rtol=1e-12)
    np.testing.assert_array_equal(_value(scope, "b.mean"), zeros)


def test_batch_norm_nhwc_act_momentum_variable_and_shared_statistics():
    rng = np.random.default_rng(2)
    x = nf.data("x", [-1, 2, 2, 3], "float64")
    momentum = nf.layers.fill_constant([1], "float64", 0.5)
    y = nf.layers.batch_norm(
        x,
        act="relu",
        momentum=momentum,
        data_layout="NHWC",
        name="bn",
        moving_mean_name="shared.mean",
        moving_variance_name="shared.var",
    )
    z = nf.layers.batch_norm(
        x, data_layout="NHWC", moving_mean_name="shared.mean", moving_variance_name="shared.var"
    )
    scope = _startup()
    batch = rng.normal(size=(4, 2, 2, 3))
    got_y, _ = nf.Executor().run(feed={"x": batch}, fetch_list=[y, z], scope=scope)
    mean, var = batch.mean(axis=(0, 1, 2)), batch.var(axis=(0, 1, 2))
    want = _normalised(batch, mean, var, np.ones(3), np.zeros(3), axis=3)
    np.testing.assert_allclose(got_y, np.maximum(want, 0), rtol=1e-12, atol=1e-12)
    # Two layers moved the one shared pair: first with momentum 0.5, then 0.9.
    once = 0.5 * np.zeros(3) + 0.5 * mean
    np.testing.assert_allclose(_value(scope, "shared.mean"), 0.9 * once + 0.1 * mean)
    assert nf.default_main_program().global_block().find_var("bn.mean") is None


def test_running_statistics_are_saved_with_the_inference_model(tmp_path):
    rng = np.random.default_rng(3)
    x = nf.data("x", [-1, 1, 4, 4])
    label = nf.data("label", [-1, 1], "int64")
    h = nf.layers.batch_norm(x, name="bn", act="relu")
    logits = nf.layers.fc(h, size=3, name="out")
    loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
    main = nf.default_main_program()
    test = main.clone(for_test=True)  # before minimize, as in Fluid: no backward, no updates
    nf.optimizer.Adam(learning_rate=0.01).minimize(loss)
    scope = _startup()
    exe = nf.Executor()
    for _ in range(3):
        feed = {
            "x": (rng.normal(size=(6, 1, 4, 4)) * 2 + 1).astype("float32"),
            "label": rng.integers(0, 3, size=(6, 1)),
        }
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    images = rng.normal(size=(5, 1, 4, 4)).astype("float32")
    (want,) = exe.run(
        test,
        feed={"x": images, "label": np.zeros((5, 1), "int64")},
        fetch_list=[logits.name],
        scope=scope,
    )
    saved = nf.io.save_inference_model(str(tmp_path), ["x"], [logits], main, scope)
    (bn_op,) = [op for op in saved.global_block().ops if op.type == "batch_norm"]
    assert bn_op.attrs["is_test"]
    program, feeds, fetches, loaded = nf.io.load_inference_model(str(tmp_path))
    for name in ("bn.mean", "bn.variance", "bn.w", "bn.b"):
        np.testing.assert_array_equal(_value(loaded, name), _value(scope, name))
    assert not np.array_equal(_value(loaded, "bn.mean"), np.zeros(1, "float32"))
    (got,) = exe.run(program, feed={feeds[0]: images}, fetch_list=fetches, scope=loaded)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_value(loaded, "bn.mean"), _value(scope, "bn.mean"))


def test_layer_norm_layer_normalises_rows_with_scale_and_shift():
    rng = np.random.default_rng(4)
    x = nf.data("x", [-1, 3, 4], "float64")
    full = nf.layers.layer_norm(x, name="ln")
    last = nf.layers.layer_norm(x, begin_norm_axis=2, shift=False, act="tanh", name="last")
    bare = nf.layers.layer_norm(x, scale=False, shift=False, name="bare")
    glob = nf.default_main_program().global_block()
    assert glob.var("ln.w").shape == (12,) and glob.var("ln.b").shape == (12,)
    assert glob.var("last.w").shape == (4,) and glob.find_var("last.b") is None
    assert glob.find_var("bare.w") is None and glob.find_var("bare.b") is None
    scope = _startup()
    scope.find_var("ln.w").get_mutable(nf.Tensor).set(rng.normal(size=12))
    scope.find_var("ln.b").get_mutable(nf.Tensor).set(rng.normal(size=12))
    batch = rng.normal(size=(2, 3, 4)) * 3 + 2
    got_full, got_last, got_bare = nf.Executor().run(
        feed={"x": batch}, fetch_list=[full, last, bare], scope=scope
    )
    rows = batch.reshape(2, 12)
    normal_rows = (rows - rows.mean(1, keepdims=True)) / np.sqrt(rows.var(1, keepdims=True) + 1e-5)
    want = normal_rows * _value(scope, "ln.w") + _value(scope, "ln.b")
    np.testing.assert_allclose(got_full, want.reshape(2, 3, 4), rtol=1e-10)
    np.testing.assert_allclose(got_bare, normal_rows.reshape(2, 3, 4), rtol=1e-10)
    norm_last = (batch - batch.mean(2, keepdims=True)) / np.sqrt(batch.var(2, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got_last, np.tanh(norm_last), rtol=1e-10)


def test_layer_norm_trains_its_parameters():
    x = nf.data("x", [-1, 5], "float64")
    y = nf.layers.layer_norm(x, name="ln")
    loss = nf.layers.mean(nf.layers.square(y - 0.3))
    _, params_grads = nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    assert sorted(p.name for p, _ in params_grads) == ["ln.b", "ln.w"]
    scope = _startup()
    exe = nf.Executor()
    batch = np.random.default_rng(5).normal(size=(4, 5))
    losses = [
        float(exe.run(feed={"x": batch}, fetch_list=[loss], scope=scope)[0]) for _ in range(20)
    ]
    assert losses[-1] < 0.5 * losses[0]


# ---- errors ----


def test_batch_norm_on_integer_input_is_a_dtype_error_before_making_parameters():
    x = nf.data("x", [-1, 3], "int64")
    with pytest.raises(DTypeError, match="batch_norm") as info:
        nf.layers.batch_norm(x)
    assert "'x' is int64[-1, 3]" in str(info.value) and "test_norm.py" in str(info.value)
    assert nf.default_main_program().global_block().all_parameters() == []


@pytest.mark.parametrize(
    "shape, kwargs, error, words",
    [
        ([-1], {}, ShapeError, "rank 1"),
        ([-1, 2, 2, 2, 2, 2], {}, ShapeError, "rank 6"),
        ([-1, -1, 4, 4], {}, ShapeError, "known channel count"),
        ([-1, 3], {"data_layout": "NDHWC"}, AttrError, "data_layout"),
        ([-1, 3], {"param_attr": False}, AttrError, "cannot be False"),
        ([-1, 3], {"epsilon": 0.5}, AttrError, "epsilon"),
    ],
)
def test_batch_norm_rejects_bad_arguments(shape, kwargs, error, words):
    x = nf.data("x", shape)
    with pytest.raises(error, match="batch_norm") as info:
        nf.layers.batch_norm(x, **kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "shape, dtype, kwargs, error, words",
    [
        ([-1, 4], "int32", {}, DTypeError, "floating-point"),
        ([-1, 4], "float32", {"begin_norm_axis": 2}, ShapeError, "must lie in [1, 2)"),
        ([-1, 4], "float32", {"begin_norm_axis": 0}, ShapeError, "out of range"),
        ([-1, 4, 3], "float32", {"begin_norm_axis": -1}, ShapeError, "out of range"),
        ([-1, -1, 3], "float32", {}, ShapeError, "known dims from dim 1"),
        ([-1, 4], "float32", {"param_attr": False}, AttrError, "param_attr is False"),
        ([-1, 4], "float32", {"begin_norm_axis": 1.0}, AttrError, "must be an int"),
    ],
)
def test_layer_norm_rejects_bad_arguments(shape, dtype, kwargs, error, words):
    x = nf.data("x", shape, dtype)
    with pytest.raises(error, match="layer_norm") as info:
        nf.layers.layer_norm(x, **kwargs)
    assert words in str(info.value)
