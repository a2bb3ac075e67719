"""Control-flow combinations a PaddlePaddle / TensorFlow user tries (issue 4 audit): an IfElse
whose condition is all-True or all-False inside an RNN step with lengths, While inside an RNN
step and an RNN inside a While body, a parameter used both inside and outside a sub-block,
values made in nested sub-blocks fetched after the run, and RNN outputs with big static shapes
(released and reused buffers) read after the recurrent op. Gradients are checked against central
differences in float64."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf

L = nf.layers


def _grad_check(loss, feed, params, inputs, scope, eps=1e-6):
    """Analytic `name@GRAD` of every parameter and fed input against central differences."""
    exe = nf.Executor()
    analytic = exe.run(feed=feed, fetch_list=[n + "@GRAD" for n in params + inputs], scope=scope)

    def loss_value(run_feed):
        return float(exe.run(feed=run_feed, fetch_list=[loss], scope=scope)[0].sum())

    for name, grad in zip(params + inputs, analytic):
        tensor = scope.find_var(name).get(nf.Tensor) if name in params else None
        base = tensor.numpy().copy() if tensor is not None else feed[name]
        numeric = np.zeros_like(base)
        for index in np.ndindex(base.shape):
            for sign in (1.0, -1.0):
                moved = base.copy()
                moved[index] += sign * eps
                if tensor is not None:
                    tensor.set(moved)
                    numeric[index] += sign * loss_value(feed) / (2 * eps)
                else:
                    numeric[index] += sign * loss_value({**feed, name: moved}) / (2 * eps)
        if tensor is not None:
            tensor.set(base)
        assert grad.shape == base.shape, name
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8, err_msg=name)


def _startup_scope():
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    return scope


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


# ---- IfElse inside an RNN step, condition all-True / all-False / mixed, with lengths ----


def _rnn_with_ifelse_on(sel_value):
    """h_t = tanh(w h + x_t) on rows where sel holds, sigmoid(w h - x_t) elsewhere; sel is a
    per-row [batch, 1] bool fed from outside (the same at every step)."""
    x = L.data("x", [-1, -1, 1], "float64")
    x.stop_gradient = False
    lengths = L.data("lengths", [-1], "int64")
    sel = L.data("sel", [-1, 1], "bool")
    w = L.create_parameter([1], "float64", name="w", initializer=nf.initializer.Constant(0.7))
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(shape=[1], value=0.1, dtype="float64", batch_ref=x)
        ie = nf.ifelse(sel)
        with ie.true_block():
            ie.output(L.tanh(L.elementwise_mul(h, w) + xt))
        with ie.false_block():
            ie.output(L.sigmoid(L.elementwise_mul(h, w) - xt))
        (new,) = ie()
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    final = rnn.final_memory(h)
    loss = L.reduce_sum(L.square(out)) + L.reduce_sum(final)
    nf.append_backward(loss)
    return out, final, loss


@pytest.mark.parametrize("sel", ["all-true", "all-false", "mixed"])
def test_ifelse_with_a_one_sided_condition_inside_an_rnn_step_with_lengths(sel, rng):
    out, final, loss = _rnn_with_ifelse_on(sel)
    rows = {"all-true": [1, 1, 1], "all-false": [0, 0, 0], "mixed": [1, 0, 1]}[sel]
    feed = {
        "x": rng.normal(size=(3, 4, 1)),
        "lengths": np.array([4, 0, 2], np.int64),
        "sel": np.array(rows, bool).reshape(3, 1),
    }
    scope = _startup_scope()
    o, f = nf.Executor().run(feed=feed, fetch_list=[out, final], scope=scope)
    h, want = np.full((3, 1), 0.1), np.zeros((3, 4, 1))
    for t in range(4):
        xt = feed["x"][:, t]
        new = np.where(feed["sel"], np.tanh(0.7 * h + xt), _sigmoid(0.7 * h - xt))
        active = (feed["lengths"] > t)[:, None]
        h = np.where(active, new, h)
        want[:, t] = np.where(active, new, 0.0)
    np.testing.assert_allclose(o, want, rtol=1e-12)
    np.testing.assert_allclose(f, h, rtol=1e-12)
    _grad_check(loss, feed, ["w"], ["x"], scope)
    assert scope.kids == []


# ---- While inside an RNN step, RNN inside a While body ----


def test_while_inside_an_rnn_step_with_gradients(rng):
    """Each step applies h <- tanh(h * w + x_t) twice in a While loop: a fixed-count inner loop
    whose loop variable is a copy of the memory."""
    x = L.data("x", [-1, -1, 1], "float64")
    x.stop_gradient = False
    lengths = L.data("lengths", [-1], "int64")
    w = L.create_parameter([1], "float64", name="w", initializer=nf.initializer.Constant(0.6))
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(shape=[1], value=0.2, dtype="float64", batch_ref=x)
        g = L.assign(h)
        i = L.fill_constant([1], "int64", 0)
        n = L.fill_constant([1], "int64", 2)
        cond = L.less_than(i, n)
        loop = nf.While(cond)
        with loop.block():
            L.assign(L.tanh(L.elementwise_mul(g, w) + xt), output=g)
            L.increment(i)
            L.less_than(i, n, out=cond)
        rnn.update_memory(h, g)
        rnn.output(g)
    out = rnn()
    loss = L.reduce_sum(L.square(out))
    nf.append_backward(loss)
    feed = {"x": rng.normal(size=(3, 3, 1)), "lengths": np.array([3, 1, 2], np.int64)}
    scope = _startup_scope()
    (o,) = nf.Executor().run(feed=feed, fetch_list=[out], scope=scope)
    h, want = np.full((3, 1), 0.2), np.zeros((3, 3, 1))
    for t in range(3):
        new = h
        for _ in range(2):
            new = np.tanh(0.6 * new + feed["x"][:, t])
        active = (feed["lengths"] > t)[:, None]
        h = np.where(active, new, h)
        want[:, t] = np.where(active, new, 0.0)
    np.testing.assert_allclose(o, want, rtol=1e-12)
    _grad_check(loss, feed, ["w"], ["x"], scope)
    assert scope.kids == []


def test_rnn_inside_a_while_body_with_gradients(rng):
    """Three passes of a tanh RNN over the same sequence, each pass starting from the previous
    pass's final memory (the While loop variable)."""
    x = L.data("x", [-1, -1, 1], "float64")
    x.stop_gradient = False
    h0 = L.data("h0", [-1, 1], "float64")
    h0.stop_gradient = False
    w = L.create_parameter([1], "float64", name="w", initializer=nf.initializer.Constant(0.5))
    carry = L.assign(h0)
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 3)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():
        rnn = nf.rnn()
        with rnn.step():
            xt = rnn.step_input(x)
            h = rnn.memory(init=carry)
            rnn.update_memory(h, L.tanh(L.elementwise_mul(h, w) + xt))
        L.assign(rnn.final_memory(h), output=carry)
        L.increment(i)
        L.less_than(i, n, out=cond)
    loss = L.reduce_sum(L.square(carry))
    nf.append_backward(loss)
    feed = {"x": rng.normal(size=(2, 4, 1)), "h0": rng.normal(size=(2, 1))}
    scope = _startup_scope()
    (got,) = nf.Executor().run(feed=feed, fetch_list=[carry], scope=scope)
    h = feed["h0"]
    for _ in range(3):
        for t in range(4):
            h = np.tanh(0.5 * h + feed["x"][:, t])
    np.testing.assert_allclose(got, h, rtol=1e-12)
    _grad_check(loss, feed, ["w"], ["x", "h0"], scope)
    assert scope.kids == []


