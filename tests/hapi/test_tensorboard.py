"""nf.callbacks.TensorBoard (issue 33, item 5): the scalars written per step and per epoch, read
back from the event files with the protobuf tensorboardX ships, and the program's graph."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import nestflow as nf

tensorboardX = pytest.importorskip(
    "tensorboardX",
    reason="the tensorboard extra is not installed (pip install -e '.[tensorboard]')",
)
from tensorboardX.proto import event_pb2, graph_pb2  # noqa: E402


def read_events(log_dir: Path) -> list:
    """Every event of the directory's event files (TFRecord framing: a little-endian u64
    length, its CRC, the record, the record's CRC)."""
    events = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            events.append(event_pb2.Event.FromString(data[at + 12 : at + 12 + length]))
            at += 12 + length + 4
    return events


def scalars(events) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for event in events:
        for value in event.summary.value:
            found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def _model(optimizer):
    nf.seed(0)
    model = nf.Model(
        lambda x: nf.layers.fc(x, 2, act="softmax"),
        inputs=nf.InputSpec([None, 4], "float32", "x"),
        labels=nf.InputSpec([None, 1], "int64", "label"),
    )
    model.prepare(optimizer, nf.layers.cross_entropy, nf.metric.Accuracy())
    return model


def test_scalars_per_step_and_epoch_read_back(tmp_path):
    x, y = _data()
    model = _model(nf.optimizer.Adam(0.05))
    history = model.fit(
        (x, y),
        eval_data=(x, y),
        batch_size=8,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[nf.callbacks.TensorBoard(tmp_path)],
    )
    found = scalars(read_events(tmp_path))
    assert [s for s, _ in found["train/loss"]] == list(range(6))  # 3 steps an epoch
    assert [s for s, _ in found["epoch/loss"]] == [0, 1]
    for key in ("loss", "acc", "eval_loss", "eval_acc"):
        got = [v for _, v in found[f"epoch/{key}"]]
        np.testing.assert_allclose(got, [h[key] for h in history], rtol=1e-6)
    # The last step's running mean is the epoch's mean.
    np.testing.assert_allclose(found["train/loss"][2][1], history[0]["loss"], rtol=1e-6)
    assert [v for _, v in found["train/lr"]] == pytest.approx([0.05] * 6)


def test_a_schedules_rate_is_logged_without_advancing_it(tmp_path):
    x, y = _data()

    def optimizer():
        return nf.optimizer.SGD(nf.layers.exponential_decay(0.1, decay_steps=1, decay_rate=0.5))

    logged, plain = _model(optimizer), _model(optimizer)
    logged.fit(
        (x, y),
        batch_size=8,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[nf.callbacks.TensorBoard(tmp_path, graph=False)],
    )
    plain.fit((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    rates = [v for _, v in scalars(read_events(tmp_path))["train/lr"]]
    assert rates == pytest.approx([0.1, 0.05, 0.025])  # the rate each step used
    for var in nf.io.persistable_vars(logged.train_program):  # the schedule went on as without
        a = logged.scope.find_var(var.name).get(nf.Tensor).numpy()
        b = plain.scope.find_var(var.name).get(nf.Tensor).numpy()
        np.testing.assert_array_equal(a, b, err_msg=var.name)


def test_the_program_graph_is_written(tmp_path):
    x, y = _data()
    model = _model(nf.optimizer.Adam(0.01))
    model.fit(
        (x, y), batch_size=8, epochs=1, verbose=0, callbacks=[nf.callbacks.TensorBoard(tmp_path)]
    )
    graphs = [e.graph_def for e in read_events(tmp_path) if e.graph_def]
    assert len(graphs) == 1
    nodes = {n.name: n for n in graph_pb2.GraphDef.FromString(graphs[0]).node}
    assert "inputs/x" in nodes and "inputs/fc_0.w" in nodes
    assert nodes["inputs/fc_0.w"].op == "Parameter"
    mul = next(n for name, n in nodes.items() if name.startswith("mul_"))
    assert set(mul.input) == {"inputs/x", "inputs/fc_0.w"}
    assert any(name.startswith("backward/") for name in nodes)
    assert any(name.startswith("optimizer/adam") for name in nodes)
    assert all(i in nodes for n in nodes.values() for i in n.input)
