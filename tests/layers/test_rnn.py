"""RNN (seeds 000 and 002's RNNOp): a step block run in one step scope per time step, memories
carried between steps, per-row lengths, and backward through time."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
import nestflow as pd
from nestflow.core.scope import live_scope_count
from nestflow.errors import ControlFlowError

L = nf.layers


def _run(fetch, feed=None, scope=None, program=None):
    scope = scope if scope is not None else nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return exe.run(program, feed=feed or {}, fetch_list=fetch, scope=scope), scope


def _seed_program():
    x = pd.sequence([10, 20, 30])
    m = pd.var(0)
    W = pd.var(0.314, param=True)
    U = pd.var(0.375, param=True)
    rnn = pd.rnn()
    with rnn.step():
        h = rnn.memory(init=m)
        h_prev = rnn.previous_memory(h)
        a = pd.layers.matmul(x, W)
        b = pd.layers.matmul(h_prev, U)
        s = pd.add(a, b)
        act = pd.sigmoid(s)
        rnn.update_memory(h, act)
        rnn.output(a, b)
    o1, o2 = rnn()
    return rnn, h, o1, o2


def _seed_reference():
    """a_t = 0.314 x_t, b_t = 0.375 h_{t-1}, h_t = sigmoid(a_t + b_t), h_0 = 0."""
    h, a_s, b_s = 0.0, [], []
    for x in (10.0, 20.0, 30.0):
        a, b = 0.314 * x, 0.375 * h
        h = 1.0 / (1.0 + np.exp(-(a + b)))
        a_s.append(a)
        b_s.append(b)
    return np.array([a_s]), np.array([b_s]), h


def test_seed_program_matches_hand_computed_values():
    rnn, h, o1, o2 = _seed_program()
    final = rnn.final_memory(h)
    (a, b, last), scope = _run([o1, o2, final])
    want_a, want_b, want_h = _seed_reference()
    # One sequence of 3 steps: outputs are [batch=1, time=3] (the per-step values are [1] and
    # the 0-d dot product of the [1] memory and the [1] weight, taken as one row).
    assert a.shape == b.shape == (1, 3)
    np.testing.assert_allclose(a, want_a, rtol=1e-6)
    np.testing.assert_allclose(b, want_b, rtol=1e-6)
    np.testing.assert_allclose(last, [want_h], rtol=1e-6)
    assert b[0, 0] == 0.0  # h_0 = 0
    assert scope.kids == []  # the step scopes went with the run's local scope


def test_seed_program_runs_the_same_after_a_protobuf_round_trip():
    _, _, o1, o2 = _seed_program()
    (a, b), scope = _run([o1, o2])
    loaded = nf.Program.from_bytes(nf.default_main_program().to_bytes())
    a2, b2 = nf.Executor().run(loaded, fetch_list=[o1.name, o2.name], scope=scope)
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)


def test_step_block_is_a_child_block_with_sliced_sequence():
    _, _, o1, _ = _seed_program()
    main = nf.default_main_program()
    op = main.global_block().ops[-1]
    assert op.type == "recurrent"
    step = op.attr("sub_block")
    assert step.parent_idx == 0
    x_name = op.input("Inputs")[0]
    # The step block declares the sequence's per-step slice: [batch, time, 1] -> [batch, 1].
    assert main.global_block().var(x_name).shape == (-1, -1, 1)
    assert step.var(x_name).shape == (-1, 1)
    assert o1.shape == (-1, -1)


def test_one_step_scope_per_time_step_is_kept_during_the_run():
    """The op's step scopes are kids of the run's local scope (seed 000/003: one scope per
    step), alive while later ops of the run execute."""
    _, _, o1, _ = _seed_program()
    seen = []
    main = nf.default_main_program()
    scopes_var = main.global_block().ops[-1].output("StepScopes")[0]
    (scopes,), scope = _run([scopes_var])
    seen.extend(scopes)
    assert len(seen) == 3
    assert all(not s.alive for s in seen)  # destroyed when the minibatch completed


def _numpy_tanh_rnn(x, lengths, h0, wx, wh, b):
    """Reference: h_t = tanh(x_t wx + h_{t-1} wh + b), rows past their length keep h and emit 0."""
    batch, steps, _ = x.shape
    h = h0.copy()
    outs = np.zeros((batch, steps, wh.shape[1]))
    for t in range(steps):
        new = np.tanh(x[:, t] @ wx + h @ wh + b)
        active = (lengths > t)[:, None]
        h = np.where(active, new, h)
        outs[:, t] = np.where(active, new, 0.0)
    return outs, h


def _tanh_rnn(hidden=3, features=2, dtype="float64", with_init=True):
    x = L.data("x", [-1, -1, features], dtype)
    lengths = L.data("lengths", [-1], "int64")
    h0 = L.data("h0", [-1, hidden], dtype) if with_init else None
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        if with_init:
            h = rnn.memory(init=h0)
        else:
            h = rnn.memory(shape=[hidden], value=0.5, batch_ref=x, dtype=dtype)
        z = L.fc(xt, hidden, name="in") + L.fc(
            rnn.previous_memory(h), hidden, bias_attr=False, name="rec"
        )
        new = L.tanh(z)
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    return x, lengths, h0, out, rnn.final_memory(h)


def _params(scope):
    get = lambda n: scope.find_var(n).get(nf.Tensor).numpy()  # noqa: E731
    return get("in.w"), get("rec.w"), get("in.b")


def test_unequal_lengths_match_a_numpy_reference(rng):
    x, lengths, h0, out, final = _tanh_rnn()
    xs = rng.normal(size=(4, 5, 2))
    lens = np.array([5, 2, 0, 3], dtype=np.int64)
    h0s = rng.normal(size=(4, 3))
    (o, f), scope = _run([out, final], feed={"x": xs, "lengths": lens, "h0": h0s})
    want_o, want_h = _numpy_tanh_rnn(xs, lens, h0s, *_params(scope))
    assert o.shape == (4, 5, 3)
    np.testing.assert_allclose(o, want_o, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(f, want_h, rtol=1e-10, atol=1e-12)
    assert not o[1, 2:].any() and not o[2].any()  # past a row's length: zeros
    np.testing.assert_array_equal(f[2], h0s[2])  # a row of length 0 keeps its initial memory


def test_memory_by_shape_and_value_takes_batch_from_batch_ref(rng):
    x, lengths, _, out, final = _tanh_rnn(with_init=False)
    xs = rng.normal(size=(2, 3, 2))
    lens = np.array([3, 1], dtype=np.int64)
    (o, f), scope = _run([out, final], feed={"x": xs, "lengths": lens})
    want_o, want_h = _numpy_tanh_rnn(xs, lens, np.full((2, 3), 0.5), *_params(scope))
    np.testing.assert_allclose(o, want_o, rtol=1e-10)
    np.testing.assert_allclose(f, want_h, rtol=1e-10)


def test_outputs_survive_the_step_scopes_and_inner_values_can_be_fetched():
    rnn, h, o1, o2 = _seed_program()
    main = nf.default_main_program()
    act_name = main.global_block().ops[-1].attr("updates")[0]
    doubled = L.scale(o1, 2.0)  # an op after the RNN reads its output
    (a, twice, act), scope = _run([o1, doubled, act_name])
    want_a, _, want_h = _seed_reference()
    np.testing.assert_allclose(a, want_a, rtol=1e-6)
    np.testing.assert_allclose(twice, 2 * want_a, rtol=1e-6)
    # A variable made inside the step is fetched from the newest step scope: the last step.
    np.testing.assert_allclose(act, [want_h], rtol=1e-6)
    a[:] = -1  # the fetched copy is the caller's; the next run is unaffected
    (again,), _ = _run([o1], scope=scope)
    np.testing.assert_allclose(again, want_a, rtol=1e-6)


def test_live_scopes_do_not_grow_over_forward_runs(rng):
    x, lengths, h0, out, _ = _tanh_rnn()
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    feed = {"x": rng.normal(size=(2, 4, 2)), "lengths": np.array([4, 2]), "h0": np.zeros((2, 3))}
    exe.run(feed=feed, fetch_list=[out], scope=scope)
    before = live_scope_count()
    for _ in range(50):
        exe.run(feed=feed, fetch_list=[out], scope=scope)
    assert live_scope_count() == before
    assert scope.kids == []


# ---- errors ----


def test_update_memory_of_a_non_memory_is_an_error():
    x = pd.sequence([1, 2])
    rnn = pd.rnn()
    with pytest.raises(ControlFlowError, match="not a memory"):
        with rnn.step():
            y = L.scale(x, 2.0)
            rnn.update_memory(y, y)


def test_memory_never_updated_is_an_error():
    x = pd.sequence([1, 2])
    m = pd.var(0)
    rnn = pd.rnn()
    with pytest.raises(ControlFlowError, match="never updated"):
        with rnn.step():
            rnn.memory(init=m)
            rnn.output(L.scale(x, 2.0))


def test_update_with_a_different_shape_is_an_error():
    x = L.data("x", [-1, -1, 2])
    rnn = pd.rnn()
    with pytest.raises(ControlFlowError, match=r"memory '.*' is float32\[-1, 3\] but the update"):
        with rnn.step():
            xt = rnn.step_input(x)
            h = rnn.memory(shape=[3])
            rnn.update_memory(h, xt)


def test_runtime_shape_mismatches_are_errors(rng):
    x, lengths, h0, out, _ = _tanh_rnn()
    exe = nf.Executor()
    scope = nf.Scope()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(2, 3, 2))
    with pytest.raises(ControlFlowError, match="initial value of memory .* 2 sequence"):
        exe.run(
            feed={"x": xs, "lengths": np.array([3, 3]), "h0": np.zeros((5, 3))},
            fetch_list=[out],
            scope=scope,
        )
    with pytest.raises(ControlFlowError, match=r"lengths 'lengths' must lie in \[0, 3\]"):
        exe.run(
            feed={"x": xs, "lengths": np.array([4, 3]), "h0": np.zeros((2, 3))},
            fetch_list=[out],
            scope=scope,
        )
    assert scope.kids == []


def test_step_reading_no_sequence_is_an_error():
    m = pd.var(0)
    rnn = pd.rnn()
    with pytest.raises(ControlFlowError, match="reads no sequence"):
        with rnn.step():
            h = rnn.memory(init=m)
            rnn.update_memory(h, L.scale(h, 2.0))


def test_step_api_outside_the_step_is_an_error():
    x = pd.sequence([1, 2])
    rnn = pd.rnn()
    with pytest.raises(ControlFlowError, match="inside `with rnn.step"):
        rnn.output(x)
    with pytest.raises(ControlFlowError, match="build the step"):
        rnn()


# ---- backward through time (float64 central differences) ----


def _numeric_grad(loss_of, array: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d loss / d array by central differences; `loss_of(a)` evaluates with `a` in its place."""
    grad = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        plus, minus = array.copy(), array.copy()
        plus[index] += eps
        minus[index] -= eps
        grad[index] = (loss_of(plus) - loss_of(minus)) / (2 * eps)
    return grad


