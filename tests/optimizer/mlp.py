"""The model the optimizer tests train in nestflow and in torch with the same data: a float64
tanh MLP regression, loss = mean((fc2(tanh(fc1(x))) - y)^2)."""

from __future__ import annotations

import nestflow as nf

L = nf.layers
SHAPES = {"fc1.w": (4, 3), "fc1.b": (3,), "fc2.w": (3, 2), "fc2.b": (2,)}


def build(opt=None, fc1_attr=None):
    """The loss variable (and, with `opt`, its minimize result): (loss, ops, params_grads)."""
    x = L.data("x", [-1, 4], "float64")
    y = L.data("y", [-1, 2], "float64")
    hidden = L.fc(x, 3, act="tanh", name="fc1", param_attr=fc1_attr)
    out = L.fc(hidden, 2, name="fc2")
    loss = L.mean(L.square(L.elementwise_sub(out, y)))
    if opt is None:
        return loss, [], []
    ops, params_grads = opt.minimize(loss)
    return loss, ops, params_grads


def start(init):
    """A scope after the startup program, with the parameters set to `init`."""
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    for name, value in init.items():
        scope.find_var(name).get(nf.Tensor).set(value)
    return scope


def value(scope, name):
    return scope.find_var(name).get(nf.Tensor).numpy()


def batches(rng, steps):
    return [(rng.normal(size=(8, 4)), rng.normal(size=(8, 2))) for _ in range(steps)]


def init_params(rng):
    return {n: rng.normal(scale=0.5, size=s) for n, s in SHAPES.items()}


class TorchModel:
    """The same MLP in torch, trained by `make_opt(params)`; `clip(params)` (optional) runs
    between backward and the step."""

    def __init__(self, init, make_opt, clip=None):
        import torch

        self.torch = torch
        self.params = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
        self.opt = make_opt(list(self.params.values()))
        self.clip = clip

    def loss(self, xs, ys):
        torch, p = self.torch, self.params
        h = torch.tanh(torch.tensor(xs) @ p["fc1.w"] + p["fc1.b"])
        return ((h @ p["fc2.w"] + p["fc2.b"] - torch.tensor(ys)) ** 2).mean()

    def step(self, xs, ys):
        loss = self.loss(xs, ys)
        self.opt.zero_grad()
        loss.backward()
        if self.clip is not None:
            self.clip(list(self.params.values()))
        self.opt.step()
        return loss.item()

    def numpy(self, name):
        return self.params[name].detach().numpy()
