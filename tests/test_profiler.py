"""nf.profiler: the per-op table (counts equal to the ops the program ran, control-flow
sub-blocks times their runs), sorting, the Chrome trace (one complete event per op run, nested
under its control-flow op), and bad arguments."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, ExecutionError, NestflowError
from nestflow.executor import plan as plan_module

L = nf.layers


@pytest.fixture(autouse=True)
def no_profiler_left_running():
    assert plan_module.profiler is None
    yield
    assert plan_module.profiler is None


def _expected(block, runs_of_sub_blocks: dict[str, int], times: int = 1) -> Counter:
    """Op runs of `block` run `times` times: each op once, a control-flow op's sub-blocks as
    many times as `runs_of_sub_blocks` says for its type."""
    counts: Counter = Counter()
    for op in block.ops:
        counts[op.type] += times
        for sub in op.sub_blocks():
            counts += _expected(sub, runs_of_sub_blocks, times * runs_of_sub_blocks[op.type])
    return counts


def _table_counts(text: str) -> Counter:
    """{op type: calls} read back from the printed table."""
    lines = text.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("Op type"))
    return Counter({line.split()[0]: int(line.split()[1]) for line in lines[header + 1 :]})


def _mlp():
    x = nf.data("x", shape=[-1, 6])
    label = nf.data("label", shape=[-1, 1], dtype="int64")
    hidden = L.fc(x, size=8, act="relu")
    logits = L.fc(hidden, size=3)
    loss = L.mean(L.softmax_with_cross_entropy(logits, label))
    nf.append_backward(loss)
    return loss, {
        "x": np.random.default_rng(0).normal(size=(5, 6)).astype("float32"),
        "label": np.array([[0], [1], [2], [1], [0]], dtype="int64"),
    }


def _run_profiled(feed, fetch, runs=1, executor=None, **options):
    exe = executor or nf.Executor()
    scope = nf.Scope()
    exe.run(nf.default_startup_program(), scope=scope)
    with nf.profiler.profiler(**options) as profile:
        for _ in range(runs):
            exe.run(feed=feed, fetch_list=fetch, scope=scope)
    return profile


def test_table_counts_equal_the_programs_op_counts(capsys):
    loss, feed = _mlp()
    profile = _run_profiled(feed, [loss], runs=4)
    want = _expected(nf.default_main_program().global_block(), {}, times=4)
    assert {r.op_type: r.calls for r in profile.stats()} == want
    assert _table_counts(capsys.readouterr().out) == want
    assert len(profile.events) == sum(want.values())


def _while_program(steps: int):
    x = L.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    w = L.create_parameter([2, 2], "float64", name="w")
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", steps)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.tanh(L.matmul(x, w)), output=x)
        L.increment(i)
        L.less_than(i, n, out=cond)
    loss = L.mean(x)
    nf.append_backward(loss)
    return loss, {"x": np.ones((3, 2))}


@pytest.mark.parametrize("check_nan_inf", [False, True])
def test_while_body_and_gradient_ops_count_once_per_iteration(check_nan_inf, capsys):
    loss, feed = _while_program(steps=5)
    exe = nf.Executor(check_nan_inf=check_nan_inf)
    profile = _run_profiled(feed, [loss], runs=2, executor=exe)
    main = nf.default_main_program().global_block()
    want = _expected(main, {"while": 5, "while_grad": 5}, times=2)
    assert want["tanh"] == want["tanh_grad"] == 10 and want["while"] == 2
    assert {r.op_type: r.calls for r in profile.stats()} == want
    assert _table_counts(capsys.readouterr().out) == want


def _ifelse_and_rnn_program():
    x = nf.minibatch([10, 20, 30])
    cond = L.greater_than(x, 15)
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.scale(x, scale=2.0))
    with ie.false_block():
        ie.output(L.exp(L.scale(x, scale=0.01)))
    (branched,) = ie(cond)
    seq = nf.sequence([1.0, 2.0, 3.0, 4.0])
    zero, w, u = nf.var(0), nf.var(0.3, param=True), nf.var(0.2, param=True)
    rnn = nf.rnn()
    with rnn.step():
        h = rnn.memory(init=zero)
        new = L.tanh(nf.add(L.matmul(seq, w), L.matmul(rnn.previous_memory(h), u)))
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    return L.mean(branched) + L.mean(out)


def test_ifelse_branches_and_rnn_steps_are_counted(capsys):
    total = _ifelse_and_rnn_program()
    profile = _run_profiled({}, [total])
    main = nf.default_main_program().global_block()
    op_types = [op.type for op in main.ops]
    assert "ifelse" in op_types and "recurrent" in op_types
    # Both branches have rows (one row takes false): each runs once; the RNN runs 4 steps.
    want = _expected(main, {"ifelse": 1, "recurrent": 4})
    assert want["tanh"] == 4 and want["exp"] == 1
    assert {r.op_type: r.calls for r in profile.stats()} == want
    assert _table_counts(capsys.readouterr().out) == want


def test_chrome_trace_has_one_complete_event_per_op_run_nested_in_its_control_flow_op(tmp_path):
    loss, feed = _while_program(steps=3)
    path = tmp_path / "trace.json"
    profile = _run_profiled(feed, [loss], runs=2, profile_path=str(path))
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(trace["traceEvents"]) == len(profile.events)
    main = nf.default_main_program().global_block()
    assert Counter(e["name"] for e in events) == _expected(
        main, {"while": 3, "while_grad": 3}, times=2
    )
    for event in events:
        assert event["dur"] >= 0 and event["ts"] >= 0
        assert set(event["args"]) == {"op_index", "block", "depth"}
    # Every sub-block op lies inside a run of the control-flow op that ran its block.
    outer = [e for e in events if e["args"]["depth"] == 0]
    inner = [e for e in events if e["args"]["depth"] == 1]
    assert len(inner) == 2 * 3 * (len(main.program.block(1).ops) + len(main.program.block(2).ops))
    for event in inner:
        parents = [
            p
            for p in outer
            if p["tid"] == event["tid"]
            and p["ts"] <= event["ts"]
            and event["ts"] + event["dur"] <= p["ts"] + p["dur"]
        ]
        assert [p["name"] for p in parents] == (
            ["while"] if event["args"]["block"] == 1 else ["while_grad"]
        )
        index = event["args"]["op_index"]
        assert event["name"] == main.program.block(event["args"]["block"]).ops[index].type


@pytest.mark.parametrize("key", ["calls", "total", "max", "min", "ave"])
def test_rows_are_sorted_by_the_key(key, capsys):
    loss, feed = _while_program(steps=4)
    profile = _run_profiled(feed, [loss], sorted_key=key)
    rows = profile.stats(key)
    values = [getattr(r, key) for r in rows]
    assert values == sorted(values, reverse=True)
    printed = list(_table_counts(capsys.readouterr().out))
    assert printed == [r.op_type for r in rows]


def test_sorted_key_none_keeps_the_order_of_first_runs():
    loss, feed = _while_program(steps=2)
    profile = _run_profiled(feed, [loss], sorted_key=None)
    first_seen = list(dict.fromkeys(e[0] for e in profile.events))
    assert [r.op_type for r in profile.stats(None)] == first_seen


def test_share_is_of_the_time_in_top_level_ops():
    loss, feed = _mlp()
    profile = _run_profiled(feed, [loss])
    top = sum(r.total for r in profile.stats())  # no sub-blocks: every op is top-level
    assert profile.profiled_ns() == top
    shares = [float(line.split()[-1]) for line in profile.table().splitlines()[2:]]
    assert sum(shares) == pytest.approx(100.0, abs=0.1)


def test_bad_arguments_and_nesting():
    with pytest.raises(AttrError, match="sorted_key must be one of calls, total, max, min, ave"):
        with nf.profiler.profiler(sorted_key="average"):
            pass
    with pytest.raises(AttrError, match="state must be one of CPU, GPU, All"):
        with nf.profiler.profiler(state="TPU"):
            pass
    with nf.profiler.profiler("GPU") as outer:  # Fluid's positional state
        with pytest.raises(NestflowError, match="already running"):
            with nf.profiler.profiler():
                pass
        assert plan_module.profiler is outer


def test_an_error_inside_stops_the_profiler_and_still_reports(capsys):
    x = nf.data("x", shape=[-1, -1])  # the mismatch shows only when matmul runs
    y = L.matmul(x, L.fill_constant([3, 2], "float32", 1.0))
    with pytest.raises(ExecutionError, match="matmul") as info:
        with nf.profiler.profiler():
            nf.Executor().run(feed={"x": np.ones((2, 3), "float32")}, fetch_list=[y])
            nf.Executor().run(feed={"x": np.ones((2, 4), "float32")}, fetch_list=[y])
    # The failing op is still named (the timed block keeps one source line per op).
    assert "op 'matmul' (#1 in block 0)" in str(info.value)
    assert _table_counts(capsys.readouterr().out) == Counter({"fill_constant": 2, "matmul": 1})


def test_nothing_is_recorded_when_not_profiling():
    loss, feed = _mlp()
    profile = _run_profiled(feed, [loss])
    recorded = len(profile.events)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(nf.default_startup_program(), scope=scope)
    exe.run(feed=feed, fetch_list=[loss], scope=scope)
    assert len(profile.events) == recorded
    source = nf.Executor._plan(nf.default_main_program()).block_plan.source()
    assert "_clock" not in source and "record" not in source


def test_start_stop_and_reset(capsys):
    loss, feed = _mlp()
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(nf.default_startup_program(), scope=scope)
    profile = nf.profiler.start_profiler("CPU")
    exe.run(feed=feed, fetch_list=[loss], scope=scope)
    nf.profiler.reset_profiler()
    assert profile.events == []
    exe.run(feed=feed, fetch_list=[loss], scope=scope)
    assert nf.profiler.stop_profiler("calls") is profile
    assert nf.profiler.stop_profiler() is None  # none running
    assert _table_counts(capsys.readouterr().out) == _expected(
        nf.default_main_program().global_block(), {}
    )


@pytest.mark.parametrize("state,waits", [("CPU", False), ("GPU", True), ("All", True)])
def test_gpu_state_waits_for_each_ops_device_work(state, waits, monkeypatch, capsys):
    """On a device place, "GPU" and "All" synchronize after every op, so each op's time holds
    its kernels, not only their launches; "CPU" (and any state on the CPU) never waits."""
    from nestflow.core import StandInPlace

    place = StandInPlace(0)
    device = nf.device_context(place)
    waited = []
    monkeypatch.setattr(device, "synchronize", lambda: waited.append(1), raising=False)
    x = nf.data("x", shape=[-1, 3])
    y = L.relu(L.scale(x, 2.0))
    feed = {"x": np.ones((2, 3), "float32")}
    with nf.profiler.profiler(state) as profile:
        nf.Executor(place).run(feed=feed, fetch_list=[y])
    ops = len(profile.events)
    assert ops == 2
    assert len(waited) == (ops if waits else 0)
    waited.clear()
    with nf.profiler.profiler(state):
        nf.Executor(nf.CPUPlace()).run(feed=feed, fetch_list=[y])
    assert not waited