def _param_loss(exe, program, feed, loss, scope, name):
    tensor = scope.find_var(name).get(nf.Tensor)

    def loss_of(value):
        saved = tensor.numpy().copy()
        tensor.set(value)
        try:
            return float(exe.run(program, feed=feed, fetch_list=[loss], scope=scope)[0])
        finally:
            tensor.set(saved)

    return loss_of


def test_gradients_match_numeric_with_unequal_lengths(rng):
    """Parameters shared by every step get summed gradients; gradients also reach the input
    sequence (zero past each row's length) and the memory's initial value."""
    x, lengths, h0, out, final = _tanh_rnn()
    x.stop_gradient = False
    h0.stop_gradient = False
    r_out = L.data("r_out", [-1, -1, 3], "float64")
    r_final = L.data("r_final", [-1, 3], "float64")
    loss = L.reduce_sum(out * r_out) + L.reduce_sum(final * r_final)
    params_grads = nf.append_backward(loss)
    assert {p.name for p, _ in params_grads} == {"in.w", "in.b", "rec.w"}
    main = nf.default_main_program()
    feed = {
        "x": rng.normal(size=(3, 4, 2)),
        "lengths": np.array([4, 1, 2], dtype=np.int64),
        "h0": rng.normal(size=(3, 3)),
        "r_out": rng.normal(size=(3, 4, 3)),
        "r_final": rng.normal(size=(3, 3)),
    }
    names = ["in.w", "rec.w", "in.b"]
    fetched, scope = _run([n + "@GRAD" for n in names] + ["x@GRAD", "h0@GRAD"], feed=feed)
    exe = nf.Executor()
    for name, got in zip(names, fetched):
        value = scope.find_var(name).get(nf.Tensor).numpy().copy()
        want = _numeric_grad(_param_loss(exe, main, feed, loss, scope, name), value)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    for key, got in zip(("x", "h0"), fetched[3:]):

        def loss_of(value, key=key):
            return float(
                exe.run(main, feed={**feed, key: value}, fetch_list=[loss], scope=scope)[0]
            )

        np.testing.assert_allclose(got, _numeric_grad(loss_of, feed[key]), rtol=1e-6, atol=1e-8)
    x_grad = fetched[3]
    assert not x_grad[1, 1:].any() and not x_grad[2, 2:].any()  # steps past the length
    assert scope.kids == []