# ---- a parameter used both inside and outside a sub-block: its gradients are summed ----


def _shared_w():
    return L.create_parameter(
        [2, 2], "float64", name="w", initializer=nf.initializer.Uniform(-1, 1)
    )


def _ifelse_sharing(x, w):
    pre = L.tanh(L.matmul(x, w))  # w outside the sub-block
    ie = nf.ifelse(L.data("c", [-1, 1], "bool"))
    with ie.true_block():
        ie.output(L.matmul(pre, w))  # ... and inside the true branch
    with ie.false_block():
        ie.output(L.scale(pre, -2.0))
    (out,) = ie()
    return L.reduce_sum(L.square(out)) + L.reduce_sum(L.matmul(x, w))


def _rnn_sharing(x, w):
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(shape=[2], dtype="float64", batch_ref=x)
        new = L.tanh(L.matmul(xt, w) + L.matmul(rnn.previous_memory(h), w))
        rnn.update_memory(h, new)
    return L.reduce_sum(L.square(L.matmul(rnn.final_memory(h), w)))


def _while_sharing(x, w):
    h = L.matmul(x, w)
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 2)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.tanh(L.matmul(h, w)), output=h)
        L.increment(i)
        L.less_than(i, n, out=cond)
    return L.reduce_sum(L.square(L.matmul(h, w)))


