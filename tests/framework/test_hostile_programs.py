"""Hostile and pathological programs (issue 12, items 1, 2 and 6): sub-block cycles, endless
While loops, deep nesting and malformed descriptions are refused with an nf.errors error
naming the op, block or variable, or run within bounded time and memory."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import (
    AttrError,
    ControlFlowError,
    MaxStepsExceededError,
    NestflowError,
    ProgramDecodeError,
)
from nestflow.executor.plan import _names_in_sub_blocks
from nestflow.framework import framework_pb2 as pb
from nestflow.ops import while_loop

L = nf.layers
ROOT = Path(__file__).resolve().parents[2]


class _TimedOut(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Fail instead of hanging: SIGALRM interrupts a Python loop that never ends."""

    def expire(signum, frame):
        raise _TimedOut(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _nested_block_ops() -> tuple[nf.Program, nf.Program]:
    """block 0 runs block 1 (a BlockOp), which runs block 2 (a BlockOp inside it)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 2], "float64")
        outer = nf.BlockOp()
        with outer.block():
            inner = nf.BlockOp()
            with inner.block():
                inner.output(L.scale(x, 2.0))
            (h,) = inner()
            outer.output(L.scale(h, 3.0))
        outer()
    return main, startup


def _block_op_location(desc: pb.ProgramDesc, block: int) -> int:
    return next(i for i, op in enumerate(desc.blocks[block].ops) if op.type == "block")


# ---- item 1: sub-block references that are not strictly nested ----


@pytest.mark.parametrize(
    ("where", "target", "what"),
    [
        (0, 0, "a block op running its own block"),
        (1, 1, "block 1 running block 1"),
        (1, 0, "block 1 running block 0"),
        (2, 1, "block 2 running its parent"),
        (0, 9, "a block that does not exist"),
    ],
)
def test_a_sub_block_reference_that_is_not_strictly_nested_is_refused_on_load(where, target, what):
    main, _ = _nested_block_ops()
    desc = main.to_desc()
    if where == 2:  # give block 2 a block op of its own, copied from block 1
        desc.blocks[2].ops.add().CopyFrom(desc.blocks[1].ops[_block_op_location(desc, 1)])
    index = _block_op_location(desc, where)
    desc.blocks[where].ops[index].attrs["sub_block"].block_idx = target
    with time_limit(10), pytest.raises(ProgramDecodeError) as info:
        nf.Program.from_bytes(desc.SerializeToString())
    message = str(info.value)
    assert f"op 'block' (#{index} in block {where})" in message, what
    assert f"block {target}" in message and "sub_block" in message


def test_sibling_and_list_references_are_refused_on_load():
    """An IfElse's true branch running its false branch (siblings, neither nested in the
    other), and a blocks_idx list holding one bad index."""
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", [-1, 1], "float32")
        ie = nf.ifelse(L.greater_than(x, 0.0))
        with ie.true_block():
            ie.output(L.scale(x, 2.0))
        with ie.false_block():
            ie.output(x)
        ie()
    desc = main.to_desc()
    op = next(op for op in desc.blocks[0].ops if op.type == "ifelse")
    op.attrs["false_block"].block_idx = 0
    with pytest.raises(ProgramDecodeError, match=r"op 'ifelse' .*false_block.*block 0"):
        nf.Program.from_desc(desc)
    desc = main.to_desc()
    # block 2 (the false branch) gets an op running block 1 (the true branch, its sibling)
    moved = desc.blocks[2].ops.add()
    moved.CopyFrom(next(op for op in desc.blocks[0].ops if op.type == "ifelse"))
    moved.attrs["false_block"].block_idx = 1
    with pytest.raises(ProgramDecodeError, match=r"in block 2\).*refers to block 1"):
        nf.Program.from_desc(desc)
    desc = main.to_desc()
    attr = next(op for op in desc.blocks[0].ops if op.type == "ifelse").attrs["true_block"]
    attr.blocks_idx.values.extend([1, 0])
    with pytest.raises(ProgramDecodeError, match=r"true_block.*block 0"):
        nf.Program.from_desc(desc)


def test_gradient_blocks_of_nested_control_flow_still_load_and_run(rng):
    """A gradient block refers to blocks nested in the forward block it differentiates (its
    own parent chain does not reach them): legal, and it round-trips."""
    main, startup = _nested_block_ops()
    with nf.program_guard(main, startup):
        x = main.global_block().var("x")
        x.stop_gradient = False
        out = main.global_block().ops[0].output("Out")[0]
        loss = L.mean(main.global_block().var(out))
        nf.append_backward(loss)
    again = nf.Program.from_bytes(main.to_bytes())
    assert again.to_bytes() == main.to_bytes()
    xs = rng.normal(size=(4, 2))
    (grad,) = nf.Executor().run(again, feed={"x": xs}, fetch_list=["x@GRAD"], scope=nf.Scope())
    np.testing.assert_allclose(grad, np.full((4, 2), 6.0 / 8), rtol=1e-12)


def test_building_a_sub_block_reference_that_is_not_nested_is_an_attr_error():
    main, _ = _nested_block_ops()
    glob = main.global_block()
    op = glob.ops[0]
    with pytest.raises(AttrError, match="'sub_block' refers to block 0.*not nested in block 0"):
        op.attrs["sub_block"] = glob
    with pytest.raises(AttrError, match="refers to block 0"):
        main.block(1).append_op(
            "block", {"X": []}, {"Out": []}, {"sub_block": glob, "outs": []}, source=""
        )
    assert op.attrs["sub_block"] is main.block(1)  # nothing changed
    other = nf.Program()
    child = other.create_block()
    with pytest.raises(AttrError, match="a block of another program"):
        op.attrs["sub_block"] = child


@pytest.mark.parametrize("value", [3, "1", None, [1]])
def test_a_sub_block_attr_that_is_not_a_block_is_an_attr_error_naming_it(value):
    """Was `'int' object has no attribute 'idx'` when the op ran."""
    x = nf.data("x", [-1, 2])
    glob = nf.default_main_program().global_block()
    with pytest.raises(
        AttrError, match=r"(?s)op 'block'.*attribute 'sub_block' must be a sub-block"
    ):
        glob.append_op("block", {"X": [x]}, {"Out": []}, {"sub_block": value, "outs": []})
    assert not glob.ops


def test_a_non_block_sub_block_from_a_file_is_a_program_decode_error():
    main, _ = _nested_block_ops()
    desc = main.to_desc()
    desc.blocks[0].ops[0].attrs["sub_block"].i = 1
    with pytest.raises(
        ProgramDecodeError, match=r"(?s)op 'block'.*'sub_block' must be a sub-block"
    ):
        nf.Program.from_desc(desc)


def test_walks_over_sub_blocks_end_even_on_a_cycle_made_behind_the_checks_back():
    """Defence in depth: a cycle put in with dict.__setitem__ (past every check) does not hang
    plan preparation, running or pruning; each ends with an nf.errors error."""
    main, _ = _nested_block_ops()
    op = main.global_block().ops[0]
    inner = main.block(1).ops[0]
    dict.__setitem__(inner.attrs, "sub_block", main.block(1))  # block 1 runs block 1
    main._bump()
    with time_limit(20):
        names = _names_in_sub_blocks([op])
        assert "x" in names
        with pytest.raises(NestflowError):
            nf.Executor().run(main, feed={"x": np.ones((2, 2))}, scope=nf.Scope())
        with pytest.raises(ProgramDecodeError, match="refers to block 1"):
            nf.prune(main, [op.output("Out")[0]])
        with pytest.raises(ProgramDecodeError, match="refers to block 1"):
            main.clone()


# ---- item 2: endless While loops ----


def _counted_while(max_steps=None, writes_cond=True):
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 3)
    cond = L.less_than(i, n)
    loop = nf.While(cond, max_steps=max_steps)
    with loop.block():
        L.increment(i)
        if writes_cond:
            L.less_than(i, n, out=cond)
    return i, cond


def test_a_while_whose_body_never_writes_its_condition_is_refused_on_load():
    """The layer API refuses it without max_steps; a file may not smuggle it in."""
    with pytest.raises(ControlFlowError, match="never writes the condition"):
        _counted_while(writes_cond=False)
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        i, cond = _counted_while(max_steps=10, writes_cond=False)
    desc = main.to_desc()
    op = next(op for op in desc.blocks[0].ops if op.type == "while")
    op.attrs["max_steps"].i = -1
    with pytest.raises(ProgramDecodeError, match=rf"(?s)op 'while'.*'{cond.name}'.*never stop"):
        nf.Program.from_bytes(desc.SerializeToString())
    loaded = nf.Program.from_bytes(main.to_bytes())  # with its max_steps it loads and runs
    with pytest.raises(MaxStepsExceededError, match="max_steps=10"):
        nf.Executor().run(loaded, fetch_list=[i], scope=nf.Scope())


def test_a_while_op_appended_by_hand_gets_the_layer_checks():
    i = L.fill_constant([1], "int64", 0)
    cond = L.less_than(i, L.fill_constant([1], "int64", 3))
    glob = nf.default_main_program().global_block()
    with nf.default_main_program().block_guard() as body:
        body.append_op("increment", {"X": [i]}, {"Out": ["i2"]}, {"step": 1.0})
    with pytest.raises(ControlFlowError, match="never writes the condition"):
        glob.append_op(
            "while",
            {"X": [i], "Condition": [cond]},
            {"Out": [i], "StepScopes": [glob.create_var("scopes", type="step_scopes")]},
            {"sub_block": body, "carried": [i.name], "carried_inner": ["i2"]},
        )
    with pytest.raises(AttrError, match="'carried' names 1 .* 'carried_inner' 0"):
        glob.append_op(
            "while",
            {"X": [i], "Condition": [cond]},
            {"Out": [i], "StepScopes": ["scopes"]},
            {"sub_block": body, "carried": [i.name], "carried_inner": [], "max_steps": 3},
        )


def _runaway_loop(size: int):
    """A loop the layer API accepts whose condition the body sets to true forever."""
    x = nf.data("x", [size], "float64")
    cond = L.fill_constant([1], "bool", True)
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.scale(x, 1.0, bias=1.0), output=x)
        L.assign(L.fill_constant([1], "bool", True), output=cond)
    return x, cond


def test_a_loop_without_a_gradient_keeps_one_step_scope_and_with_one_every_step():
    i, cond = _counted_while()
    scopes_var = nf.default_main_program().global_block().ops[-1].output("StepScopes")[0]
    (scopes,) = nf.Executor().run(fetch_list=[scopes_var], scope=nf.Scope(), return_numpy=False)
    assert len(scopes) == 1  # only the newest: values made in the body stay fetchable
    x = nf.data("x", [2], "float64")
    x.stop_gradient = False
    i2 = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 4)
    cond2 = L.less_than(i2, n)
    loop = nf.While(cond2)
    with loop.block():
        L.assign(L.tanh(x), output=x)
        L.increment(i2)
        L.less_than(i2, n, out=cond2)
    kept = nf.default_main_program().global_block().ops[-1].output("StepScopes")[0]
    nf.append_backward(L.mean(x))
    got = nf.Executor().run(
        feed={"x": np.ones(2)}, fetch_list=[kept, "x@GRAD"], scope=nf.Scope(), return_numpy=False
    )
    assert len(got[0]) == 4  # every step, for while_grad
    np.testing.assert_allclose(got[1], _tanh_chain_grad(4), rtol=1e-12)


def _tanh_chain_grad(steps: int) -> np.ndarray:
    """d mean(tanh^steps(x)) / dx at x = 1 (both elements)."""
    value, grad = 1.0, 0.5
    values = []
    for _ in range(steps):
        values.append(value)
        value = np.tanh(value)
    for v in reversed(values):
        grad *= 1 - np.tanh(v) ** 2
    return np.full(2, grad)


def test_a_runaway_loop_with_a_gradient_stops_at_the_kept_steps_limit(monkeypatch):
    monkeypatch.setattr(while_loop, "MAX_KEPT_STEPS", 50)
    x, _ = _runaway_loop(3)
    x.stop_gradient = False
    nf.append_backward(L.mean(x))
    with time_limit(30), pytest.raises(MaxStepsExceededError, match=r"after 50 iterations.*max"):
        nf.Executor().run(feed={"x": np.zeros(3)}, fetch_list=["x@GRAD"], scope=nf.Scope())


_RUNAWAY = """
import os, sys, threading, time
import numpy as np
import nestflow as nf
program = nf.Program.from_bytes(open(sys.argv[1], "rb").read())
feed = {"x": np.zeros(int(sys.argv[2]))}

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