def test_seed_program_gradients_match_numeric():
    """In the seed's step, `a` is both an output and an input of `s`, and `b` is a 0-d value:
    both gradient paths are summed, W and U get the sum over the three steps."""
    rnn, h, o1, o2 = _seed_program()
    loss = L.reduce_sum(o1) + L.reduce_sum(L.scale(o2, 3.0)) + L.reduce_sum(rnn.final_memory(h))
    params_grads = nf.append_backward(loss)
    assert len(params_grads) == 2
    main = nf.default_main_program()
    fetched, scope = _run([g for _, g in params_grads])
    exe = nf.Executor()
    for (param, _), got in zip(params_grads, fetched):
        value = scope.find_var(param.name).get(nf.Tensor).numpy().astype("float64")
        want = _numeric_grad(_param_loss(exe, main, {}, loss, scope, param.name), value, 1e-3)
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-4)
    # By hand for W: d/dW of sum a_t = sum x_t = 60, plus the (small) paths through h.
    w_grad = fetched[0] if params_grads[0][0].name == "param_0" else fetched[1]
    assert 60.0 <= float(w_grad[0]) < 61.0


def test_memory_by_shape_gradients_reach_parameters(rng):
    x, lengths, _, out, final = _tanh_rnn(with_init=False)
    loss = L.reduce_sum(L.square(out)) + L.reduce_sum(final)
    nf.append_backward(loss)
    main = nf.default_main_program()
    feed = {"x": rng.normal(size=(2, 3, 2)), "lengths": np.array([3, 2], dtype=np.int64)}
    (got,), scope = _run(["rec.w@GRAD"], feed=feed)
    value = scope.find_var("rec.w").get(nf.Tensor).numpy().copy()
    want = _numeric_grad(_param_loss(nf.Executor(), main, feed, loss, scope, "rec.w"), value)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


