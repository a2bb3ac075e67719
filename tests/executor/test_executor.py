"""Executor.run: prepared plans, where variables live, feeds and fetches (DESIGN: Execution;
seeds 000, 002)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import nestflow as nf
import nestflow.executor.executor as executor_module
from nestflow.core.scope import live_scope_count
from nestflow.ops import register_op
from nestflow.ops.registry import _REGISTRY

_kids_made: list[nf.Scope] = []


class RunInKidOp:
    """Test-only control-flow-like op: runs its sub-block in a fresh kid scope of the scope it
    runs in, keeps the block's variables there (as control-flow ops do for their gradient), and
    outputs the sub-block variable named by `inner`."""

    type = "test_run_in_kid"
    inputs, outputs = ("X",), ("Out",)
    attrs = {"sub_block": None, "inner": ""}

    def run(ctx):
        kid = ctx.scope.new_scope()
        _kids_made.append(kid)
        frame = ctx.run_block(ctx.attrs["sub_block"], kid, {})
        frame.store_in_scope(kid)
        ctx.set_output("Out", frame.value(ctx.attrs["inner"]))


@pytest.fixture(autouse=True, scope="module")
def run_in_kid_op():
    """Registered only while this module runs, so suites that walk the registry never see it."""
    register_op(RunInKidOp)
    yield
    _REGISTRY.pop(RunInKidOp.type)


def _mlp(act: str = "relu"):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", shape=[-1, 4])
        h = nf.layers.fc(x, size=3, act=act, name="fc1")
        y = nf.layers.fc(h, size=2, name="fc2")
    return main, startup, x, y


@pytest.fixture
def mlp():
    main, startup, x, y = _mlp()
    scope = nf.Scope()
    exe = nf.Executor(nf.CPUPlace())
    exe.run(startup, scope=scope)
    return main, scope, exe, y


def _xs(rows: int = 2) -> np.ndarray:
    return np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 10


def _reference(scope: nf.Scope, xs: np.ndarray) -> np.ndarray:
    def p(name):
        return scope.find_var(name).get(nf.Tensor).numpy()

    h = np.maximum(xs @ p("fc1.w") + p("fc1.b"), 0)
    return h @ p("fc2.w") + p("fc2.b")


class _CountingPlans:
    """Counts BlockPlans the executor prepares."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = executor_module.BlockPlan
        counter = self

        class Counting(real):
            def __init__(self, block, device=None):
                counter.count += 1
                super().__init__(block, device)

        monkeypatch.setattr(executor_module, "BlockPlan", Counting)


# ---- prepared plans ----


def test_second_run_reuses_the_prepared_plan(mlp, monkeypatch):
    """DESIGN Execution: a per-program prepared plan, reused across runs until the program
    changes."""
    main, scope, exe, y = mlp
    plans = _CountingPlans(monkeypatch)
    (first,) = exe.run(main, feed={"x": _xs()}, fetch_list=[y], scope=scope)
    (second,) = exe.run(main, feed={"x": _xs(5)}, fetch_list=[y], scope=scope)
    assert plans.count == 1
    np.testing.assert_allclose(second[:2], first, rtol=1e-6)


def test_editing_the_program_invalidates_the_plan(mlp, monkeypatch):
    """DESIGN Execution: a plan is reused "until the program changes" — appending an op or
    changing an attr gives a new plan whose results reflect the edit."""
    main, scope, exe, y = mlp
    plans = _CountingPlans(monkeypatch)
    (base,) = exe.run(main, feed={"x": _xs()}, fetch_list=[y], scope=scope)
    with nf.program_guard(main):
        doubled = nf.layers.scale(y, scale=2.0)
    (twice,) = exe.run(main, feed={"x": _xs()}, fetch_list=[doubled], scope=scope)
    assert plans.count == 2
    np.testing.assert_allclose(twice, 2 * base, rtol=1e-6)
    main.global_block().ops[-1].set_attr("scale", 3.0)
    (thrice,) = exe.run(main, feed={"x": _xs()}, fetch_list=[doubled], scope=scope)
    assert plans.count == 3
    np.testing.assert_allclose(thrice, 3 * base, rtol=1e-6)
    main.global_block().remove_op(len(main.global_block().ops) - 1)
    exe.run(main, feed={"x": _xs()}, fetch_list=[y], scope=scope)
    assert plans.count == 4


