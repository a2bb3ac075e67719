"""nf.layers.cond: a whole-batch conditional over conditional_block ops (Fluid 1.7's cond):
values and float64 central-difference gradients with either branch taken, inside While and
nf.rnn steps, nested, structured results, errors, protobuf/inference round trips and prune."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.scope import live_scope_count
from nestflow.errors import ControlFlowError, DTypeError, FeedError, ShapeError
from tests.gradcheck import assert_gradients_match

L = nf.layers


def _startup(scope=None):
    scope = scope if scope is not None else nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return exe, scope


def _param(name, shape, low=-1.0, high=1.0):
    init = nf.initializer.Uniform(low, high)
    return L.create_parameter(shape, "float64", name=name, initializer=init)


def _value(scope, name):
    return scope.find_var(name).get(nf.Tensor).numpy()


def _shared_parameter_model():
    """pred = sum(x) > 0; true: tanh(x @ w + b), false: (x * x) @ w - 1; w used by both."""
    x = L.data("x", [-1, 3], "float64")
    x.stop_gradient = False
    w, b = _param("w", [3, 2]), _param("b", [2])
    pred = L.greater_than(L.reduce_sum(x), L.fill_constant([], "float64", 0.0))
    out = L.cond(
        pred,
        lambda: L.tanh(L.elementwise_add(L.matmul(x, w), b)),
        lambda: L.scale(L.matmul(L.elementwise_mul(x, x), w), bias=-1.0),
    )
    loss = L.reduce_sum(L.square(out))
    nf.append_backward(loss)
    return x, pred, out, loss


def _shared_reference(xs, w, b):
    if xs.sum() > 0:
        return np.tanh(xs @ w + b)
    return (xs * xs) @ w - 1.0


def test_either_branch_runs_across_a_batch_of_runs(rng):
    x, pred, out, _ = _shared_parameter_model()
    exe, scope = _startup()
    w, b = _value(scope, "w"), _value(scope, "b")
    taken = set()
    before = live_scope_count()
    for _ in range(12):
        xs = rng.normal(size=(int(rng.integers(1, 5)), 3))
        got, p = exe.run(feed={"x": xs}, fetch_list=[out, pred], scope=scope)
        taken.add(bool(p))
        assert bool(p) == (xs.sum() > 0)
        np.testing.assert_allclose(got, _shared_reference(xs, w, b), rtol=1e-12)
    assert taken == {True, False}
    assert live_scope_count() == before and scope.kids == []


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_branch", "false_branch"])
def test_gradients_to_parameters_used_by_both_branches(sign, rng):
    x, pred, _, loss = _shared_parameter_model()
    exe, scope = _startup()
    xs = np.abs(rng.normal(size=(4, 3))) * sign
    (p,) = exe.run(feed={"x": xs}, fetch_list=[pred], scope=scope)
    assert bool(p) == (sign > 0)
    grads = assert_gradients_match(exe, None, scope, {"x": xs}, loss, ["w", "b", "x"])
    # b is used by the true branch only: the false branch gives it zeros
    assert (np.abs(grads[1]).sum() > 0) == (sign > 0)


def test_the_untaken_branch_does_not_run(rng):
    """A branch whose ops would fail at run time (a gather past the rows) is never run."""
    x = L.data("x", [-1, 2], "float64")
    flag = L.data("flag", [1], "bool")
    bad = L.fill_constant([1], "int64", 99)
    out = L.cond(flag, lambda: L.gather(x, bad), lambda: x + 1.0)
    exe, scope = _startup()
    xs = rng.normal(size=(3, 2))
    (got,) = exe.run(feed={"x": xs, "flag": np.array([False])}, fetch_list=[out], scope=scope)
    np.testing.assert_allclose(got, xs + 1.0)
    with pytest.raises(nf.errors.ExecutionError):
        exe.run(feed={"x": xs, "flag": np.array([True])}, fetch_list=[out], scope=scope)


def _numpy_loop(x, w, v, steps):
    flag = True
    for _ in range(steps):
        x = np.tanh(x @ w) if flag else x * v + 0.5
        flag = not flag
    return x


def test_cond_inside_a_while_loop_with_gradients(rng):
    """Each iteration alternates branches: x = tanh(x @ w) on even steps, x * v + 0.5 on odd."""
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    w, v = _param("w", [2, 2]), _param("v", [2])
    state = L.assign(x)
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 5)
    flag = L.fill_constant([1], "bool", 1.0)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():
        new = L.cond(
            flag,
            lambda: L.tanh(L.matmul(state, w)),
            lambda: L.scale(L.elementwise_mul(state, v), bias=0.5),
        )
        L.assign(new, output=state)
        L.logical_not(flag, out=flag)
        L.increment(i)
        L.less_than(i, n, out=cond)
    loss = L.reduce_sum(L.square(state))
    nf.append_backward(loss)
    exe, scope = _startup()
    xs = rng.normal(size=(3, 2))
    (got,) = exe.run(feed={"x": xs}, fetch_list=[state], scope=scope)
    want = _numpy_loop(xs, _value(scope, "w"), _value(scope, "v"), 5)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert_gradients_match(exe, None, scope, {"x": xs}, loss, ["w", "v", "x"])
    assert scope.kids == []


def test_cond_inside_rnn_steps_with_gradients(rng):
    """h_t = tanh(x_t u + h w) when the batch's x_t sums positive, else 0.5 h - x_t."""
    x = L.data("x", [-1, -1, 1], "float64")
    x.stop_gradient = False
    u = _param("u", [1])
    w = _param("w", [1])
    zero = L.fill_constant([], "float64", 0.0)
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(shape=[1], dtype="float64", batch_ref=x)
        positive = L.greater_than(L.reduce_sum(xt), zero)
        new = L.cond(
            positive,
            lambda: L.tanh(L.elementwise_mul(xt, u) + L.elementwise_mul(h, w)),
            lambda: L.scale(h, 0.5) - xt,
        )
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    loss = L.reduce_sum(L.square(out))
    nf.append_backward(loss)
    exe, scope = _startup()
    xs = rng.normal(size=(2, 6, 1))
    (got,) = exe.run(feed={"x": xs}, fetch_list=[out], scope=scope)
    uv, wv = _value(scope, "u"), _value(scope, "w")
    h_ref, want = np.zeros((2, 1)), np.zeros((2, 6, 1))
    for t in range(6):
        xt_ = xs[:, t]
        h_ref = np.tanh(xt_ * uv + h_ref * wv) if xt_.sum() > 0 else 0.5 * h_ref - xt_
        want[:, t] = h_ref
    signs = {xs[:, t].sum() > 0 for t in range(6)}
    assert signs == {True, False}  # both branches run over the steps
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert_gradients_match(exe, None, scope, {"x": xs}, loss, ["u", "w", "x"])