# ---- nested control flow ----


def _loss_of_feed(main, feed, loss, scope, key):
    exe = nf.Executor()

    def loss_of(value):
        return float(exe.run(main, feed={**feed, key: value}, fetch_list=[loss], scope=scope)[0])

    return loss_of


def _check_w_and_x_grads(loss, feed, extra_fetch):
    main = nf.default_main_program()
    (w_grad, x_grad, *rest), scope = _run(["w@GRAD", "x@GRAD", *extra_fetch], feed=feed)
    w = scope.find_var("w").get(nf.Tensor).numpy().copy()
    want_w = _numeric_grad(_param_loss(nf.Executor(), main, feed, loss, scope, "w"), w)
    np.testing.assert_allclose(w_grad, want_w, rtol=1e-6, atol=1e-8)
    want_x = _numeric_grad(_loss_of_feed(main, feed, loss, scope, "x"), feed["x"])
    np.testing.assert_allclose(x_grad, want_x, rtol=1e-6, atol=1e-8)
    assert scope.kids == []
    return rest


def test_ifelse_inside_an_rnn_step_with_gradients(rng):
    """Each step splits the batch by the sign of x_t: h = tanh(w h + x_t) or sigmoid(w h - x_t)."""
    x = L.data("x", [-1, -1, 1], "float64")
    x.stop_gradient = False
    lengths = L.data("lengths", [-1], "int64")
    w = L.create_parameter([1], "float64", name="w", initializer=nf.initializer.Constant(0.7))
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(shape=[1], dtype="float64", batch_ref=x)
        ie = nf.ifelse(L.greater_than(xt, L.fill_constant([1], "float64", 0.0)))
        with ie.true_block():
            ie.output(L.tanh(L.elementwise_mul(h, w) + xt))
        with ie.false_block():
            ie.output(L.sigmoid(L.elementwise_mul(h, w) - xt))
        (new,) = ie()
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    loss = L.reduce_sum(L.square(out))
    nf.append_backward(loss)
    feed = {"x": rng.normal(size=(3, 4, 1)), "lengths": np.array([4, 2, 3], dtype=np.int64)}
    (o,) = _check_w_and_x_grads(loss, feed, [out])
    h_ref, want = np.zeros((3, 1)), np.zeros((3, 4, 1))
    for t in range(4):
        xt_ = feed["x"][:, t]
        new_ = np.where(xt_ > 0, np.tanh(0.7 * h_ref + xt_), 1 / (1 + np.exp(-(0.7 * h_ref - xt_))))
        active = (feed["lengths"] > t)[:, None]
        h_ref = np.where(active, new_, h_ref)
        want[:, t] = np.where(active, new_, 0.0)
    np.testing.assert_allclose(o, want, rtol=1e-12)


