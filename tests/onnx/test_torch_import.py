"""PyTorch models exported with torch.onnx (the TorchScript exporter, dynamo=False) imported
with nf.onnx.load and compared with PyTorch's own outputs: an MLP, a small CNN (Conv,
BatchNormalization kept or folded, pooling, Flatten, Gemm, LogSoftmax), an LSTM and a GRU
with batch_first; the batch dim exported dynamic and run at several sizes. An imported MLP
trained one SGD step in nestflow equals the same step in PyTorch."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

import nestflow as nf  # noqa: E402

torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.tanh(self.fc1(x))), dim=-1)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 12, 3, stride=2, padding=(0, 1), groups=4)
        self.fc = torch.nn.Linear(12 * 3 * 3, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(x, 2, ceil_mode=True)
        x = torch.nn.functional.avg_pool2d(torch.relu(self.conv2(x)), (1, 2), padding=(0, 1))
        x = x.view(x.size(0), -1)
        return torch.log_softmax(self.fc(x), dim=1)


class Recurrent(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        cell = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
        self.rnn = cell(5, 7, num_layers=2, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(14, 3)

    def forward(self, x):
        y, state = self.rnn(x)
        h = state[0] if isinstance(state, tuple) else state
        return self.head(y[:, -1]), h


def exported(module, example, **kwargs) -> bytes:
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
            **kwargs,
        )
    return buffer.getvalue()


def check_module(module, shape, batches=(1, 4, 3), rtol=1e-4, atol=1e-5, **kwargs):
    data = exported(module, torch.randn(2, *shape), **kwargs)
    scope = nf.Scope()
    program, feeds, fetches = nf.onnx.load(data, scope)
    assert feeds == ["x"]
    for batch in batches:
        x = torch.randn(batch, *shape)
        with torch.no_grad():
            expected = module(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = nf.Executor().run(program, feed={"x": x.numpy()}, fetch_list=fetches, scope=scope)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == tuple(e.shape)
            np.testing.assert_allclose(g, e.numpy(), rtol=rtol, atol=atol)
    return program


def test_mlp():
    check_module(MLP(), (6,))


def test_cnn_with_batch_norm_folded_into_the_convolution():
    module = CNN()
    module.bn1.running_mean.uniform_(-1, 1)
    module.bn1.running_var.uniform_(0.5, 2)
    check_module(module, (3, 14, 16))


def test_cnn_with_batch_norm_kept():
    module = CNN()
    module.bn1.running_mean.uniform_(-1, 1)
    module.bn1.running_var.uniform_(0.5, 2)
    program = check_module(module, (3, 14, 16), do_constant_folding=False)
    assert "batch_norm" in {op.type for op in program.global_block().ops}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_two_layer_bidirectional_recurrent_batch_first(kind):
    program = check_module(Recurrent(kind), (6, 5), batches=(1, 3))
    assert "recurrent" in {op.type for op in program.global_block().ops}


def test_an_imported_mlp_trains_one_step_as_pytorch_does():
    module = MLP().double()
    data = exported(module, torch.randn(2, 6, dtype=torch.float64))
    scope = nf.Scope()
    program, feeds, (probs,) = nf.onnx.load(data, scope)
    startup = nf.Program()
    with nf.program_guard(program, startup):
        label = nf.data("label", [-1, 4], "float64")
        loss = nf.layers.mean(nf.layers.square(probs - label))
        nf.optimizer.SGD(learning_rate=0.5).minimize(loss)
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    x = torch.randn(5, 6, dtype=torch.float64)
    t = torch.rand(5, 4, dtype=torch.float64)
    (nf_loss,) = exe.run(
        program, feed={"x": x.numpy(), "label": t.numpy()}, fetch_list=[loss], scope=scope
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    torch_loss = torch.mean((module(x) - t) ** 2)
    optimizer.zero_grad()
    torch_loss.backward()
    optimizer.step()
    np.testing.assert_allclose(nf_loss, torch_loss.item(), rtol=1e-12)
    # the exporter names parameters after the module's (fc1.weight ...) or onnx::MatMul_*
    # for a transposed weight; compare the updated weights by value
    updated = [scope.find_var(p.name).get(nf.Tensor).numpy() for p in program.all_parameters()]
    for name, param in module.named_parameters():
        want = param.detach().numpy()
        assert any(
            u.shape == want.shape
            and np.allclose(u, want, rtol=1e-12, atol=1e-14)
            or u.shape == want.T.shape
            and np.allclose(u, want.T, rtol=1e-12, atol=1e-14)
            for u in updated
        ), name


class PlainLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 5, batch_first=True)

    def forward(self, x):
        y, (h, c) = self.lstm(x)  # no initial state: PyTorch exports constant zeros
        return y, h, c


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed_batch", "dynamic_batch"])
def test_lstm_exported_without_an_initial_state(dynamic):
    """Issue 30: the zero initial states of a fixed-batch export fold to constants, which the
    importer once passed to memory() as nothing ("memory() needs init= or shape=")."""
    module = PlainLSTM().eval()
    x = torch.randn(2, 4, 3)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), buffer, dynamo=False, input_names=["x"],
                          output_names=["y", "h", "c"], opset_version=17,
                          dynamic_axes={"x": {0: "batch"}} if dynamic else None)  # fmt: skip
    scope = nf.Scope()
    program, feeds, fetches = nf.onnx.load(buffer.getvalue(), scope)
    with torch.no_grad():
        expected = module(x)
    got = nf.Executor().run(program, feed={"x": x.numpy()}, fetch_list=fetches, scope=scope)
    for g, e in zip(got, expected):
        assert g.shape == tuple(e.shape)
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-6)
