"""append_backward / gradients: MLP gradients against hand-written NumPy backprop, summed
contributions, stop_gradient / no_grad_set, loss shapes, overwritten variables, naming."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import NestflowError
from nestflow.ops.registry import register_op

L = nf.layers


def _run(fetch, feed=None, scope=None):
    scope = scope if scope is not None else nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return exe.run(feed=feed or {}, fetch_list=fetch, scope=scope), scope


def _param(scope, name):
    return scope.find_var(name).get(nf.Tensor).numpy()


def _ops(block):
    return [op.type for op in block.ops]


def test_mlp_gradients_match_numpy_backprop(rng):
    """fc -> tanh -> fc -> softmax_with_cross_entropy -> mean (float64) vs NumPy to 1e-8."""
    x = L.data("x", [-1, 5], "float64")
    y = L.data("y", [-1, 1], "int64")
    h = L.fc(x, 4, act="tanh", name="fc1")
    logits = L.fc(h, 3, name="fc2")
    loss = L.mean(L.softmax_with_cross_entropy(logits, y))
    pairs = nf.append_backward(loss)
    assert {p.name: g.name for p, g in pairs} == {
        n: n + "@GRAD" for n in ("fc1.w", "fc1.b", "fc2.w", "fc2.b")
    }
    xs, ys = rng.normal(size=(6, 5)), rng.integers(0, 3, size=(6, 1))
    names = ["fc1.w", "fc1.b", "fc2.w", "fc2.b"]
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    # Non-zero biases so the bias paths are exercised too.
    for name in ("fc1.b", "fc2.b"):
        tensor = scope.find_var(name).get(nf.Tensor)
        tensor.set(rng.normal(size=tensor.shape))
    got = nf.Executor().run(
        feed={"x": xs, "y": ys}, fetch_list=[loss] + [n + "@GRAD" for n in names], scope=scope
    )
    w1, b1, w2, b2 = (_param(scope, n) for n in names)

    # Independent backprop.
    a = np.tanh(xs @ w1 + b1)
    z = a @ w2 + b2
    e = np.exp(z - z.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    n = len(xs)
    loss_ref = -np.log(p[np.arange(n), ys[:, 0]]).mean()
    dz = p.copy()
    dz[np.arange(n), ys[:, 0]] -= 1.0
    dz /= n
    dw2, db2 = a.T @ dz, dz.sum(axis=0)
    da = dz @ w2.T
    dpre = da * (1.0 - a * a)
    dw1, db1 = xs.T @ dpre, dpre.sum(axis=0)

    np.testing.assert_allclose(got[0], loss_ref, rtol=1e-12)
    for value, ref, name in zip(got[1:], (dw1, db1, dw2, db2), names):
        assert value.shape == ref.shape, name
        np.testing.assert_allclose(value, ref, rtol=1e-8, atol=0, err_msg=name)
    # data variables are stop_gradient: no gradient ops for x or the integer label.
    block = nf.default_main_program().global_block()
    assert not block.has_var("x@GRAD") and not block.has_var("y@GRAD")


def test_a_variable_used_twice_gets_its_gradients_summed(rng):
    """out = x*w + w: two contributions to w@GRAD, added by a sum op."""
    x = L.data("x", [-1, 3], "float64")
    w = L.create_parameter([3], "float64", name="w", initializer=nf.initializer.Constant(0.5))
    loss = L.mean(L.elementwise_add(L.elementwise_mul(x, w), w))
    (pair,) = nf.append_backward(loss)
    assert pair[1].name == "w@GRAD"
    block = nf.default_main_program().global_block()
    sums = [op for op in block.ops if op.type == "sum"]
    assert len(sums) == 1 and sums[0].output("Out") == ["w@GRAD"]
    assert all("@RENAME@" in name for name in sums[0].input("X"))
    xs = rng.normal(size=(4, 3))
    (grad,), _ = _run(["w@GRAD"], {"x": xs})
    np.testing.assert_allclose(grad, (xs.sum(axis=0) + 4) / 12, rtol=1e-12)


def test_same_variable_in_two_slots_of_one_op(rng):
    """square via x*x: both slots' gradients reach x (2x), none overwritten."""
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    loss = L.mean(L.elementwise_mul(x, x))
    nf.append_backward(loss)
    xs = rng.normal(size=(3, 2))
    (grad,), _ = _run(["x@GRAD"], {"x": xs})
    np.testing.assert_allclose(grad, 2 * xs / 6, rtol=1e-12)


def test_stop_gradient_blocks_gradients(rng):
    x = L.data("x", [-1, 3], "float64")
    h = L.fc(x, 2, act="tanh", name="fc1")
    h.stop_gradient = True
    loss = L.mean(L.fc(h, 1, name="fc2"))
    pairs = nf.append_backward(loss)
    assert sorted(p.name for p, _ in pairs) == ["fc2.b", "fc2.w"]
    block = nf.default_main_program().global_block()
    assert not block.has_var("fc1.w@GRAD") and not block.has_var(h.name + "@GRAD")
    # Nothing computes gradients below h.
    assert "tanh_grad" not in _ops(block)
    (grad,), _ = _run(["fc2.w@GRAD"], {"x": rng.normal(size=(4, 3))})
    assert grad.shape == (2, 1)


