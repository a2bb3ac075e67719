"""Net / PlainNet / NetBuilder (seed 003): ops run directly in a scope."""

import gc
import sys

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.scope import live_scope_count
from nestflow.framework import framework_pb2 as pb


def put(scope, name, array):
    scope.var(name).get_mutable(nf.Tensor).set(np.asarray(array))


def get(scope, name):
    return scope.find_var(name).get(nf.Tensor).numpy()


def scale_mul_net():
    net = nf.Net.create()
    assert (
        net.add_op("scale", inputs={"X": ["a"]}, outputs={"Out": ["b"]}, attrs={"scale": 2.0}) == 0
    )
    assert net.add_op("mul", inputs={"X": ["b"], "Y": ["w"]}, outputs={"Out": ["c"]}) == 1
    return net


def test_create_gives_a_plain_net_for_no_desc_and_for_plain():
    assert isinstance(nf.Net.create(), nf.PlainNet)
    assert isinstance(nf.Net.create(pb.NetDesc(model_type=pb.NetDesc.PLAIN)), nf.PlainNet)


def test_create_recurrent_without_its_module_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "nestflow.executor.recurrent_net", None)
    with pytest.raises(nf.errors.NestflowError, match="RECURRENT needs"):
        nf.Net.create(pb.NetDesc(model_type=pb.NetDesc.RECURRENT))


