"""RNN hoisting: time-batchable ops of the step that need no other time-varying value than
step inputs run once over whole sequences before the recurrent op. Every program is built
twice, with hoist=True and hoist=False, and both must give the same outputs and gradients."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import nestflow as nf
import nestflow as pd

L = nf.layers


def _build(build: Callable[[bool], list], hoist: bool) -> tuple[nf.Program, nf.Program, list]:
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        fetch = build(hoist)
    return main, startup, [f if isinstance(f, str) else f.name for f in fetch]


def _run(main, startup, names, feed):
    """Run with every parameter set to the same values (by name) in both builds."""
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    init = np.random.default_rng(7)
    for param in sorted(main.all_parameters(), key=lambda p: p.name):
        value = init.normal(scale=0.5, size=param.shape).astype(param.dtype)
        scope.find_var(param.name).get(nf.Tensor).set(value)
    return exe.run(main, feed=feed, fetch_list=names, scope=scope)


def _same_with_and_without_hoisting(build, feed, rtol=1e-6, atol=1e-9):
    """Build and run both ways; assert every fetched value agrees; return (hoisted program,
    its fetched values)."""
    runs = {}
    for hoist in (True, False):
        main, startup, names = _build(build, hoist)
        runs[hoist] = main, _run(main, startup, names, feed)
    for name, got, want in zip(names, runs[True][1], runs[False][1]):
        assert np.shape(got) == np.shape(want), name
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    return runs[True]


def _recurrent(block) -> nf.framework.program.OpDesc:
    (op,) = [op for op in block.ops if op.type == "recurrent"]
    return op


def _step_ops(main) -> list[str]:
    return [op.type for op in _recurrent(main.global_block()).attr("sub_block").ops]


def _outer_ops(main, block=None) -> list[str]:
    """Ops before the recurrent op, less those the RNN and nf.var always put there."""
    block = block or main.global_block()
    made = {"assign_value", "fill_constant", "rnn_memory_boot"}
    return [op.type for op in block.ops[: _recurrent(block).index] if op.type not in made]


def _w3_rnn(hoist, dtype="float64", steps=5, features=4, hidden=3):
    """bench/w3_rnn.py's step: h_t = tanh(x_t @ Wx + h_{t-1} @ Wh)."""
    x = L.data("x", [-1, steps, features], dtype)
    x.stop_gradient = False
    h0 = L.data("h0", [-1, hidden], dtype)
    h0.stop_gradient = False
    wx = L.create_parameter([features, hidden], dtype, name="wx")
    wh = L.create_parameter([hidden, hidden], dtype, name="wh")
    rnn = nf.rnn(hoist=hoist)
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(init=h0)
        act = L.tanh(L.matmul(xt, wx) + L.matmul(rnn.previous_memory(h), wh))
        rnn.update_memory(h, act)
        rnn.output(act)
    out = rnn()
    r = L.data("r", [-1, steps, hidden], dtype)
    loss = L.reduce_sum(out * r) + L.reduce_sum(L.square(rnn.final_memory(h)))
    nf.append_backward(loss)
    return [out, loss, "wx@GRAD", "wh@GRAD", "x@GRAD", "h0@GRAD"]


def _w3_feed(rng, dtype="float64", batch=3, steps=5, features=4, hidden=3):
    return {
        "x": rng.normal(size=(batch, steps, features)).astype(dtype),
        "h0": rng.normal(size=(batch, hidden)).astype(dtype),
        "r": rng.normal(size=(batch, steps, hidden)).astype(dtype),
    }


def test_w3_rnn_same_outputs_and_gradients(rng):
    main, _ = _same_with_and_without_hoisting(_w3_rnn, _w3_feed(rng))
    assert _outer_ops(main) == ["mul"]  # x @ Wx over all steps: one 2-D product
    assert _step_ops(main) == ["matmul", "elementwise_add", "tanh"]


def test_w3_rnn_float32_same_outputs_and_gradients(rng):
    build = lambda hoist: _w3_rnn(hoist, "float32", steps=6, features=8, hidden=5)  # noqa: E731
    feed = _w3_feed(rng, "float32", batch=4, steps=6, features=8, hidden=5)
    _same_with_and_without_hoisting(build, feed, rtol=1e-5, atol=1e-6)