@pytest.mark.parametrize("as_var", [False, True], ids=["names", "vardescs"])
def test_no_grad_set_blocks_gradients(as_var):
    x = L.data("x", [-1, 3], "float64")
    h = L.fc(x, 2, act="tanh", name="fc1")
    loss = L.mean(L.fc(h, 1, name="fc2"))
    pairs = nf.append_backward(loss, no_grad_set=[h] if as_var else [h.name])
    assert sorted(p.name for p, _ in pairs) == ["fc2.b", "fc2.w"]
    assert not nf.default_main_program().global_block().has_var("fc1.w@GRAD")


def test_parameter_list_limits_the_parameters_differentiated():
    x = L.data("x", [-1, 3], "float64")
    h = L.fc(x, 2, act="tanh", name="fc1")
    loss = L.mean(L.fc(h, 1, name="fc2"))
    pairs = nf.append_backward(loss, parameter_list=["fc1.w"])
    assert [(p.name, g.name) for p, g in pairs] == [("fc1.w", "fc1.w@GRAD")]
    block = nf.default_main_program().global_block()
    assert not block.has_var("fc2.w@GRAD") and not block.has_var("fc1.b@GRAD")


def test_non_trainable_parameter_gets_no_gradient():
    x = L.data("x", [-1, 3], "float64")
    w = L.create_parameter([3, 1], "float64", name="frozen", trainable=False)
    loss = L.mean(L.fc(L.matmul(x, w), 1, name="fc"))
    pairs = nf.append_backward(loss)
    assert sorted(p.name for p, _ in pairs) == ["fc.b", "fc.w"]


@pytest.mark.parametrize("shape", [(), (1,)], ids=["0-d", "[1]"])
def test_loss_shapes_seed_ones(shape, rng):
    x = L.data("x", [-1, 2], "float64")
    w = L.create_parameter([2], "float64", name="w", initializer=nf.initializer.Constant(1.0))
    loss = L.mean(L.elementwise_mul(x, w))
    if shape == (1,):
        loss = L.reshape(loss, [1])
    assert loss.shape == shape
    nf.append_backward(loss)
    block = nf.default_main_program().global_block()
    seed_op = next(op for op in block.ops if loss.name + "@GRAD" in op.output_names())
    assert seed_op.type in ("fill_constant", "fill_any_like")
    assert block.var(loss.name + "@GRAD").shape == shape
    xs = rng.normal(size=(5, 2))
    (seed, grad), _ = _run([loss.name + "@GRAD", "w@GRAD"], {"x": xs})
    assert seed.shape == shape and np.all(seed == 1.0)
    np.testing.assert_allclose(grad, xs.mean(axis=0) / 2, rtol=1e-12)


def test_integer_variables_never_get_gradients(rng):
    ids = L.data("ids", [-1, 1], "int64")
    emb = L.embedding(ids, size=[5, 2], dtype="float64", param_attr=nf.ParamAttr(name="emb"))
    loss = L.mean(emb)
    pairs = nf.append_backward(loss, no_grad_set=[])
    assert [p.name for p, _ in pairs] == ["emb"]
    block = nf.default_main_program().global_block()
    assert not block.has_var("ids@GRAD")
    (grad,), _ = _run(["emb@GRAD"], {"ids": np.array([[1], [1], [3]])})
    expected = np.zeros((5, 2))
    expected[1], expected[3] = 2 / 6, 1 / 6
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


def test_overwritten_variable_gradient_reaches_its_first_value(rng):
    """h = x*w, then h = tanh(h) written over h: w's gradient goes through both values."""
    x = L.data("x", [-1, 2], "float64")
    w = L.create_parameter([2], "float64", name="w", initializer=nf.initializer.Constant(0.3))
    h = L.elementwise_mul(x, w)
    L.assign(L.tanh(h), output=h)
    loss = L.mean(h)
    nf.append_backward(loss)
    xs = rng.normal(size=(3, 2))
    (grad,), _ = _run(["w@GRAD"], {"x": xs})
    t = np.tanh(xs * 0.3)
    np.testing.assert_allclose(grad, ((1 - t * t) * xs).sum(axis=0) / 6, rtol=1e-12)


def test_gradient_ops_carry_the_forward_op_source_line():
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    h = L.tanh(x)
    loss = L.mean(h)
    nf.append_backward(loss)
    ops = nf.default_main_program().global_block().ops
    tanh, tanh_grad = (next(op for op in ops if op.type == t) for t in ("tanh", "tanh_grad"))
    assert tanh.source and tanh_grad.source == tanh.source
    seed = next(op for op in ops if op.output_names() == [loss.name + "@GRAD"])
    assert "test_backward.py" in seed.source  # the line calling append_backward


def test_ops_after_the_loss_are_not_differentiated():
    x = L.data("x", [-1, 2], "float64")
    loss = L.mean(L.fc(x, 1, name="fc"))
    L.scale(loss, 2.0)  # built after the loss: not on any path to it
    nf.append_backward(loss)
    assert "scale_grad" not in _ops(nf.default_main_program().global_block())


