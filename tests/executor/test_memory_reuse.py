"""Eager release of temporaries and in-place buffer reuse in compiled plans (issue 5).

Rules under test: a temporary is dropped after its last use; an op may write its output into an
input's buffer only when the run owns that buffer outright. Fetched, fed, persistable and
user-held arrays are never released early nor overwritten.
"""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf

BIG = (64, 128)  # above the size below which temporaries are kept to the end of the run


def _program(build):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        out = build()
    return main, startup, out


def _source(exe, program, fetches):
    names = frozenset(f if isinstance(f, str) else f.name for f in fetches)
    return exe._plan(program).block_plan.source(names)


def test_chain_runs_in_place_and_matches_numpy():
    def build():
        x = nf.data("x", [-1, BIG[1]])
        return nf.layers.tanh(nf.layers.relu(nf.layers.scale(x, scale=2.0)))

    main, _, out = _program(build)
    exe = nf.Executor()
    xs = np.random.default_rng(0).standard_normal(BIG).astype("float32")
    (got,) = exe.run(main, feed={"x": xs}, fetch_list=[out])
    np.testing.assert_allclose(got, np.tanh(np.maximum(2 * xs, 0)), rtol=1e-6)
    source = _source(exe, main, [out])
    assert "_into(" in source, source  # relu and tanh write into the buffer they read


def test_fed_array_is_never_overwritten():
    def build():
        x = nf.data("x", [-1, BIG[1]])
        return nf.layers.relu(x)

    main, _, out = _program(build)
    xs = np.random.default_rng(1).standard_normal(BIG).astype("float32")
    before = xs.copy()
    exe = nf.Executor()
    for _ in range(2):
        (got,) = exe.run(main, feed={"x": xs}, fetch_list=[out])
    np.testing.assert_array_equal(xs, before)
    np.testing.assert_array_equal(got, np.maximum(before, 0))


def test_fetched_intermediate_is_neither_released_nor_overwritten():
    def build():
        x = nf.data("x", [-1, BIG[1]])
        h = nf.layers.scale(x, scale=3.0)
        return h, nf.layers.relu(h)

    main, _, (h, out) = _program(build)
    xs = np.random.default_rng(2).standard_normal(BIG).astype("float32")
    exe = nf.Executor()
    got_h, got_out = exe.run(main, feed={"x": xs}, fetch_list=[h, out])
    np.testing.assert_allclose(got_h, 3 * xs, rtol=1e-6)  # relu did not write into h
    np.testing.assert_allclose(got_out, np.maximum(3 * xs, 0), rtol=1e-6)
    source = _source(exe, main, [h, out])
    h_slot = exe._plan(main).block_plan.slot_of[h.name]
    assert f"e[{h_slot}] = None" not in source
    assert f"out=e[{h_slot}]" not in source


def test_persistable_input_is_never_donated():
    def build():
        w = nf.layers.create_parameter(list(BIG), "float32", name="w")
        return w, nf.layers.relu(w)

    main, startup, (w, out) = _program(build)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    held = scope.find_var("w").get(nf.Tensor).numpy()
    before = np.array(held)
    (got,) = exe.run(main, fetch_list=[out], scope=scope)
    np.testing.assert_array_equal(scope.find_var("w").get(nf.Tensor).numpy(), before)
    np.testing.assert_array_equal(held, before)
    np.testing.assert_array_equal(got, np.maximum(before, 0))


def test_temporary_still_read_later_is_not_donated():
    def build():
        x = nf.data("x", [-1, BIG[1]])
        h = nf.layers.scale(x, scale=-1.0)
        a = nf.layers.relu(h)  # h is read again below: relu must not overwrite it
        return nf.layers.elementwise_add(a, h)

    main, _, out = _program(build)
    xs = np.random.default_rng(3).standard_normal(BIG).astype("float32")
    (got,) = nf.Executor().run(main, feed={"x": xs}, fetch_list=[out])
    np.testing.assert_allclose(got, np.maximum(-xs, 0) - xs, rtol=1e-6)


def test_view_of_a_live_temporary_is_not_donated():
    def build():
        x = nf.data("x", [-1, BIG[1]])
        h = nf.layers.scale(x, scale=2.0)
        flat = nf.layers.reshape(h, [-1])  # a view of h's buffer
        r = nf.layers.relu(flat)  # flat's last use, but h is still live
        return nf.layers.elementwise_add(nf.layers.reshape(r, [-1, BIG[1]]), h)

    main, _, out = _program(build)
    xs = np.random.default_rng(4).standard_normal(BIG).astype("float32")
    (got,) = nf.Executor().run(main, feed={"x": xs}, fetch_list=[out])
    np.testing.assert_allclose(got, np.maximum(2 * xs, 0) + 2 * xs, rtol=1e-6)


def test_broadcast_that_grows_the_donor_falls_back_to_a_new_array():
    def build():
        x = nf.data("x", [-1, 1])
        y = nf.data("y", [-1, BIG[1]])
        h = nf.layers.scale(x, scale=1.0)
        return nf.layers.elementwise_add(h, y)  # [N, 1] + [N, 128]: h's buffer is too small

    main, _, out = _program(build)
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((BIG[0], 1)).astype("float32")
    ys = rng.standard_normal(BIG).astype("float32")
    (got,) = nf.Executor().run(main, feed={"x": xs, "y": ys}, fetch_list=[out])
    np.testing.assert_allclose(got, xs + ys, rtol=1e-6)