def test_hoisted_op_moves_to_the_enclosing_block_as_a_step_input():
    main, _, _ = _build(_w3_rnn, hoist=True)
    block = main.global_block()
    op = _recurrent(block)
    step = op.attr("sub_block")
    (moved,) = [o for o in block.ops if o.type == "mul"]
    (name,) = moved.output("Out")
    assert moved.input("X") == ["x"] and moved.input("Y") == ["wx"]
    assert moved.attr("x_num_col_dims") == 2
    assert moved.index < op.index
    # Declared [batch, time, hidden] outside, read as its [batch, hidden] slice in the step.
    assert block.var(name).shape == (-1, 5, 3)
    assert step.var(name).shape == (-1, 3)
    # x itself is no longer sliced per step: only the hoisted product read it.
    assert op.input("Inputs") == [name]
    assert "x" not in step.vars
    assert "wx" not in op.input("Params")
    assert all(o.type != "mul" and "wx" not in o.input_names() for o in step.ops)
    assert any(name in o.input_names() for o in step.ops)


def test_hoist_false_keeps_every_op_in_the_step():
    main, _, _ = _build(_w3_rnn, hoist=False)
    assert _outer_ops(main) == []
    assert _step_ops(main) == ["matmul", "matmul", "elementwise_add", "tanh"]
    assert _recurrent(main.global_block()).input("Inputs") == ["x"]


def _fc_rnn(hoist, hidden=3):
    """An fc with bias and activation of the step input (mul, elementwise_add with axis=1,
    relu: all hoisted) plus a recurrent fc, with unequal lengths."""
    x = L.data("x", [-1, -1, 2], "float64")
    x.stop_gradient = False
    lengths = L.data("lengths", [-1], "int64")
    h0 = L.data("h0", [-1, hidden], "float64")
    h0.stop_gradient = False
    rnn = nf.rnn(hoist=hoist)
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(init=h0)
        inp = L.fc(xt, hidden, act="relu", name="in")
        new = L.tanh(inp + L.fc(rnn.previous_memory(h), hidden, bias_attr=False, name="rec"))
        rnn.update_memory(h, new)
        rnn.output(new, inp)
    out, inp_out = rnn()
    final = rnn.final_memory(h)
    r = L.data("r", [-1, -1, hidden], "float64")
    loss = L.reduce_sum(out * r) + L.reduce_sum(L.square(inp_out)) + L.reduce_sum(final)
    nf.append_backward(loss)
    return [out, inp_out, final, "in.w@GRAD", "in.b@GRAD", "rec.w@GRAD", "x@GRAD", "h0@GRAD"]


def test_fc_in_the_step_with_unequal_lengths(rng):
    lens = np.array([4, 1, 0, 3], dtype=np.int64)
    feed = {
        "x": rng.normal(size=(4, 4, 2)),
        "lengths": lens,
        "h0": rng.normal(size=(4, 3)),
        "r": rng.normal(size=(4, 4, 3)),
    }
    main, (out, inp, final, *_, x_grad, _) = _same_with_and_without_hoisting(_fc_rnn, feed)
    assert _outer_ops(main) == ["mul", "elementwise_add", "relu"]
    assert _step_ops(main) == ["mul", "elementwise_add", "tanh"]
    (add,) = [op for op in main.global_block().ops if op.type == "elementwise_add"][:1]
    assert add.attr("axis") == 2  # was 1 in the step: the time dim comes before it now
    # A hoisted step output is still zero past each row's length, and so are the gradients.
    past = np.arange(4)[None, :] >= lens[:, None]
    assert not out[past].any() and not inp[past].any() and not x_grad[past].any()
    assert inp[~past].any()


def _seed_rnn(hoist):
    """The seed RNN program (docs/concepts.md)."""
    x = pd.sequence([10, 20, 30])
    m = pd.var(0)
    W = pd.var(0.314, param=True)
    U = pd.var(0.375, param=True)
    rnn = pd.rnn(hoist=hoist)
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
    loss = L.reduce_sum(o1) + L.reduce_sum(L.scale(o2, 3.0)) + L.reduce_sum(rnn.final_memory(h))
    grads = nf.append_backward(loss)
    return [o1, o2] + [g for _, g in grads]