def test_rnn_inside_an_ifelse_branch_with_gradients(rng):
    """Rows where `sel` holds run an RNN over their sequence; the others take w * sum(x)."""
    x = L.data("x", [-1, -1, 1], "float64")
    x.stop_gradient = False
    sel = L.data("sel", [-1, 1], "bool")
    w = L.create_parameter([1], "float64", name="w", initializer=nf.initializer.Constant(0.7))
    ie = nf.ifelse(sel)
    with ie.true_block():
        rnn = nf.rnn()
        with rnn.step():
            xt = rnn.step_input(x)
            h = rnn.memory(shape=[1], dtype="float64", batch_ref=x)
            rnn.update_memory(h, L.tanh(L.elementwise_mul(h, w) + xt))
        ie.output(rnn.final_memory(h))
    with ie.false_block():
        ie.output(L.reduce_sum(x, dim=1) * w)
    (out,) = ie()
    loss = L.reduce_sum(L.square(out))
    nf.append_backward(loss)
    feed = {"x": rng.normal(size=(4, 3, 1)), "sel": np.array([[True], [False], [True], [True]])}
    (o,) = _check_w_and_x_grads(loss, feed, [out])
    h_ref = np.zeros((4, 1))
    for t in range(3):
        h_ref = np.tanh(0.7 * h_ref + feed["x"][:, t])
    np.testing.assert_allclose(o, np.where(feed["sel"], h_ref, 0.7 * feed["x"].sum(1)), rtol=1e-12)


def test_live_scopes_do_not_grow_over_1000_training_steps(rng):
    """Each run's step scopes (and the gradient pass's use of them) are released with the run's
    local scope: training does not accumulate scopes."""
    x, lengths, h0, out, final = _tanh_rnn(hidden=2, features=1)
    target = L.data("target", [-1, 2], "float64")
    loss = L.mean(L.square(final - target))
    nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(4, 3, 1))
    feed = {
        "x": xs,
        "lengths": np.array([3, 1, 2, 3], dtype=np.int64),
        "h0": np.zeros((4, 2)),
        "target": np.tanh(np.concatenate([xs.sum(1), -xs.sum(1)], axis=1)),
    }
    exe.run(feed=feed, fetch_list=[loss], scope=scope)
    before = live_scope_count()
    losses = [float(exe.run(feed=feed, fetch_list=[loss], scope=scope)[0]) for _ in range(1000)]
    assert live_scope_count() == before
    assert scope.kids == []
    assert losses[-1] < 0.1 * losses[0]


