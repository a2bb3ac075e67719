"""A loop's parameter read by its gradient steps only as the right operand Y of a product
gradient (dX = dOut @ Y^T at every step) is given to them as the transpose of a contiguous
Y^T (StepRunner._laid_out): the same values, copied once per loop run, so each step's product
runs OpenBLAS's plain kernel. The parameter itself, and every other reader, is untouched."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.executor.executor import StepRunner
from nestflow.ops import register_op
from nestflow.ops.registry import _REGISTRY, get_op_def, place_args

L = nf.layers
STEPS, BATCH, N_IN, N_HID = 5, 3, 4, 6
LR = 0.5


def _tanh_rnn(also_reads_wh: bool):
    """h_t = tanh(x_t @ wx + h_{t-1} @ wh) (+ sum(wh) inside the step when `also_reads_wh`),
    loss = mean of the outputs, SGD."""
    x = L.data("x", [-1, STEPS, N_IN], "float64")
    wx = L.create_parameter([N_IN, N_HID], "float64", name="wx")
    wh = L.create_parameter([N_HID, N_HID], "float64", name="wh")
    h0 = L.fill_constant([BATCH, N_HID], "float64", 0.0)
    rnn = nf.rnn()
    with rnn.step():
        x_t = rnn.step_input(x)
        h = rnn.memory(init=h0)
        z = L.matmul(x_t, wx) + L.matmul(rnn.previous_memory(h), wh)
        if also_reads_wh:
            z = z + L.reduce_sum(wh)
        new = L.tanh(z)
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    loss = L.mean(out[0] if isinstance(out, list | tuple) else out)
    nf.optimizer.SGD(learning_rate=LR).minimize(loss)
    return loss


def _numpy_steps(xs, wx, wh, runs: int, also_reads_wh: bool):
    """`runs` SGD steps of _tanh_rnn by hand (backward through time written out)."""
    wx, wh = wx.copy(), wh.copy()
    for _ in range(runs):
        hs = [np.zeros((BATCH, N_HID))]
        for t in range(STEPS):
            z = xs[:, t] @ wx + hs[-1] @ wh + (wh.sum() if also_reads_wh else 0.0)
            hs.append(np.tanh(z))
        seed = 1.0 / (STEPS * BATCH * N_HID)
        gwx, gwh, dh = np.zeros_like(wx), np.zeros_like(wh), np.zeros((BATCH, N_HID))
        for t in reversed(range(STEPS)):
            dz = (dh + seed) * (1 - hs[t + 1] ** 2)
            gwx += xs[:, t].T @ dz
            gwh += hs[t].T @ dz + (dz.sum() if also_reads_wh else 0.0)
            dh = dz @ wh.T
        wx -= LR * gwx
        wh -= LR * gwh
    return wx, wh


def _y_layouts(monkeypatch, op_type: str) -> list[tuple[tuple[int, ...], bool, bool]]:
    """Every Y the `op_type` kernel is given from now on, as (shape, C-contiguous,
    F-contiguous)."""
    grad_def = get_op_def(op_type)
    kernel, layouts = grad_def.forward, []

    def spy(X, Y, *args, **kwargs):
        layouts.append((Y.shape, Y.flags.c_contiguous, Y.flags.f_contiguous))
        return kernel(X, Y, *args, **kwargs, **place_args(kernel))  # CPUPlace's, as bound

    monkeypatch.setattr(grad_def, "forward", spy)
    return layouts


@pytest.mark.parametrize("also_reads_wh", [False, True])
def test_a_parameter_only_a_product_gradient_reads_is_laid_out_transposed(
    rng, monkeypatch, also_reads_wh
):
    layouts = _y_layouts(monkeypatch, "matmul_grad")
    loss = _tanh_rnn(also_reads_wh)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(BATCH, STEPS, N_IN))
    wx0, wh0 = (scope.find_var(n).get(nf.Tensor).numpy().copy() for n in ("wx", "wh"))
    for _ in range(2):
        exe.run(feed={"x": xs}, fetch_list=[loss], scope=scope)

    # every step's product gradient got wh; laid out transposed unless another op reads it
    assert len(layouts) == 2 * STEPS
    assert {(c, f) for _, c, f in layouts} == (
        {(True, False)} if also_reads_wh else {(False, True)}
    )
    # the parameters themselves stay C-contiguous and train exactly as by hand
    want_wx, want_wh = _numpy_steps(xs, wx0, wh0, 2, also_reads_wh)
    for name, want in (("wx", want_wx), ("wh", want_wh)):
        got = scope.find_var(name).get(nf.Tensor).numpy()
        assert got.flags.c_contiguous
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_the_layout_follows_a_parameter_changed_between_runs(rng):
    """The copy is made per loop run: a parameter set anew (or updated) is seen by the next run."""
    _tanh_rnn(False)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(BATCH, STEPS, N_IN))
    wx0 = scope.find_var("wx").get(nf.Tensor).numpy().copy()
    for _ in range(2):
        wh0 = rng.normal(size=(N_HID, N_HID)) / N_HID
        scope.find_var("wh").get(nf.Tensor).set(wh0.copy())
        scope.find_var("wx").get(nf.Tensor).set(wx0.copy())
        exe.run(feed={"x": xs}, scope=scope)
        _, want_wh = _numpy_steps(xs, wx0, wh0, 1, False)
        got = scope.find_var("wh").get(nf.Tensor).numpy()
        np.testing.assert_allclose(got, want_wh, rtol=1e-12, atol=1e-14)


def test_an_fc_weight_in_the_step_is_laid_out_for_mul_grad(rng, monkeypatch):
    """h_t = tanh(fc(x_t) + fc(h_{t-1})): the fc's mul_grad gets its weight laid out too; the
    weight gradients equal central differences."""
    layouts = _y_layouts(monkeypatch, "mul_grad")
    x = L.data("x", [-1, STEPS, N_IN], "float64")
    h0 = L.fill_constant([BATCH, N_HID], "float64", 0.0)
    rnn = nf.rnn()
    with rnn.step():
        x_t = rnn.step_input(x)
        h = rnn.memory(init=h0)
        z = L.fc(x_t, N_HID, bias_attr=False, name="in") + L.fc(
            rnn.previous_memory(h), N_HID, bias_attr=False, name="rec"
        )
        new = L.tanh(z)
        rnn.update_memory(h, new)
        rnn.output(new)
    out = rnn()
    loss = L.reduce_sum(out[0] if isinstance(out, list | tuple) else out)
    nf.append_backward(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(BATCH, STEPS, N_IN))
    w_in, w_rec = (scope.find_var(n).get(nf.Tensor).numpy().copy() for n in ("in.w", "rec.w"))
    (got,) = exe.run(feed={"x": xs}, fetch_list=["rec.w@GRAD"], scope=scope)
    assert ((N_HID, N_HID), False, True) in layouts

    def total(w_rec_value):
        h = np.zeros((BATCH, N_HID))
        value = 0.0
        for t in range(STEPS):
            h = np.tanh(xs[:, t] @ w_in + h @ w_rec_value)
            value += h.sum()
        return value

    want, eps = np.zeros_like(w_rec), 1e-6
    for i in np.ndindex(*w_rec.shape):
        up, down = w_rec.copy(), w_rec.copy()
        up[i] += eps
        down[i] -= eps
        want[i] = (total(up) - total(down)) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


class TouchStepScopesOp:
    """Test-only: looks up `name` in every step scope it is given by name, which turns the
    scopes' held values into Variables (the gradient op then runs those steps by name)."""

    type = "test_touch_step_scopes"
    inputs, outputs = ("Scopes",), ("Out",)
    attrs = {"name": ""}

    def run(ctx):
        for scope in ctx.input("Scopes"):
            assert scope.find_local_var(ctx.attrs["name"]) is not None
        ctx.set_output("Out", np.zeros(1))


