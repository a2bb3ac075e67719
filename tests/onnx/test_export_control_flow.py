"""Control flow exported to ONNX and run by onnxruntime equals nestflow's run (1e-5, float32):
per-row IfElse (all-true, all-false, mixed, empty batch), the seed IfElse/RNN programs, RNNs
with unequal lengths, While loops with tensor arrays, whole-batch cond, BlockOp, nesting."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

import nestflow as nf
from tests.onnx.export_harness import roundtrip

pytest.importorskip("onnxruntime")

L = nf.layers
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def programs():
    """A fresh main/startup pair as the default programs, and a scope."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        yield main, startup
    # (leaving the guard restores the previous default programs)


def _initialised(startup):
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    return scope


def _ops(model) -> list[str]:
    found = []

    def walk(graph):
        for node in graph.node:
            found.append(node.op_type)
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g)

    walk(model.graph)
    return found


# ---- per-row IfElse ----


def _ifelse_model(programs):
    main, startup = programs
    x = L.data("x", [-1, 3])
    flag = L.data("flag", [-1, 1], "bool")
    bias = L.create_parameter([3], "float32", name="shift")
    ie = nf.ifelse(flag)
    with ie.true_block():
        h = L.fc(x, 4, act="tanh", name="t_fc")
        ie.output(h, L.reduce_sum(h, dim=[1], keep_dim=True))
    with ie.false_block():
        d = L.elementwise_add(x, bias)
        h = L.fc(d, 4, name="f_fc")
        ie.output(L.relu(h), L.reduce_max(h, dim=[1], keep_dim=True))
    out, score = ie()
    return main, startup, [out, score]


@pytest.mark.parametrize(
    "flags",
    [[True] * 5, [False] * 5, [True, False, False, True, False], [], [True], [False]],
    ids=["all-true", "all-false", "mixed", "empty", "one-true", "one-false"],
)
def test_per_row_ifelse(programs, flags):
    main, startup, fetches = _ifelse_model(programs)
    scope = _initialised(startup)
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.normal(size=(len(flags), 3)).astype("f4"),
        "flag": np.array(flags, bool).reshape(-1, 1),
    }
    model = roundtrip(main, scope, feed, fetches)
    assert "ScatterND" in _ops(model) and "If" not in _ops(model)


def test_per_row_ifelse_one_model_serves_every_split(programs):
    main, startup, fetches = _ifelse_model(programs)
    scope = _initialised(startup)
    rng = np.random.default_rng(1)
    runs = [
        {"x": rng.normal(size=(n, 3)).astype("f4"), "flag": rng.random((n, 1)) < p}
        for n, p in ((7, 0.5), (7, 1.0), (7, 0.0), (1, 0.5), (0, 0.5))
    ]
    roundtrip(main, scope, runs[0], fetches, runs=runs[1:])


