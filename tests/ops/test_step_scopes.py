"""Step scopes of the control-flow ops (seeds 000/002/003): one per time step, holding the
step's values by name for the gradient op, destroyed with the run's local scope; outer values
a step reads are looked up once per op, a step scope's own value winning; gradients summed over
steps never write into a value another op holds."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.scope import live_scope_count
from nestflow.errors import ScopeDestroyedError
from nestflow.executor.executor import StepRunner
from nestflow.ops import register_op
from nestflow.ops.ifelse import GradSum, scope_array
from nestflow.ops.registry import _REGISTRY

L = nf.layers
_seen: list = []


class PeekStepScopesOp:
    """Test-only: records, for every step scope it is given (or the one of index `step`),
    the Variable named `name` and what it holds (read while the run is on, as a later op
    would)."""

    type = "test_peek_step_scopes"
    inputs, outputs = ("Scopes",), ("Out",)
    attrs = {"name": "", "step": -1}

    def run(ctx):
        name, step = ctx.attrs["name"], ctx.attrs["step"]
        for index, scope in enumerate(ctx.input("Scopes")):
            if step >= 0 and index != step:
                continue
            var = scope.find_local_var(name)
            _seen.append((scope, var, var.get(nf.Tensor).numpy()))
        ctx.set_output("Out", np.zeros(1))


class TwoParentsOp:
    """Test-only: runs `sub_block` in two kids of each of three parent scopes holding different
    `c`, with one remembered-values dict, as a control-flow op runs its steps."""

    type = "test_two_parents"
    inputs, outputs = (), ("Out",)
    attrs = {"sub_block": None, "inner": ""}

    def run(ctx):
        block, inner = ctx.attrs["sub_block"], ctx.attrs["inner"]
        remembered: dict = {}
        results = []
        for value in (1.0, 2.0, 3.0):
            parent = ctx.scope.new_scope()
            parent.var("c").set_value(np.array([value]))
            for own in (None, 10.0 * value):
                kid = parent.new_scope()
                if own is not None:  # a value the kid holds itself wins
                    kid._hold({"c": 0}, [np.array([own])])
                frame = ctx.executor.run_sub_block(block, kid, {}, ctx.frame, remembered)
                results.append(frame.value(inner))
        ctx.set_output("Out", np.concatenate(results))


@pytest.fixture(autouse=True, scope="module")
def test_ops():
    """Registered only while this module runs, so suites that walk the registry never see them."""
    register_op(PeekStepScopesOp)
    register_op(TwoParentsOp)
    yield
    _REGISTRY.pop(PeekStepScopesOp.type)
    _REGISTRY.pop(TwoParentsOp.type)


def _rnn(steps=4, hidden=3):
    """h_t = tanh(x_t @ w + h_{t-1}), outputs h_t; x is [batch, steps, 2]."""
    x = L.data("x", [-1, steps, 2], "float64")
    w = L.create_parameter([2, hidden], "float64", name="w")
    h0 = L.fill_constant([2, hidden], "float64", 0.0)
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(init=h0)
        new = L.tanh(L.matmul(xt, w) + rnn.previous_memory(h))
        rnn.update_memory(h, new)
        rnn.output(new)
    return x, w, new, rnn()


def _w_grad_checked(rng):
    """Run the default programs on a random batch of 3 steps; w@GRAD must equal central
    differences. Returns the batch and w's value."""
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(2, 3, 2))
    w0 = scope.find_var("w").get(nf.Tensor).numpy()
    (got,) = exe.run(feed={"x": xs}, fetch_list=["w@GRAD"], scope=scope)
    np.testing.assert_allclose(got, _numeric_w_grad(xs, w0), rtol=1e-6, atol=1e-9)
    return xs, w0


def _peek_after_the_rnn(block, name: str, step: int = -1) -> None:
    """Insert a test_peek_step_scopes op reading `name` from the recurrent op's step scopes
    right after that op."""
    index = next(i for i, op in enumerate(block.ops) if op.type == "recurrent")
    scopes = block.ops[index].output("StepScopes")[0]
    block.create_var("peek", [1], "float64")
    block.insert_op(
        index + 1,
        "test_peek_step_scopes",
        {"Scopes": [scopes]},
        {"Out": ["peek"]},
        {"name": name, "step": step},
    )