@pytest.fixture
def touch_op():
    register_op(TouchStepScopesOp)
    yield
    _REGISTRY.pop(TouchStepScopesOp.type)


def test_steps_run_by_name_get_the_laid_out_parameter_too(rng, monkeypatch, touch_op):
    layouts = _y_layouts(monkeypatch, "matmul_grad")
    loss = _tanh_rnn(False)
    block = nf.default_main_program().global_block()
    index = next(i for i, op in enumerate(block.ops) if op.type == "recurrent")
    step_value = block.ops[index].attrs["sub_block"].ops[-1].output_names()[0]
    block.create_var("touched", [1], "float64")
    block.insert_op(
        index + 1,
        TouchStepScopesOp.type,
        {"Scopes": [block.ops[index].output("StepScopes")[0]]},
        {"Out": ["touched"]},
        {"name": step_value},
    )
    by_name = []
    run = StepRunner.run
    monkeypatch.setattr(StepRunner, "run", lambda self, *a: by_name.append(1) or run(self, *a))
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.normal(size=(BATCH, STEPS, N_IN))
    wx0, wh0 = (scope.find_var(n).get(nf.Tensor).numpy().copy() for n in ("wx", "wh"))
    exe.run(feed={"x": xs}, fetch_list=[loss], scope=scope)

    assert len(by_name) == STEPS and {(c, f) for _, c, f in layouts} == {(False, True)}
    want_wx, want_wh = _numpy_steps(xs, wx0, wh0, 1, False)
    for name, want in (("wx", want_wx), ("wh", want_wh)):
        got = scope.find_var(name).get(nf.Tensor).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
