"""Every nf.optimizer against torch.optim (Lamb against a NumPy reference of the paper's rule):
the same float64 MLP, data and hyper-parameters, 20 steps, parameters equal to 1e-10, with and
without weight decay."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from tests.optimizer.mlp import SHAPES, TorchModel, batches, build, init_params, start, value

torch = pytest.importorskip("torch")

O = nf.optimizer
L2 = nf.regularizer.L2Decay
STEPS = 20


class NumpyLamb:
    """LAMB (You et al. 2019, with Adam's bias correction as Fluid's lamb op) in NumPy, applied
    to torch tensors' .data: r = m_hat / (sqrt(v_hat) + eps) + wd * x,
    x -= lr * (||x|| / ||r||) * r (ratio 1 where a norm is 0)."""

    def __init__(self, params, lr, weight_decay, beta1=0.9, beta2=0.999, eps=1e-6, exclude=()):
        self.params, self.lr, self.wd = params, lr, weight_decay
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.exclude = set(exclude)
        self.m = [np.zeros(p.shape) for p in params]
        self.v = [np.zeros(p.shape) for p in params]
        self.t = 0

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        for i, p in enumerate(self.params):
            x, g = p.detach().numpy(), p.grad.numpy()
            self.m[i] = b1 * self.m[i] + (1 - b1) * g
            self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
            m_hat = self.m[i] / (1 - b1**self.t)
            v_hat = self.v[i] / (1 - b2**self.t)
            wd = 0.0 if i in self.exclude else self.wd
            r = m_hat / (np.sqrt(v_hat) + self.eps) + wd * x
            x_norm, r_norm = np.linalg.norm(x), np.linalg.norm(r)
            ratio = x_norm / r_norm if x_norm > 0 and r_norm > 0 else 1.0
            with torch.no_grad():
                p.copy_(torch.tensor(x - self.lr * ratio * r))


CASES = {
    "sgd": (lambda: O.SGD(0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "sgd-wd": (
        lambda: O.SGD(0.1, weight_decay=0.05),
        lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.05),
    ),
    "sgd-l2decay": (
        lambda: O.SGDOptimizer(0.1, regularization=L2(0.05)),
        lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.05),
    ),
    "momentum": (
        lambda: O.Momentum(0.05, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    ),
    "nesterov-l2decay": (
        lambda: O.Momentum(0.05, momentum=0.8, use_nesterov=True, regularization=L2(0.1)),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
    ),
    "adam": (lambda: O.Adam(0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)),
    "adam-l2decay": (
        lambda: O.AdamOptimizer(0.01, beta1=0.8, beta2=0.99, regularization=L2(0.1)),
        lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
    ),
    "adagrad": (
        lambda: O.Adagrad(0.1, epsilon=1e-6),
        lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-6),
    ),
    "adagrad-init-l2decay": (
        lambda: O.AdagradOptimizer(
            0.1, epsilon=1e-8, initial_accumulator_value=0.5, regularization=L2(0.05)
        ),
        lambda ps: torch.optim.Adagrad(
            ps, lr=0.1, eps=1e-8, initial_accumulator_value=0.5, weight_decay=0.05
        ),
    ),
    "rmsprop": (
        lambda: O.RMSProp(0.01, rho=0.9, epsilon=1e-6),
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, eps=1e-6),
    ),
    "rmsprop-centered-momentum": (
        lambda: O.RMSPropOptimizer(0.01, rho=0.95, epsilon=1e-6, momentum=0.5, centered=True),
        lambda ps: torch.optim.RMSprop(
            ps, lr=0.01, alpha=0.95, eps=1e-6, momentum=0.5, centered=True
        ),
    ),
    "rmsprop-momentum-l2decay": (
        lambda: O.RMSProp(0.01, rho=0.9, epsilon=1e-6, momentum=0.9, regularization=L2(0.1)),
        lambda ps: torch.optim.RMSprop(
            ps, lr=0.01, alpha=0.9, eps=1e-6, momentum=0.9, weight_decay=0.1
        ),
    ),
    "adadelta": (
        lambda: O.Adadelta(1.0, rho=0.9, epsilon=1e-6),
        lambda ps: torch.optim.Adadelta(ps, lr=1.0, rho=0.9, eps=1e-6),
    ),
    "adadelta-lr-l2decay": (
        lambda: O.AdadeltaOptimizer(0.5, rho=0.95, epsilon=1e-5, regularization=L2(0.1)),
        lambda ps: torch.optim.Adadelta(ps, lr=0.5, rho=0.95, eps=1e-5, weight_decay=0.1),
    ),
    "adamax": (lambda: O.Adamax(0.02), lambda ps: torch.optim.Adamax(ps, lr=0.02)),
    "adamax-l2decay": (
        lambda: O.AdamaxOptimizer(0.02, beta1=0.8, beta2=0.99, epsilon=1e-6, weight_decay=0.1),
        lambda ps: torch.optim.Adamax(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    ),
    "adamw-no-decay": (
        lambda: O.AdamW(0.01, weight_decay=0.0),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.0),
    ),
    "adamw-default-decay": (
        lambda: O.AdamW(0.01),
        lambda ps: torch.optim.AdamW(ps, lr=0.01),  # both default to weight_decay=0.01
    ),
    "adamw-decay": (
        lambda: O.AdamW(0.02, beta1=0.85, weight_decay=0.5),
        lambda ps: torch.optim.AdamW(ps, lr=0.02, betas=(0.85, 0.999), weight_decay=0.5),
    ),
    "lamb-no-decay": (
        lambda: O.Lamb(0.01, lamb_weight_decay=0.0),
        lambda ps: NumpyLamb(ps, lr=0.01, weight_decay=0.0),
    ),
    "lamb-decay": (
        lambda: O.LambOptimizer(0.02, lamb_weight_decay=0.1, beta1=0.8, epsilon=1e-8),
        lambda ps: NumpyLamb(ps, lr=0.02, weight_decay=0.1, beta1=0.8, eps=1e-8),
    ),
}


def _train(make_nf, make_torch, rng, lr_var=None):
    loss, ops, params_grads = build(make_nf())
    init = init_params(rng)
    scope = start(init)
    model = TorchModel(init, make_torch)
    exe = nf.Executor()
    for xs, ys in batches(rng, STEPS):
        (got,) = exe.run(feed={"x": xs, "y": ys}, fetch_list=[loss], scope=scope)
        np.testing.assert_allclose(got, model.step(xs, ys), rtol=1e-10)
    return init, scope, model, ops, params_grads


@pytest.mark.parametrize("case", list(CASES))
def test_twenty_steps_equal_torch(case, rng):
    init, scope, model, ops, params_grads = _train(*CASES[case], rng)
    assert len(ops) == 4 and {p.name for p, _ in params_grads} == set(SHAPES)
    for name in SHAPES:
        ref = model.numpy(name)
        assert np.abs(ref - init[name]).max() > 1e-3, name  # the parameters did move
        np.testing.assert_allclose(value(scope, name), ref, rtol=1e-10, atol=1e-12, err_msg=name)


def test_lamb_zero_parameter_moves_and_excluded_parameters_get_no_decay(rng):
    """A zero bias has trust ratio 1 (it moves); exclude_from_weight_decay_fn takes the biases
    out of the decay."""
    init = init_params(rng)
    init["fc2.b"] = np.zeros(2)
    biases = [i for i, name in enumerate(SHAPES) if name.endswith(".b")]
    opt = O.Lamb(0.05, lamb_weight_decay=0.3, exclude_from_weight_decay_fn=lambda p: ".b" in p.name)
    loss, ops, _ = build(opt)
    assert [op.attr("weight_decay") for op in ops] == [0.3, 0.0, 0.3, 0.0]
    scope = start(init)
    model = TorchModel(init, lambda ps: NumpyLamb(ps, 0.05, 0.3, exclude=biases))
    for xs, ys in batches(rng, 5):
        nf.Executor().run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
    assert np.abs(value(scope, "fc2.b")).max() > 1e-3
    for name in SHAPES:
        np.testing.assert_allclose(value(scope, name), model.numpy(name), rtol=1e-10, atol=1e-12)


def test_adamw_apply_decay_param_fun_limits_the_decay(rng):
    """Decay on the weights only equals torch AdamW with two parameter groups."""
    opt = O.AdamW(0.02, weight_decay=0.3, apply_decay_param_fun=lambda name: name.endswith(".w"))
    loss, ops, _ = build(opt)
    init = init_params(rng)
    scope = start(init)

    def groups(ps):
        weights, biases = ps[0::2], ps[1::2]  # SHAPES order: w, b, w, b
        return torch.optim.AdamW(
            [{"params": weights}, {"params": biases, "weight_decay": 0.0}],
            lr=0.02,
            weight_decay=0.3,
        )

    model = TorchModel(init, groups)
    for xs, ys in batches(rng, 10):
        nf.Executor().run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
    for name in SHAPES:
        np.testing.assert_allclose(value(scope, name), model.numpy(name), rtol=1e-10, atol=1e-12)


def test_a_schedule_as_learning_rate_equals_torch_with_the_same_rates(rng):
    """Momentum reading exponential_decay's variable equals torch with lr set each step."""
    loss, _, _ = build()
    lr = nf.layers.exponential_decay(0.1, decay_steps=4, decay_rate=0.5, dtype="float64")
    O.Momentum(lr, momentum=0.9).minimize(loss)
    init = init_params(rng)
    scope = start(init)
    model = TorchModel(init, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    for step, (xs, ys) in enumerate(batches(rng, 12)):
        for group in model.opt.param_groups:
            group["lr"] = 0.1 * 0.5 ** (step / 4)
        nf.Executor().run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
    for name in SHAPES:
        np.testing.assert_allclose(value(scope, name), model.numpy(name), rtol=1e-10, atol=1e-12)
