"""nf.regularizer: L2Decay equals torch's weight_decay, L1Decay a NumPy reference; a
parameter's own regularizer (ParamAttr) overrides the optimizer's; the decay ops sit between
backward and the update; errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from tests.optimizer.mlp import SHAPES, TorchModel, batches, build, init_params, start, value

torch = pytest.importorskip("torch")

R = nf.regularizer


class NumpySGD:
    """param -= lr * (grad + decay term), the term per parameter index (None: no decay)."""

    def __init__(self, params, lr, terms):
        self.params, self.lr, self.terms = params, lr, terms

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        for p, term in zip(self.params, self.terms):
            x, g = p.detach().numpy(), p.grad.numpy()
            decay = 0.0 if term is None else term(x)
            with torch.no_grad():
                p.copy_(torch.tensor(x - self.lr * (g + decay)))


def l1(c):
    return lambda x: c * np.sign(x)


def l2(c):
    return lambda x: c * x


def _compare(opt, make_reference, rng, fc1_attr=None, steps=20):
    loss, ops, _ = build(opt, fc1_attr=fc1_attr)
    init = init_params(rng)
    scope = start(init)
    model = TorchModel(init, make_reference)
    for xs, ys in batches(rng, steps):
        (got,) = nf.Executor().run(feed={"x": xs, "y": ys}, fetch_list=[loss], scope=scope)
        np.testing.assert_allclose(got, model.step(xs, ys), rtol=1e-10)
    for name in SHAPES:
        np.testing.assert_allclose(value(scope, name), model.numpy(name), rtol=1e-10, atol=1e-12)
    return ops


def test_l2decay_with_sgd_equals_torch_weight_decay(rng):
    _compare(
        nf.optimizer.SGD(0.1, regularization=R.L2Decay(0.2)),
        lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.2),
        rng,
    )


def test_l1decay_with_sgd_equals_numpy(rng):
    _compare(
        nf.optimizer.SGD(0.1, regularization=R.L1DecayRegularizer(0.05)),
        lambda ps: NumpySGD(ps, 0.1, [l1(0.05)] * 4),
        rng,
    )


def test_a_parameters_own_regularizer_overrides_the_optimizers(rng):
    attr = nf.ParamAttr(regularizer=R.L1Decay(0.3))
    _compare(
        nf.optimizer.SGD(0.1, regularization=R.L2Decay(0.2)),
        lambda ps: NumpySGD(ps, 0.1, [l1(0.3), l2(0.2), l2(0.2), l2(0.2)]),
        rng,
        fc1_attr=attr,
    )


def test_a_parameters_own_regularizer_alone(rng):
    attr = nf.ParamAttr(regularizer=R.L2Decay(0.5))
    _compare(
        nf.optimizer.SGD(0.1),
        lambda ps: NumpySGD(ps, 0.1, [l2(0.5), None, None, None]),
        rng,
        fc1_attr=attr,
    )


def test_decay_ops_sit_between_backward_and_the_update():
    loss, _, _ = build(nf.optimizer.Adam(0.1, regularization=R.L1Decay(0.01)))
    types = [op.type for op in nf.default_main_program().global_block().ops]
    last_grad = max(i for i, t in enumerate(types) if t.endswith("_grad"))
    first_update = types.index("adam")
    between = types[last_grad + 1 : first_update]
    assert between.count("sign") == 4 and between.count("sum") >= 4
    updates = [op for op in nf.default_main_program().global_block().ops if op.type == "adam"]
    assert all(".regularized" in op.input("Grad")[0] for op in updates)


def test_append_regularization_ops_as_fluid():
    loss, _, _ = build()
    params_grads = nf.append_backward(loss)
    params_grads.append((params_grads[0][0], None))
    out = R.append_regularization_ops(params_grads, R.L2Decay(0.1))
    assert [p.name for p, _ in out] == [p.name for p, _ in params_grads]
    assert all(g.name.endswith(".regularized_0") for _, g in out[:4])
    assert out[4][1] is None
    assert R.append_regularization_ops(params_grads[:1]) == params_grads[:1]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: R.L2Decay(-0.1), "must be >= 0"),
        (lambda: R.L1Decay("0.1"), "must be a number"),
        (lambda: R.L2Decay(float("nan")), "must be >= 0"),
        (lambda: nf.ParamAttr(regularizer=0.1), "nf.regularizer"),
    ],
)
def test_bad_regularizers_are_attr_errors(make, message):
    with pytest.raises(nf.errors.AttrError, match=message):
        make()