@pytest.mark.parametrize("build", [_ifelse_sharing, _rnn_sharing, _while_sharing])
def test_a_parameter_used_inside_and_outside_a_sub_block_gets_the_summed_gradient(build, rng):
    sequence = build is _rnn_sharing
    x = L.data("x", [-1, -1, 2] if sequence else [-1, 2], "float64")
    x.stop_gradient = False
    loss = build(x, _shared_w())
    params_grads = nf.append_backward(loss)
    assert [p.name for p, _ in params_grads] == ["w"]
    feed = {"x": rng.normal(size=(4, 3, 2) if sequence else (4, 2))}
    if build is _ifelse_sharing:
        feed["c"] = np.array([[True], [False], [True], [False]])
    scope = _startup_scope()
    _grad_check(loss, feed, ["w"], ["x"], scope)
    assert scope.kids == []


# ---- gradient ops reuse the forward step scopes: a dropout mask drawn once per run ----


def _grad_op_reads_the_forward_step_scopes(forward_type):
    ops = [op for b in nf.default_main_program().blocks for op in b.ops]
    (forward,) = [op for op in ops if op.type == forward_type]
    (grad,) = [op for op in ops if op.type == forward_type + "_grad"]
    assert grad.input("StepScopes") == forward.output("StepScopes")
    grad_ops = [op.type for block in grad.sub_blocks() for op in block.ops]
    assert grad_ops and "dropout" not in grad_ops  # the body is not run again


def _ifelse_dropout(x):
    ie = nf.ifelse(L.data("c", [-1, 1], "bool"))
    with ie.true_block():
        ie.output(L.dropout(x, 0.5, dropout_implementation="upscale_in_train"))
    with ie.false_block():
        ie.output(L.scale(L.dropout(x, 0.5, dropout_implementation="upscale_in_train"), 3.0))
    (out,) = ie()
    return out


def _rnn_dropout(x):
    rnn = nf.rnn()
    with rnn.step():
        rnn.output(
            L.dropout(
                rnn.step_input(x, lengths=L.data("lengths", [-1], "int64")),
                0.5,
                dropout_implementation="upscale_in_train",
            )
        )
    return rnn()


def _while_dropout(x):
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 3)
    cond = L.less_than(i, n)
    array = L.create_array("float64")
    loop = nf.While(cond)
    with loop.block():
        L.array_write(L.dropout(x, 0.5, dropout_implementation="upscale_in_train"), i, array)
        L.increment(i)
        L.less_than(i, n, out=cond)
    return L.array_to_tensor(array)


