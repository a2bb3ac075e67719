"""Net / PlainNet / NetBuilder (seed 003): ops run directly in a scope."""

import sys

import numpy as np
import pytest

import nestflow as nf
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