def test_run_writes_every_result_into_the_scope():
    net = scale_mul_net()
    scope = nf.Scope()
    put(scope, "a", np.ones((2, 3), "float32"))
    put(scope, "w", np.arange(12, dtype="float32").reshape(3, 4))
    net.run(scope)
    np.testing.assert_array_equal(get(scope, "b"), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(get(scope, "c"), 2.0 * np.ones((2, 3)) @ get(scope, "w"))


def test_run_begin_end_runs_a_range_of_ops():
    net = scale_mul_net()
    scope = nf.Scope()
    put(scope, "a", np.ones((1, 3), "float32"))
    put(scope, "w", np.ones((3, 2), "float32"))
    net.run(scope, begin=0, end=1)
    assert scope.find_var("b") is not None and scope.find_var("c") is None
    put(scope, "b", np.full((1, 3), 5.0, "float32"))
    net.run(scope, begin=1)
    np.testing.assert_array_equal(get(scope, "c"), [[15.0, 15.0]])


def test_run_in_a_kid_scope_reads_parents_and_keeps_new_vars_local():
    # The RNN pattern of seed 003: one step net, run in one scope per step.
    net = scale_mul_net()
    outer = nf.Scope()
    put(outer, "w", np.eye(3, dtype="float32"))
    steps = [outer.new_scope() for _ in range(2)]
    for i, step in enumerate(steps):
        put(step, "a", np.full((1, 3), i + 1, "float32"))
        net.run(step)
    assert outer.find_local_var("c") is None
    np.testing.assert_array_equal(get(steps[0], "c"), [[2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(get(steps[1], "c"), [[4.0, 4.0, 4.0]])


def test_run_in_a_kid_scope_writes_a_parents_variable_where_it_lives():
    net = scale_mul_net()
    outer = nf.Scope()
    put(outer, "w", np.eye(3, dtype="float32"))
    put(outer, "b", np.zeros((1, 3), "float32"))
    kid = outer.new_scope()
    put(kid, "a", np.ones((1, 3), "float32"))
    net.run(kid)
    assert kid.find_local_var("b") is None and kid.find_local_var("c") is not None
    np.testing.assert_array_equal(get(outer, "b"), [[2.0, 2.0, 2.0]])


def test_missing_input_names_the_variable_and_its_reader():
    net = scale_mul_net()
    scope = nf.Scope()
    put(scope, "a", np.ones((1, 3), "float32"))
    with pytest.raises(
        nf.errors.UninitializedError, match="'w' is not in the scope.*'mul' \\(#1\\)"
    ):
        net.run(scope)


def test_failed_run_stores_nothing():
    net = scale_mul_net()
    scope = nf.Scope()
    put(scope, "a", np.ones((2, 3), "float32"))
    put(scope, "w", np.ones((4, 4), "float32"))  # does not fit b [2, 3]
    with pytest.raises(nf.errors.ExecutionError, match="mul"):
        net.run(scope)
    assert scope.find_var("b") is None


def test_infer_shape_uses_the_scope_tensors():
    net = scale_mul_net()
    scope = nf.Scope()
    put(scope, "a", np.ones((5, 3), "float32"))
    put(scope, "w", np.ones((3, 7), "float32"))
    shapes = net.infer_shape(scope)
    assert shapes["b"] == (5, 3) and shapes["c"] == (5, 7)
    assert scope.find_var("c") is not None  # created, filled by run


def test_infer_shape_mismatch_is_a_shape_error_naming_the_op():
    net = scale_mul_net()
    scope = nf.Scope()
    put(scope, "a", np.ones((5, 3), "float32"))
    put(scope, "w", np.ones((4, 7), "float32"))
    with pytest.raises(nf.errors.ShapeError) as info:
        net.infer_shape(scope)
    assert "mul" in str(info.value) and "test_net.py" in str(info.value)


def test_declared_inputs_are_checked_when_the_op_is_added():
    net = nf.Net.create()
    net.add_var("x", [2, 3])
    net.add_var("w", [4, 5])
    with pytest.raises(nf.errors.ShapeError):
        net.add_op("mul", inputs={"X": ["x"], "Y": ["w"]}, outputs={"Out": ["y"]})
    assert len(net) == 0
    net.add_var("v", [3, 5])
    net.add_op("mul", inputs={"X": ["x"], "Y": ["v"]}, outputs={"Out": ["y"]})
    assert net.block.var("y").shape == (2, 5)


def test_unknown_op_type_is_rejected():
    net = nf.Net.create()
    with pytest.raises(nf.errors.UnknownOpError):
        net.add_op("no_such_op", inputs={"X": ["a"]}, outputs={"Out": ["b"]})
    assert len(net) == 0


def test_add_op_accepts_an_op_desc_protobuf_and_desc_round_trips():
    net = scale_mul_net()
    desc = net.desc
    assert isinstance(desc, pb.NetDesc) and [op.type for op in desc.ops] == ["scale", "mul"]
    again = nf.Net.create(pb.NetDesc.FromString(desc.SerializeToString()))
    other = nf.Net.create()
    for op in desc.ops:
        other.add_op(op)
    for copy in (again, other):
        scope = nf.Scope()
        put(scope, "a", np.ones((1, 3), "float32"))
        put(scope, "w", np.ones((3, 2), "float32"))
        copy.run(scope)
        np.testing.assert_array_equal(get(scope, "c"), [[6.0, 6.0]])
    assert again.ops[0].attr("scale") == 2.0


def linear_regression(builder):
    x = builder.data("x", [-1, 3])
    y = builder.data("y", [-1, 1])
    pred = builder.add_op("fc", input=x, size=1, name="lin")
    diff = builder.add_op("elementwise_sub", pred, y)
    loss = builder.add_op("mean", builder.add_op("elementwise_mul", diff, diff))
    return x, y, pred, loss


def regression_data(n=16):
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((n, 3)).astype("float32")
    ys = (xs @ np.array([[1.5], [-2.0], [0.5]]) + 0.3).astype("float32")
    return xs, ys


def test_add_backward_ops_leaves_gradients_in_the_scope():
    builder = nf.NetBuilder(nf.Net.create())
    _, _, pred, loss = linear_regression(builder)
    net = builder.net
    params_grads = net.add_backward_ops(loss)
    assert sorted(p.name for p, _ in params_grads) == ["lin.b", "lin.w"]
    scope = nf.Scope()
    xs, ys = regression_data()
    put(scope, "x", xs)
    put(scope, "y", ys)
    net.run(scope)  # initialises lin.w/lin.b first, then forward + backward
    residual = get(scope, pred.name) - ys
    w_grad = dict((p.name, g.name) for p, g in params_grads)["lin.w"]
    np.testing.assert_allclose(get(scope, w_grad), 2 * xs.T @ residual / len(xs), rtol=1e-5)
    np.testing.assert_allclose(get(scope, "lin.w@GRAD"), get(scope, w_grad))


def test_initialisation_runs_once_per_scope_and_keeps_what_the_scope_holds():
    builder = nf.NetBuilder(nf.Net.create())
    linear_regression(builder)
    xs, ys = regression_data()
    scope = nf.Scope()
    put(scope, "lin.w", np.ones((3, 1), "float32"))
    builder.run(scope, need_backward=False, feed={"x": xs, "y": ys})
    np.testing.assert_array_equal(get(scope, "lin.w"), np.ones((3, 1)))
    np.testing.assert_array_equal(get(scope, "lin.b"), np.zeros(1))  # from the startup ops


def test_forward_only_run_stops_after_the_last_forward_op():
    builder = nf.NetBuilder(nf.Net.create())
    _, _, pred, loss = linear_regression(builder)
    builder.backward_from(loss)
    builder.add_optimization(0.1, "sgd")
    xs, ys = regression_data()
    scope = nf.Scope()
    builder.run(scope, feed={"x": xs, "y": ys})  # builds backward + sgd, one step
    forward_ops = builder.last_forward_op
    assert len(builder.net) > forward_ops and builder.net.ops[-1].type == "sgd"
    w = get(scope, "lin.w")
    builder.run(scope, need_backward=False, feed={"x": xs, "y": ys})
    np.testing.assert_array_equal(get(scope, "lin.w"), w)  # no update
    np.testing.assert_allclose(get(scope, pred.name), xs @ w + get(scope, "lin.b"), rtol=1e-6)


def test_net_builder_training_lowers_the_loss():
    builder = nf.NetBuilder(nf.Net.create())
    _, _, _, loss = linear_regression(builder)
    builder.backward_from(loss)
    builder.add_optimization(0.05, "adam")
    xs, ys = regression_data(32)
    scope = nf.Scope()
    builder.run(scope, need_backward=False, feed={"x": xs, "y": ys})
    first = float(get(scope, loss.name))
    for _ in range(200):
        builder.run(scope, feed={"x": xs, "y": ys})
    builder.run(scope, need_backward=False)
    last = float(get(scope, loss.name))
    assert last < first * 0.01
    np.testing.assert_allclose(get(scope, "lin.w").ravel(), [1.5, -2.0, 0.5], atol=0.05)


def test_seed_003_usage_plain_net_with_backward_and_optimizer_ops():
    # Seed 003: create a net, add ops, AddBackwardOps, AddOptimizerOps, Run(scope).
    net = nf.Net.create()
    with net.building():
        image = nf.data("image", shape=[-1, 4])
        label = nf.data("label", shape=[-1, 1], dtype="int64")
        hidden = nf.layers.fc(image, size=8, act="sigmoid")
        prediction = nf.layers.fc(hidden, size=3, act="softmax")
        avg_loss = nf.layers.mean(nf.layers.cross_entropy(prediction, label))
    net.add_backward_ops(avg_loss)
    net.add_optimizer_ops({"type": "momentum", "learning_rate": 0.5, "momentum": 0.9})
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((30, 4)).astype("float32")
    labels = (xs[:, :1] > 0).astype("int64") + (xs[:, 1:2] > 0.5).astype("int64")
    scope = nf.Scope()
    put(scope, "image", xs)
    put(scope, "label", labels)
    losses = []
    for _ in range(60):
        net.run(scope)
        losses.append(float(get(scope, avg_loss.name)))
    assert losses[-1] < 0.5 * losses[0]


def test_create_recurrent_gives_a_recurrent_net():
    from nestflow.executor.recurrent_net import RecurrentNet

    net = nf.Net.create(pb.NetDesc(model_type=pb.NetDesc.RECURRENT))
    assert isinstance(net, RecurrentNet) and isinstance(net, nf.Net)


def ifelse_net():
    """A net whose forward ops include an ifelse (step scopes), plus its backward ops."""
    net = nf.Net.create()
    with net.building():
        x = nf.data("x", shape=[-1, 2], dtype="float64")
        x.stop_gradient = False
        cond = nf.layers.greater_than(nf.layers.reduce_sum(x, dim=[1], keep_dim=True), 0.0)
        ie = nf.ifelse()
        with ie.true_block():
            ie.output(nf.layers.scale(x, scale=2.0))
        with ie.false_block():
            ie.output(nf.layers.tanh(x))
        (out,) = ie(cond)
        loss = nf.layers.mean(out)
    net.add_backward_ops(loss)
    return net, x


def ifelse_grad(xs):
    """d mean(ifelse(sum(x) > 0, 2x, tanh x)) / dx."""
    rows = xs.sum(axis=1, keepdims=True) > 0
    return np.where(rows, 2.0, 1.0 - np.tanh(xs) ** 2) / xs.size


def live_scopes():
    gc.collect()  # scopes other tests left in reference cycles
    return live_scope_count()


def test_sub_block_scopes_do_not_pile_up_in_the_callers_scope():
    net, x = ifelse_net()
    scope = nf.Scope()
    xs = np.array([[1.0, 2.0], [-1.0, -3.0], [0.5, -0.25]])
    put(scope, "x", xs)
    net.run(scope)
    live = live_scopes()
    for _ in range(5):
        net.run(scope)
    assert scope.kids == []
    assert live_scopes() == live
    np.testing.assert_allclose(get(scope, x.name + "@GRAD"), ifelse_grad(xs))


def test_while_step_scopes_do_not_pile_up_in_the_callers_scope():
    net = nf.Net.create()
    with net.building():
        i = nf.layers.fill_constant([1], "int64", 0)
        n = nf.layers.fill_constant([1], "int64", 3)
        cond = nf.layers.less_than(i, n)
        loop = nf.While(cond)
        with loop.block():
            nf.layers.increment(i)
            nf.layers.less_than(i, n, out=cond)
    scope = nf.Scope()
    net.run(scope)
    live = live_scopes()
    for _ in range(3):
        net.run(scope)
    assert scope.kids == [] and live_scopes() == live
    np.testing.assert_array_equal(get(scope, i.name), [3])


def test_split_forward_and_backward_runs_keep_only_the_newest_step_scopes():
    net, x = ifelse_net()
    forward = next(i for i, op in enumerate(net.ops) if op.type == "mean") + 1
    scope = nf.Scope()
    xs = np.array([[1.0, 2.0], [-1.0, -3.0]])
    put(scope, "x", xs)
    counts = []
    for _ in range(4):
        net.run(scope, end=forward)  # the ifelse's gradient op, run next, reads its scopes
        net.run(scope, begin=forward)
        counts.append((live_scopes(), len(scope.kids)))
    assert counts[1:] == counts[:-1] and counts[0][1] == 1
    np.testing.assert_allclose(get(scope, x.name + "@GRAD"), ifelse_grad(xs))
    net.run(scope, end=forward)  # forward-only runs do not pile up either
    net.run(scope, end=forward)
    assert (live_scopes(), len(scope.kids)) == counts[-1]
    net.run(scope)  # a whole run writes the scopes again: the kept local is dropped
    assert scope.kids == []


def _net_with_backward():
    net = nf.Net.create()
    with net.building():
        x = nf.data("x", shape=[-1, 3])
        loss = nf.layers.mean(nf.layers.fc(x, size=2, name="fc"))
    net.add_backward_ops(loss)
    return net


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"type": "ftrl", "learning_rate": 0.1}, "unknown optimizer type 'ftrl'"),
        ({"type": "adam", "learning_rate": 0.1, "betas": 0.9}, "no option ['betas']"),
        ({"type": "sgd"}, "needs a 'learning_rate'"),
        ({"type": "sgd", "learning_rate": "fast"}, "learning_rate must be a number"),
    ],
)
def test_add_optimizer_ops_rejects_bad_options_naming_them(attrs, message):
    net = _net_with_backward()
    ops_before = len(net.program.global_block().ops)
    with pytest.raises(nf.errors.AttrError, match=message.replace("[", r"\[")):
        net.add_optimizer_ops(attrs)
    assert len(net.program.global_block().ops) == ops_before  # nothing half-appended


