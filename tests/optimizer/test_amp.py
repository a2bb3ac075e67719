"""nf.amp.decorate: the digits MLP trains in float16 and bfloat16 to the float32 accuracy, a step
with an inf gradient is skipped (parameters and optimizer state bit-identical) and lowers the
loss scale, clean steps raise it, the scale is persistable state, nf.Model takes the decorated
optimizer, and the rewrite casts by the op lists."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.cli.demo_mlp import load_digits, mlp
from nestflow.errors import AttrError

pytest.importorskip("sklearn")


def _build(dtype, optimizer=None, **amp):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = nf.data("x", [-1, 64])
        label = nf.data("label", [-1, 1], dtype="int64")
        probabilities = mlp(x)
        loss = nf.layers.mean(nf.layers.cross_entropy(probabilities, label))
        opt = nf.amp.decorate(optimizer or nf.optimizer.Adam(1e-3), dtype=dtype, **amp)
        opt.minimize(loss)
    return main, startup, probabilities, loss, opt


def _value(scope, var):
    return np.array(scope.find_var(var.name).get(nf.Tensor).numpy())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_digits_mlp_trains_to_97_percent_in_low_precision(dtype):
    nf.seed(0)
    data = load_digits()
    main, startup, probabilities, loss, opt = _build(dtype)
    # The matrix products and the hidden layer run in the low dtype, the softmax in float32.
    kinds = {
        op.type: main.global_block().var(op.output_names()[0]).dtype
        for op in main.global_block().ops
    }
    assert kinds["mul"] == dtype and kinds["relu"] == dtype and kinds["softmax"] == "float32"
    assert all(p.dtype == "float32" for p in main.global_block().all_parameters())
    evaluate = nf.prune(main.clone(for_test=True), [probabilities.name])  # the same casts
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    for _ in range(20):
        order = rng.permutation(len(data.train_x))
        for start in range(0, len(order), 32):
            rows = order[start : start + 32]
            exe.run(main, {"x": data.train_x[rows], "label": data.train_y[rows]}, [], scope)
    (p,) = exe.run(evaluate, {"x": data.test_x}, [probabilities], scope)
    accuracy = float((p.argmax(axis=1) == data.test_y.ravel()).mean())
    assert accuracy >= 0.97, f"{dtype}: {accuracy:.3f} held-out"
    assert np.isfinite(_value(scope, opt.get_loss_scaling())).all()


def _one_layer(dtype, **amp):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = nf.data("x", [-1, 4])
        loss = nf.layers.mean(nf.layers.fc(x, 3, act="relu"))
        opt = nf.amp.decorate(nf.optimizer.Adam(0.1), dtype=dtype, **amp)
        opt.minimize(loss)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    return main, exe, scope, opt


def _persistables(main, scope):
    return {
        v.name: _value(scope, v)
        for v in nf.io.persistable_vars(main)
        if not v.name.startswith(("loss_scaling", "num_"))
    }


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_step_with_an_inf_gradient_is_skipped_and_lowers_the_scale(dtype):
    main, exe, scope, opt = _one_layer(dtype, decr_every_n_nan_or_inf=2, decr_ratio=0.5)
    good = np.ones((2, 4), "float32")
    exe.run(main, {"x": good}, [], scope)  # a clean step moves the parameters and moments
    before = _persistables(main, scope)
    scale = float(_value(scope, opt.get_loss_scaling())[0])
    bad = good.copy()
    bad[0, 1] = np.inf
    exe.run(main, {"x": bad}, [], scope)
    after = _persistables(main, scope)
    assert before.keys() == after.keys() and len(before) > 2
    for name in before:  # parameters, Adam's moments and beta powers: bit-identical
        assert before[name].tobytes() == after[name].tobytes(), name
    assert float(_value(scope, opt.get_loss_scaling())[0]) == scale  # 1 bad step of 2
    exe.run(main, {"x": bad}, [], scope)
    assert float(_value(scope, opt.get_loss_scaling())[0]) == scale * 0.5
    assert _persistables(main, scope)["fc_0.w"].tobytes() == before["fc_0.w"].tobytes()
    exe.run(main, {"x": good}, [], scope)  # and training goes on
    assert not np.array_equal(_persistables(main, scope)["fc_0.w"], before["fc_0.w"])


def test_nan_gradients_are_skipped_with_a_static_scale_too():
    main, exe, scope, opt = _one_layer("float16", use_dynamic_loss_scaling=False)
    before = _persistables(main, scope)
    exe.run(main, {"x": np.full((2, 4), np.nan, "float32")}, [], scope)
    for name, value in _persistables(main, scope).items():
        assert value.tobytes() == before[name].tobytes(), name
    assert float(_value(scope, opt.get_loss_scaling())[0]) == 2.0**15


def test_the_scale_rises_after_incr_every_n_steps_clean_steps():
    main, exe, scope, opt = _one_layer("bfloat16", incr_every_n_steps=3, incr_ratio=2.0)
    feed = {"x": np.ones((2, 4), "float32")}
    scales = []
    for _ in range(7):
        exe.run(main, feed, [], scope)
        scales.append(float(_value(scope, opt.get_loss_scaling())[0]))
    base = 2.0**15
    assert scales == [base, base, 2 * base, 2 * base, 2 * base, 4 * base, 4 * base]


def test_float16_overflow_lowers_the_scale_until_steps_go_through():
    """The scaled loss's gradients overflow float16 at a scale of 2**24: the first steps are
    skipped and halve the scale, then training moves the parameters."""
    main, exe, scope, opt = _one_layer(
        "float16", init_loss_scaling=2.0**24, decr_every_n_nan_or_inf=1
    )
    feed = {"x": np.full((2, 4), 30.0, "float32")}
    w0 = _persistables(main, scope)["fc_0.w"]
    for _ in range(20):  # 60 * scale / 6 fits float16 below a scale of 2**13
        exe.run(main, feed, [], scope)
    assert float(_value(scope, opt.get_loss_scaling())[0]) < 2.0**24
    assert not np.array_equal(_persistables(main, scope)["fc_0.w"], w0)


def test_the_scale_and_counters_are_saved_and_resumed(tmp_path):
    main, exe, scope, opt = _one_layer("float16", incr_every_n_steps=2)
    feed = {"x": np.ones((2, 4), "float32")}
    for _ in range(3):
        exe.run(main, feed, [], scope)
    path = tmp_path / "params.safetensors"
    nf.io.save_params(scope, main, path)
    resumed = nf.Scope()
    nf.io.load_params(resumed, main, path)
    names = [v.name for v in opt.amp_state_vars]
    assert len(names) == 3
    for name in names:
        assert _value(resumed, main.global_block().var(name)).tolist() == (
            _value(scope, main.global_block().var(name)).tolist()
        )
    exe.run(main, feed, [], resumed)  # step 4: the second clean step since the last rise
    assert float(_value(resumed, opt.get_loss_scaling())[0]) == 2.0**17


def test_nf_model_trains_with_a_decorated_optimizer():
    nf.seed(0)
    data = load_digits()
    model = nf.Model(
        mlp,
        inputs=nf.InputSpec([None, 64], "float32", "x"),
        labels=nf.InputSpec([None, 1], "int64", "label"),
    )
    model.prepare(
        nf.amp.decorate(nf.optimizer.Adam(1e-3), dtype="bfloat16"),
        loss=nf.layers.cross_entropy,
        metrics=nf.metric.Accuracy(),
    )
    model.fit((data.train_x, data.train_y), batch_size=32, epochs=20, verbose=0)
    result = model.evaluate((data.test_x, data.test_y), batch_size=256, verbose=0)
    assert result["acc"] >= 0.97, result


def test_custom_lists_move_ops_and_bfloat16_parameters_save(tmp_path):
    lists = nf.amp.AutoMixedPrecisionLists(custom_black_list={"mul"})
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        y = nf.layers.fc(nf.data("x", [-1, 4]), 3)
    nf.amp.rewrite_program(main, lists, "bfloat16")
    assert [op.type for op in main.global_block().ops] == ["mul", "elementwise_add"]
    assert y.dtype == "float32"
    with pytest.raises(AttrError, match="both"):
        nf.amp.AutoMixedPrecisionLists(custom_white_list={"relu"}, custom_black_list={"relu"})
    with pytest.raises(AttrError, match="dtype"):
        nf.amp.decorate(nf.optimizer.SGD(0.1), dtype="int8")
    # A bfloat16 parameter goes through safetensors (BF16) and back bit for bit.
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        nf.layers.create_parameter([3, 2], "bfloat16", name="w")
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    nf.io.save_params(scope, main, tmp_path / "p.safetensors")
    loaded = nf.Scope()
    nf.io.load_params(loaded, main, tmp_path / "p.safetensors")
    got = loaded.find_var("w").get(nf.Tensor).numpy()
    assert got.dtype.name == "bfloat16"
    assert got.tobytes() == scope.find_var("w").get(nf.Tensor).numpy().tobytes()