def test_seed_program_keeps_its_values_and_gradients():
    main, startup, names = _build(_seed_rnn, hoist=True)
    # `a = x_t W` multiplies by a [1] vector, not a matrix: it stays, like the ops reading h.
    assert _outer_ops(main) == []
    assert _step_ops(main) == ["matmul", "matmul", "elementwise_add", "sigmoid"]
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    got = exe.run(main, fetch_list=names, scope=scope)
    np.testing.assert_allclose(got[0], [[3.14, 6.28, 9.42]], rtol=1e-6)
    np.testing.assert_allclose(got[1], [[0.0, 0.35944, 0.37451]], atol=1e-5)
    main0, startup0, names0 = _build(_seed_rnn, hoist=False)
    scope0 = nf.Scope()
    exe.run(startup0, scope=scope0)
    want = exe.run(main0, fetch_list=names0, scope=scope0)
    assert names == names0 and len(names) == 4  # o1, o2, W@GRAD, U@GRAD
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def _input_used_twice(hoist):
    """x_t feeds a hoisted product and is also read directly (by an op reading the memory,
    and as a step output); the hoisted product is an output too."""
    x = L.data("x", [-1, -1, 3], "float64")
    x.stop_gradient = False
    lengths = L.data("lengths", [-1], "int64")
    w = L.create_parameter([3, 3], "float64", name="w")
    rnn = nf.rnn(hoist=hoist)
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(shape=[3], value=0.1, dtype="float64")
        a = L.matmul(xt, w)
        new = L.tanh(a + L.elementwise_mul(xt, rnn.previous_memory(h)))
        rnn.update_memory(h, new)
        rnn.output(new, a, xt)
    out, a_out, x_out = rnn()
    loss = L.reduce_sum(L.square(out)) + L.reduce_sum(a_out) + L.reduce_sum(L.sigmoid(x_out))
    nf.append_backward(loss)
    return [out, a_out, x_out, "w@GRAD", "x@GRAD"]


def test_step_input_used_both_by_a_hoisted_op_and_directly(rng):
    feed = {"x": rng.normal(size=(3, 4, 3)), "lengths": np.array([2, 4, 3], dtype=np.int64)}
    main, (out, a_out, x_out, *_) = _same_with_and_without_hoisting(_input_used_twice, feed)
    assert _outer_ops(main) == ["mul"]
    assert _step_ops(main) == ["elementwise_mul", "elementwise_add", "tanh"]
    assert _recurrent(main.global_block()).input("Inputs") == ["x", a_name(main)]
    past = np.arange(4)[None, :] >= feed["lengths"][:, None]
    assert not a_out[past].any()
    np.testing.assert_allclose(a_out[~past], (feed["x"] @ _param(main, "w"))[~past], rtol=1e-12)


def a_name(main) -> str:
    (op,) = [op for op in main.global_block().ops if op.type == "mul"]
    return op.output("Out")[0]


def _param(main, name):
    """The value _run gives parameter `name` (same draw order)."""
    init = np.random.default_rng(7)
    for param in sorted(main.all_parameters(), key=lambda p: p.name):
        value = init.normal(scale=0.5, size=param.shape).astype(param.dtype)
        if param.name == name:
            return value
    raise KeyError(name)


def _chains(hoist):
    """Both-varying elementwise ops, a time-invariant X with a varying Y, an invariant computed
    outside the RNN, unary ops, and an elementwise axis on a rank-3 step input."""
    x = L.data("x", [-1, -1, 2, 3], "float64")  # [batch, time, 2, 3]: steps are [batch, 2, 3]
    x.stop_gradient = False
    w1 = L.create_parameter([3, 4], "float64", name="w1")
    w2 = L.create_parameter([3, 4], "float64", name="w2")
    b = L.create_parameter([2], "float64", name="b")
    c = L.create_parameter([4], "float64", name="c")
    c2 = L.scale(c, 2.0)  # an invariant made by an op of the enclosing block
    rnn = nf.rnn(hoist=hoist)
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(shape=[2, 4], dtype="float64")
        p = L.matmul(xt, w1) * L.sigmoid(L.matmul(xt, w2))  # [batch, 2, 4]
        q = L.elementwise_sub(c2, p)  # X invariant [4], Y varying
        s = L.elementwise_add(L.scale(q, 0.5, bias=1.0), b, axis=1)  # b on the dim of size 2
        new = L.tanh(s + h)
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    loss = L.reduce_sum(L.square(out))
    nf.append_backward(loss)
    return [out, "w1@GRAD", "w2@GRAD", "b@GRAD", "c@GRAD", "x@GRAD"]