@pytest.mark.parametrize(
    "build, forward_type",
    [(_ifelse_dropout, "ifelse"), (_rnn_dropout, "recurrent"), (_while_dropout, "while")],
)
def test_gradient_ops_reuse_the_values_the_forward_pass_kept(build, forward_type, rng):
    """Dropout draws a new mask each time it runs: the gradient matches the mask of this run's
    forward output only if the gradient op reads the kept step scopes, never reruns the body."""
    sequence = forward_type == "recurrent"
    x = L.data("x", [-1, -1, 3] if sequence else [-1, 3], "float64")
    x.stop_gradient = False
    out = build(x)
    r = L.data("r", list(out.shape), "float64")
    nf.append_backward(L.reduce_sum(L.elementwise_mul(out, r)))
    _grad_op_reads_the_forward_step_scopes(forward_type)
    xs = rng.uniform(1.0, 2.0, size=(4, 5, 3) if sequence else (4, 3))
    feed = {"x": xs}
    if forward_type == "ifelse":
        feed["c"] = np.array([[True], [False], [False], [True]])
    if sequence:
        feed["lengths"] = np.array([5, 2, 0, 3], np.int64)
    out_shape = {"ifelse": (4, 3), "recurrent": (4, 5, 3), "while": (3, 4, 3)}[forward_type]
    feed["r"] = rng.normal(size=out_shape)
    scope = _startup_scope()
    exe = nf.Executor()
    for _ in range(3):  # a new mask every run
        got, x_grad = exe.run(feed=feed, fetch_list=[out, "x@GRAD"], scope=scope)
        kept = got != 0
        assert 0 < kept.mean() < 1
        if forward_type == "ifelse":
            factor = np.where(feed["c"], 2.0, 6.0)
            np.testing.assert_allclose(got, kept * xs * factor, rtol=1e-12)
            want = kept * feed["r"] * factor
        elif forward_type == "recurrent":
            np.testing.assert_allclose(got, kept * xs * 2.0, rtol=1e-12)
            want = kept * feed["r"] * 2.0
        else:
            np.testing.assert_allclose(got, kept * xs * 2.0, rtol=1e-12)
            want = (kept * feed["r"] * 2.0).sum(axis=0)
        np.testing.assert_allclose(x_grad, want, rtol=1e-12)
    assert scope.kids == []


# ---- nf.data called inside a sub-block ----


def test_data_declared_inside_a_sub_block_is_global_and_can_be_fed():
    """As PaddlePaddle's layers.data: the variable goes to the global block (feeds bind there;
    before, feeding it was 'not a variable of the program'), and an IfElse branch that reads it
    gets its rows like any outer minibatch variable."""
    x = L.data("x", [-1, 1], "float64")
    ie = nf.ifelse(L.greater_than(x, 0.0))
    with ie.true_block():
        b = L.data("b", [-1, 1], "float64")
        ie.output(x + b)
    with ie.false_block():
        ie.output(x)
    (out,) = ie()
    assert nf.default_main_program().global_block().find_var("b", recursive=False) is b
    feed = {"x": np.array([[1.0], [-1.0], [2.0]]), "b": np.array([[10.0], [20.0], [30.0]])}
    (got,) = nf.Executor().run(feed=feed, fetch_list=[out], scope=nf.Scope())
    np.testing.assert_array_equal(got.ravel(), [11.0, -1.0, 32.0])


# ---- values made in nested sub-blocks can be fetched after the run ----


