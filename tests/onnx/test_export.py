"""nf.onnx.export and `nestflow export`: the demo and example models round-trip through ONNX
(onnxruntime equals nestflow to 1e-5), the model's interface (symbolic batch dim, parameters
as initializers, outputs named as the fetches), every supported opset, the errors, and the file
written whole or not at all."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import (
    AttrError,
    FeedError,
    FetchError,
    FileWriteError,
    ShapeError,
    TypeMismatchError,
    UnknownOpError,
)
from tests.onnx.export_harness import compare, nestflow_run, roundtrip, session

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from nestflow.onnx.exporter import MAX_OPSET, MIN_OPSET, NOT_EXPORTED  # noqa: E402

L = nf.layers
ROOT = Path(__file__).resolve().parents[2]


def _train(main, startup, feeds, loss, steps=3):
    """A scope whose parameters (and batch_norm statistics) a few Adam steps have moved."""
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    for _ in range(steps):
        exe.run(main, feed=feeds, fetch_list=[loss], scope=scope)
    return scope


def _digits(n, rng, shape=(64,)):
    return rng.normal(size=(n, *shape)).astype("f4"), rng.integers(0, 10, (n, 1)).astype("i8")


def _mlp_program():
    from nestflow.cli import demo_mlp

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 64])
        label = nf.data("label", [-1, 1], "int64")
        probabilities = demo_mlp.mlp(x)
        loss = L.mean(L.cross_entropy(probabilities, label))
        nf.optimizer.Adam(1e-2).minimize(loss)
    return main, startup, probabilities, loss


# ---- the demo and example models ----


def test_mlp_demo_model_round_trips():
    main, startup, probabilities, loss = _mlp_program()
    rng = np.random.default_rng(0)
    xs, ys = _digits(16, rng)
    scope = _train(main, startup, {"x": xs, "label": ys}, loss)
    runs = [{"x": _digits(n, rng)[0]} for n in (1, 7, 0)]
    model = roundtrip(main, scope, runs[0], [probabilities], runs=runs[1:])
    # the interface: a symbolic batch dim, the trained parameters as initializers
    (x_info,) = model.graph.input
    dims = x_info.type.tensor_type.shape.dim
    assert x_info.name == "x" and dims[0].dim_param == "N" and dims[1].dim_value == 64
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for name in ("hidden.w", "hidden.b", "probabilities.w", "probabilities.b"):
        want = scope.find_var(name).get(nf.Tensor).numpy()
        np.testing.assert_array_equal(initializers[name], want)
    assert not any("adam" in name or "moment" in name for name in initializers)
    assert [o.name for o in model.graph.output] == [probabilities.name]


@pytest.mark.parametrize("opset", range(MIN_OPSET, MAX_OPSET + 1))
def test_every_supported_opset(opset):
    main, startup, probabilities, _ = _mlp_program()
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    rng = np.random.default_rng(opset)
    model = roundtrip(main, scope, {"x": _digits(5, rng)[0]}, [probabilities], opset=opset)
    assert model.opset_import[0].version == opset


def test_conv_demo_model_round_trips_with_trained_batch_norm():
    """The conv demo's training program exported as is: pruned to the prediction and switched
    to inference (batch_norm on its moved running statistics); onnxruntime equals the demo's
    own test program."""
    from nestflow.cli import demo_conv

    model = demo_conv.build_model()
    rng = np.random.default_rng(1)
    xs, ys = _digits(12, rng, (1, 8, 8))
    scope = _train(model.main, model.startup, {"x": xs, "label": ys}, model.loss)
    mean = scope.find_var(_batch_norm_mean(model.main)).get(nf.Tensor).numpy()
    assert np.abs(mean).max() > 0  # the running statistics moved
    runs = [{"x": _digits(n, rng, (1, 8, 8))[0]} for n in (1, 7, 0)]
    exported = roundtrip(model.main, scope, runs[0], [model.probabilities], runs=runs[1:])
    sess = session(exported)
    for feed in runs[:2]:
        n = len(feed["x"])
        (want,) = nf.Executor().run(
            model.test,
            feed={**feed, "label": np.zeros((n, 1), "i8")},
            fetch_list=[model.probabilities],
            scope=scope,
        )
        compare(sess.run(None, feed), [want], ["probabilities"], 1e-5, 1e-5)


def _batch_norm_mean(program) -> str:
    op = next(op for op in program.global_block().ops if op.type == "batch_norm")
    return op.input("Mean")[0]


def test_recognize_digits_conv_example_network():
    namespace = runpy.run_path(str(ROOT / "examples" / "recognize_digits_conv.py"), run_name="ex")
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        img = nf.data("img", [-1, 1, 8, 8])
        label = nf.data("label", [-1, 1], "int64")
        prediction = namespace["convolutional_neural_network"](img)
        loss = L.mean(L.cross_entropy(prediction, label))
        nf.optimizer.Adam(1e-3).minimize(loss)
    rng = np.random.default_rng(2)
    xs, ys = _digits(8, rng, (1, 8, 8))
    scope = _train(main, startup, {"img": xs, "label": ys}, loss, steps=2)
    runs = [{"img": _digits(n, rng, (1, 8, 8))[0]} for n in (3, 1, 0)]
    roundtrip(main, scope, runs[0], [prediction], runs=runs[1:])


def test_rnn_demo_saved_model_exported_by_the_cli(tmp_path, capsys):
    """The RNN demo saved with save_inference_model, exported by `nestflow export`, run by
    onnxruntime on unequal lengths: equal to nestflow's run of the loaded model."""
    from nestflow.cli import demo_rnn
    from nestflow.cli.main import main as cli

    model = demo_rnn.build_model()
    rng = np.random.default_rng(3)
    data = demo_rnn.make_sequences(32, rng)
    feed = {"x": data.x, "lengths": data.lengths, "label": data.labels}
    scope = _train(model.main, model.startup, feed, model.loss)
    model_dir = tmp_path / "rnn"
    nf.io.save_inference_model(
        str(model_dir), ["x", "lengths"], [model.probabilities], model.main, scope
    )
    out = tmp_path / "rnn.onnx"
    assert cli(["export", str(model_dir), str(out), "--opset", "15"]) == 0
    assert "wrote" in capsys.readouterr().out
    exported = onnx.load(str(out))
    onnx.checker.check_model(exported, full_check=True)
    assert exported.opset_import[0].version == 15
    program, feeds, fetches, loaded = nf.io.load_inference_model(str(model_dir))
    sess = session(exported)
    for n in (9, 1, 0):
        batch = demo_rnn.make_sequences(n, rng)
        run = {"x": batch.x, "lengths": batch.lengths}
        assert len(set(batch.lengths.tolist())) > 1 or n < 2  # unequal lengths
        want = nf.Executor().run(program, feed=run, fetch_list=fetches, scope=loaded)
        compare(sess.run(None, run), want, fetches, 1e-5, 1e-5)


