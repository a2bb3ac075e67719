"""Gradients of gradients (issue 31): nf.gradients on a program that already holds gradient
ops. WGAN-GP penalties (an MLP and a conv critic), a MAML inner step and a Hessian-vector
product equal torch.autograd.grad(..., create_graph=True) in float64 to 1e-10; an op without
a second order is an error naming it, and a failed call leaves the program unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.layers.helper import append_op

torch = pytest.importorskip("torch")
F = torch.nn.functional
L = nf.layers
rng = np.random.default_rng(0)


def _param(name, value):
    return L.create_parameter(list(value.shape), "float64", name=name)


def _run(main, feed, fetch):
    return nf.Executor().run(main, feed=feed, fetch_list=fetch, scope=nf.Scope())


def _t(value, grad=True):
    return torch.tensor(value, dtype=torch.float64, requires_grad=grad)


def _close(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=1e-10, atol=1e-10)


def _penalty(critic_out, x_hat):
    """WGAN-GP: mean over the batch of (||d critic / d x_hat||_2 - 1)^2."""
    (g,) = nf.gradients(critic_out, x_hat)
    flat = L.reshape(g, [0, -1])
    norm = L.sqrt(L.reduce_sum(L.square(flat), dim=[1]))
    return L.reduce_mean(L.square(norm - 1.0))


def _torch_penalty(out, x_hat):
    (g,) = torch.autograd.grad(out.sum(), x_hat, create_graph=True)
    return ((g.reshape(len(g), -1).square().sum(1).sqrt() - 1) ** 2).mean()


def test_wgan_gp_penalty_of_an_mlp_equals_torch():
    values = {
        "w1": rng.standard_normal((2, 16)) * 0.5,
        "b1": rng.standard_normal(16) * 0.1,
        "w2": rng.standard_normal((16, 16)) * 0.3,
        "b2": rng.standard_normal(16) * 0.1,
        "w3": rng.standard_normal((16, 1)) * 0.3,
    }
    real, fake = rng.standard_normal((8, 2)), rng.standard_normal((8, 2)) + 2
    alpha = rng.uniform(size=(8, 1))
    x_hat = alpha * real + (1 - alpha) * fake
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x_hat", [-1, 2], "float64")
        x.stop_gradient = False
        p = {k: _param(k, v) for k, v in values.items()}
        h = L.leaky_relu(L.elementwise_add(L.mul(x, p["w1"]), p["b1"]), alpha=0.2)
        h = L.tanh(L.elementwise_add(L.mul(h, p["w2"]), p["b2"]))
        d = L.mul(h, p["w3"])
        pen = _penalty(d, x)
        grads = nf.gradients(pen, list(p.values()))
    got = _run(main, {"x_hat": x_hat, **values}, [pen, *grads])
    t = {k: _t(v) for k, v in values.items()}
    tx = _t(x_hat)
    th = F.leaky_relu(tx @ t["w1"] + t["b1"], 0.2)
    th = torch.tanh(th @ t["w2"] + t["b2"])
    tpen = _torch_penalty(th @ t["w3"], tx)
    _close(got, [tpen, *torch.autograd.grad(tpen, list(t.values()))])


def test_wgan_gp_penalty_of_a_conv_critic_equals_torch():
    values = {
        "k1": rng.standard_normal((4, 1, 3, 3)) * 0.4,
        "c1": rng.standard_normal(4) * 0.1,
        "k2": rng.standard_normal((6, 4, 3, 3)) * 0.3,
        "w": rng.standard_normal((6 * 2 * 2, 1)) * 0.3,
    }
    x_hat = rng.standard_normal((3, 1, 8, 8))
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x_hat", [-1, 1, 8, 8], "float64")
        x.stop_gradient = False
        p = {k: _param(k, v) for k, v in values.items()}
        h = append_op("conv2d", {"Input": x, "Filter": p["k1"]}, {"paddings": [1, 1]}, ("Output",))
        h = L.softplus(L.elementwise_add(h, p["c1"], axis=1))
        h = append_op(
            "conv2d",
            {"Input": h, "Filter": p["k2"]},
            {"strides": [2, 2], "paddings": [1, 1]},
            ("Output",),
        )
        h = L.pool2d(L.gelu(h), pool_size=2, pool_type="avg", pool_stride=2)
        d = L.mul(L.reshape(h, [0, -1]), p["w"])
        pen = _penalty(d, x)
        grads = nf.gradients(pen, list(p.values()))
    got = _run(main, {"x_hat": x_hat, **values}, [pen, *grads])
    t = {k: _t(v) for k, v in values.items()}
    tx = _t(x_hat)
    th = F.softplus(F.conv2d(tx, t["k1"], padding=1) + t["c1"].reshape(1, -1, 1, 1))
    th = F.avg_pool2d(F.gelu(F.conv2d(th, t["k2"], stride=2, padding=1)), 2)
    tpen = _torch_penalty(th.reshape(3, -1) @ t["w"], tx)
    _close(got, [tpen, *torch.autograd.grad(tpen, list(t.values()))])


def test_wgan_gp_penalty_of_a_conv_critic_with_batch_norm_and_max_pooling_equals_torch():
    values = {
        "k1": rng.standard_normal((4, 1, 3, 3)) * 0.4,
        "bn.w": 1.0 + rng.standard_normal(4) * 0.2,
        "bn.b": rng.standard_normal(4) * 0.1,
        "k2": rng.standard_normal((5, 4, 3, 3)) * 0.3,
        "w": rng.standard_normal((5 * 3 * 3, 1)) * 0.3,
    }
    running = {"bn.mean": rng.standard_normal(4) * 0.1, "bn.variance": rng.uniform(0.5, 2, 4)}
    x_hat = rng.standard_normal((3, 1, 7, 7))
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x_hat", [-1, 1, 7, 7], "float64")
        x.stop_gradient = False
        p = {k: _param(k, v) for k, v in values.items() if not k.startswith("bn.")}
        h = append_op("conv2d", {"Input": x, "Filter": p["k1"]}, {"paddings": [1, 1]}, ("Output",))
        h = L.batch_norm(h, name="bn", epsilon=1e-4)  # training: the batch's statistics
        h = L.pool2d(L.leaky_relu(h, alpha=0.2), pool_size=2, pool_type="max", pool_stride=2)
        h = append_op("conv2d", {"Input": h, "Filter": p["k2"]}, {"paddings": [1, 1]}, ("Output",))
        h = L.pool2d(L.tanh(h), pool_size=3, pool_type="max", pool_padding=1)
        d = L.mul(L.reshape(h, [0, -1]), p["w"])
        pen = _penalty(d, x)
        params = [main.global_block().var(k) for k in values]
        grads = nf.gradients(pen, params)
    got = _run(main, {"x_hat": x_hat, **values, **running}, [pen, *grads])
    t = {k: _t(v) for k, v in values.items()}
    tx = _t(x_hat)
    th = F.conv2d(tx, t["k1"], padding=1)
    th = F.batch_norm(
        th,
        _t(running["bn.mean"], False),
        _t(running["bn.variance"], False),
        t["bn.w"],
        t["bn.b"],
        training=True,
        eps=1e-4,
    )
    th = F.max_pool2d(F.leaky_relu(th, 0.2), 2, 2)
    th = F.max_pool2d(torch.tanh(F.conv2d(th, t["k2"], padding=1)), 3, 1, padding=1)
    tpen = _torch_penalty(th.reshape(3, -1) @ t["w"], tx)
    _close(got, [tpen, *torch.autograd.grad(tpen, list(t.values()))])


def test_wgan_gp_penalty_of_a_conv_critic_with_layer_norm_equals_torch():
    values = {
        "k1": rng.standard_normal((3, 2, 3, 3)) * 0.4,
        "ln.w": 1.0 + rng.standard_normal(3 * 5 * 5) * 0.2,
        "ln.b": rng.standard_normal(3 * 5 * 5) * 0.1,
        "w": rng.standard_normal((3 * 3 * 3, 1)) * 0.3,
    }
    x_hat = rng.standard_normal((4, 2, 5, 5))
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x_hat", [-1, 2, 5, 5], "float64")
        x.stop_gradient = False
        p = {k: _param(k, v) for k, v in values.items() if not k.startswith("ln.")}
        h = append_op("conv2d", {"Input": x, "Filter": p["k1"]}, {"paddings": [1, 1]}, ("Output",))
        h = L.gelu(L.layer_norm(h, name="ln"))
        h = L.pool2d(h, pool_size=3, pool_type="max", pool_stride=2, pool_padding=1)
        d = L.mul(L.reshape(h, [0, -1]), p["w"])
        pen = _penalty(d, x)
        params = [main.global_block().var(k) for k in values]
        grads = nf.gradients(pen, params)
    got = _run(main, {"x_hat": x_hat, **values}, [pen, *grads])
    t = {k: _t(v) for k, v in values.items()}
    tx = _t(x_hat)
    th = F.conv2d(tx, t["k1"], padding=1)
    th = F.layer_norm(th, (3, 5, 5), t["ln.w"].reshape(3, 5, 5), t["ln.b"].reshape(3, 5, 5))
    th = F.max_pool2d(F.gelu(th), 3, 2, padding=1)
    tpen = _torch_penalty(th.reshape(4, -1) @ t["w"], tx)
    _close(got, [tpen, *torch.autograd.grad(tpen, list(t.values()))])


def test_maml_inner_step_differentiated_back_to_theta_equals_torch():
    values = {"w1": rng.standard_normal((3, 8)) * 0.5, "w2": rng.standard_normal((8, 4)) * 0.5}
    xs, ys = rng.standard_normal((6, 3)), rng.integers(0, 4, (6, 1))
    xq, yq = rng.standard_normal((5, 3)), rng.integers(0, 4, (5, 1))
    lr = 0.3

    def net(x, w1, w2):
        return L.mul(L.sigmoid(L.mul(x, w1)), w2)

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x_s, y_s = nf.data("xs", [-1, 3], "float64"), nf.data("ys", [-1, 1], "int64")
        x_q, y_q = nf.data("xq", [-1, 3], "float64"), nf.data("yq", [-1, 1], "int64")
        theta = [_param(k, v) for k, v in values.items()]
        inner = L.mean(L.cross_entropy(L.softmax(net(x_s, *theta)), y_s))
        grads = nf.gradients(inner, theta)
        adapted = [L.elementwise_sub(w, L.scale(g, scale=lr)) for w, g in zip(theta, grads)]
        outer = L.mean(L.cross_entropy(L.softmax(net(x_q, *adapted)), y_q))
        meta = nf.gradients(outer, theta)
    got = _run(main, {"xs": xs, "ys": ys, "xq": xq, "yq": yq, **values}, [outer, *meta])

    t = [_t(v) for v in values.values()]

    def tnet(x, w1, w2):
        return torch.sigmoid(torch.tensor(x) @ w1) @ w2

    tin = F.cross_entropy(tnet(xs, *t), torch.tensor(ys[:, 0]))
    tg = torch.autograd.grad(tin, t, create_graph=True)
    tout = F.cross_entropy(tnet(xq, *[w - lr * g for w, g in zip(t, tg)]), torch.tensor(yq[:, 0]))
    _close(got, [tout, *torch.autograd.grad(tout, t)])


def test_hessian_vector_product_equals_torch():
    w0, v0 = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    xv = rng.standard_normal((7, 4))
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4], "float64")
        v = nf.data("v", [4, 3], "float64")
        w = _param("w", w0)
        loss = L.reduce_sum(L.softmax(L.tanh(L.matmul(x, w))) * L.exp(L.matmul(x, w) * 0.5))
        (g,) = nf.gradients(loss, w)
        (hv,) = nf.gradients(L.reduce_sum(L.elementwise_mul(g, v)), w)
    got = _run(main, {"x": xv, "v": v0, "w": w0}, [g, hv])
    tw, tx = _t(w0), _t(xv, False)
    tloss = (torch.softmax(torch.tanh(tx @ tw), -1) * torch.exp(tx @ tw * 0.5)).sum()
    (tg,) = torch.autograd.grad(tloss, tw, create_graph=True)
    (thv,) = torch.autograd.grad((tg * _t(v0, False)).sum(), tw)
    _close(got, [tg, thv])
    assert hv.name != g.name and hv.name.startswith("w@GRAD")


def _snapshot(program):
    return [(len(b.ops), sorted(b.vars)) for b in program.blocks], program.num_blocks


def test_an_op_without_a_second_order_is_an_error_and_leaves_the_program_unchanged():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 1, 4, 4], "float64")
        x.stop_gradient = False
        d = L.reduce_sum(L.group_norm(x, groups=1))
        (g,) = nf.gradients(d, x)
        s = L.reduce_sum(L.square(g))
        before = _snapshot(main)
        with pytest.raises(
            nf.errors.NestflowError,
            match="higher-order gradient of group_norm_grad is not supported",
        ):
            nf.gradients(s, x)
        assert _snapshot(main) == before


def test_third_order_through_a_grad_grad_kernel_is_an_error():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3], "float64")
        x.stop_gradient = False
        (g,) = nf.gradients(L.reduce_sum(L.tanh(x)), x)
        (h,) = nf.gradients(L.reduce_sum(g), x)
        s = L.reduce_sum(h)
        before = _snapshot(main)
        with pytest.raises(
            nf.errors.NestflowError, match="higher-order gradient of tanh_grad_grad"
        ):
            nf.gradients(s, x)
        assert _snapshot(main) == before
    xv = rng.standard_normal((2, 3))
    (hv,) = _run(main, {"x": xv}, [h])
    t = np.tanh(xv)
    np.testing.assert_allclose(hv, -2 * t * (1 - t * t), rtol=1e-12)


def test_a_failed_first_order_call_leaves_no_stray_seed():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3], "float64")
        x.stop_gradient = False
        y = L.reduce_sum(append_op("sign", {"X": x}) * x)
        before = _snapshot(main)
        with pytest.raises(nf.errors.NestflowError, match="'sign' has no gradient"):
            nf.gradients(y, x)
        assert _snapshot(main) == before
        assert "fill_constant" not in [op.type for op in main.global_block().ops]
