"""nf.prune (seed 002's Prune) and Executor.eval (Prune + Run)."""

import sys

import numpy as np
import pytest

import nestflow as nf
from nestflow.executor.prune import prune_cached


def build_regression():
    x = nf.data("x", shape=[-1, 4])
    y = nf.data("y", shape=[-1, 1])
    h = nf.layers.fc(x, size=8, act="tanh", name="fc1")
    pred = nf.layers.fc(h, size=1, name="fc2")
    diff = nf.layers.elementwise_sub(pred, y)
    loss = nf.layers.mean(nf.layers.elementwise_mul(diff, diff))
    return x, y, pred, loss


def op_types(program, block=0):
    return [op.type for op in program.block(block).ops]


def test_prune_to_prediction_keeps_only_the_forward_path():
    _, _, pred, _ = build_regression()
    main = nf.default_main_program()
    small = nf.prune(main, [pred])
    assert op_types(small) == ["mul", "elementwise_add", "tanh", "mul", "elementwise_add"]
    assert "y" not in small.global_block().vars
    assert set(small.global_block().vars) >= {"x", "fc1.w", "fc1.b", "fc2.w", "fc2.b"}
    # The original is untouched.
    assert op_types(main)[-3:] == ["elementwise_sub", "elementwise_mul", "mean"]


def test_prune_to_prediction_drops_loss_gradient_and_optimizer_ops():
    _, _, pred, loss = build_regression()
    nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    main = nf.default_main_program()
    assert any(t.endswith("_grad") for t in op_types(main)) and "sgd" in op_types(main)
    small = nf.prune(main, [pred.name])
    types = op_types(small)
    assert types == ["mul", "elementwise_add", "tanh", "mul", "elementwise_add"]
    assert not any(n.endswith("@GRAD") for n in small.global_block().vars)


def test_prune_to_updated_parameter_keeps_whole_training_path():
    _, _, _, loss = build_regression()
    nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    main = nf.default_main_program()
    # sgd writes ParamOut = the parameter itself: its updated value needs the loss, every
    # gradient op on the path to fc1.w and the sgd op.
    small = nf.prune(main, ["fc1.w"])
    types = op_types(small)
    assert types.count("sgd") == 1
    assert "mean" in types and "mean_grad" in types and "tanh_grad" in types
    sgd = small.global_block().ops[-1]
    assert sgd.type == "sgd" and sgd.output("ParamOut") == ["fc1.w"]
    assert "y" in small.global_block().vars
    # fc2.b's own update is not needed for fc1.w.
    assert all(op.output_names() != ["fc2.b"] for op in small.global_block().ops)
    # Running the pruned program updates fc1.w exactly as the full program does.
    scope_full, scope_small = nf.Scope(), nf.Scope()
    exe = nf.Executor()
    for scope in (scope_full, scope_small):
        nf.seed(7)
        exe.run(nf.default_startup_program(), scope=scope)
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((5, 4)).astype("float32"), "y": np.ones((5, 1), "float32")}
    exe.run(main, feed=feed, scope=scope_full)
    exe.run(small, feed=feed, scope=scope_small)
    np.testing.assert_array_equal(
        scope_full.find_var("fc1.w").get(nf.Tensor).numpy(),
        scope_small.find_var("fc1.w").get(nf.Tensor).numpy(),
    )


def test_eval_needs_no_label_feed():
    x, _, pred, loss = build_regression()
    nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    main = nf.default_main_program()
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    before = scope.find_var("fc1.w").get(nf.Tensor).numpy()
    xs = np.random.default_rng(1).standard_normal((3, 4)).astype("float32")
    (out,) = exe.eval(main, targets=[pred], feed={"x": xs}, scope=scope)
    w1, b1, w2, b2 = (
        scope.find_var(n).get(nf.Tensor).numpy() for n in ("fc1.w", "fc1.b", "fc2.w", "fc2.b")
    )
    np.testing.assert_allclose(out, np.tanh(xs @ w1 + b1) @ w2 + b2, rtol=1e-5, atol=1e-6)
    # Eval ran no optimizer op.
    np.testing.assert_array_equal(scope.find_var("fc1.w").get(nf.Tensor).numpy(), before)


def test_prune_cached_reuses_until_the_program_changes():
    x, _, pred, _ = build_regression()
    main = nf.default_main_program()
    first = prune_cached(main, [pred])
    assert prune_cached(main, [pred.name]) is first
    with nf.program_guard(main):
        nf.layers.relu(pred)
    again = prune_cached(main, [pred])
    assert again is not first
    assert op_types(again) == op_types(first)


def test_prune_unknown_target_is_a_clear_error():
    build_regression()
    with pytest.raises(nf.errors.NestflowError, match="'nope' is not a variable"):
        nf.prune(nf.default_main_program(), ["nope"])


@nf.ops.register_op
class prune_test_block_owner:
    """A stand-in control-flow op: it owns a sub-block and names what the block exports."""

    inputs, outputs = ("X*",), ("Out*",)
    attrs = {"sub_block": None, "exports": []}

    def run(ctx):  # never run: these tests only prune
        raise NotImplementedError