def _example(name: str):
    """Run examples/<name> as a script: its main() builds the seed program in the default
    programs (here a fresh pair), runs it and prints it. Returns the pair."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        runpy.run_path(str(ROOT / "examples" / name), run_name="__main__")
    return main, startup


def _op(program, op_type: str):
    return next(op for op in program.global_block().ops if op.type == op_type)


def test_seed_ifelse_program_as_written():
    """examples/seed_ifelse.py's program exported with no feeds (its minibatches are
    constants), and again with the minibatches fed: rows of any count and any split."""
    main, startup = _example("seed_ifelse.py")
    ifelse = _op(main, "ifelse")
    scope = _initialised(startup)
    roundtrip(main, scope, {}, ifelse.input("Cond") + ifelse.output("Out"))
    rows = [[10, 20, 30], [16], [1, 2], [40, 50, 60, 70], []]
    runs = [{name: np.array(r, "f4").reshape(-1, 1) for name in ifelse.input("X")} for r in rows]
    roundtrip(main, scope, runs[0], ifelse.output("Out"), runs=runs[1:])


# ---- RNN ----


def test_seed_rnn_program_as_written():
    main, startup = _example("seed_rnn.py")
    rnn = _op(main, "recurrent")
    fetches = rnn.output("Outputs") + rnn.output("FinalMemories")
    model = roundtrip(main, _initialised(startup), {}, fetches)
    assert "Loop" in _ops(model)


def _tanh_rnn(hidden=3, features=2, with_init=True):
    x = L.data("x", [-1, -1, features])
    lengths = L.data("lengths", [-1], "int64")
    h0 = L.data("h0", [-1, hidden]) if with_init else None
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        if with_init:
            h = rnn.memory(init=h0)
        else:
            h = rnn.memory(shape=[hidden], value=0.5, batch_ref=x)
        z = L.fc(xt, hidden, name="in") + L.fc(
            rnn.previous_memory(h), hidden, bias_attr=False, name="rec"
        )
        new = L.tanh(z)
        rnn.update_memory(h, new)
        rnn.output(new, xt)
    out, echoed = rnn()
    return out, echoed, rnn.final_memory(h)


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_rnn_with_unequal_lengths(programs, opset):
    main, startup = programs
    fetches = _tanh_rnn()
    scope = _initialised(startup)
    rng = np.random.default_rng(2)

    def feed(lengths, steps):
        n = len(lengths)
        return {
            "x": rng.normal(size=(n, steps, 2)).astype("f4"),
            "lengths": np.array(lengths, np.int64),
            "h0": rng.normal(size=(n, 3)).astype("f4"),
        }

    runs = [
        feed([5, 2, 0, 3], 5),
        feed([1], 1),
        feed([4, 4, 1, 2, 3, 0, 2], 4),
        feed([], 3),
        feed([0, 0], 0),  # no time steps: outputs [batch, 0, ...], memories their boots
    ]
    model = roundtrip(main, scope, runs[0], fetches, runs=runs[1:], opset=opset)
    assert "Loop" in _ops(model)


def test_rnn_memory_by_shape_without_lengths(programs):
    main, startup = programs
    x = L.data("x", [-1, -1, 2])
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x)
        h = rnn.memory(shape=[3], value=0.5, batch_ref=x)
        c = rnn.memory(shape=[3], batch_ref=x)
        new_c = L.fc(xt, 3, name="cell") + c
        new_h = L.sigmoid(L.fc(rnn.previous_memory(h), 3, name="hid") + new_c)
        rnn.update_memory(h, new_h)
        rnn.update_memory(c, new_c)
        rnn.output(new_h)
    out = rnn()
    scope = _initialised(startup)
    rng = np.random.default_rng(3)
    runs = [{"x": rng.normal(size=(n, t, 2)).astype("f4")} for n, t in ((3, 4), (1, 1), (0, 2))]
    roundtrip(main, scope, runs[0], [out, rnn.final_memory(h)], runs=runs[1:])


def test_rnn_demo_model_with_unequal_lengths():
    from nestflow.cli import demo_rnn

    model = demo_rnn.build_model()
    scope = _initialised(model.startup)
    rng = np.random.default_rng(4)
    data = [demo_rnn.make_sequences(n, rng) for n in (9, 1, 0)]
    runs = [{"x": d.x, "lengths": d.lengths} for d in data]
    roundtrip(model.main, scope, runs[0], [model.probabilities], runs=runs[1:])


def test_ifelse_inside_an_rnn_step(programs):
    main, startup = programs
    x = L.data("x", [-1, -1, 1])
    lengths = L.data("lengths", [-1], "int64")
    w = L.create_parameter([1], "float32", name="w", initializer=nf.initializer.Constant(0.7))
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(shape=[1], batch_ref=x)
        ie = nf.ifelse(L.greater_than(xt, L.fill_constant([1], "float32", 0.0)))
        with ie.true_block():
            ie.output(L.tanh(L.elementwise_mul(h, w) + xt))
        with ie.false_block():
            ie.output(L.sigmoid(L.elementwise_mul(h, w) - xt))
        (new,) = ie()
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    rng = np.random.default_rng(5)
    feed = {"x": rng.normal(size=(3, 4, 1)).astype("f4"), "lengths": np.array([4, 2, 3])}
    roundtrip(main, _initialised(startup), feed, [out])


def test_rnn_inside_an_ifelse_branch(programs):
    main, startup = programs
    x = L.data("x", [-1, -1, 1])
    sel = L.data("sel", [-1, 1], "bool")
    w = L.create_parameter([1], "float32", name="w", initializer=nf.initializer.Constant(0.7))
    ie = nf.ifelse(sel)
    with ie.true_block():
        rnn = nf.rnn()
        with rnn.step():
            xt = rnn.step_input(x)
            h = rnn.memory(shape=[1], batch_ref=x)
            rnn.update_memory(h, L.tanh(L.elementwise_mul(h, w) + xt))
        ie.output(rnn.final_memory(h))
    with ie.false_block():
        ie.output(L.reduce_sum(x, dim=1) * w)
    (out,) = ie()
    rng = np.random.default_rng(6)
    runs = [
        {"x": rng.normal(size=(n, 3, 1)).astype("f4"), "sel": rng.random((n, 1)) < 0.5}
        for n in (4, 1, 6)
    ]
    roundtrip(main, _initialised(startup), runs[0], [out], runs=runs[1:])


# ---- While ----


def _tanh_loop(steps: int, max_steps=None):
    """x_{t+1} = tanh(x_t @ w) for `steps` steps, each x_{t+1} also written to an array
    (tests/layers/test_while.py's loop)."""
    x = L.data("x", [-1, 2])
    w = L.create_parameter([2, 2], "float32", name="w", initializer=nf.initializer.Uniform(-1, 1))
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", steps)
    cond = L.less_than(i, n)
    array = L.create_array("float32")
    loop = nf.While(cond, max_steps=max_steps)
    with loop.block():
        h = L.tanh(L.matmul(x, w))
        L.assign(h, output=x)
        L.array_write(h, i, array)
        L.increment(i)
        L.less_than(i, n, out=cond)
    return x, i, array


@pytest.mark.parametrize(("steps", "opset"), [(0, 17), (1, 17), (4, 17), (4, 13), (4, 21)])
def test_while_loop_with_a_tensor_array(programs, steps, opset):
    main, startup = programs
    x, i, array = _tanh_loop(steps)
    fetches = [x, i, L.array_length(array)]
    if steps:
        fetches.append(L.array_to_tensor(array))
        fetches.append(L.array_read(array, L.fill_constant([1], "int64", steps - 1)))
    scope = _initialised(startup)
    rng = np.random.default_rng(7)
    runs = [{"x": rng.normal(size=(n, 2)).astype("f4")} for n in (3, 1, 0)]
    model = roundtrip(main, scope, runs[0], fetches, runs=runs[1:], opset=opset)
    assert "Loop" in _ops(model)


def test_while_with_max_steps_that_stops_in_time(programs):
    main, startup = programs
    x, i, _ = _tanh_loop(5, max_steps=5)
    feed = {"x": np.random.default_rng(8).normal(size=(2, 2)).astype("f4")}
    roundtrip(main, _initialised(startup), feed, [x, i])


def test_while_overwriting_array_elements(programs):
    """array_write at an index the array has replaces that element."""
    main, startup = programs
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 6)
    zero = L.fill_constant([1], "int64", 0)
    cond = L.less_than(i, n)
    x = L.data("x", [-1, 2])
    array = L.create_array("float32")
    L.array_write(L.scale(x, 0.0), zero, array)
    loop = nf.While(cond)
    with loop.block():
        slot = L.elementwise_sub(
            i,
            L.elementwise_mul(
                L.elementwise_div(i, L.fill_constant([1], "int64", 2)),
                L.fill_constant([1], "int64", 2),
            ),
        )
        L.array_write(L.scale(x, 1.0, bias=1.0) * L.cast(i, "float32"), slot, array)
        L.increment(i)
        L.less_than(i, n, out=cond)
    fetches = [L.array_to_tensor(array), L.array_length(array)]
    feed = {"x": np.random.default_rng(9).normal(size=(3, 2)).astype("f4")}
    roundtrip(main, _initialised(startup), feed, fetches)


