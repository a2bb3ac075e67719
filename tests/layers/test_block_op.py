"""nf.BlockOp: a Block run as one operator (seed 002's `class Block : OperatorBase`; the
`block` and `block_grad` ops in nestflow/ops/block.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.scope import live_scope_count
from tests.gradcheck import numeric_gradient

L = nf.layers


def _fc_block(dtype="float64"):
    """out = tanh(x @ inner.w + inner.b), built inside a BlockOp; loss = sum(out ** 2)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = L.data("x", [-1, 3], dtype)
        x.stop_gradient = False
        blk = nf.BlockOp()
        with blk.block():
            hidden = L.fc(x, 4, act="tanh", name="inner")
            blk.output(hidden)
        (out,) = blk()
        loss = L.reduce_sum(L.square(out))
        nf.append_backward(loss)
    return main, startup, out, loss, hidden


def _params(scope):
    return [scope.find_var(n).get(nf.Tensor).numpy() for n in ("inner.w", "inner.b")]


def test_the_block_runs_as_one_op_and_matches_numpy(rng):
    main, startup, out, _, hidden = _fc_block()
    ops = main.global_block().ops
    assert ops[0].type == "block" and ops[0].attr("sub_block").parent_idx == 0
    assert [op.type for op in ops[0].attr("sub_block").ops] == ["mul", "elementwise_add", "tanh"]
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    xs = rng.normal(size=(5, 3))
    gc.collect()  # earlier tests' unreachable scopes must not be collected during the run
    before = live_scope_count()
    got, inner = exe.run(main, feed={"x": xs}, fetch_list=[out, hidden], scope=scope)
    w, b = _params(scope)
    np.testing.assert_allclose(got, np.tanh(xs @ w + b), rtol=1e-12)
    np.testing.assert_array_equal(inner, got)  # a variable made inside the block is fetchable
    assert live_scope_count() == before  # the block's kid scope went with the run's scope


def test_gradients_match_central_differences(rng):
    main, startup, _, loss, _ = _fc_block()
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    feed = {"x": rng.normal(size=(4, 3))}
    names = ["x@GRAD", "inner.w@GRAD", "inner.b@GRAD"]
    analytic = exe.run(main, feed=feed, fetch_list=names, scope=scope)
    for name, got in zip(names, analytic):
        want = numeric_gradient(exe, main, scope, feed, loss, name[: -len("@GRAD")])
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, err_msg=name)


