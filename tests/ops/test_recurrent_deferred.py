"""recurrent_grad's deferred parameter products: a step's X @ W whose W gradient is summed over
the steps in one product of all steps' rows (nestflow/ops/recurrent.py). Gradients are checked
against central differences of the loss in float64, with unequal lengths."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.framework.program import GRAD_SUFFIX
from tests.gradcheck import numeric_gradient

L = nf.layers
BATCH, STEPS, FEATURES, HIDDEN = 3, 4, 3, 2


def _build(step):
    """An RNN over x [batch, steps, FEATURES] (hoisting off: the products stay in the step),
    loss = sum(outputs * r) + sum(final memory ** 2)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = L.data("x", [-1, STEPS] + step.x_tail, "float64")
        lengths = L.data("lengths", [-1], "int64")
        h0 = L.data("h0", [-1, HIDDEN], "float64")
        rnn = nf.rnn(hoist=False)
        with rnn.step():
            xt = rnn.step_input(x, lengths=lengths)
            h = rnn.memory(init=h0)
            new = step(xt, rnn.previous_memory(h))
            rnn.update_memory(h, new)
            rnn.output(new)
        out = rnn()
        r = L.data("r", [-1, STEPS] + step.out_tail, "float64")
        loss = L.reduce_sum(out * r) + L.reduce_sum(L.square(rnn.final_memory(h)))
        params_grads = nf.append_backward(loss)
    return main, startup, loss, params_grads


def _plain(xt, h_prev):
    wx = L.create_parameter([FEATURES, HIDDEN], "float64", name="wx")
    wh = L.create_parameter([HIDDEN, HIDDEN], "float64", name="wh")
    return L.tanh(L.matmul(xt, wx) + L.matmul(h_prev, wh))


_plain.x_tail, _plain.out_tail = [FEATURES], [HIDDEN]


def _fc_and_shared(xt, h_prev):
    """fc (a mul) of the input; wh used twice in the step, so its gradient is a sum of two
    products and stays in the step."""
    wh = L.create_parameter([HIDDEN, HIDDEN], "float64", name="wh")
    inp = L.fc(xt, HIDDEN, name="in")
    return L.tanh(inp + L.matmul(h_prev, wh) + L.matmul(L.sigmoid(h_prev), wh))


_fc_and_shared.x_tail, _fc_and_shared.out_tail = [FEATURES], [HIDDEN]


def _batched(xt, h_prev):
    """x_t is [batch, 2, FEATURES]: a batched matmul by a matrix (per-step fallback)."""
    wx = L.create_parameter([FEATURES, HIDDEN], "float64", name="wx")
    proj = L.reduce_sum(L.matmul(xt, wx), dim=1)
    return L.tanh(proj + h_prev)


_batched.x_tail, _batched.out_tail = [2, FEATURES], [HIDDEN]


def _feed(rng, step):
    return {
        "x": rng.normal(size=[BATCH, STEPS] + step.x_tail),
        "lengths": np.array([STEPS, 1, 3], np.int64),
        "h0": rng.normal(size=(BATCH, HIDDEN)),
        "r": rng.normal(size=[BATCH, STEPS] + step.out_tail),
    }


def _recurrent_grad(main):
    return next(op for b in main.blocks for op in b.ops if op.type == "recurrent_grad")


@pytest.mark.parametrize(
    "step, deferred",
    [(_plain, ["wx", "wh"]), (_fc_and_shared, ["in.w"]), (_batched, ["wx"])],
    ids=["matmuls", "fc-and-shared-weight", "batched-matmul"],
)
def test_parameter_gradients_match_central_differences(rng, step, deferred):
    main, startup, loss, params_grads = _build(step)
    grad_op = _recurrent_grad(main)
    by_grad = dict(zip(grad_op.attr("param_grads"), grad_op.input("Params")))
    assert sorted(by_grad[g] for g in grad_op.attr("deferred_grads")) == sorted(deferred)
    # The step's product ops no longer compute the deferred gradients.
    grad_block = grad_op.attr("grad_block")
    for op in grad_block.ops:
        if op.type in ("matmul_grad", "mul_grad") and op.input("Y")[0] in deferred:
            assert op.output("Y" + GRAD_SUFFIX) == [""]

    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    for param, _ in params_grads:
        value = rng.normal(scale=0.5, size=param.shape)
        scope.find_var(param.name).get(nf.Tensor).set(value)
    feed = _feed(rng, step)
    names = [g.name for _, g in params_grads]
    analytic = exe.run(main, feed=feed, fetch_list=names, scope=scope)
    for (param, _), got in zip(params_grads, analytic):
        want = numeric_gradient(exe, main, scope, feed, loss, param.name)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8, err_msg=param.name)


def test_deferred_gradients_survive_program_round_trip_and_pruning(rng):
    main, startup, loss, params_grads = _build(_plain)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    feed = _feed(rng, _plain)
    names = [g.name for _, g in params_grads]
    want = exe.run(main, feed=feed, fetch_list=names, scope=scope)
    for program in (nf.Program.from_bytes(main.to_bytes()), nf.prune(main, names)):
        got = exe.run(program, feed=feed, fetch_list=names, scope=scope)
        for name, value, expected in zip(names, got, want):
            np.testing.assert_allclose(value, expected, rtol=1e-12, err_msg=name)


@pytest.mark.parametrize("kind, y_shape, col_dims", [("mul", (6, 5), 1), ("matmul", (6, 5), 1)])
def test_deferred_products_sum_on_the_steps_place(kind, y_shape, col_dims):
    """finish() multiplies the steps' device arrays on their place (the stand-in here), equal
    to the host's sum of the steps' X^T @ dOut."""
    from nestflow.core import standin
    from nestflow.ops.step_products import DeferredProduct

    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((rows, 6)) for rows in (3, 200, 0, 7)]
    gs = [rng.standard_normal((rows, 5)) for rows in (3, 200, 0, 7)]
    product = DeferredProduct(kind, "x", "g", col_dims)
    product.xs = [standin.xp.asarray(x) for x in xs]
    product.gs = [standin.xp.asarray(g) for g in gs]
    got = product.finish(standin.xp.zeros(y_shape))
    assert type(got) is standin.StandInArray
    want = sum(x.T @ g for x, g in zip(xs, gs))
    np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=1e-12)