def test_prune_keeps_op_with_sub_block_and_what_the_sub_block_reads():
    main = nf.default_main_program()
    glob = main.global_block()
    a = nf.data("a", shape=[2])
    b = nf.data("b", shape=[2])
    nf.layers.scale(a, scale=5.0)  # needed by nobody: pruned away
    outer = nf.layers.scale(a, scale=2.0)
    other = nf.layers.scale(b, scale=7.0)  # read only inside the sub-block
    with main.block_guard() as sub:
        inner = sub.create_var("inner", shape=[2])
        dead = sub.create_var("dead", shape=[2])
        sub.append_op("elementwise_add", {"X": outer, "Y": other}, {"Out": inner})
        sub.append_op("scale", {"X": outer}, {"Out": dead}, {"scale": 4.0})
    result = glob.create_var("result", shape=[2])
    glob.append_op(
        "prune_test_block_owner",
        {"X": [outer]},
        {"Out": [result]},
        {"sub_block": sub, "exports": ["inner"]},
    )
    small = nf.prune(main, [result])
    assert op_types(small) == ["scale", "scale", "prune_test_block_owner"]
    assert [op.attr("scale") for op in small.global_block().ops[:2]] == [2.0, 7.0]
    # The sub-block keeps what its owner names; `dead` is computed for nobody.
    kept = small.block(sub.idx).ops
    assert [op.output_names() for op in kept] == [["inner"]]
    assert "dead" not in small.block(sub.idx).vars
    # Pruning to something else drops the owner op and empties its block.
    smaller = nf.prune(main, [other])
    assert op_types(smaller) == ["scale"] and smaller.block(sub.idx).ops == []


def test_prune_through_ifelse_keeps_both_branches_and_only_the_needed_output():
    x = nf.minibatch([10, 20, 30])
    y = nf.var(1)
    z = nf.minibatch([10, 20, 30])
    cond = nf.layers.greater_than(x, 15)
    ie = nf.ifelse()
    with ie.true_block():
        d = nf.layers.add_scalar(x, y)
        ie.output(d, nf.layers.softmax(d))
    with ie.false_block():
        d = nf.layers.fc(z, size=1)
        ie.output(d, d + 1)
    o1, _ = ie(cond)
    nf.layers.scale(x, 3.0)  # needed by nobody
    main = nf.default_main_program()
    small = nf.prune(main, [o1])
    assert op_types(small) == [
        "assign_value",
        "assign_value",
        "assign_value",
        "fill_constant",
        "greater_than",
        "ifelse",
    ]
    # The second output (softmax / d + 1) is needed by nobody: dropped with what makes it.
    (ifelse,) = [op for op in small.global_block().ops if op.type == "ifelse"]
    assert ifelse.output("Out") == [o1.name]
    assert len(ifelse.attr("true_outs")) == len(ifelse.attr("false_outs")) == 1
    assert op_types(small, 1) == ["elementwise_add"]
    assert op_types(small, 2) == ["mul", "elementwise_add"]
    assert op_types(main, 1) == ["elementwise_add", "softmax"]  # the original is unchanged
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    (want,) = exe.run(main, fetch_list=[o1], scope=scope)
    (got,) = exe.run(small, fetch_list=[o1], scope=scope)
    np.testing.assert_array_equal(got, want)


def test_eval_prunes_once_per_program_and_targets(monkeypatch):
    """seed 002 Eval = Prune + Run, the pruned program cached per (program, targets): repeated
    evals prune once; other targets or an edited program prune again."""
    prune_module = sys.modules[prune_cached.__module__]  # the package's `prune` is the function
    x, _, pred, loss = build_regression()
    main = nf.default_main_program()
    calls = []
    real = prune_module.prune
    monkeypatch.setattr(prune_module, "prune", lambda p, t: calls.append(list(t)) or real(p, t))
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    feed = {"x": np.ones((2, 4), "float32")}
    first = [exe.eval(main, [pred], feed=feed, scope=scope)[0] for _ in range(3)]
    assert calls == [[pred.name]]
    for value in first[1:]:
        np.testing.assert_array_equal(value, first[0])
    exe.eval(main, [pred.name], feed=feed, scope=scope)  # same target by name: cached
    assert len(calls) == 1
    exe.eval(main, [loss], feed=dict(feed, y=np.ones((2, 1), "float32")), scope=scope)
    assert calls[-1] == [loss.name]
    with nf.program_guard(main):
        nf.layers.relu(pred)
    exe.eval(main, [pred], feed=feed, scope=scope)
    assert calls == [[pred.name], [loss.name], [pred.name]]


def test_prune_drops_unneeded_rnn_and_block_op_outputs_with_their_step_ops(rng):
    x = nf.data("x", [-1, 4, 3], "float64")
    rnn = nf.rnn(hoist=False)
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(shape=[2], batch_ref=x, dtype="float64")
        new = nf.layers.tanh(nf.layers.fc(xt, 2, name="in") + rnn.previous_memory(h))
        rnn.update_memory(h, new)
        rnn.output(new, nf.layers.sigmoid(xt))  # the second output: needed by nobody
    kept, _ = rnn()
    blk = nf.BlockOp()
    with blk.block():
        blk.output(nf.layers.scale(kept, 2.0), nf.layers.sigmoid(kept))
    doubled, _ = blk()
    main = nf.default_main_program()
    small = nf.prune(main, [doubled])
    recurrent = next(op for op in small.global_block().ops if op.type == "recurrent")
    block_op = next(op for op in small.global_block().ops if op.type == "block")
    assert recurrent.output("Outputs") == [kept.name] and len(recurrent.attr("step_outputs")) == 1
    assert "sigmoid" in op_types(main, recurrent.attr("sub_block").idx)
    assert "sigmoid" not in op_types(small, recurrent.attr("sub_block").idx)
    assert block_op.output("Out") == [doubled.name]
    assert op_types(small, block_op.attr("sub_block").idx) == ["scale"]
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    feed = {"x": rng.normal(size=(2, 4, 3))}
    (want,) = exe.run(main, feed=feed, fetch_list=[doubled], scope=scope)
    (got,) = exe.run(small, feed=feed, fetch_list=[doubled], scope=scope)
    np.testing.assert_array_equal(got, want)