def test_each_program_has_its_own_plan(monkeypatch):
    """DESIGN Execution: plans are per program; alternating programs does not mix them up."""
    main_a, startup_a, _, ya = _mlp("relu")
    main_b, startup_b, _, yb = _mlp("tanh")
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup_a, scope=scope)
    plans = _CountingPlans(monkeypatch)
    for _ in range(3):
        (a,) = exe.run(main_a, feed={"x": _xs()}, fetch_list=[ya], scope=scope)
        (b,) = exe.run(main_b, feed={"x": _xs()}, fetch_list=[yb], scope=scope)
    assert plans.count == 2
    np.testing.assert_allclose(a, _reference(scope, _xs()), rtol=1e-5, atol=1e-6)
    assert not np.allclose(a, b)


# ---- where variables live ----


def test_temporaries_do_not_leak_into_the_users_scope(mlp):
    """DESIGN Execution: persistables live in the scope passed in; temporaries do not."""
    main, scope, exe, y = mlp
    exe.run(main, feed={"x": _xs()}, fetch_list=[y], scope=scope)
    persistables = sorted(v.name for v in main.list_vars() if v.persistable)
    assert sorted(scope.local_var_names()) == persistables == ["fc1.b", "fc1.w", "fc2.b", "fc2.w"]
    assert scope.kids == []


def test_kid_scopes_are_dropped_after_the_run():
    """seed 002: "When the execution enters a block, PaddlePaddle adds a new scope"; it is not
    popped when the block ends (the inner variable is still fetchable from it at the end of
    the run) but "destroy[ed] when minibatch completes"; sub-block variables never reach the
    user's scope."""
    main = nf.Program()
    with nf.program_guard(main):
        x = nf.data("x", shape=[-1, 3])
        with main.block_guard() as sub:
            inner = nf.layers.relu(x)
        out = main.global_block().create_var("out", [-1, 3])
        main.global_block().append_op(
            "test_run_in_kid",
            {"X": x},
            {"Out": out},
            {"sub_block": sub, "inner": inner.name},
        )
    scope = nf.Scope()
    scope.var("kept").set_value(1)
    xs = np.array([[-1.0, 0.5, 2.0]], np.float32)
    gc.collect()
    live = live_scope_count()
    _kids_made.clear()
    got_out, got_inner = nf.Executor().run(
        main, feed={"x": xs}, fetch_list=[out, inner.name], scope=scope
    )
    np.testing.assert_array_equal(got_out, np.maximum(xs, 0))
    np.testing.assert_array_equal(got_inner, np.maximum(xs, 0))  # fetched from the kid scope
    assert len(_kids_made) == 1 and not _kids_made[0].alive
    assert scope.kids == []
    assert scope.local_var_names() == ["kept"]
    gc.collect()
    assert live_scope_count() == live


def test_one_program_runs_in_different_scopes(mlp):
    """seed 000: "One net can run in different scopes and update different variable in the
    scope"."""
    main, _, exe, _ = mlp
    with nf.program_guard(main, nf.Program()):
        steps = nf.layers.create_parameter(
            [1], name="steps", initializer=nf.initializer.Constant(0.0), trainable=False
        )
        main.global_block().append_op("scale", {"X": steps}, {"Out": steps}, {"bias": 1.0})
    scopes = []
    for start in (0.0, 10.0):
        s = nf.Scope()
        for name, shape in (("fc1.w", (4, 3)), ("fc1.b", (3,)), ("fc2.w", (3, 2)), ("fc2.b", (2,))):
            s.var(name).get_mutable(nf.Tensor).set(np.full(shape, start + 1, np.float32))
        s.var("steps").get_mutable(nf.Tensor).set(np.array([start], np.float32))
        scopes.append(s)
    for s in scopes:
        (y,) = exe.run(main, feed={"x": _xs()}, fetch_list=["fc2.tmp_1"], scope=s)
        np.testing.assert_allclose(y, _reference(s, _xs()), rtol=1e-6)
    exe.run(main, feed={"x": _xs()}, scope=scopes[0])
    assert scopes[0].find_var("steps").get(nf.Tensor).numpy().tolist() == [2.0]
    assert scopes[1].find_var("steps").get(nf.Tensor).numpy().tolist() == [11.0]