def test_nested_cond_with_gradients(rng):
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    a = L.data("a", [1], "bool")
    b = L.data("b", [1], "bool")
    w = _param("w", [2])

    def true_fn():
        return L.cond(b, lambda: L.elementwise_mul(x, w), lambda: L.tanh(x) * 3.0)

    out = L.cond(a, true_fn, lambda: L.elementwise_add(x, w))
    loss = L.reduce_sum(L.square(out))
    nf.append_backward(loss)
    exe, scope = _startup()
    xs = rng.normal(size=(3, 2))
    wv = _value(scope, "w")
    cases = {
        (True, True): xs * wv,
        (True, False): np.tanh(xs) * 3.0,
        (False, True): xs + wv,
        (False, False): xs + wv,
    }
    for (av, bv), want in cases.items():
        feed = {"x": xs, "a": np.array([av]), "b": np.array([bv])}
        (got,) = exe.run(feed=feed, fetch_list=[out], scope=scope)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert_gradients_match(exe, None, scope, feed, loss, ["w", "x"])


def test_structured_results_and_outer_values(rng):
    """Tuples, dicts and namedtuples come back in the branch's structure; a branch may return
    an outer variable as it is (copied in the branch), and integer values merge too."""
    pair = collections.namedtuple("pair", "low high")
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    k = L.data("k", [-1], "int64")
    flag = L.data("flag", [1], "bool")
    out = L.cond(
        flag,
        lambda: (pair(x, x * 2.0), {"ids": k, "y": L.tanh(x)}),
        lambda: (pair(x - 1.0, x), {"ids": k + 1, "y": x}),
    )
    assert isinstance(out, tuple) and isinstance(out[0], pair) and sorted(out[1]) == ["ids", "y"]
    assert out[1]["ids"].dtype == "int64" and out[0].low.shape == (-1, 2)
    loss = L.reduce_sum(out[0].low) + L.reduce_sum(out[1]["y"])
    nf.append_backward(loss)
    exe, scope = _startup()
    xs, ks = rng.normal(size=(3, 2)), np.array([4, 5], np.int64)
    fetch = [out[0].low, out[0].high, out[1]["ids"], out[1]["y"], "x@GRAD"]
    for flag_value in (True, False):
        feed = {"x": xs, "k": ks, "flag": np.array([flag_value])}
        low, high, ids, y, x_grad = exe.run(feed=feed, fetch_list=fetch, scope=scope)
        if flag_value:
            want = (xs, 2 * xs, ks, np.tanh(xs), 1.0 + (1 - np.tanh(xs) ** 2))
        else:
            want = (xs - 1.0, xs, ks + 1, xs, np.full_like(xs, 2.0))
        for got_value, want_value in zip((low, high, ids, y, x_grad), want):
            np.testing.assert_allclose(got_value, want_value, rtol=1e-12)