def _numpy_rnn(x, w):
    h = np.zeros((x.shape[0], w.shape[1]))
    outs = []
    for t in range(x.shape[1]):
        h = np.tanh(x[:, t] @ w + h)
        outs.append(h)
    return np.stack(outs, 1)


def _numeric_w_grad(xs, w0, eps=1e-6):
    """d sum(_numpy_rnn(xs, w)) / dw at w0, by central differences."""
    want = np.zeros_like(w0)
    for i in np.ndindex(*w0.shape):
        up, down = w0.copy(), w0.copy()
        up[i] += eps
        down[i] -= eps
        want[i] = (_numpy_rnn(xs, up).sum() - _numpy_rnn(xs, down).sum()) / (2 * eps)
    return want


def test_step_scope_variables_are_visible_by_name_and_die_with_the_run(rng):
    x, w, new, out = _rnn()
    main = nf.default_main_program()
    rnn_op = next(op for op in main.global_block().ops if op.type == "recurrent")
    block = main.global_block()
    peek = block.create_var("peek", [1], "float64")
    block.append_op(
        "test_peek_step_scopes",
        {"Scopes": [rnn_op.output("StepScopes")[0]]},
        {"Out": peek},
        {"name": new.name},
    )
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(2, 4, 2))
    gc.collect()
    before = live_scope_count()
    _seen.clear()
    got, _ = exe.run(main, feed={"x": xs}, fetch_list=[out, peek], scope=scope)
    want = _numpy_rnn(xs, scope.find_var("w").get(nf.Tensor).numpy())
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert len(_seen) == 4  # one step scope per time step
    for t, (step, var, held) in enumerate(_seen):
        np.testing.assert_allclose(held, want[:, t], rtol=1e-12)
        assert not step.alive
        with pytest.raises(ScopeDestroyedError):
            var.get(nf.Tensor)  # a stale reference never reads the dead step's value
    assert scope.kids == []
    gc.collect()
    assert live_scope_count() == before


def test_a_step_variable_can_be_fetched_after_the_run(rng):
    x, w, new, out = _rnn()
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(2, 4, 2))
    (last,) = exe.run(feed={"x": xs}, fetch_list=[new.name], scope=scope)
    want = _numpy_rnn(xs, scope.find_var("w").get(nf.Tensor).numpy())
    np.testing.assert_allclose(last, want[:, -1], rtol=1e-12)  # the newest step scope's
    assert scope.kids == []


def test_parameter_gradients_summed_over_steps_leave_the_seeds_alone(rng):
    """At every step the gradient of `p` is the output gradient's slice itself (out = x + p):
    the sum over steps must be a new array, never accumulated into that slice."""
    steps = 5
    x = L.data("x", [-1, steps, 3], "float64")
    c = L.data("c", [-1, steps, 3], "float64")
    p = L.create_parameter([2, 3], "float64", name="p")
    rnn = nf.rnn()
    with rnn.step():
        rnn.output(rnn.step_input(x) + p)
    out = rnn()
    loss = L.reduce_sum(out * c)
    nf.append_backward(loss)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    cs = rng.normal(size=(2, steps, 3))
    p_grad, out_grad = exe.run(
        feed={"x": rng.normal(size=(2, steps, 3)), "c": cs},
        fetch_list=["p@GRAD", out.name + "@GRAD"],
        scope=scope,
    )
    np.testing.assert_allclose(out_grad, cs, rtol=1e-12)
    np.testing.assert_allclose(p_grad, cs.sum(axis=1), rtol=1e-12)


def test_weight_gradient_reads_each_steps_own_input_slice(rng):
    """The gradient block reads `x` (the step's slice, held by the step scope), not the outer
    [batch, time, ...] sequence of the same name."""
    x, w, new, out = _rnn(steps=3)
    loss = L.reduce_sum(out)
    nf.append_backward(loss)
    _w_grad_checked(rng)