def test_chains_of_hoisted_ops_and_axis_rewrites(rng):
    main, _ = _same_with_and_without_hoisting(_chains, {"x": rng.normal(size=(2, 3, 2, 3))})
    outer = _outer_ops(main)
    assert outer.count("mul") == 2 and "sigmoid" in outer and "elementwise_sub" in outer
    assert _step_ops(main) == ["elementwise_add", "tanh"]
    block = main.global_block()
    (add,) = [op for op in block.ops[: _recurrent(block).index] if op.type == "elementwise_add"]
    assert add.attr("axis") == 2


def _stays(hoist):
    """Ops that must stay: a random op (dropout) and what uses it, an op reading the memory,
    an op whose output is the memory's update, an elementwise op aligned on the batch dim, an
    op reading an outer variable the step writes."""
    x = L.data("x", [-1, -1, 3], "float64")
    rows = L.data("rows", [-1], "float64")
    w = L.create_parameter([3, 3], "float64", name="w")
    counter = L.fill_constant([3], "float64", 0.0)
    rnn = nf.rnn(hoist=hoist)
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(shape=[3], dtype="float64")
        dropped = L.scale(L.dropout(xt, 0.5, seed=3), 2.0)
        by_row = L.elementwise_mul(xt, rows, axis=0)  # rows[i] scales batch row i
        counted = L.elementwise_add(xt, counter)
        L.assign(L.reduce_sum(xt, dim=0), output=counter)
        rec = L.matmul(h, w)
        rnn.update_memory(h, L.tanh(rec))
        rnn.output(dropped, by_row, counted)
    rnn()
    return []


def test_ops_that_are_not_time_batchable_stay_in_the_step():
    main, _, _ = _build(_stays, hoist=True)
    assert _step_ops(main) == [
        "dropout",
        "scale",
        "elementwise_mul",
        "elementwise_add",
        "reduce_sum",
        "assign",
        "matmul",
        "tanh",
    ]


def test_memory_update_computed_from_the_step_input_stays(rng):
    def build(hoist):
        x = L.data("x", [-1, -1, 2], "float64")
        rnn = nf.rnn(hoist=hoist)
        with rnn.step():
            xt = rnn.step_input(x)
            h = rnn.memory(shape=[2], dtype="float64")
            rnn.update_memory(h, L.scale(xt, 3.0))
            rnn.output(L.sigmoid(h))
        return [rnn()]

    main, (out,) = _same_with_and_without_hoisting(build, {"x": rng.normal(size=(2, 3, 2))})
    assert _step_ops(main) == ["scale", "sigmoid"]


def _in_a_branch(hoist):
    """An RNN inside an IfElse branch: its hoisted product lands in the branch's block."""
    x = L.data("x", [-1, -1, 2], "float64")
    x.stop_gradient = False
    sel = L.data("sel", [-1, 1], "bool")
    w = L.create_parameter([2, 2], "float64", name="w")
    ie = nf.ifelse(sel)
    with ie.true_block():
        rnn = nf.rnn(hoist=hoist)
        with rnn.step():
            xt = rnn.step_input(x)
            h = rnn.memory(shape=[2], dtype="float64", batch_ref=x)
            rnn.update_memory(h, L.tanh(L.matmul(xt, w) + h))
        ie.output(rnn.final_memory(h))
    with ie.false_block():
        ie.output(L.reduce_sum(x, dim=1))
    (out,) = ie()
    nf.append_backward(L.reduce_sum(L.square(out)))
    return [out, "w@GRAD", "x@GRAD"]


def test_hoisting_into_a_nested_block(rng):
    feed = {"x": rng.normal(size=(4, 3, 2)), "sel": np.array([[True], [False], [True], [True]])}
    main, _ = _same_with_and_without_hoisting(_in_a_branch, feed)
    (ie_op,) = [op for op in main.global_block().ops if op.type == "ifelse"]
    branch = ie_op.attr("true_block")
    rec = _recurrent(branch)
    assert _outer_ops(main, branch) == ["mul"]
    assert [op.type for op in rec.attr("sub_block").ops] == ["elementwise_add", "tanh"]


def test_hoisted_program_runs_the_same_after_a_protobuf_round_trip(rng):
    main, startup, names = _build(_w3_rnn, hoist=True)
    feed = _w3_feed(rng)
    want = _run(main, startup, names, feed)
    loaded = nf.Program.from_bytes(main.to_bytes())
    got = _run(loaded, startup, names, feed)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("with_y", [True, False])
