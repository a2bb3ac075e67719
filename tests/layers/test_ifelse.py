"""IfElse (seed 002's IfElseOp): per-row branches in kid scopes, merged back in row order."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
import nestflow as pd
from nestflow.errors import ControlFlowError
from tests.gradcheck import assert_gradients_match

L = nf.layers


def _run(fetch, feed=None, scope=None):
    scope = scope if scope is not None else nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return exe.run(feed=feed or {}, fetch_list=fetch, scope=scope), scope


def _seed_program():
    x = pd.minibatch([10, 20, 30])
    y = pd.var(1)
    z = pd.minibatch([10, 20, 30])
    cond = pd.layers.greater_than(x, 15)
    ie = pd.ifelse()
    with ie.true_block():
        d = pd.layers.add_scalar(x, y)
        ie.output(d, pd.layers.softmax(d))
    with ie.false_block():
        d = pd.layers.fc(z, size=1)
        ie.output(d, d + 1)
    o1, o2 = ie(cond)
    return cond, o1, o2


def test_seed_program_matches_hand_computed_values():
    """Seed 002: rows 20 and 30 take x + y and softmax of one column (1); row 10 takes fc(z)."""
    cond, o1, o2 = _seed_program()
    (c, a, b), scope = _run([cond, o1, o2])
    w = scope.find_var("fc_0.w").get(nf.Tensor).numpy()[0, 0]
    bias = scope.find_var("fc_0.b").get(nf.Tensor).numpy()[0]
    np.testing.assert_array_equal(c.ravel(), [False, True, True])
    np.testing.assert_allclose(a.ravel(), [10 * w + bias, 21, 31], rtol=1e-6)
    np.testing.assert_allclose(b.ravel(), [10 * w + bias + 1, 1, 1], rtol=1e-6)
    assert scope.kids == []


def test_seed_program_runs_the_same_after_a_protobuf_round_trip():
    cond, o1, o2 = _seed_program()
    (a, b), scope = _run([o1, o2])
    loaded = nf.Program.from_bytes(nf.default_main_program().to_bytes())
    a2, b2 = nf.Executor().run(loaded, fetch_list=[o1.name, o2.name], scope=scope)
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)


def _doubling_program(cond_shape):
    x = L.data("x", [-1, 2], "float64")
    c = L.data("c", cond_shape, "bool")
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.scale(x, 2.0))
    with ie.false_block():
        ie.output(L.scale(ie.input(x), -1.0))
    (out,) = ie(c)
    return out


@pytest.mark.parametrize("cond_shape", [[-1, 1], [-1]])
@pytest.mark.parametrize(
    "rows", [[True, False, True], [False, False, False], [True, True, True], []]
)
def test_rows_are_merged_in_order_for_any_split(cond_shape, rows):
    """Includes branches that receive no rows, an empty batch and a 1-D [N] condition."""
    out = _doubling_program(cond_shape)
    x = np.arange(2 * len(rows), dtype=np.float64).reshape(len(rows), 2)
    mask = np.asarray(rows, dtype=bool).reshape([len(rows)] + cond_shape[1:])
    (got,), scope = _run([out], {"x": x, "c": mask})
    expected = np.where(np.asarray(rows, bool).reshape(-1, 1), 2 * x, -x)
    np.testing.assert_array_equal(got, expected.reshape(len(rows), 2))
    assert scope.kids == []


def test_a_variable_made_in_a_branch_can_be_fetched_after_the_run():
    x = L.data("x", [-1, 1], "float32")
    c = L.greater_than(x, 0.0)
    ie = nf.ifelse(c)
    with ie.true_block():
        inner = L.scale(x, 3.0)
        ie.output(inner)
    with ie.false_block():
        ie.output(L.scale(x, 0.0))
    ie()
    (got,), scope = _run([inner], {"x": np.array([[1.0], [-1.0], [2.0]], np.float32)})
    np.testing.assert_array_equal(got.ravel(), [3.0, 6.0])
    assert scope.kids == []


def test_condition_must_be_bool():
    x = L.data("x", [-1, 1], "float32")
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(x)
    with ie.false_block():
        ie.output(x)
    with pytest.raises(ControlFlowError, match="must be bool"):
        ie(x)


def test_condition_must_be_one_bool_per_row():
    c = L.data("c", [-1, 2], "bool")
    with pytest.raises(ControlFlowError, match=r"\[N, 1\] or \[N\]"):
        nf.ifelse(c)


def test_condition_of_wrong_shape_at_run_time_is_a_clear_error():
    out = _doubling_program([-1, 1])
    scope = nf.Scope()
    with pytest.raises(ControlFlowError, match="condition has 2 rows"):
        nf.Executor().run(
            feed={"x": np.zeros((3, 2)), "c": np.ones((2, 1), bool)}, fetch_list=[out], scope=scope
        )
    assert scope.kids == []


def test_branches_must_output_the_same_number_of_variables():
    x = L.data("x", [-1, 1], "float32")
    c = L.data("c", [-1, 1], "bool")
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(x, x)
    with ie.false_block():
        ie.output(x)
    with pytest.raises(ControlFlowError, match="outputs 2 variable"):
        ie(c)


def test_branch_outputs_must_have_the_same_dtype_and_row_shape():
    x = L.data("x", [-1, 2], "float32")
    c = L.data("c", [-1, 1], "bool")
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.cast(x, "float64"))
    with ie.false_block():
        ie.output(x)
    with pytest.raises(ControlFlowError, match="float64"):
        ie(c)
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.reshape(x, [-1, 1, 2]))
    with ie.false_block():
        ie.output(x)
    with pytest.raises(ControlFlowError, match="differ in shape"):
        ie(c)


def test_a_branch_may_not_write_an_outer_variable():
    x = L.data("x", [-1, 1], "float32")
    c = L.data("c", [-1, 1], "bool")
    ie = nf.ifelse()
    with ie.true_block():
        L.assign(L.scale(x, 2.0), output=x)
        ie.output(x)
    with ie.false_block():
        ie.output(x)
    with pytest.raises(ControlFlowError, match="writes outer variable"):
        ie(c)


def test_output_outside_a_branch_is_an_error():
    x = L.data("x", [-1, 1], "float32")
    ie = nf.ifelse()
    with pytest.raises(ControlFlowError, match="inside true_block"):
        ie.output(x)


def test_a_non_row_output_fails_at_run_time_with_a_clear_error():
    x = L.data("x", [-1, 1], "float32")
    c = L.data("c", [-1, 1], "bool")
    p = L.data("p", [3, 1], "float32")  # a known first dim: passed whole, not split
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.scale(x, 1.0))
    with ie.false_block():
        ie.output(p)
    (out,) = ie(c)
    feed = {
        "x": np.zeros((3, 1), np.float32),
        "p": np.zeros((3, 1), np.float32),
        "c": np.array([[True], [False], [False]]),
    }
    with pytest.raises(ControlFlowError, match="one row per row"):
        nf.Executor().run(feed=feed, fetch_list=[out], scope=nf.Scope())


def _numeric_check(loss, feed, params, inputs, scope):
    """Analytic gradients (fetched as `name@GRAD`) against central differences of the loss."""
    assert_gradients_match(nf.Executor(), None, scope, feed, loss, params + inputs)


@pytest.mark.parametrize(
    "rows",
    [[True, False, True, False], [False, False, False], [True, True, True]],
    ids=["both", "true-branch-empty", "false-branch-empty"],
)
def test_gradients_match_central_differences(rows, rng):
    """Gradients reach both branches, batch inputs by row and parameters summed (float64)."""
    x = L.data("x", [-1, 3], "float64")
    x.stop_gradient = False
    c = L.data("c", [-1, 1], "bool")
    s = L.create_parameter([1], "float64", name="s", initializer=nf.initializer.Constant(0.7))
    ie = nf.ifelse()
    with ie.true_block():
        h = L.fc(x, 2, act="tanh", name="t")
        ie.output(h, L.softmax(L.elementwise_mul(h, s)))
    with ie.false_block():
        h = L.fc(x, 2, name="f")
        ie.output(L.elementwise_mul(h, s), h)
    o1, o2 = ie(c)
    loss = L.mean(L.elementwise_add(L.tanh(o1), o2))
    nf.append_backward(loss)
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    feed = {"x": rng.normal(size=(len(rows), 3)), "c": np.array(rows, bool).reshape(-1, 1)}
    _numeric_check(loss, feed, ["t.w", "t.b", "f.w", "f.b", "s"], ["x"], scope)
    assert scope.kids == []


def test_an_empty_branch_gives_its_parameters_zero_gradients(rng):
    """A 1-D condition with no true rows: the true branch never runs, forward or backward."""
    x = L.data("x", [-1, 2], "float64")
    c = L.data("c", [-1], "bool")
    ie = nf.ifelse(c)
    with ie.true_block():
        ie.output(L.fc(x, 1, name="t"))
    with ie.false_block():
        ie.output(L.fc(x, 1, name="f"))
    (out,) = ie()
    loss = L.mean(out)
    nf.append_backward(loss)
    x_value = rng.normal(size=(3, 2))
    (t_grad, f_grad), scope = _run(["t.w@GRAD", "f.w@GRAD"], {"x": x_value, "c": np.zeros(3, bool)})
    np.testing.assert_array_equal(t_grad, np.zeros((2, 1)))
    np.testing.assert_allclose(f_grad, x_value.mean(axis=0, keepdims=True).T, rtol=1e-12)
    assert scope.kids == []