def run():
    try:
        nf.Executor().run(program, feed=feed, scope=nf.Scope())
    except BaseException as exc:  # noqa: BLE001 (reported to the parent)
        print("ended", type(exc).__name__, exc, flush=True)
        os._exit(3)

threading.Thread(target=run, daemon=True).start()
time.sleep(1.0)
start = rss_mb()
time.sleep(2.0)
print(f"growth {rss_mb() - start:.1f}", flush=True)
os._exit(0)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads the child's RSS from /proc")
def test_a_hostile_runaway_loop_from_a_file_holds_bounded_memory(tmp_path):
    """A .pb whose while runs forever without a gradient op: it used to keep one step scope
    per iteration (17-27 MB/s); now its memory stays flat while it runs (each step holds
    0.8 MB, so keeping them would grow by hundreds of MB a second)."""
    size = 100_000
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        _runaway_loop(size)
    path = tmp_path / "runaway.pb"
    path.write_bytes(main.to_bytes())
    done = subprocess.run(
        [sys.executable, "-c", _RUNAWAY, str(path), str(size)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    growth = float(done.stdout.split("growth")[1])
    assert growth < 40, done.stdout


# ---- item 6: deep but legal nesting ----

_DEEP = """
import sys, time
import numpy as np
import nestflow as nf
L = nf.layers
kind, depth = sys.argv[1], int(sys.argv[2])
main, startup = nf.Program(), nf.Program()
with nf.program_guard(main, startup):
    x = nf.data("x", [-1, 2], "float64")
    x.stop_gradient = False
    w = L.create_parameter([2], "float64", name="w", initializer=nf.initializer.Constant(0.5))
    # Built level by level without recursion in this script: enter every level, then close
    # them innermost first.
    levels, v = [], x
    for _ in range(depth):
        if kind == "block":
            op = nf.BlockOp()
            cm = op.block()
            extra = None
        elif kind == "ifelse":
            op = nf.ifelse(L.greater_than(L.reduce_sum(v, dim=1, keep_dim=True), -1e9))
            cm = op.true_block()
            extra = v
        else:
            i = L.fill_constant([1], "int64", 0)
            n = L.fill_constant([1], "int64", 1)
            cond = L.less_than(i, n)
            acc = L.scale(v, 1.0)
            op = nf.While(cond)
            cm = op.block()
            extra = (i, n, cond, acc)
        cm.__enter__()
        levels.append((op, cm, extra))
        v = extra[3] if kind == "while" else v
    v = L.elementwise_mul(v, w)
    for op, cm, extra in reversed(levels):
        if kind == "block":
            op.output(v)
            cm.__exit__(None, None, None)
            v = op()[0]
        elif kind == "ifelse":
            op.output(v)
            cm.__exit__(None, None, None)
            with op.false_block():
                op.output(L.scale(extra, 1.0))
            v = op()[0]
        else:
            i, n, cond, acc = extra
            L.assign(v, output=acc)
            L.increment(i)
            L.less_than(i, n, out=cond)
            cm.__exit__(None, None, None)
            v = acc
    loss = L.mean(v)
assert sys.getrecursionlimit() == 1000


def check():
    xs = np.arange(6.0).reshape(3, 2)
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    (got,) = exe.run(main, feed={"x": xs}, fetch_list=[loss], scope=scope)
    assert np.isclose(got, (xs * 0.5).mean()), got
    small = nf.prune(main, [loss])  # every op is needed
    assert [len(b.ops) for b in small.blocks] == [len(b.ops) for b in main.blocks]
    data = main.clone().to_bytes()
    assert nf.Program.from_bytes(data).to_bytes() == data == main.to_bytes()
    with nf.program_guard(main, startup):
        nf.append_backward(loss)
    got = exe.run(main, feed={"x": xs}, fetch_list=["w@GRAD", "x@GRAD"], scope=scope)
    np.testing.assert_allclose(got[0], xs.mean(axis=0) / 2, rtol=1e-12)
    np.testing.assert_allclose(got[1], np.full((3, 2), 0.5 / 6), rtol=1e-12)
    assert sys.getrecursionlimit() == 1000
    print("ok", kind, depth)


if kind == "block":  # in a thread, whose C stack is the platform's default for threads
    import threading

    thread = threading.Thread(target=check)
    thread.start()
    thread.join()
else:
    check()
"""


def test_1000_levels_of_nesting_build_run_prune_clone_round_trip_and_differentiate():
    """IfElse, While and BlockOp nested 1000 deep (was ~162), each in a fresh process with
    the default recursion limit and C stack: all three at once."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_DEEP), kind, "1000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for kind in ("block", "ifelse", "while")
    ]
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0 and out.startswith("ok"), out + err[-3000:]


# ---- item 6: what still works beside the new errors ----


def test_create_var_of_an_existing_name_returns_it_when_nothing_differs():
    x = nf.data("x", [-1, 3])
    block = nf.default_main_program().global_block()
    assert block.create_var("x") is x
    assert block.create_var("x", shape=[-1, 3], dtype="float32") is x
    with pytest.raises(nf.errors.ShapeError, match=r"'x'.*\[5\]"):
        block.create_var("x", shape=[5])


def test_a_loaded_program_nested_deeper_than_nestflow_runs_is_refused_on_load(monkeypatch):
    from nestflow.framework import nesting

    monkeypatch.setattr(nesting, "MAX_NESTING", 30)
    main, _ = _nested_block_ops()
    desc = main.to_desc()
    parent = 2
    for _ in range(40):  # a chain of forward-only block ops below the innermost block
        idx = len(desc.blocks)
        desc.blocks.add(idx=idx, parent_idx=parent, forward_block_idx=-1)
        desc.blocks[parent].ops.add(type="block").attrs["sub_block"].block_idx = idx
        parent = idx
    with time_limit(20), pytest.raises(ProgramDecodeError, match="nests sub-blocks 43 deep"):
        nf.Program.from_bytes(desc.SerializeToString())
    monkeypatch.setattr(nesting, "MAX_NESTING", 50)
    loaded = nf.Program.from_bytes(desc.SerializeToString())
    (out,) = nf.Executor().run(
        loaded,
        feed={"x": np.ones((2, 2))},
        fetch_list=[loaded.global_block().ops[0].output("Out")[0]],
        scope=nf.Scope(),
    )
    np.testing.assert_array_equal(out, np.full((2, 2), 6.0))


def test_erase_vars_takes_any_iterable_of_names():
    scope = nf.Scope()
    for name in "abc":
        scope.var(name)
    scope.erase_vars(n for n in ("a", "b"))
    scope.erase_vars("c")
    assert scope.local_var_names() == []