def test_cli_export_errors(tmp_path, capsys):
    from nestflow.cli.main import main as cli

    assert cli(["export", str(tmp_path / "missing"), str(tmp_path / "m.onnx")]) == 1
    assert "nestflow: error:" in capsys.readouterr().err
    main, startup, probabilities, _ = _mlp_program()
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    nf.io.save_inference_model(str(tmp_path / "mlp"), ["x"], [probabilities], main, scope)
    code = cli(["export", str(tmp_path / "mlp"), str(tmp_path / "m.onnx"), "--opset", "9"])
    assert code == 1
    assert "opset_version 9 is not supported" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


def test_sequence_models_lstm_and_gru_cells():
    """LSTMCell and GRUCell run by nf.layers.rnn over padded sequences with lengths (the fused
    lstm_unit and gru_cell step ops inside a Loop)."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, -1, 3])
        lengths = nf.data("lengths", [-1], "int64")
        lstm_out, (h, c) = L.rnn(L.LSTMCell(4), x, sequence_length=lengths)
        gru_out, last = L.rnn(L.GRUCell(5), lstm_out, sequence_length=lengths)
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    rng = np.random.default_rng(4)

    def feed(lens, steps):
        return {
            "x": rng.normal(size=(len(lens), steps, 3)).astype("f4"),
            "lengths": np.array(lens, np.int64),
        }

    runs = [feed([4, 1, 3], 4), feed([2], 2), feed([5, 5, 0, 2, 3, 1, 4], 5)]
    roundtrip(main, scope, runs[0], [lstm_out, h, c, gru_out, last], runs=runs[1:])


@pytest.mark.skipif(not hasattr(nf.layers, "lstm"), reason="nf.layers.lstm has not landed")
def test_lstm_and_gru_layers():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, -1, 3])
        lengths = nf.data("lengths", [-1], "int64")
        out, last_h, last_c = L.lstm(x, 4, lengths=lengths, num_layers=2, is_bidirec=True)
        g_out, g_last = L.gru(out, 3, lengths=lengths)
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    rng = np.random.default_rng(5)
    runs = [
        {"x": rng.normal(size=(len(ls), t, 3)).astype("f4"), "lengths": np.array(ls, np.int64)}
        for ls, t in (([3, 1, 2], 3), ([1], 1), ([4, 2, 4, 3], 4))
    ]
    roundtrip(main, scope, runs[0], [out, last_h, last_c, g_out, g_last], runs=runs[1:])


# ---- errors ----


def _fc_program():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4])
        y = L.fc(x, 3, name="fc")
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    return main, scope, x, y


def test_an_op_without_export_is_named_with_its_source_line(tmp_path):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4])
        shown = L.Print(L.relu(x), message="h")  # the line the error must name
        y = L.scale(shown, 2.0)
    line = f"{Path(__file__).name}:{_line_of('shown = L.Print')}"
    with pytest.raises(UnknownOpError) as info:
        nf.onnx.export(main, tmp_path / "m.onnx", ["x"], [y], nf.Scope())
    message = str(info.value)
    assert "op 'print'" in message and NOT_EXPORTED["print"] in message
    assert line in message
    assert not (tmp_path / "m.onnx").exists()


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "_line_of" not in line)


def test_a_random_op_does_not_export(tmp_path):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4])
        noise = main.global_block().create_var("noise", (4,), "float32")
        main.global_block().append_op(
            "uniform_random", outputs={"Out": [noise]}, attrs={"shape": [4]}
        )
        y = x + noise
    with pytest.raises(UnknownOpError, match="op 'uniform_random'.*random ops"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["x"], [y], nf.Scope())


def test_training_ops_do_not_export(tmp_path):
    """Exporting from a training program exports its inference part: clone(for_test=True)
    drops the backward and optimizer ops (as Fluid's save_inference_model), so a parameter the
    optimizer updates is exported as its value; a gradient op not marked as training (built
    by hand) is still refused."""
    main, startup, _, loss = _mlp_program()
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    path = str(tmp_path / "weights.onnx")
    nf.onnx.export(main, path, ["x", "label"], ["hidden.w"], scope)
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    dtypes = {"tensor(float)": "float32", "tensor(int64)": "int64"}
    feed = {
        i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], dtypes[i.type])
        for i in session.get_inputs()
    }
    (weights,) = session.run(None, feed)
    np.testing.assert_array_equal(weights, scope.find_var("hidden.w").get(nf.Tensor).numpy())
    for op in main.global_block().ops:
        op.attrs["op_role"] = 0  # as if the gradient ops had been appended by hand
    with pytest.raises(UnknownOpError, match="_grad' cannot be exported.*training"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["x", "label"], ["hidden.w"], scope)


def test_collective_ops_do_not_export(tmp_path):
    from nestflow.ops.registry import has_op

    if not has_op("c_allreduce_sum"):
        pytest.skip("the collective ops of nf.distributed are not in this tree")
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4])
        total = main.global_block().create_var("total")
        main.global_block().append_op("c_allreduce_sum", {"X": [x]}, {"Out": [total]})
    with pytest.raises(UnknownOpError, match="op 'c_allreduce_sum'.*MPI ranks"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["x"], [total], nf.Scope())


@pytest.mark.parametrize("opset", [MIN_OPSET - 1, MAX_OPSET + 1, "17"])
def test_opsets_outside_the_supported_range(opset, tmp_path):
    main, scope, x, y = _fc_program()
    with pytest.raises(AttrError, match=f"{MIN_OPSET} to {MAX_OPSET}|must be an int"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["x"], [y], scope, opset_version=opset)


def test_scatter_adding_needs_opset_16(tmp_path):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3])
        ids = nf.data("ids", [-1], "int64")
        out = L.scatter(x, ids, x, overwrite=False)
    with pytest.raises(AttrError, match="opset >= 16.*opset 13"):
        nf.onnx.export(
            main, str(tmp_path / "unused.onnx"), ["x", "ids"], [out], nf.Scope(), opset_version=13
        )


def test_a_dim_that_cannot_be_resolved_is_a_shape_error(tmp_path):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3, -1, -1])
        block = main.global_block()
        out = block.create_var("pooled")
        block.append_op(
            "pool2d",
            {"X": [x]},
            {"Out": [out]},
            {"pooling_type": "avg", "ksize": [2, 2], "adaptive": True},
        )
    with pytest.raises(ShapeError, match="adaptive pool2d.*height and width.*-1"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["x"], [out], nf.Scope())


def test_missing_feeds_and_parameters_are_feed_errors(tmp_path):
    main, scope, x, y = _fc_program()
    with pytest.raises(FeedError, match="'x'.*neither fed.*feed_names"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), [], [y], scope)
    with pytest.raises(FeedError, match="'fc.w'.*no value in the scope.*startup"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["x"], [y], nf.Scope())
    with pytest.raises(FeedError, match="feed 'nope' is not a variable"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["nope"], [y], scope)
    with pytest.raises(FetchError, match="fetch 'nope' is not a variable"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["x"], ["nope"], scope)
    with pytest.raises(FetchError, match="names 'fc.tmp_1' twice"):
        nf.onnx.export(main, str(tmp_path / "unused.onnx"), ["x"], [y, y], scope)
    with pytest.raises(TypeMismatchError, match="Program"):
        nf.onnx.export(main.to_bytes(), str(tmp_path / "unused.onnx"), ["x"], [y], scope)


def test_a_fetch_that_is_a_feed_or_a_parameter(tmp_path):
    main, scope, x, y = _fc_program()
    feed = {"x": np.ones((2, 4), "f4")}
    roundtrip(main, scope, feed, [x, "fc.w", y])


# ---- the file ----


def test_a_failed_export_leaves_the_old_file_and_no_temporary(tmp_path):
    main, scope, x, y = _fc_program()
    path = tmp_path / "model.onnx"
    path.write_bytes(b"the previous model")
    with pytest.raises(AttrError):
        nf.onnx.export(main, path, ["x"], [y], scope, opset_version=99)
    assert path.read_bytes() == b"the previous model"
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_a_write_that_fails_half_way_leaves_the_old_file(tmp_path, monkeypatch):
    from nestflow.io import atomic

    main, scope, x, y = _fc_program()
    path = tmp_path / "model.onnx"
    path.write_bytes(b"the previous model")

    def broken(file, data):
        file.write(data[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "write_chunks", broken)
    with pytest.raises(FileWriteError, match="No space left"):
        nf.onnx.export(main, path, ["x"], [y], scope)
    assert path.read_bytes() == b"the previous model"
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_export_replaces_the_file_and_returns_the_model(tmp_path):
    main, scope, x, y = _fc_program()
    path = tmp_path / "model.onnx"
    path.write_bytes(b"old")
    model = nf.onnx.export(main, path, ["x"], [y], scope)
    assert onnx.load(str(path)) == model
    feed = {"x": np.arange(8, dtype="f4").reshape(2, 4)}
    compare(session(model).run(None, feed), nestflow_run(main, scope, feed, [y]), ["y"], 1e-5, 1e-5)


def test_nestflow_imports_without_onnx_and_export_says_what_to_install():
    """import nestflow (and nestflow.onnx) never imports onnx; export without it names the
    extra to install."""
    code = (
        "import sys\n"
        "sys.modules['onnx'] = None\n"  # as if onnx were not installed
        "import nestflow as nf, nestflow.onnx\n"
        "assert 'onnxruntime' not in sys.modules\n"
        "try:\n"
        "    nf.onnx.export(nf.Program(), 'x.onnx', [], [])\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'nestflow[onnx]'" in done.stdout


def test_sentiment_demo_model_bidirectional_lstm():
    """The understand_sentiment model (embedding, bidirectional LSTM over each review's length,
    max pool over time, fc), on batches trimmed to their longest review as the demo feeds."""
    demo = pytest.importorskip("nestflow.cli.demo_sentiment")
    model = demo.build_model()
    rng = np.random.default_rng(6)
    data = demo.make_reviews(40, rng)
    scope = _train(model.main, model.startup, demo.feed_of(data, slice(0, 32)), model.loss, 2)
    runs = [
        {k: v for k, v in demo.feed_of(data, rows).items() if k != "label"}
        for rows in (slice(0, 9), slice(9, 10), np.array([3, 17, 25, 31]))
    ]
    roundtrip(model.main, scope, runs[0], [model.probabilities], runs=runs[1:])


@pytest.mark.parametrize("beam", [1, 4])
def test_translation_demo_attention_decoder(beam):
    """The machine_translation model's inference program: a bidirectional GRU encoder, then
    beam search (greedy for one beam) with an attention GRU cell."""
    demo = pytest.importorskip("nestflow.cli.demo_translate")
    training = demo.build_training()
    scope = nf.Scope()
    nf.Executor().run(training.startup, scope=scope)
    decoding = demo.build_decoding(beam)
    rng = np.random.default_rng(7)
    runs = []
    for n in (5, 1):
        pairs = demo.make_pairs(n, rng)
        runs.append({"src": pairs.src[:, : int(pairs.src_len.max())], "src_len": pairs.src_len})
    fetches = [decoding.ids, decoding.scores]
    roundtrip(decoding.program, scope, runs[0], fetches, runs=runs[1:])