def test_add_optimizer_ops_builds_the_same_update_as_the_frontend():
    """Net.add_optimizer_ops and nf.optimizer.Adam share one builder: same op, same attrs."""
    net = _net_with_backward()
    net.add_optimizer_ops({"type": "adam", "learning_rate": np.float32(0.01), "beta2": 0.99})
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", shape=[-1, 3])
        loss = nf.layers.mean(nf.layers.fc(x, size=2, name="fc"))
        nf.optimizer.Adam(learning_rate=0.01, beta2=0.99).minimize(loss)
    for program in (net.program, main):
        adams = [op for op in program.global_block().ops if op.type == "adam"]
        assert len(adams) == 2  # fc.w and fc.b
        role = {"op_role": 2}  # OpRole.OPTIMIZE: clone(for_test=True) drops it
        want = {"beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8, "lazy_mode": False, **role}
        assert dict(adams[0].attrs) == want


def test_net_builder_bad_feed_names_its_reader_and_stores_nothing():
    builder = nf.NetBuilder(nf.Net.create())
    linear_regression(builder)
    xs, ys = regression_data()
    scope = nf.Scope()
    with pytest.raises(nf.errors.FeedError, match="'y' has shape .*read by op") as info:
        builder.run(scope, need_backward=False, feed={"x": xs, "y": ys[:, :0]})
    assert "built at" in str(info.value) and "test_net.py" in str(info.value)
    assert scope.find_var("x") is None  # the good feed before it was not stored either