def test_nested_blocks_and_an_ifelse_inside_with_gradients(rng):
    """A BlockOp in a BlockOp, the inner one holding an IfElse: values and gradients."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = L.data("x", [-1, 2], "float64")
        x.stop_gradient = False
        w = L.create_parameter([2, 2], "float64", name="w")
        outer = nf.BlockOp()
        with outer.block():
            inner = nf.BlockOp()
            with inner.block():
                cond = L.greater_than(L.slice(x, axes=[1], starts=[0], ends=[1]), 0.0)
                ie = nf.ifelse()
                with ie.true_block():
                    ie.output(L.matmul(x, w))
                with ie.false_block():
                    ie.output(L.scale(x, 3.0))
                (picked,) = ie(cond)
                inner.output(L.tanh(picked))
            (mid,) = inner()
            outer.output(L.scale(mid, 2.0))
        (out,) = outer()
        loss = L.reduce_sum(L.square(out))
        nf.append_backward(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    xs = np.array([[1.0, -0.5], [-1.0, 0.25], [0.5, 0.5]])
    feed = {"x": xs}
    got, gx, gw = exe.run(main, feed=feed, fetch_list=[out, "x@GRAD", "w@GRAD"], scope=scope)
    wv = scope.find_var("w").get(nf.Tensor).numpy()
    rows = xs[:, :1] > 0
    want = 2 * np.tanh(np.where(rows, xs @ wv, 3 * xs))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for name, value in (("x", gx), ("w", gw)):
        numeric = numeric_gradient(exe, main, scope, feed, loss, name)
        np.testing.assert_allclose(value, numeric, rtol=1e-6, atol=1e-9, err_msg=name)


def test_round_trip_prune_and_a_float32_training_step(rng):
    main, startup, out, _, _ = _fc_block("float32")
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    xs = rng.normal(size=(3, 3)).astype("float32")
    (want,) = exe.run(main, feed={"x": xs}, fetch_list=[out], scope=scope)
    again = nf.Program.from_bytes(main.to_bytes())
    np.testing.assert_array_equal(
        exe.run(again, feed={"x": xs}, fetch_list=[out], scope=scope)[0], want
    )
    small = nf.prune(main, [out])
    assert [op.type for op in small.global_block().ops] == ["block"]  # no loss, no gradients
    np.testing.assert_array_equal(
        exe.run(small, feed={"x": xs}, fetch_list=[out], scope=scope)[0], want
    )

    main2, startup2 = nf.Program(), nf.Program()
    with nf.program_guard(main2, startup2), nf.unique_name.guard():
        x = L.data("x", [-1, 3])
        blk = nf.BlockOp()
        with blk.block():
            blk.output(L.fc(x, 2, name="inner"))
        (o,) = blk()
        loss = L.mean(L.square(o))
        nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    scope2 = nf.Scope()
    exe.run(startup2, scope=scope2)
    losses = [
        float(exe.run(main2, feed={"x": xs}, fetch_list=[loss], scope=scope2)[0]) for _ in range(20)
    ]
    assert losses[-1] < 0.5 * losses[0]  # the parameters inside the block train


def test_misuse_is_a_control_flow_error():
    with nf.program_guard(nf.Program(), nf.Program()):
        x = L.data("x", [-1, 3])
        blk = nf.BlockOp()
        with pytest.raises(nf.errors.ControlFlowError, match="output\\(\\) must be inside"):
            blk.output(x)
        with pytest.raises(nf.errors.ControlFlowError, match="after building block"):
            blk()
        with blk.block():
            L.assign(L.scale(x, 2.0), output=x)  # writes the outer x
        with pytest.raises(nf.errors.ControlFlowError, match="writes outer variable"):
            blk()
        with pytest.raises(nf.errors.ControlFlowError, match="already built"):
            with blk.block():
                pass


def test_a_block_op_written_by_hand_with_create_block(rng):
    """The op as a program description holds it: a child block from Program.create_block and a
    `block` op whose BLOCK attr references it (no Scope output: forward only)."""
    prog, startup = nf.Program(), nf.Program()
    with nf.program_guard(prog, startup):
        x = L.data("x", [-1, 2])
        sub = prog.create_block()
        tripled = L.scale(x, 3.0)
        prog.rollback()
        out = prog.global_block().create_var("out", [-1, 2], "float32")
        prog.global_block().append_op(
            "block",
            inputs={"X": [x]},
            outputs={"Out": [out]},
            attrs={"sub_block": sub, "outs": [tripled.name]},
        )
        loss = L.reduce_sum(out)
    assert sub.parent_idx == 0 and prog.global_block().ops[0].attr("sub_block") is sub
    xs = rng.normal(size=(3, 2)).astype("float32")
    got, inner = nf.Executor().run(
        prog, feed={"x": xs}, fetch_list=[out, tripled], scope=nf.Scope()
    )
    np.testing.assert_allclose(got, 3 * xs, rtol=1e-6)
    np.testing.assert_array_equal(inner, got)
    x.stop_gradient = False
    with (
        nf.program_guard(prog, startup),
        pytest.raises(nf.errors.ControlFlowError, match="no 'Scope' output"),
    ):
        nf.append_backward(loss)


def test_outputs_big_enough_to_be_released_keep_the_values_the_gradient_reads(rng):
    """Out aliases the value kept in the block's kid scope: ops after the block that could
    reuse a released buffer in place (relu, scale) must not change what block_grad reads."""
    x = L.data("x", [-1, 128], "float64")
    w = L.create_parameter([128, 128], "float64", name="w")
    blk = nf.BlockOp()
    with blk.block():
        blk.output(L.tanh(L.matmul(x, w)))
    (out,) = blk()
    after = L.scale(L.relu(L.scale(out, 2.0, bias=-0.1)), 3.0)  # 64 x 128 > 4096 elements
    loss = L.reduce_sum(L.square(after))
    nf.append_backward(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(64, 128)) / 8
    got, g_w = exe.run(feed={"x": xs}, fetch_list=[after, "w@GRAD"], scope=scope)
    wv = scope.find_var("w").get(nf.Tensor).numpy()
    hidden = np.tanh(xs @ wv)
    pre = 2 * hidden - 0.1
    want = 3 * np.maximum(pre, 0)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    d_hidden = 2 * want * 3 * (pre > 0) * 2
    np.testing.assert_allclose(g_w, xs.T @ (d_hidden * (1 - hidden**2)), rtol=1e-10)


def test_an_output_made_outside_the_block_passes_through_with_its_gradient(rng):
    """blk.output(h) of an outer h (as ie.output may): the op reads h, so the executor keeps
    it for the block (with a dynamic batch it was released first: None came out) and its
    gradient flows back through the op (w@GRAD was never computed)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = L.data("x", [-1, 2], "float64")
        w = L.create_parameter([2, 2], "float64", name="w")
        h = L.matmul(x, w)
        blk = nf.BlockOp()
        with blk.block():
            blk.output(h, L.scale(x, 2.0))
        outer, inner = blk()
        loss = L.reduce_sum(L.square(outer)) + L.reduce_sum(inner)
        nf.append_backward(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    feed = {"x": rng.normal(size=(3, 2))}
    got, inner_got, w_grad = exe.run(
        main, feed=feed, fetch_list=[outer, inner, "w@GRAD"], scope=scope
    )
    w_value = scope.find_var("w").get(nf.Tensor).numpy()
    np.testing.assert_allclose(got, feed["x"] @ w_value, rtol=1e-12)
    np.testing.assert_allclose(inner_got, 2 * feed["x"], rtol=1e-12)
    want = numeric_gradient(exe, main, scope, feed, loss, "w")
    np.testing.assert_allclose(w_grad, want, rtol=1e-6, atol=1e-8)