def test_persistables_read_from_and_written_to_the_scope(mlp):
    """seed 000: "All parameters, data, states in a Net should be variables and stored inside a
    scope. Each op should get inputs and outputs to do computation from a scope"."""
    main, scope, exe, y = mlp
    scope.find_var("fc2.b").get(nf.Tensor).set(np.array([100.0, -100.0], np.float32))
    (out,) = exe.run(main, feed={"x": _xs()}, fetch_list=[y], scope=scope)
    np.testing.assert_allclose(out, _reference(scope, _xs()), rtol=1e-6)
    assert (out[:, 0] > 50).all()


def test_default_scope_is_the_global_scope():
    """DESIGN Execution: run() without a scope uses nf.global_scope()."""
    main, startup, _, y = _mlp()
    exe = nf.Executor()
    exe.run(startup)
    assert nf.global_scope().find_var("fc1.w") is not None
    (out,) = exe.run(main, feed={"x": _xs()}, fetch_list=[y])
    np.testing.assert_allclose(out, _reference(nf.global_scope(), _xs()), rtol=1e-5, atol=1e-6)
    nf.global_scope().erase_vars(["fc1.w", "fc1.b", "fc2.w", "fc2.b"])


# ---- feeds and fetches ----


def test_fetch_by_name_and_by_vardesc(mlp):
    """DESIGN Execution: fetch_list holds VarDescs or names, results come back in order."""
    main, scope, exe, y = mlp
    by_desc, by_name, param, fed = exe.run(
        main, feed={"x": _xs()}, fetch_list=[y, y.name, "fc1.w", "x"], scope=scope
    )
    np.testing.assert_array_equal(by_desc, by_name)
    np.testing.assert_allclose(by_desc, _reference(scope, _xs()), rtol=1e-6)
    np.testing.assert_array_equal(param, scope.find_var("fc1.w").get(nf.Tensor).numpy())
    np.testing.assert_array_equal(fed, _xs())
    assert exe.run(main, feed={"x": _xs()}, scope=scope) == []


def test_fetched_values_are_numpy_arrays(mlp):
    """DESIGN Execution: fetched values are NumPy arrays of the variable's dtype and shape."""
    main, scope, exe, y = mlp
    results = exe.run(main, feed={"x": _xs(3)}, fetch_list=[y, "fc1.b", "x"], scope=scope)
    assert all(type(r) is np.ndarray for r in results)
    assert results[0].shape == (3, 2) and results[0].dtype == np.float32
    assert results[1].shape == (3,)


def test_fetched_arrays_do_not_alias_the_scope(mlp):
    """DESIGN Execution: persistables change only through runs; writing into a fetched array
    must not silently change a parameter."""
    main, scope, exe, y = mlp
    before = scope.find_var("fc1.w").get(nf.Tensor).numpy()
    (w,) = exe.run(main, feed={"x": _xs()}, fetch_list=["fc1.w"], scope=scope)
    w += 1.0
    np.testing.assert_array_equal(scope.find_var("fc1.w").get(nf.Tensor).numpy(), before)


def test_a_fetched_temporary_is_handed_over_and_everything_else_copied(mlp):
    """An op's fresh output only the run held goes to the caller as it is (no copy); a
    parameter, a fed array, a view of either, and a name fetched twice are copies."""
    main, scope, exe, y = mlp
    xs = _xs()
    fetched = exe.run(main, feed={"x": xs}, fetch_list=[y, y, "fc1.w", "x"], scope=scope)
    y1, y2, w, x = fetched
    assert y1 is not y2 and not np.shares_memory(y1, y2)
    assert not np.shares_memory(x, xs)
    y1 += 1.0  # the caller's own: the next run is unchanged
    (again,) = exe.run(main, feed={"x": xs}, fetch_list=[y], scope=scope)
    np.testing.assert_array_equal(again, y2)
    before = w.copy()
    w += 1.0
    np.testing.assert_array_equal(scope.find_var("fc1.w").get(nf.Tensor).numpy(), before)