def test_step_inputs_the_step_still_needs_are_kept(rng, with_y):
    """An explicit step input the step never reads (y) still gives the number of steps; x, read
    only by a hoisted op whose result nothing uses, is dropped unless no other input is left."""

    def build(hoist):
        x = L.data("x", [-1, -1, 2], "float64")
        y = L.data("y", [-1, -1, 1], "float64")
        rnn = nf.rnn(hoist=hoist)
        with rnn.step():
            if with_y:
                rnn.step_input(y)
            xt = rnn.step_input(x)
            L.tanh(xt)  # read by nothing
            h = rnn.memory(shape=[1], value=1.0, dtype="float64", batch_ref=x)
            rnn.update_memory(h, L.scale(h, 2.0))
            rnn.output(h)
        return [rnn()]

    feed = {"x": rng.normal(size=(2, 3, 2)), "y": rng.normal(size=(2, 3, 1))}
    main, (out,) = _same_with_and_without_hoisting(build, feed)
    assert _outer_ops(main) == ["tanh"]
    assert _recurrent(main.global_block()).input("Inputs") == (["y"] if with_y else ["x"])
    np.testing.assert_array_equal(out[..., 0], [[1, 2, 4], [1, 2, 4]])


def _embedding_rnn(hoist):
    """An embedding of the step's ids (Ids [batch, 1] per step) feeding a tanh RNN, with a
    padding id and repeated ids (their gradients add up)."""
    ids = L.data("ids", [-1, -1, 1], "int64")
    lengths = L.data("lengths", [-1], "int64")
    wh = L.create_parameter([3, 3], "float64", name="wh")
    rnn = nf.rnn(hoist=hoist)
    with rnn.step():
        ids_t = rnn.step_input(ids, lengths=lengths)
        h = rnn.memory(shape=[3], dtype="float64", batch_ref=ids)
        emb = L.embedding(ids_t, size=[5, 3], padding_idx=0, dtype="float64", name="emb")
        new = L.tanh(L.scale(emb, 2.0) + L.matmul(rnn.previous_memory(h), wh))
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    nf.append_backward(L.reduce_sum(L.square(out)))
    return [out, "emb.w@GRAD", "wh@GRAD"]


def test_embedding_of_the_step_ids(rng):
    feed = {
        "ids": rng.integers(0, 5, size=(3, 4, 1)).astype(np.int64),
        "lengths": np.array([4, 2, 3], dtype=np.int64),
    }
    main, (out, emb_grad, _) = _same_with_and_without_hoisting(_embedding_rnn, feed)
    assert _outer_ops(main) == ["lookup_table", "scale"]
    assert _step_ops(main) == ["matmul", "elementwise_add", "tanh"]
    assert emb_grad[1:].any() and not emb_grad[0].any()  # the padding row gets none


def _nested_rnn(hoist):
    """An RNN over the inner sequences inside an RNN's step: the inner product moves out of
    the inner step into the outer step, then out of the outer step too."""
    x = L.data("x", [-1, -1, -1, 2], "float64")  # [batch, outer time, inner time, 2]
    x.stop_gradient = False
    w = L.create_parameter([2, 3], "float64", name="w")
    u = L.create_parameter([3, 3], "float64", name="u")
    outer = nf.rnn(hoist=hoist)
    with outer.step():
        xt = outer.step_input(x)  # [batch, inner time, 2]
        g = outer.memory(shape=[3], dtype="float64", batch_ref=x)
        inner = nf.rnn(hoist=hoist)
        with inner.step():
            xs = inner.step_input(xt)  # [batch, 2]
            h = inner.memory(init=g)
            inner.update_memory(h, L.tanh(L.matmul(xs, w) + L.matmul(h, u)))
        new = inner.final_memory(h)
        outer.update_memory(g, new)
        outer.output(new)
    out = outer()
    nf.append_backward(L.reduce_sum(L.square(out)))
    return [out, "w@GRAD", "u@GRAD", "x@GRAD"]


def test_rnn_inside_an_rnn_step(rng):
    main, _ = _same_with_and_without_hoisting(_nested_rnn, {"x": rng.normal(size=(2, 3, 4, 2))})
    assert _outer_ops(main) == ["mul"]
    (moved,) = [op for op in main.global_block().ops if op.type == "mul"]
    assert moved.attr("x_num_col_dims") == 3
    assert main.global_block().var(moved.output("Out")[0]).shape == (-1, -1, -1, 3)
