"""While (seed 002's WhileOp): one kept step scope per iteration, SSA loop variables, arrays."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import ControlFlowError, MaxStepsExceededError
from tests.gradcheck import assert_gradients_match

L = nf.layers


def _run(fetch, feed=None, scope=None):
    scope = scope if scope is not None else nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return exe.run(feed=feed or {}, fetch_list=fetch, scope=scope), scope


def _counter(limit: int):
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", limit)
    return i, n, L.less_than(i, n)


def _tanh_loop(steps: int, max_steps=None):
    """x_{t+1} = tanh(x_t @ w) for `steps` steps, each x_{t+1} also written to an array."""
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    w = L.create_parameter([2, 2], "float64", name="w", initializer=nf.initializer.Uniform(-1, 1))
    i, n, cond = _counter(steps)
    array = L.create_array("float64")
    loop = nf.While(cond, max_steps=max_steps)
    with loop.block():
        h = L.tanh(L.matmul(x, w))
        L.assign(h, output=x)  # x is read and written by the body
        L.array_write(h, i, array)
        L.increment(i)
        L.less_than(i, n, out=cond)
    return x, w, i, array, h


def _numpy_tanh_loop(x, w, steps):
    values = []
    for _ in range(steps):
        x = np.tanh(x @ w)
        values.append(x)
    return x, values


@pytest.mark.parametrize("steps", [0, 1, 4])
def test_loop_variable_read_and_written_by_the_body(steps, rng):
    x, w, i, array, h = _tanh_loop(steps)
    stacked = L.array_to_tensor(array) if steps else None
    length = L.array_length(array)
    x0 = rng.normal(size=(3, 2))
    fetch = [x, i, length] + ([stacked] if steps else [])
    got, scope = _run(fetch, {"x": x0})
    w_value = scope.find_var("w").get(nf.Tensor).numpy()
    final, values = _numpy_tanh_loop(x0, w_value, steps)
    np.testing.assert_allclose(got[0], final, rtol=1e-12)
    assert got[1].tolist() == [steps] and got[2].tolist() == [steps]
    if steps:
        np.testing.assert_allclose(got[3], np.stack(values), rtol=1e-12)
    assert scope.kids == []


def test_array_read_inside_and_after_the_loop():
    i, n, cond = _counter(3)
    squares = L.create_array("int64")
    loop = nf.While(cond)
    with loop.block():
        L.array_write(L.elementwise_mul(i, i), i, squares)
        L.increment(i)
        L.less_than(i, n, out=cond)
    last = L.array_read(squares, L.fill_constant([1], "int64", 2))
    (got,), _ = _run([last])
    assert got.tolist() == [4]


def test_a_variable_made_in_the_body_can_be_fetched_after_the_run(rng):
    x, w, i, array, h = _tanh_loop(3)
    x0 = rng.normal(size=(2, 2))
    (got_h, got_x), scope = _run([h, x], {"x": x0})
    np.testing.assert_array_equal(got_h, got_x)  # the last iteration's value
    assert scope.kids == []


def test_max_steps_guard_raises_cleanly_and_keeps_the_scope_unchanged(rng):
    x, w, i, array, h = _tanh_loop(50, max_steps=5)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    before = scope.find_var("w").get(nf.Tensor).numpy().copy()
    with pytest.raises(MaxStepsExceededError, match="max_steps=5"):
        exe.run(feed={"x": rng.normal(size=(2, 2))}, fetch_list=[x], scope=scope)
    np.testing.assert_array_equal(scope.find_var("w").get(nf.Tensor).numpy(), before)
    assert scope.kids == []


def test_max_steps_allows_a_loop_that_stops_in_time(rng):
    x, w, i, array, h = _tanh_loop(5, max_steps=5)
    (got,), _ = _run([i], {"x": rng.normal(size=(2, 2))})
    assert got.tolist() == [5]


def test_a_body_that_never_updates_the_condition_needs_max_steps():
    i, n, cond = _counter(3)
    loop = nf.While(cond)
    with pytest.raises(ControlFlowError, match="never writes the condition"):
        with loop.block():
            L.increment(i)


def test_a_body_that_never_updates_the_condition_stops_at_max_steps():
    i, n, cond = _counter(3)
    loop = nf.While(cond, max_steps=7)
    with loop.block():
        L.increment(i)
    with pytest.raises(MaxStepsExceededError):
        _run([i])


def test_condition_must_be_bool():
    i, n, _ = _counter(3)
    with pytest.raises(ControlFlowError, match="must be bool"):
        nf.While(i)


def test_condition_must_be_one_value():
    c = L.data("c", [-1, 1], "bool")
    with pytest.raises(ControlFlowError, match=r"shape \[1\]"):
        nf.While(c)


def test_array_read_of_an_unwritten_element_is_a_clear_error():
    array = L.create_array("float32")
    out = L.array_read(array, L.fill_constant([1], "int64", 0))
    with pytest.raises(ControlFlowError, match="never written"):
        _run([out])


def test_while_program_round_trips_through_protobuf(rng):
    x, w, i, array, h = _tanh_loop(3)
    x0 = rng.normal(size=(2, 2))
    (a,), scope = _run([x], {"x": x0})
    loaded = nf.Program.from_bytes(nf.default_main_program().to_bytes())
    (b,) = nf.Executor().run(loaded, feed={"x": x0}, fetch_list=["x"], scope=scope)
    np.testing.assert_array_equal(a, b)


def _numeric_check(loss, feed, params, inputs, scope):
    """Analytic gradients (fetched as `name@GRAD`) against central differences of the loss."""
    assert_gradients_match(nf.Executor(), None, scope, feed, loss, params + inputs)


@pytest.mark.parametrize("loss_reads_x", [True, False])
@pytest.mark.parametrize("steps", [0, 1, 4])
def test_gradients_through_a_loop_variable_match_central_differences(steps, loss_reads_x, rng):
    """x_{t+1} = tanh(x_t @ w) + v, and acc += mean(x_{t+1}): d loss / d w, v, x0 (float64).
    Without loss_reads_x no gradient arrives for the final x, only through acc."""
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    w = L.create_parameter([2, 2], "float64", name="w", initializer=nf.initializer.Uniform(-1, 1))
    v = L.create_parameter([2], "float64", name="v", initializer=nf.initializer.Uniform(-1, 1))
    i, n, cond = _counter(steps)
    acc = L.fill_constant([1], "float64", 0.0)
    acc.stop_gradient = False
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.elementwise_add(L.tanh(L.matmul(x, w)), v), output=x)
        L.assign(L.elementwise_add(acc, L.mean(x)), output=acc)
        L.increment(i)
        L.less_than(i, n, out=cond)
    loss = L.mean(L.elementwise_add(L.mean(x), acc)) if loss_reads_x else L.mean(acc)
    nf.append_backward(loss)
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    _numeric_check(loss, {"x": rng.normal(size=(3, 2))}, ["w", "v"], ["x"], scope)
    assert scope.kids == []


def test_gradients_through_an_ifelse_inside_the_loop(rng):
    """Nested control flow: each step routes rows through an IfElse on the current x."""
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    w = L.create_parameter([2, 2], "float64", name="w", initializer=nf.initializer.Uniform(-1, 1))
    v = L.create_parameter([2], "float64", name="v", initializer=nf.initializer.Uniform(-1, 1))
    i, n, cond = _counter(3)
    loop = nf.While(cond)
    with loop.block():
        row_sum = L.matmul(x, L.fill_constant([2, 1], "float64", 1.0))
        ie = nf.ifelse(L.greater_than(row_sum, 0.0))
        with ie.true_block():
            ie.output(L.tanh(L.matmul(x, w)))
        with ie.false_block():
            ie.output(L.elementwise_mul(x, v))
        (new_x,) = ie()
        L.assign(new_x, output=x)
        L.increment(i)
        L.less_than(i, n, out=cond)
    loss = L.mean(x)
    nf.append_backward(loss)
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    _numeric_check(loss, {"x": rng.normal(size=(5, 2))}, ["w", "v"], ["x"], scope)
    assert scope.kids == []


def test_gradients_through_a_tensor_array_match_central_differences(rng):
    """Each step writes h_t = tanh(x_t @ w) to an array; the loss reads the stacked array and
    one element read back, so gradients flow out of the array into every step."""
    x, w, i, array, h = _tanh_loop(3)
    stacked = L.array_to_tensor(array)
    second = L.array_read(array, L.fill_constant([1], "int64", 1))
    loss = L.elementwise_add(L.mean(L.tanh(stacked)), L.mean(second))
    nf.append_backward(loss)
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    _numeric_check(loss, {"x": rng.normal(size=(2, 2))}, ["w"], ["x"], scope)
    assert scope.kids == []


def test_a_weights_product_gradient_is_summed_after_the_loop(rng):
    """x_{t+1} = tanh(x_t @ w): while_grad multiplies all steps' x_t and dOut once for w's
    gradient (nestflow/ops/step_products.py); values still match central differences."""
    x = L.data("x", [-1, 3], "float64")  # stop_gradient, as data is: its new values are not
    w = L.create_parameter([3, 3], "float64", name="w", initializer=nf.initializer.Uniform(-1, 1))
    i, n, cond = _counter(3)
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.tanh(L.matmul(x, w)), output=x)
        L.increment(i)
        L.less_than(i, n, out=cond)
    loss = L.reduce_sum(L.square(x))
    nf.append_backward(loss)
    (grad_op,) = [
        op for op in nf.default_main_program().global_block().ops if op.type == "while_grad"
    ]
    by_grad = dict(zip(grad_op.attr("x_grads"), grad_op.input("X")))
    assert [by_grad[g] for g in grad_op.attr("deferred_grads")] == ["w"]
    assert grad_op.attr("deferred_types") == ["matmul"]
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    _numeric_check(loss, {"x": rng.normal(size=(4, 3))}, ["w"], [], scope)


def test_a_constant_initial_state_updated_through_parameters_gets_gradients(rng):
    """h starts as fill_constant (no gradient of its own); the body makes it from a parameter,
    so the loop's result needs one: the parameter's gradient matches central differences."""
    x = L.data("x", [-1, 2], "float64")
    h = L.fill_constant([3, 2], "float64", 0.0)
    u = L.create_parameter([2, 2], "float64", name="u", initializer=nf.initializer.Uniform(-1, 1))
    i, n, cond = _counter(2)
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.tanh(L.matmul(h, u) + x), output=h)
        L.increment(i)
        L.less_than(i, n, out=cond)
    loss = L.reduce_sum(L.square(h))
    params_grads = nf.append_backward(loss)
    assert [p.name for p, _ in params_grads] == ["u"]
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    _numeric_check(loss, {"x": rng.normal(size=(3, 2))}, ["u"], [], scope)