def test_missing_branches_and_branches_returning_none():
    flag = L.data("flag", [1], "bool")
    x = L.data("x", [-1, 2], "float64")
    assert L.cond(flag) is None
    assert L.cond(flag, lambda: None, lambda: None) is None
    assert L.cond(flag, false_fn=lambda: None) is None
    printed = L.cond(flag, lambda: L.Print(x, message="taken") and None)
    assert printed is None
    exe, scope = _startup()
    for value in (True, False):
        exe.run(feed={"flag": np.array([value]), "x": np.ones((1, 2))}, scope=scope)


def test_the_program_round_trips_through_protobuf_and_an_inference_model(rng, tmp_path):
    x, pred, out, _ = _shared_parameter_model()
    exe, scope = _startup()
    main = nf.default_main_program()
    loaded = nf.Program.from_bytes(main.to_bytes())
    for sign in (1.0, -1.0):
        xs = np.abs(rng.normal(size=(2, 3))) * sign
        want = exe.run(main, feed={"x": xs}, fetch_list=[out, "w@GRAD"], scope=scope)
        got = exe.run(loaded, feed={"x": xs}, fetch_list=[out.name, "w@GRAD"], scope=scope)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    nf.io.save_inference_model(str(tmp_path / "m"), ["x"], [out], main, scope)
    program, feeds, fetches, loaded_scope = nf.io.load_inference_model(str(tmp_path / "m"))
    assert "@GRAD" not in str(program)
    for sign in (1.0, -1.0):
        xs = np.abs(rng.normal(size=(2, 3))) * sign
        (want,) = exe.run(main, feed={"x": xs}, fetch_list=[out], scope=scope)
        (got,) = exe.run(program, feed={"x": xs}, fetch_list=fetches, scope=loaded_scope)
        np.testing.assert_array_equal(got, want)


def test_prune_keeps_only_the_branch_outputs_a_target_needs(rng):
    x = L.data("x", [-1, 2], "float64")
    flag = L.data("flag", [1], "bool")
    first, second = L.cond(
        flag, lambda: (L.tanh(x), L.exp(x) * 2.0), lambda: (x + 1.0, L.sigmoid(x))
    )
    small = nf.prune(nf.default_main_program(), [first])
    blocks = [op.attr("sub_block") for op in small.global_block().ops if op.sub_blocks()]
    assert len(blocks) == 2
    kept = sorted(op.type for block in blocks for op in block.ops)
    assert kept == ["scale", "tanh"]  # exp and sigmoid are gone with the second value
    exe, scope = _startup()
    xs = rng.normal(size=(3, 2))
    for value, want in ((True, np.tanh(xs)), (False, xs + 1.0)):
        feed = {"x": xs, "flag": np.array([value])}
        (got,) = exe.run(small, feed=feed, fetch_list=[first.name], scope=scope)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        (evaluated,) = exe.eval(nf.default_main_program(), [first], feed=feed, scope=scope)
        np.testing.assert_allclose(evaluated, want, rtol=1e-12)
    assert second.name not in {n for op in small.global_block().ops for n in op.output_names()}


# ---- errors ----


def _raises_at_this_file(kind, match, build):
    with pytest.raises(kind, match=match) as info:
        build()
    assert "test_cond.py" in str(info.value)


def test_a_non_scalar_or_non_bool_predicate_is_a_build_time_error():
    rows = L.data("rows", [-1], "bool")
    pair = L.data("pair", [2], "bool")
    number = L.data("number", [1], "float32")
    _raises_at_this_file(ShapeError, r"'rows' has shape \[-1\].*IfElse", lambda: L.cond(rows))
    _raises_at_this_file(ShapeError, r"'pair' has shape \[2\]", lambda: L.cond(pair))
    _raises_at_this_file(
        DTypeError, "'number' must be bool, but it is float32", lambda: L.cond(number)
    )
    _raises_at_this_file(ControlFlowError, "got int", lambda: L.cond(1))
    assert nf.default_main_program().global_block().ops == []


def test_a_predicate_fed_with_the_wrong_shape_is_a_feed_error():
    flag = L.data("flag", [1], "bool")
    out = L.cond(
        flag,
        lambda: L.fill_constant([1], "float32", 1.0),
        lambda: L.fill_constant([1], "float32", 2.0),
    )
    exe, scope = _startup()
    with pytest.raises(FeedError, match=r"'flag' has shape \[2\].*\[1\]"):
        exe.run(feed={"flag": np.array([True, False])}, fetch_list=[out], scope=scope)