def test_while_counting_with_a_condition_on_data(programs):
    """Halve x until its sum falls below a limit: the number of iterations depends on the
    fed data."""
    main, startup = programs
    x = L.data("x", [-1, 3])
    limit = L.fill_constant([1], "float32", 1.0)
    count = L.fill_constant([1], "int64", 0)
    cond = L.greater_than(L.reshape(L.reduce_sum(L.abs(x), dim=[0, 1]), [1]), limit)
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.scale(x, 0.5), output=x)
        L.increment(count)
        L.assign(
            L.greater_than(L.reshape(L.reduce_sum(L.abs(x), dim=[0, 1]), [1]), limit), output=cond
        )
    rng = np.random.default_rng(10)
    runs = [
        {"x": (rng.normal(size=(n, 3)) * s).astype("f4")} for n, s in ((4, 10), (1, 0.1), (2, 100))
    ]
    roundtrip(main, _initialised(startup), runs[0], [x, count], runs=runs[1:])


# ---- whole-batch cond, BlockOp ----


@pytest.mark.parametrize(("sign", "opset"), [(1.0, 17), (-1.0, 17), (-1.0, 13), (1.0, 21)])
def test_cond_exports_as_if(programs, sign, opset):
    main, startup = programs
    x = L.data("x", [-1, 4])
    zero = L.fill_constant([1], "float32", 0.0)
    pred = L.less_than(L.reshape(L.reduce_sum(x, dim=[0, 1]), [1]), zero)
    out = L.cond(pred, lambda: L.fc(x, 2, name="neg_fc"), lambda: L.relu(x[:, :2] * 2.0))
    scope = _initialised(startup)
    rng = np.random.default_rng(11)
    runs = [{"x": (sign * np.abs(rng.normal(size=(n, 4)))).astype("f4")} for n in (3, 1)]
    model = roundtrip(main, scope, runs[0], [out], runs=runs[1:], opset=opset)
    assert "If" in _ops(model)