def test_remembered_outer_values_follow_the_parent_scope():
    main = nf.default_main_program()
    with main.block_guard() as sub:
        c = sub.create_var("c", [1], "float64")
        inner = L.scale(c, 2.0)
    block = main.global_block()
    out = block.create_var("out", [-1], "float64")
    block.append_op("test_two_parents", {}, {"Out": out}, {"sub_block": sub, "inner": inner.name})
    (got,) = nf.Executor().run(main, fetch_list=[out], scope=nf.Scope())
    assert got.tolist() == [2.0, 20.0, 4.0, 40.0, 6.0, 60.0]


def test_grad_sum_adds_in_place_only_into_its_own_array():
    first, second, third = np.ones(3), np.full(3, 2.0), np.full(3, 4.0)
    total = GradSum()
    total.add(first)
    assert total.value is first
    total.add(second)
    made = total.value
    assert made is not first and made.tolist() == [3.0] * 3
    total.add(third)
    assert total.value is made and made.tolist() == [7.0] * 3  # in place, into its own array
    assert first.tolist() == [1.0] * 3 and second.tolist() == [2.0] * 3
    mixed = GradSum()
    for grad in (np.ones(2, "float32"), np.ones(2, "float32"), np.ones(2)):
        mixed.add(grad)
    assert mixed.value.dtype == np.float64 and mixed.value.tolist() == [3.0, 3.0]  # as a + b


@pytest.mark.parametrize("peek", [None, "all", "one"])
def test_gradients_are_the_same_when_step_scopes_were_read_by_name(rng, peek, monkeypatch):
    """Reading a step variable by name makes the step scope's held values Variables; the
    gradient op then binds that step by name instead of by index, with the same result (one
    step scope read, the others still holding values: each step as its scope allows)."""
    x, w, new, out = _rnn(steps=3)
    loss = L.reduce_sum(out)
    nf.append_backward(loss)
    main = nf.default_main_program()
    block = main.global_block()
    if peek:
        _peek_after_the_rnn(block, new.name, step=1 if peek == "one" else -1)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(2, 3, 2))
    w0 = scope.find_var("w").get(nf.Tensor).numpy()
    _seen.clear()
    general = []  # steps run by name (StepRunner.run), not over a held-value env
    run = StepRunner.run
    monkeypatch.setattr(StepRunner, "run", lambda self, *a: general.append(1) or run(self, *a))
    (got,) = exe.run(feed={"x": xs}, fetch_list=["w@GRAD"], scope=scope)
    assert len(_seen) == len(general) == {None: 0, "all": 3, "one": 1}[peek]
    np.testing.assert_allclose(got, _numeric_w_grad(xs, w0), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("peek", [False, True])
def test_step_values_the_gradient_needs_only_the_shape_of_are_kept_as_stand_ins(
    rng, peek, monkeypatch
):
    """x_t @ w (hoisted: a step input's slice) is read by the gradient block only as the add's
    X (grad_no_need_buffer): the step scopes keep a zero-stride stand-in of it, except the
    newest (fetches read that one), and the gradient is unchanged. When another op reads the
    step scopes by name, every step keeps the real value."""
    x, w, new, out = _rnn(steps=3)
    loss = L.reduce_sum(out)
    nf.append_backward(loss)
    block = nf.default_main_program().global_block()
    index = next(i for i, op in enumerate(block.ops) if op.type == "recurrent")
    step_block = block.ops[index].attr("sub_block")
    product = next(op for op in step_block.ops if op.type == "elementwise_add").input("X")[0]
    if peek:
        _peek_after_the_rnn(block, product)
    held = []
    grad_def = _REGISTRY["recurrent_grad"]

    def run(ctx):
        held.extend(scope_array(s, product) for s in ctx.input("StepScopes"))
        return real_run(ctx)

    real_run = grad_def.run
    monkeypatch.setattr(grad_def, "run", run)
    xs, w0 = _w_grad_checked(rng)
    assert len(held) == 3
    for t, value in enumerate(held):
        real = peek or t == 2
        assert (value.strides == (0, 0)) is not real, (t, value.strides)
        if real:
            np.testing.assert_allclose(value, xs[:, t] @ w0, rtol=1e-12)
