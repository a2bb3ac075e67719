"""Models imported with nf.onnx.load export again: PyTorch models exported by torch.onnx (a CNN
with batch norm and pooling, a bidirectional LSTM) and a nestflow model exported and imported
back; the re-exported model run by onnxruntime equals the original model run by onnxruntime,
and nestflow's run of the imported program."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import nestflow as nf
from tests.onnx.export_harness import compare, roundtrip, session

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from nestflow.onnx.exporter import build_model  # noqa: E402


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(6)
        self.fc = torch.nn.Linear(6 * 3 * 3, 4)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return torch.softmax(self.fc(torch.flatten(x, 1)), dim=1)


class BiLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 5, batch_first=True, bidirectional=True)

    def forward(self, x):
        y, (h, _) = self.rnn(x)
        return y, h


def _torch_onnx(module, example) -> bytes:
    module.eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module,
            (example,),
            buffer,
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
            opset_version=17,
        )
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("module", "shape"), [(CNN, (3, 6, 6)), (BiLSTM, (5, 4))], ids=["cnn", "bilstm"]
)
def test_a_torch_model_imported_exports_again(module, shape):
    torch.manual_seed(0)
    original = _torch_onnx(module(), torch.zeros(2, *shape))
    scope = nf.Scope()
    program, feeds, fetches = nf.onnx.load(original, scope)
    rng = np.random.default_rng(0)
    runs = [{feeds[0]: rng.normal(size=(n, *shape)).astype("f4")} for n in (2, 1, 5)]
    model = roundtrip(program, scope, runs[0], fetches, runs=runs[1:])
    names = [f.name for f in fetches]
    reference, again = session(onnx.load_from_string(original)), session(model)
    for feed in runs:
        compare(again.run(None, feed), reference.run(None, feed), names, 1e-5, 1e-5)


def test_a_nestflow_model_exported_imported_and_exported_again():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 6])
        h = nf.layers.fc(x, 8, act="tanh")
        y = nf.layers.fc(nf.layers.layer_norm(h), 3, act="softmax")
    scope = nf.Scope()
    nf.Executor().run(startup, scope=scope)
    first = build_model(main, ["x"], [y], scope)
    imported = nf.Scope()
    program, feeds, fetches = nf.onnx.load(first, imported)
    rng = np.random.default_rng(1)
    runs = [{feeds[0]: rng.normal(size=(n, 6)).astype("f4")} for n in (4, 1, 0)]
    second = roundtrip(program, imported, runs[0], fetches, runs=runs[1:])
    for feed in runs:
        compare(session(second).run(None, feed), session(first).run(None, feed), ["y"], 1e-6, 1e-6)