def test_cond_both_ways_in_one_model(programs):
    main, startup = programs
    x = L.data("x", [-1, 4])
    zero = L.fill_constant([1], "float32", 0.0)
    pred = L.less_than(L.reshape(L.reduce_sum(x, dim=[0, 1]), [1]), zero)
    out = L.cond(pred, lambda: L.tanh(x), lambda: L.sigmoid(x) * 3.0)
    rng = np.random.default_rng(12)
    runs = [{"x": (s * np.abs(rng.normal(size=(2, 4)))).astype("f4")} for s in (1, -1, 1)]
    roundtrip(main, _initialised(startup), runs[0], [out], runs=runs[1:])


def test_block_op_is_inlined(programs):
    main, startup = programs
    x = L.data("x", [-1, 3])
    op = nf.BlockOp()
    with op.block():
        h = L.fc(x, 5, act="relu", name="inner")
        op.output(L.scale(h, 2.0))
    (out,) = op()
    feed = {"x": np.random.default_rng(13).normal(size=(4, 3)).astype("f4")}
    model = roundtrip(main, _initialised(startup), feed, [out])
    assert "Loop" not in _ops(model) and "If" not in _ops(model)


# ---- beam search decoding (While, tensor arrays, top_k, gather_tree) ----


@pytest.mark.parametrize("beam", [1, 3])
def test_beam_search_decoder(programs, beam):
    from tests.layers.test_decode import TinyModel

    main, startup = programs
    model = TinyModel(seed=3, end_bias=1.0)
    h0 = L.data("h0", [-1, model.hidden], "float64")
    decoder = model.decoder(beam)
    ids, final, lengths = L.dynamic_decode(decoder, inits=h0, max_step_num=6, return_length=True)
    scope = _initialised(startup)
    model.load(scope)
    rng = np.random.default_rng(14)
    runs = [{"h0": rng.normal(size=(n, model.hidden))} for n in (4, 1)]
    fetches = [ids, final.log_probs, lengths, final.finished]
    exported = roundtrip(main, scope, runs[0], fetches, runs=runs[1:], atol=1e-9, rtol=1e-9)
    assert {"Loop", "TopK"} <= set(_ops(exported))