def test_sgd_step_in_place_matches_numpy_and_keeps_old_arrays_intact():
    def build():
        x = nf.data("x", [-1, BIG[1]])
        h = nf.layers.fc(x, BIG[1], act="relu", name="fc")
        loss = nf.layers.mean(h)
        nf.optimizer.SGD(learning_rate=0.5).minimize(loss)
        return loss

    main, startup, loss = _program(build)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    w_before = scope.find_var("fc.w").get(nf.Tensor).numpy()
    w_copy = np.array(w_before)
    b = np.array(scope.find_var("fc.b").get(nf.Tensor).numpy())
    xs = np.random.default_rng(6).standard_normal(BIG).astype("float32")
    exe.run(main, feed={"x": xs}, fetch_list=[loss], scope=scope)
    z = xs @ w_copy + b
    grad_h = (z > 0) / z.size
    expected = w_copy - 0.5 * (xs.T @ grad_h.astype("float32"))
    np.testing.assert_allclose(
        scope.find_var("fc.w").get(nf.Tensor).numpy(), expected, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(w_before, w_copy)  # the array a user held was not updated


def test_gradient_fetched_by_name_is_not_reused_by_the_optimizer():
    def build():
        x = nf.data("x", [-1, BIG[1]])
        h = nf.layers.fc(x, BIG[1], name="fc2")
        loss = nf.layers.mean(h)
        nf.optimizer.SGD(learning_rate=1.0).minimize(loss)
        return loss

    main, startup, loss = _program(build)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    xs = np.random.default_rng(7).standard_normal(BIG).astype("float32")
    (grad,) = exe.run(main, feed={"x": xs}, fetch_list=["fc2.w@GRAD"], scope=scope)
    expected = xs.T @ np.full(BIG, 1.0 / (BIG[0] * BIG[1]), "float32")
    np.testing.assert_allclose(grad, expected, rtol=1e-5)


@pytest.mark.parametrize("check_nan_inf", [False, True])
def test_results_do_not_depend_on_the_checked_path(check_nan_inf):
    def build():
        x = nf.data("x", [-1, BIG[1]])
        return nf.layers.sigmoid(nf.layers.relu(nf.layers.scale(x, scale=0.5)))

    main, _, out = _program(build)
    xs = np.random.default_rng(8).standard_normal(BIG).astype("float32")
    (got,) = nf.Executor().run(main, feed={"x": xs}, fetch_list=[out], check_nan_inf=check_nan_inf)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-np.maximum(xs * 0.5, 0))), rtol=1e-6)


def _train_program():
    """x -> fc (mul, add) -> tanh -> mean, with SGD: the gradient ops read the fc's product
    and the tanh input only for their shapes (grad_no_need_buffer)."""

    def build():
        x = nf.data("x", [-1, BIG[1]])
        h = nf.layers.fc(x, BIG[1], act="tanh")
        loss = nf.layers.mean(h)
        nf.optimizer.SGD(0.5).minimize(loss)
        return h, loss

    return _program(build)


def _run_training(main, startup, fetches, steps=3):
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    xs = np.random.default_rng(5).standard_normal(BIG).astype("float32")
    got = [exe.run(main, feed={"x": xs}, fetch_list=fetches, scope=scope) for _ in range(steps)]
    return exe, scope, got


def test_values_read_later_for_their_shape_only_give_way_to_stand_ins():
    main, startup, (h, loss) = _train_program()
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    params = [p.name for p in main.global_block().all_parameters()]
    initial = {name: scope.find_var(name).get(nf.Tensor).numpy().copy() for name in params}
    xs = np.random.default_rng(5).standard_normal(BIG).astype("float32")

    def train():
        for name, value in initial.items():
            scope.find_var(name).get(nf.Tensor).set(value.copy())
        losses = [exe.run(main, feed={"x": xs}, fetch_list=[loss], scope=scope)[0].item()]
        losses += [exe.run(main, feed={"x": xs}, fetch_list=[loss], scope=scope)[0].item()]
        return losses, [scope.find_var(name).get(nf.Tensor).numpy().copy() for name in params]

    got = train()
    plan = exe._plan(main).block_plan
    source = _source(exe, main, [loss])
    product = next(op for op in main.global_block().ops if op.type == "mul").output("Out")[0]
    assert f"e[{plan.slot_of[product]}] = _stand_in(e[{plan.slot_of[product]}])" in source
    # the same steps with the real values kept to their last reader give the same numbers
    plan._compiled.clear()
    plan._stand_ins = lambda keep: [()] * len(plan.ops)
    assert "_stand_in" not in _source(exe, main, [loss])
    want = train()
    assert got[0] == want[0]
    for g, w in zip(got[1], want[1]):
        np.testing.assert_array_equal(g, w)


def test_a_fetched_value_is_never_replaced_by_a_stand_in():
    main, startup, (h, loss) = _train_program()
    exe, _, got = _run_training(main, startup, [h, loss], steps=1)
    h_value = got[0][0]
    assert h_value.strides[0] != 0 and h_value.flags.writeable
    assert np.all(np.abs(h_value) > 0)  # the tanh of a fc of random inputs, not zeros
    plan = exe._plan(main).block_plan
    assert f"e[{plan.slot_of[h.name]}] = _stand_in" not in _source(exe, main, [h, loss])


def test_stand_in_is_read_only_shared_and_shaped_like_the_value():
    from nestflow.ops.registry import shape_stand_in

    value = np.ones((3, 5), "float32")
    stand_in = shape_stand_in(value)
    assert stand_in.shape == value.shape and stand_in.dtype == value.dtype
    assert stand_in.strides == (0, 0) and not stand_in.flags.writeable
    assert shape_stand_in(np.zeros((3, 5), "float32")) is stand_in
    assert shape_stand_in(value.astype("float64")) is not stand_in
    assert shape_stand_in([1, 2]) == [1, 2]  # not an array: kept as it is