def test_outputs_that_are_the_memory_and_the_step_input_get_their_gradients(rng):
    """rnn.output(h) stacks each step's previous memory, rnn.output(x_t) the input slices:
    their output gradients join the gradients flowing through the step."""
    x = L.data("x", [-1, -1, 2], "float64")
    x.stop_gradient = False
    lengths = L.data("lengths", [-1], "int64")
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(shape=[2], value=0.25, dtype="float64")
        w = L.create_parameter([2], "float64", name="w", initializer=nf.initializer.Constant(0.5))
        rnn.update_memory(h, L.sigmoid(L.elementwise_mul(h, w) + xt))
        rnn.output(rnn.previous_memory(h), xt)
    prev, slices = rnn()
    loss = L.reduce_sum(L.square(prev)) + L.reduce_sum(L.square(slices) * 0.5)
    nf.append_backward(loss)
    feed = {"x": rng.normal(size=(2, 3, 2)), "lengths": np.array([3, 2], dtype=np.int64)}
    (p, s), _ = _run([prev, slices], feed=feed)
    np.testing.assert_allclose(p[:, 0], 0.25)
    np.testing.assert_allclose(s, feed["x"] * (np.arange(3)[None, :, None] < [[[3]], [[2]]]))
    _check_w_and_x_grads(loss, feed, [])


@pytest.mark.parametrize("hoist", [True, False])
def test_sequences_with_no_time_steps(hoist):
    """T = 0 (e.g. a batch trimmed to its longest row, all empty): no step runs, memories keep
    their initial values, outputs are [batch, 0, ...]; gradients reach the initial values."""
    x = L.data("x", [-1, -1, 3], "float64")
    x.stop_gradient = False
    h0 = L.data("h0", [-1, 2], "float64")
    h0.stop_gradient = False
    w = L.create_parameter([3, 2], "float64", name="w")
    u = L.create_parameter([2, 2], "float64", name="u")
    rnn = nf.rnn(hoist=hoist)
    with rnn.step():
        h = rnn.memory(init=h0)
        new = L.tanh(L.matmul(rnn.step_input(x), w) + L.matmul(rnn.previous_memory(h), u))
        rnn.update_memory(h, new)
        rnn.output(new)
    out, final = rnn(), rnn.final_memory(h)
    loss = L.reduce_sum(out) + L.reduce_sum(L.square(final))
    nf.append_backward(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    h0v = np.arange(4.0).reshape(2, 2)
    feed = {"x": np.zeros((2, 0, 3)), "h0": h0v}
    names = [out, final, loss, "h0@GRAD", "w@GRAD", "u@GRAD", "x@GRAD"]
    got_out, got_final, got_loss, g_h0, g_w, g_u, g_x = exe.run(
        feed=feed, fetch_list=names, scope=scope
    )
    assert got_out.shape == (2, 0, 2) and g_x.shape == (2, 0, 3)
    np.testing.assert_array_equal(got_final, h0v)
    assert float(got_loss) == float((h0v**2).sum())
    np.testing.assert_array_equal(g_h0, 2 * h0v)
    assert not g_w.any() and not g_u.any() and g_w.shape == (3, 2)


def test_no_time_steps_with_an_unknown_output_row_shape_is_a_clear_error():
    x = L.data("x", [-1, -1, -1], "float64")  # features: any number
    rnn = nf.rnn()
    with rnn.step():
        rnn.output(L.scale(rnn.step_input(x), 2.0))
    out = rnn()
    with pytest.raises(nf.errors.ControlFlowError, match="no time steps"):
        nf.Executor().run(feed={"x": np.zeros((2, 0, 3))}, fetch_list=[out], scope=nf.Scope())


@pytest.mark.parametrize("train", [False, True])
def test_a_kernel_failing_in_a_step_names_its_op_and_line(train):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4, -1])
        w = nf.layers.create_parameter([3, 2], "float32", name="w")
        rnn = nf.rnn(hoist=False)  # the product stays in the step block
        with rnn.step():
            xt = rnn.step_input(x)
            h = rnn.memory(shape=[2])
            y = nf.layers.matmul(xt, w) + rnn.previous_memory(h)  # the failing op's line
            rnn.update_memory(h, y)
            rnn.output(y)
        out = rnn()
        if train:
            nf.optimizer.SGD(0.1).minimize(nf.layers.mean(out))
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    with pytest.raises(nf.errors.ExecutionError, match=r"'matmul' \(#0 in block 1\)") as caught:
        exe.run(main, feed={"x": np.ones((2, 4, 5), "float32")}, fetch_list=[out], scope=scope)
    location = caught.value.location
    assert location.op_type == "matmul" and location.block_idx == 1
    assert location.source.startswith(f"{__file__}:") and "x: float32[2, 5]" in str(caught.value)