def test_values_made_in_an_ifelse_inside_an_rnn_step_can_be_fetched():
    """Each is the newest step's: the last time step's branch rows, the step's merged rows."""
    x = L.data("x", [-1, -1, 1], "float64")
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(shape=[1], dtype="float64", batch_ref=x)
        ie = nf.ifelse(L.greater_than(xt, 0.0))
        with ie.true_block():
            in_true = L.scale(xt, 3.0)
            ie.output(in_true)
        with ie.false_block():
            in_false = L.scale(xt, -1.0)
            ie.output(in_false)
        (merged,) = ie()
        rnn.update_memory(h, merged + h)
        rnn.output(merged)
    out = rnn()
    scope = _startup_scope()
    xs = np.array([[[1.0], [-2.0], [3.0]], [[-1.0], [2.0], [-3.0]]])
    got = nf.Executor().run(
        feed={"x": xs}, fetch_list=[in_true, in_false, merged, out], scope=scope
    )
    np.testing.assert_array_equal(got[0], [[9.0]])  # row 0 at the last step
    np.testing.assert_array_equal(got[1], [[3.0]])  # row 1 at the last step
    np.testing.assert_array_equal(got[2], [[9.0], [3.0]])
    np.testing.assert_array_equal(got[3], np.where(xs > 0, 3 * xs, -xs))
    assert scope.kids == []


