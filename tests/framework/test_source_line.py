"""Each op records the user's line that built it (op.source, and every error about the op), not
a line of nestflow or of the standard library (contextlib's frames of a `with` block)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

import nestflow as nf
from nestflow.errors import MaxStepsExceededError, ShapeError

L = nf.layers


def _at(marker: str) -> str:
    """'this_file:line' of the statement containing `marker`."""
    lines = Path(__file__).read_text().splitlines()
    return f"{__file__}:{next(i + 1 for i, text in enumerate(lines) if marker in text)} "


def _ops(program: nf.Program) -> dict[str, nf.OpDesc]:
    return {op.type: op for block in program.blocks for op in block.ops}


def test_ops_built_inside_program_guard_name_the_users_line():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", shape=[-1, 2])
        L.relu(x)  # marker: guard-relu
    assert _ops(main)["relu"].source.startswith(_at("marker: guard-relu"))


def test_the_op_a_with_block_builds_on_exit_names_the_with_line_not_contextlib():
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 5)
    cond = L.less_than(i, n)
    loop = nf.While(cond, max_steps=2)
    with loop.block():  # marker: while-with
        L.increment(i)  # marker: while-increment
        L.less_than(i, n, out=cond)
    ops = _ops(nf.default_main_program())
    assert ops["while"].source.startswith(_at("marker: while-with"))
    assert ops["increment"].source.startswith(_at("marker: while-increment"))
    with pytest.raises(MaxStepsExceededError) as caught:
        nf.Executor().run(scope=nf.Scope())
    assert _at("marker: while-with").strip() in str(caught.value)


def test_ops_in_ifelse_branches_and_rnn_steps_name_the_users_lines():
    x = nf.data("x", shape=[-1, 2])
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.scale(x, scale=2.0))  # marker: ifelse-scale
    with ie.false_block():
        ie.output(L.tanh(x))
    ie(L.greater_than(L.reduce_sum(x, dim=[1], keep_dim=True), 0.0))  # marker: ifelse-call
    seq = nf.sequence([1.0, 2.0, 3.0])
    rnn = nf.rnn()
    with rnn.step():  # marker: rnn-step
        h = rnn.memory(shape=[1], batch_ref=seq)
        rnn.update_memory(h, L.sigmoid(L.elementwise_add(seq, h)))  # marker: rnn-sigmoid
        rnn.output(h)
    rnn()
    ops = _ops(nf.default_main_program())
    assert ops["scale"].source.startswith(_at("marker: ifelse-scale"))
    assert ops["ifelse"].source.startswith(_at("marker: ifelse-call"))
    assert ops["sigmoid"].source.startswith(_at("marker: rnn-sigmoid"))
    assert ops["recurrent"].source.startswith(_at("marker: rnn-step"))


def test_a_shape_error_inside_an_rnn_step_names_the_users_line():
    seq = nf.sequence([1.0, 2.0, 3.0])
    w = L.create_parameter([3, 4], "float32", name="w")
    rnn = nf.rnn()
    with rnn.step():
        h = rnn.memory(shape=[1], batch_ref=seq)
        with pytest.raises(ShapeError) as caught:
            L.matmul(seq, w)  # marker: rnn-matmul
        rnn.update_memory(h, L.elementwise_add(seq, h))
        rnn.output(h)
    assert _at("marker: rnn-matmul").strip() in str(caught.value)


def test_an_op_the_users_own_context_manager_builds_names_that_line():
    x = nf.data("x", shape=[-1, 2])

    @contextlib.contextmanager
    def then_sigmoid():
        yield
        L.sigmoid(x)  # marker: own-cm

    with then_sigmoid():
        pass
    assert _ops(nf.default_main_program())["sigmoid"].source.startswith(_at("marker: own-cm"))
