"""RecurrentNet (seed 003, "Compatibility with RNN"): a step net over one scope per time step,
state variables copied from step scope t to step scope t+1, outlinks stacked into the outer
scope."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.framework import framework_pb2 as pb

# x: batch of 2 sequences, 3 steps, 1 feature. Step net: h = 0.5 * h_pre + x.
X = np.array([[[1.0], [2.0], [3.0]], [[4.0], [0.0], [2.0]]], dtype="float32")
H0 = np.array([[2.0], [0.0]], dtype="float32")
# By hand: row 0: 0.5*2+1 = 2, 0.5*2+2 = 3, 0.5*3+3 = 4.5; row 1: 0+4 = 4, 2+0 = 2, 1+2 = 3.
EXPECTED_H = np.array([[2.0, 3.0, 4.5], [4.0, 2.0, 3.0]], dtype="float32")[..., None]


def _decay_net() -> nf.RecurrentNet:
    net = nf.RecurrentNet(
        inlinks=["x"], outlinks=["h"], states=["h"], pre_states=["h_pre"], boot_states=["h0"]
    )
    net.add_var("x", [-1, 1])
    net.add_var("h_pre", [-1, 1])
    net.add_op("scale", inputs={"X": ["h_pre"]}, outputs={"Out": ["hs"]}, attrs={"scale": 0.5})
    net.add_op("elementwise_add", inputs={"X": ["hs"], "Y": ["x"]}, outputs={"Out": ["h"]})
    return net


def _scope() -> nf.Scope:
    scope = nf.Scope()
    scope.var("x").get_mutable(nf.Tensor).set(X)
    scope.var("h0").get_mutable(nf.Tensor).set(H0)
    return scope


def _array(scope: nf.Scope, name: str, local: bool = False) -> np.ndarray:
    var = scope.find_local_var(name) if local else scope.find_var(name)
    return var.get(nf.Tensor).numpy()


def test_net_create_with_recurrent_model_type_returns_a_recurrent_net():
    desc = _decay_net().to_desc()
    assert desc.model_type == pb.NetDesc.RECURRENT
    net = nf.Net.create(pb.NetDesc.FromString(desc.SerializeToString()))
    assert isinstance(net, nf.RecurrentNet)
    assert isinstance(net, nf.Net)
    assert (net.inlinks, net.outlinks, net.states) == (["x"], ["h"], ["h"])
    assert (net.pre_states, net.boot_states) == (["h_pre"], ["h0"])
    assert [op.type for op in net.step_net.ops] == ["scale", "elementwise_add"]


def test_run_matches_the_hand_computed_recurrence():
    net = nf.Net.create(_decay_net().to_desc())
    scope = _scope()
    net.run(scope)
    np.testing.assert_allclose(_array(scope, "h", local=True), EXPECTED_H)


def test_one_step_scope_per_time_step_with_state_copied_forward():
    net = _decay_net()
    scope = _scope()
    net.run(scope)
    assert len(net.step_scopes) == 3
    assert scope.kids == net.step_scopes
    np.testing.assert_allclose(_array(net.step_scopes[0], "h_pre", local=True), H0)
    for t in range(1, 3):
        previous = _array(net.step_scopes[t - 1], "h", local=True)
        np.testing.assert_allclose(_array(net.step_scopes[t], "h_pre", local=True), previous)
        # Each step scope holds its own time slice of the inlink, shadowing the sequence.
        np.testing.assert_allclose(_array(net.step_scopes[t], "x", local=True), X[:, t])


def test_step_writes_stay_in_the_step_scopes_and_rerun_replaces_them():
    net = _decay_net()
    scope = _scope()
    net.run(scope)
    first = list(net.step_scopes)
    assert scope.find_local_var("hs") is None
    net.run(scope)
    assert all(not s.alive for s in first)
    assert len(scope.kids) == 3
    np.testing.assert_allclose(_array(scope, "h", local=True), EXPECTED_H)
    net.drop_step_scopes()
    assert scope.kids == []


def test_step_net_reads_outer_parameters_through_the_parent_scope():
    net = nf.RecurrentNet(
        inlinks=["x"], outlinks=["y"], states=["y"], pre_states=["y_pre"], boot_states=["y0"]
    )
    net.add_var("x", [-1, 1])
    net.add_var("y_pre", [-1, 1])
    net.add_var("w", [1], persistable=True)
    net.add_op("elementwise_mul", inputs={"X": ["x"], "Y": ["w"]}, outputs={"Out": ["xw"]})
    net.add_op("elementwise_add", inputs={"X": ["xw"], "Y": ["y_pre"]}, outputs={"Out": ["y"]})
    scope = _scope()
    scope.var("w").get_mutable(nf.Tensor).set(np.array([3.0], dtype="float32"))
    scope.var("y0").get_mutable(nf.Tensor).set(np.zeros((2, 1), dtype="float32"))
    net.run(scope)
    # y_t = sum of 3 * x_s for s <= t (a running sum).
    np.testing.assert_allclose(_array(scope, "y", local=True), np.cumsum(3 * X, axis=1))


def test_infer_shape_uses_one_time_slice():
    net = _decay_net()
    scope = _scope()
    shapes = net.infer_shape(scope)
    assert shapes["x"] == (2, 1)
    assert shapes["h"] == (2, 1)
    assert scope.kids == []


def test_errors_are_clear():
    net = _decay_net()
    scope = nf.Scope()
    with pytest.raises(nf.errors.UninitializedError, match="inlink 'x'"):
        net.run(scope)
    scope.var("x").get_mutable(nf.Tensor).set(X)
    with pytest.raises(nf.errors.UninitializedError, match="boot state 'h0'"):
        net.run(scope)
    with pytest.raises(nf.errors.NestflowError, match="forward only"):
        net.add_backward_ops("h")
    with pytest.raises(nf.errors.NestflowError, match="pair up"):
        nf.RecurrentNet(states=["h"], pre_states=[], boot_states=[])