def test_a_value_made_in_an_rnn_inside_a_while_body_can_be_fetched(rng):
    x = L.data("x", [-1, -1, 1], "float64")
    carry = L.fill_constant([2, 1], "float64", 0.0)
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 2)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():
        rnn = nf.rnn()
        with rnn.step():
            h = rnn.memory(init=carry)
            inner = L.elementwise_add(h, rnn.step_input(x))
            rnn.update_memory(h, inner)
        L.assign(rnn.final_memory(h), output=carry)
        L.increment(i)
        L.less_than(i, n, out=cond)
    xs = rng.normal(size=(2, 3, 1))
    scope = _startup_scope()
    got_inner, got_carry = nf.Executor().run(feed={"x": xs}, fetch_list=[inner, carry], scope=scope)
    # Two passes of a running sum: the last step of the last pass is the final carry.
    np.testing.assert_allclose(got_carry, 2 * xs.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(got_inner, got_carry, rtol=1e-12)
    assert scope.kids == []


# ---- RNN outputs with big static shapes: released and reused buffers ----


def _big_rnn(static: bool):
    """Step values of 4 x 2048 float64 (over the executor's release size when the shapes are
    static), outputs read after the op by ops that may write in place."""
    batch, steps, features = 4, 3, 2048
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        shape = [batch, steps, features] if static else [-1, -1, features]
        x = L.data("x", shape, "float64")
        x.stop_gradient = False
        h0 = L.data("h0", [shape[0], features], "float64")
        h0.stop_gradient = False
        r = L.data("r", shape, "float64")
        rnn = nf.rnn()
        with rnn.step():
            xt = rnn.step_input(x)
            h = rnn.memory(init=h0)
            prev = rnn.previous_memory(h)
            s = L.elementwise_mul(L.scale(prev, 0.5), L.sigmoid(xt))
            a = L.tanh(s)
            new = L.elementwise_add(L.square(a), L.elementwise_mul(a, xt))
            rnn.update_memory(h, new)
            rnn.output(new, prev, s)
        o_new, o_prev, o_s = rnn()
        final = rnn.final_memory(h)
        after = [L.tanh(L.scale(o_new, 2.0)), L.sigmoid(L.scale(final, 3.0)), o_prev + o_s]
        loss = (
            L.reduce_sum(L.elementwise_mul(L.tanh(o_new), r))
            + L.reduce_sum(L.square(final))
            + L.reduce_sum(o_s)
        )
        nf.append_backward(loss)
    return main, [o_new, o_prev, o_s, final, *after, loss, "x@GRAD", "h0@GRAD"]


def test_rnn_outputs_survive_buffer_release_and_reuse_until_copied_out(rng):
    feed = {
        "x": rng.normal(size=(4, 3, 2048)),
        "h0": rng.normal(size=(4, 2048)),
        "r": rng.normal(size=(4, 3, 2048)),
    }
    runs = []
    for static in (True, False):
        main, fetch = _big_rnn(static)
        exe, scope = nf.Executor(), nf.Scope()
        runs.append(exe.run(main, feed=feed, fetch_list=fetch, scope=scope))
        again = exe.run(main, feed=feed, fetch_list=fetch[:4], scope=scope)  # fewer kept names
        for a, b in zip(runs[-1], again):
            np.testing.assert_array_equal(a, b)
    h, news, prevs, ss = feed["h0"], [], [], []
    for t in range(3):
        prevs.append(h)
        ss.append(0.5 * h / (1 + np.exp(-feed["x"][:, t])))
        a = np.tanh(ss[-1])
        h = a * a + a * feed["x"][:, t]
        news.append(h)
    news, prevs, ss = np.stack(news, 1), np.stack(prevs, 1), np.stack(ss, 1)
    want = [news, prevs, ss, h, np.tanh(2 * news), 1 / (1 + np.exp(-3 * h)), prevs + ss]
    for got, expected in zip(runs[0], want):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    for got_static, got_dynamic in zip(*runs):  # gradients too: no value lost to a release
        np.testing.assert_allclose(got_static, got_dynamic, rtol=1e-12, atol=1e-12)


# ---- RNN steps where no row is running any more ----


@pytest.mark.parametrize("lens", [[2, 1], [0, 0]], ids=["trailing-steps-idle", "all-empty"])
def test_rnn_steps_past_every_rows_length_keep_memories_and_gradients(lens, rng):
    x = L.data("x", [-1, -1, 2], "float64")
    x.stop_gradient = False
    lengths = L.data("lengths", [-1], "int64")
    h0 = L.data("h0", [-1, 2], "float64")
    h0.stop_gradient = False
    w = L.create_parameter([2, 2], "float64", name="w", initializer=nf.initializer.Uniform(-1, 1))
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(init=h0)
        new = L.tanh(L.matmul(rnn.previous_memory(h), w) + xt)
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    final = rnn.final_memory(h)
    loss = L.reduce_sum(L.square(out)) + L.reduce_sum(L.square(final))
    nf.append_backward(loss)
    feed = {
        "x": rng.normal(size=(2, 4, 2)),
        "lengths": np.array(lens, np.int64),
        "h0": rng.normal(size=(2, 2)),
    }
    scope = _startup_scope()
    o, f = nf.Executor().run(feed=feed, fetch_list=[out, final], scope=scope)
    w_value = scope.find_var("w").get(nf.Tensor).numpy()
    hs, want = feed["h0"].copy(), np.zeros((2, 4, 2))
    for t in range(4):
        new_value = np.tanh(hs @ w_value + feed["x"][:, t])
        active = (np.array(lens) > t)[:, None]
        hs = np.where(active, new_value, hs)
        want[:, t] = np.where(active, new_value, 0.0)
    np.testing.assert_allclose(o, want, rtol=1e-12)
    np.testing.assert_allclose(f, hs, rtol=1e-12)
    assert not o[:, max(lens) :].any()
    _grad_check(loss, feed, ["w"], ["x", "h0"], scope)
    assert scope.kids == []


# ---- a condition fed with the wrong dtype or shape ----


@pytest.mark.parametrize(
    "cond, words",
    [
        (np.array([[1.0], [0.0]]), "has dtype float64, but the variable is bool"),
        (np.array([[1], [0]]), "has dtype int64, but the variable is bool"),
        (np.ones((2, 2), bool), r"has shape \[2, 2\], but the variable is declared \[-1, 1\]"),
    ],
    ids=["float", "int", "two-columns"],
)
def test_an_ifelse_condition_fed_wrong_is_a_clear_error_naming_the_op(cond, words):
    x = L.data("x", [-1, 2], "float64")
    ie = nf.ifelse(L.data("c", [-1, 1], "bool"))
    with ie.true_block():
        ie.output(L.scale(x, 2.0))
    with ie.false_block():
        ie.output(x)
    (out,) = ie()
    scope = nf.Scope()
    with pytest.raises(nf.errors.FeedError, match=words + ".*read by op 'ifelse'"):
        nf.Executor().run(feed={"x": np.ones((2, 2)), "c": cond}, fetch_list=[out], scope=scope)
    assert scope.kids == []
