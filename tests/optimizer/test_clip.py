"""nf.clip: the gradients the update ops read equal torch.nn.utils.clip_grad_value_ /
clip_grad_norm_ on the same gradients (the norm clips up to torch's 1e-6 added to the norm,
Fluid's formula having none); clipped training equals torch; need_clip; op order; errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from tests.optimizer.mlp import SHAPES, TorchModel, batches, build, init_params, start, value

torch = pytest.importorskip("torch")

C = nf.clip
TORCH_EPS = 1e-6  # torch's clip_grad_norm_ divides by total_norm + 1e-6


def _clipped_grads(grad_clip, rng, regularization=None):
    """(nestflow's clipped gradients by parameter name, torch's raw gradients), one batch."""
    opt = nf.optimizer.SGD(0.1, grad_clip=grad_clip, regularization=regularization)
    loss, ops, _ = build(opt)
    init = init_params(rng)
    scope = start(init)
    ((xs, ys),) = batches(rng, 1)
    names = {op.input("Param")[0]: op.input("Grad")[0] for op in ops}
    fetched = nf.Executor().run(
        feed={"x": xs, "y": ys}, fetch_list=list(names.values()), scope=scope
    )
    model = TorchModel(init, lambda ps: torch.optim.SGD(ps, lr=0.1))
    model.loss(xs, ys).backward()
    return dict(zip(names, fetched)), model.params


def _torch_grads(params):
    return {n: p.grad.detach().numpy().copy() for n, p in params.items()}


@pytest.mark.parametrize("low, high", [(None, 0.05), (-0.02, 0.1)])
def test_clip_by_value_equals_torch_clip_grad_value(low, high, rng):
    got, params = _clipped_grads(C.GradientClipByValue(high, min=low), rng)
    if low is None:
        torch.nn.utils.clip_grad_value_(list(params.values()), high)
        want = _torch_grads(params)
    else:  # torch clips symmetrically; the asymmetric range against NumPy
        want = {n: np.clip(g, low, high) for n, g in _torch_grads(params).items()}
    clipped = 0
    for name in SHAPES:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, err_msg=name)
        clipped += int(np.sum(np.isin(got[name], [low or -high, high])))
    assert clipped > 0  # the bounds did bite


@pytest.mark.parametrize("clip_norm", [0.05, 1e3])
def test_clip_by_norm_equals_torch_clip_grad_norm_per_gradient(clip_norm, rng):
    got, params = _clipped_grads(C.GradientClipByNorm(clip_norm), rng)
    raw = _torch_grads(params)
    for name, param in params.items():
        norm = float(torch.nn.utils.clip_grad_norm_([param], clip_norm))
        want = param.grad.numpy()
        if norm > clip_norm:  # torch: clip_norm / (norm + 1e-6); Fluid: clip_norm / norm
            np.testing.assert_allclose(got[name], want * (norm + TORCH_EPS) / norm, rtol=1e-13)
            np.testing.assert_allclose(np.linalg.norm(got[name]), clip_norm, rtol=1e-13)
        else:
            np.testing.assert_array_equal(raw[name], want)  # torch left them alone too
            np.testing.assert_allclose(got[name], raw[name], rtol=1e-12)


@pytest.mark.parametrize("clip_norm", [0.05, 1e3])
def test_clip_by_global_norm_equals_torch_clip_grad_norm(clip_norm, rng):
    got, params = _clipped_grads(C.GradientClipByGlobalNorm(clip_norm), rng)
    raw = _torch_grads(params)
    norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip_norm))
    expected_norm = min(norm, clip_norm)
    together = np.sqrt(sum(np.sum(g**2) for g in got.values()))
    np.testing.assert_allclose(together, expected_norm, rtol=1e-13)
    for name, param in params.items():
        want = param.grad.numpy()
        if norm > clip_norm:
            np.testing.assert_allclose(got[name], want * (norm + TORCH_EPS) / norm, rtol=1e-13)
            np.testing.assert_allclose(got[name], raw[name] * clip_norm / norm, rtol=1e-13)
        else:
            np.testing.assert_array_equal(raw[name], want)
            np.testing.assert_allclose(got[name], raw[name], rtol=1e-12)


def test_training_with_value_clip_equals_torch(rng):
    opt = nf.optimizer.Momentum(0.1, momentum=0.9, grad_clip=C.GradientClipByValue(0.05))
    loss, _, _ = build(opt)
    init = init_params(rng)
    scope = start(init)
    model = TorchModel(
        init,
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        clip=lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.05),
    )
    for xs, ys in batches(rng, 20):
        nf.Executor().run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
    for name in SHAPES:
        np.testing.assert_allclose(value(scope, name), model.numpy(name), rtol=1e-10, atol=1e-12)


def test_training_with_global_norm_clip_equals_fluids_rule(rng):
    """Adam after a global-norm clip, against torch Adam fed Fluid's clipped gradients."""

    def fluid_clip(ps):
        norm = float(torch.sqrt(sum((p.grad**2).sum() for p in ps)))
        for p in ps:
            p.grad.mul_(0.1 / max(norm, 0.1))

    loss, _, _ = build(nf.optimizer.Adam(0.01, grad_clip=C.GradientClipByGlobalNorm(0.1)))
    init = init_params(rng)
    scope = start(init)
    model = TorchModel(init, lambda ps: torch.optim.Adam(ps, lr=0.01), clip=fluid_clip)
    for xs, ys in batches(rng, 20):
        nf.Executor().run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
    for name in SHAPES:
        np.testing.assert_allclose(value(scope, name), model.numpy(name), rtol=1e-10, atol=1e-12)


def test_need_clip_picks_the_clipped_gradients(rng):
    clip = C.GradientClipByGlobalNorm(0.01, need_clip=lambda p: p.name.endswith(".w"))
    got, params = _clipped_grads(clip, rng)
    raw = _torch_grads(params)
    norm = np.sqrt(sum(np.sum(raw[n] ** 2) for n in ("fc1.w", "fc2.w")))
    for name in SHAPES:
        scale = 0.01 / norm if name.endswith(".w") else 1.0
        np.testing.assert_allclose(got[name], raw[name] * scale, rtol=1e-13)


def test_clip_comes_before_regularization_and_update(rng):
    got, params = _clipped_grads(
        C.GradientClipByValue(0.01), rng, regularization=nf.regularizer.L2Decay(0.5)
    )
    types = [op.type for op in nf.default_main_program().global_block().ops]
    assert types.index("clip") < types.index("scale", types.index("clip")) < types.index("sgd")
    for name, param in params.items():  # the decay term is added to the clipped gradient
        want = np.clip(param.grad.numpy(), -0.01, 0.01) + 0.5 * param.detach().numpy()
        np.testing.assert_allclose(got[name], want, rtol=1e-13)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: C.GradientClipByValue(-1.0), "max must be > 0 when min is None"),
        (lambda: C.GradientClipByValue(1.0, min=2.0), r"min \(2.0\) must not exceed max"),
        (lambda: C.GradientClipByValue("1"), "max must be a finite number"),
        (lambda: C.GradientClipByNorm(0.0), "clip_norm must be > 0"),
        (lambda: C.GradientClipByGlobalNorm(float("inf")), "finite number"),
        (lambda: C.GradientClipByNorm(1.0, need_clip=True), "need_clip must be a function"),
    ],
)
def test_bad_clips_are_attr_errors(make, message):
    with pytest.raises(nf.errors.AttrError, match=message):
        make()