def test_feeding_a_tensor_works(mlp):
    """DESIGN Core runtime / Execution: a nf.Tensor can be fed like an array."""
    main, scope, exe, y = mlp
    t = nf.Tensor()
    t.set(_xs())
    (from_tensor,) = exe.run(main, feed={"x": t}, fetch_list=[y], scope=scope)
    (from_array,) = exe.run(main, feed={"x": _xs()}, fetch_list=[y], scope=scope)
    np.testing.assert_array_equal(from_tensor, from_array)


def test_feed_may_be_keyed_by_vardesc_and_be_a_list(mlp):
    """Feeds accept VarDesc keys and array-likes (nested lists) of the right dtype."""
    main, scope, exe, y = mlp
    x = main.global_block().var("x")
    (a,) = exe.run(main, feed={x: _xs()}, fetch_list=[y], scope=scope)
    (b,) = exe.run(main, feed={"x": _xs().tolist()}, fetch_list=[y], scope=scope)
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_return_numpy_false_gives_raw_values(mlp):
    """Executor.run(return_numpy=False) hands back the values as the run left them."""
    main, scope, exe, y = mlp
    (raw,) = exe.run(main, feed={"x": _xs()}, fetch_list=[y], scope=scope, return_numpy=False)
    np.testing.assert_allclose(np.asarray(raw), _reference(scope, _xs()), rtol=1e-6)


def test_a_feed_is_checked_again_when_its_shape_or_dtype_changes():
    """The executor skips re-checking a feed like the last accepted one; any other is checked."""
    x = nf.data("x", shape=[-1, 3], dtype="float32")
    out = nf.layers.scale(x, 2.0)
    exe, scope = nf.Executor(), nf.Scope()
    for rows in (2, 2, 5):
        (got,) = exe.run(feed={"x": np.ones((rows, 3), "float32")}, fetch_list=[out], scope=scope)
        assert got.shape == (rows, 3)
    with pytest.raises(nf.errors.FeedError, match="shape"):
        exe.run(feed={"x": np.ones((2, 4), "float32")}, fetch_list=[out], scope=scope)
    with pytest.raises(nf.errors.FeedError, match="dtype"):
        exe.run(feed={"x": np.ones((2, 3), "int64")}, fetch_list=[out], scope=scope)
    (got,) = exe.run(feed={"x": np.ones((2, 3), "float64")}, fetch_list=[out], scope=scope)
    assert got.dtype == np.float32  # same-kind values are cast to the declared dtype


def test_an_executor_does_not_keep_the_programs_it_ran_alive():
    import weakref

    exe = nf.Executor()
    program = nf.Program()
    with nf.program_guard(program, nf.Program()):
        out = nf.layers.scale(nf.data("x", [2]), 2.0)
    (got,) = exe.run(program, feed={"x": np.ones(2, "float32")}, fetch_list=[out])
    np.testing.assert_array_equal(got, [2.0, 2.0])
    gone = weakref.ref(program)
    del program, out
    gc.collect()
    assert gone() is None


def test_a_large_fresh_fetch_is_not_copied(monkeypatch):
    """The hand-over applies to arrays of 64 KiB or more that only the run held: an op's
    output is, a persistable fetched beside it is not."""
    from nestflow.executor import executor as executor_module

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 256])
        w = nf.layers.create_parameter([512, 256], "float32", name="big_w")
        y = nf.layers.elementwise_add(x, w)
    exe, scope = nf.Executor(nf.CPUPlace()), nf.Scope()
    exe.run(startup, scope=scope)
    decided = []
    fresh_fetches = executor_module._fresh_fetches
    monkeypatch.setattr(
        executor_module,
        "_fresh_fetches",
        lambda *args: decided.append(fresh_fetches(*args)) or decided[-1],
    )
    out, weights = exe.run(main, {"x": np.ones((512, 256), "float32")}, [y, "big_w"], scope=scope)
    assert decided == [{0}]
    weights += 1.0  # a copy: the parameter is unchanged
    assert not np.array_equal(scope.find_var("big_w").get(nf.Tensor).numpy(), weights)
    assert out.shape == (512, 256)