def test_non_differentiable_ops_on_the_way_stop_quietly(rng):
    """accuracy's (float) output added to the loss: no gradient flows through it."""
    x = L.data("x", [-1, 3], "float64")
    y = L.data("y", [-1, 1], "int64")
    p = L.fc(x, 3, act="softmax", name="fc")
    acc = L.cast(L.accuracy(p, y), "float64")
    loss = L.elementwise_add(L.mean(L.cross_entropy(p, y)), L.reshape(acc, []))
    pairs = nf.append_backward(loss)
    assert sorted(p.name for p, _ in pairs) == ["fc.b", "fc.w"]


@register_op
class backward_test_opaque:
    """A float op with no gradient, to check the walk refuses to drop a needed gradient."""

    inputs, outputs = ("X",), ("Out",)

    def infer(X):
        return X

    def forward(X):
        return np.asarray(X * 2)


def test_an_op_without_gradient_on_the_path_raises():
    x = L.data("x", [-1, 2], "float64")
    h = L.fc(x, 2, name="fc")
    block = nf.default_main_program().global_block()
    out = block.create_var("opaque_out", [-1, 2], "float64")
    block.append_op("backward_test_opaque", {"X": [h]}, {"Out": [out]})
    loss = L.mean(out)
    with pytest.raises(NestflowError, match="backward_test_opaque.*no gradient") as info:
        nf.append_backward(loss)
    assert info.value.location is not None and info.value.location.op_type == (
        "backward_test_opaque"
    )


def test_integer_loss_is_rejected():
    x = L.data("x", [-1, 2], "int64")
    with pytest.raises(NestflowError, match="floating-point"):
        nf.append_backward(L.reduce_sum(x))


def test_gradients_of_targets_with_respect_to_inputs(rng):
    """nf.gradients works for data inputs (stop_gradient) and takes target gradients."""
    x = L.data("x", [-1, 2], "float64")
    y = L.tanh(x)
    (gx,) = nf.gradients([y], [x])
    assert gx.name == "x@GRAD"
    xs = rng.normal(size=(3, 2))
    (value,), _ = _run([gx], {"x": xs})
    np.testing.assert_allclose(value, 1 - np.tanh(xs) ** 2, rtol=1e-12)


def test_gradients_with_target_gradients_and_unreached_input(rng):
    x = L.data("x", [-1, 2], "float64")
    other = L.data("other", [-1, 2], "float64")
    y = L.scale(x, 3.0)
    upstream = L.data("upstream", [-1, 2], "float64")
    gx, gother = nf.gradients(y, [x, other], target_gradients=[upstream])
    assert gother is None
    xs, us = rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    (value,), _ = _run([gx], {"x": xs, "upstream": us})
    np.testing.assert_allclose(value, 3 * us, rtol=1e-12)


def test_grad_blocks_never_write_the_outer_gradient_names(rng):
    """Convention: inside a control-flow grad block, an outer variable's gradient is
    `x@GRAD@BLOCK<k>`, so the outer block's own `x@GRAD` is written only by outer ops."""
    x = L.data("x", [-1, 2], "float64")
    w = L.create_parameter([2, 2], "float64", name="w", initializer=nf.initializer.Constant(0.4))
    c = L.data("c", [-1, 1], "bool")
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.tanh(L.matmul(x, w)))
    with ie.false_block():
        ie.output(L.matmul(x, w))
    (out,) = ie(c)
    loss = L.mean(out)
    nf.append_backward(loss)
    program = nf.default_main_program()
    grad_blocks = [b for b in program.blocks if b.forward_block_idx >= 0]
    assert len(grad_blocks) == 2
    for block in grad_blocks:
        written = {n for op in block.ops for n in op.output_names()}
        assert "w@GRAD" not in written
        assert f"w@GRAD@BLOCK{block.idx}" in written
        assert block.parent_idx == block.forward_block_idx
    xs = rng.normal(size=(4, 2))
    rows = np.array([[True], [False], [True], [False]])
    (grad,), _ = _run(["w@GRAD"], {"x": xs, "c": rows})
    t = np.tanh(xs @ np.full((2, 2), 0.4))
    up = np.where(rows, 1 - t * t, 1.0) / 8
    np.testing.assert_allclose(grad, xs.T @ up, rtol=1e-12)


def test_backward_program_survives_a_protobuf_round_trip(rng):
    x = L.data("x", [-1, 3], "float64")
    loss = L.mean(L.fc(L.fc(x, 3, act="tanh", name="a"), 1, name="b"))
    nf.append_backward(loss)
    main = nf.default_main_program()
    copy = nf.Program.from_bytes(main.to_bytes())
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    feed = {"x": rng.normal(size=(2, 3))}
    first = nf.Executor().run(main, feed=feed, fetch_list=["a.w@GRAD"], scope=scope)
    second = nf.Executor().run(copy, feed=feed, fetch_list=["a.w@GRAD"], scope=scope)
    np.testing.assert_array_equal(first[0], second[0])