def test_a_zero_d_predicate_holding_several_values_at_run_time_is_an_error():
    flag = L.data("flag", [], "bool")
    out = L.cond(
        flag,
        lambda: L.fill_constant([1], "float32", 1.0),
        lambda: L.fill_constant([1], "float32", 2.0),
    )
    exe, scope = _startup()
    (got,) = exe.run(feed={"flag": np.array(False)}, fetch_list=[out], scope=scope)
    assert got.tolist() == [2.0]
    with pytest.raises(ControlFlowError, match=r"'flag' must hold one bool value, got bool\[2\]"):
        exe.run(feed={"flag": np.array([True, False])}, fetch_list=[out], scope=scope)


def test_branches_returning_different_things_are_errors():
    flag = L.data("flag", [1], "bool")
    x = L.data("x", [-1, 2], "float64")
    y = L.data("y", [-1, 3], "float64")
    k = L.data("k", [-1, 2], "int64")
    cases = [
        (ControlFlowError, "different structures", lambda: (x, x), lambda: x),
        (ControlFlowError, r"dict keys \['a'\] vs \['b'\]", lambda: {"a": x}, lambda: {"b": x}),
        (DTypeError, "value 0 is float64 in true_fn but int64", lambda: x, lambda: k),
        (ShapeError, r"value 1 has shape \[-1, 2\] in true_fn but \[-1, 3\]", lambda: [x, x], lambda: [x, y]),
        (ControlFlowError, "true_fn returns values but false_fn returns None", lambda: x, lambda: None),
        (ControlFlowError, "returned float", lambda: 1.0, lambda: x),
    ]  # fmt: skip
    for kind, match, true_fn, false_fn in cases:
        _raises_at_this_file(kind, match, lambda: L.cond(flag, true_fn, false_fn))
    _raises_at_this_file(
        ControlFlowError, "false_fn returns values but true_fn is not given",
        lambda: L.cond(flag, None, lambda: x),
    )  # fmt: skip
    _raises_at_this_file(ControlFlowError, "true_fn must be callable", lambda: L.cond(flag, x))
    assert nf.default_main_program().global_block().ops == []


def test_a_branch_writing_an_outer_variable_is_an_error():
    flag = L.data("flag", [1], "bool")
    x = L.data("x", [-1, 2], "float64")
    total = L.fill_constant([1], "float64", 0.0)

    def writes():
        L.assign(L.reduce_sum(x, keep_dim=True)[0], output=total)
        return x

    _raises_at_this_file(
        ControlFlowError,
        r"writes variable\(s\) \[.*\] of the enclosing",
        lambda: L.cond(flag, writes, lambda: x),
    )


def test_conditional_block_op_checks_its_condition_and_attrs():
    block = nf.default_main_program().global_block()
    x = L.data("x", [2], "float32")
    several = L.data("several", [3], "bool")
    sub = nf.default_main_program().create_block(0)
    nf.default_main_program().rollback()
    with pytest.raises(ShapeError, match=r"'several' has shape \[3\]"):
        block.append_op(
            "conditional_block",
            {"Cond": [several], "Input": [x]},
            {"Out": []},
            {"sub_block": sub, "is_scalar_condition": True},
        )
    with pytest.raises(nf.errors.AttrError, match="'sub_block' must be a sub-block"):
        block.append_op("conditional_block", {"Cond": [x], "Input": [x]}, {"Out": []}, {})


def test_without_is_scalar_condition_the_block_runs_when_every_cond_is_non_empty():
    """Fluid's other mode: Cond tensors are tested for elements, not for truth."""
    program = nf.default_main_program()
    block = program.global_block()
    x = L.data("x", [-1], "float32")
    with program.block_guard(0) as sub:
        doubled = L.scale(x, 2.0)
    out = block.create_var("out")
    scope_var = block.create_var("scope", type="step_scopes")
    block.append_op(
        "conditional_block",
        {"Cond": [x], "Input": [x]},
        {"Out": [out], "Scope": [scope_var]},
        {"sub_block": sub, "outs": [doubled.name]},
    )
    assert out.shape == (-1,) and out.dtype == "float32"
    exe, scope = _startup()
    (got,) = exe.run(feed={"x": np.array([1.0, 2.0], np.float32)}, fetch_list=[out], scope=scope)
    assert got.tolist() == [2.0, 4.0]
    with pytest.raises(nf.errors.FetchError, match="'out' was not computed"):
        exe.run(feed={"x": np.zeros(0, np.float32)}, fetch_list=[out], scope=scope)
