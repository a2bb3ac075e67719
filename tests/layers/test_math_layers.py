"""nf.layers' elementwise math, activation and loss layers: Fluid 1.8 signatures and defaults,
the ops and attrs they append, `act=` strings, and small programs trained end to end."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError

L = nf.layers

# Fluid 1.8's parameters and defaults, layer by layer (fluid/layers/nn.py, loss.py, ops.py).
FLUID_SIGNATURES = {
    "exp": "(x, name=None)",
    "log": "(x, name=None)",
    "sqrt": "(x, name=None)",
    "rsqrt": "(x, name=None)",
    "abs": "(x, name=None)",
    "pow": "(x, factor=1.0, name=None)",
    "clip": "(x, min, max, name=None)",
    "leaky_relu": "(x, alpha=0.02, name=None)",
    "elu": "(x, alpha=1.0, name=None)",
    "gelu": "(x, approximate=False, name=None)",  # Fluid 1.8 has no name; one more is harmless
    "softplus": "(x, name=None)",
    "softsign": "(x, name=None)",
    "swish": "(x, beta=1.0, name=None)",
    "hard_sigmoid": "(x, slope=0.2, offset=0.5, name=None)",
    "elementwise_max": "(x, y, axis=-1, act=None, name=None)",
    "elementwise_min": "(x, y, axis=-1, act=None, name=None)",
    "elementwise_pow": "(x, y, axis=-1, act=None, name=None)",
    "square_error_cost": "(input, label)",
    "sigmoid_cross_entropy_with_logits": "(x, label, ignore_index=-100, name=None, normalize=False)",
    "huber_loss": "(input, label, delta)",
    "smooth_l1": "(x, y, inside_weight=None, outside_weight=None, sigma=None)",
    "log_loss": "(input, label, epsilon=0.0001, name=None)",
    "kldiv_loss": "(x, target, reduction='mean', name=None)",
}


def _plain_signature(fn) -> str:
    params = [
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in inspect.signature(fn).parameters.values()
    ]
    return "(" + ", ".join(params) + ")"


@pytest.mark.parametrize("name", sorted(FLUID_SIGNATURES))
def test_layer_signatures_are_fluids(name):
    assert name in L.__all__
    assert _plain_signature(getattr(L, name)) == FLUID_SIGNATURES[name]


def _ops():
    return [(op.type, op.attrs) for op in nf.default_main_program().global_block().ops]


@pytest.mark.parametrize(
    "call,op_type,attrs",
    [
        (lambda x: L.pow(x, 3), "pow", {"factor": 3.0}),
        (lambda x: L.clip(x, -1, 2), "clip", {"min": -1.0, "max": 2.0}),
        (lambda x: L.leaky_relu(x), "leaky_relu", {"alpha": 0.02}),
        (lambda x: L.elu(x, alpha=0.5), "elu", {"alpha": 0.5}),
        (lambda x: L.gelu(x, approximate=True), "gelu", {"approximate": True}),
        (lambda x: L.swish(x), "swish", {"beta": 1.0}),
        (lambda x: L.hard_sigmoid(x, slope=0.1), "hard_sigmoid", {"slope": 0.1, "offset": 0.5}),
        (lambda x: L.elementwise_max(x, x, axis=0), "elementwise_max", {"axis": 0}),
        (lambda x: L.kldiv_loss(x, x, "sum"), "kldiv_loss", {"reduction": "sum"}),
        (lambda x: L.log_loss(x, x), "log_loss", {"epsilon": 1e-4}),
        (lambda x: L.smooth_l1(x, x), "smooth_l1_loss", {"sigma": 1.0}),
        (lambda x: L.smooth_l1(x, x, sigma=3), "smooth_l1_loss", {"sigma": 3.0}),
        (lambda x: L.huber_loss(x, x, 2), "huber_loss", {"delta": 2.0}),
        (
            lambda x: L.sigmoid_cross_entropy_with_logits(x, x, normalize=True),
            "sigmoid_cross_entropy_with_logits",
            {"ignore_index": -100, "normalize": True},
        ),
    ],
)
def test_layers_append_their_op_with_fluids_attrs(call, op_type, attrs):
    x = nf.data("x", [4, 3], "float32")
    call(x)
    (got_type, got_attrs), *_ = _ops()[-1:]
    assert got_type == op_type
    assert {k: got_attrs[k] for k in attrs} == attrs


def test_square_error_cost_is_elementwise_sub_then_square():
    x = nf.data("x", [3, 1], "float64")
    y = nf.data("y", [3, 1], "float64")
    out = L.square_error_cost(x, y)
    assert [t for t, _ in _ops()] == ["elementwise_sub", "square"]
    xs, ys = np.array([[1.0], [2.0], [4.0]]), np.array([[0.5], [2.0], [1.0]])
    (got,) = nf.Executor().run(feed={"x": xs, "y": ys}, fetch_list=[out], scope=nf.Scope())
    np.testing.assert_allclose(got, (xs - ys) ** 2)


@pytest.mark.parametrize(
    "act",
    [
        "exp",
        "abs",
        "gelu",
        "leaky_relu",
        "elu",
        "softplus",
        "softsign",
        "swish",
        "hard_sigmoid",
        "GELU",
    ],
)
def test_fc_act_takes_the_new_activations(act):
    x = nf.data("x", [5, 3], "float64")
    out = L.fc(x, size=4, act=act, bias_attr=False, name="fc")
    assert _ops()[-1][0] == act.lower()
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = np.abs(np.random.default_rng(3).standard_normal((5, 3)))
    (got,) = exe.run(feed={"x": xs}, fetch_list=[out], scope=scope)
    w = scope.find_var("fc.w").get(nf.Tensor).numpy()
    h = xs @ w
    want = {
        "exp": np.exp,
        "abs": np.abs,
        "leaky_relu": lambda v: np.maximum(v, 0.02 * v),
        "softplus": lambda v: np.log1p(np.exp(v)),
        "softsign": lambda v: v / (1 + np.abs(v)),
        "swish": lambda v: v / (1 + np.exp(-v)),
        "hard_sigmoid": lambda v: np.clip(0.2 * v + 0.5, 0, 1),
    }.get(act.lower())
    if want is not None:
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(got, want(h), rtol=1e-12)
    assert got.shape == (5, 4)


def test_act_that_is_not_an_activation_is_an_attr_error():
    x = nf.data("x", [5, 3], "float32")
    with pytest.raises(AttrError, match=r"act='reduce_sum' is not an activation; .*'gelu'"):
        L.fc(x, size=2, act="reduce_sum")
    with pytest.raises(AttrError, match="act='clip'"):  # clip has no default bounds
        L.elementwise_add(x, x, act="clip")


def test_pow_with_a_variable_factor():
    x = nf.data("x", [3], "float64")
    f = L.fill_constant([1], "float64", 3.0)
    out = L.pow(x, f)
    assert _ops()[-1][0] == "pow"
    (got,) = nf.Executor().run(
        feed={"x": np.array([1.0, 2.0, -2.0])}, fetch_list=[out], scope=nf.Scope()
    )
    np.testing.assert_allclose(got, [1.0, 8.0, -8.0])


def test_layers_reject_integer_inputs_when_built():
    ids = nf.data("ids", [4, 1], "int64")
    for fn in (
        L.exp,
        L.gelu,
        L.softplus,
        lambda v: L.log_loss(v, v),
        lambda v: L.square_error_cost(L.cast(v, "float32"), v),
    ):
        with pytest.raises(DTypeError):
            fn(ids)


def test_kldiv_loss_reduced_is_0d_and_trains():
    """kldiv_loss of log_softmax against a target distribution: minimising it with SGD brings
    the distribution to the target (a 0-d loss seeds append_backward like mean's)."""
    logits = L.create_parameter(
        [2, 3], "float64", name="logits", initializer=nf.initializer.Constant(0.0)
    )
    target = nf.data("target", [2, 3], "float64")
    loss = L.kldiv_loss(L.log(L.softmax(logits)), target, reduction="batchmean")
    assert loss.shape == ()
    nf.optimizer.SGD(learning_rate=1.0).minimize(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    want = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    first = None
    for _ in range(300):
        (value,) = exe.run(feed={"target": want}, fetch_list=[loss], scope=scope)
        first = value if first is None else first
    z = scope.find_var("logits").get(nf.Tensor).numpy()
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    assert value < 1e-4 < first
    np.testing.assert_allclose(p, want, atol=5e-3)


@pytest.mark.parametrize(
    "loss_name", ["square_error_cost", "huber_loss", "smooth_l1", "log_loss", "sigmoid_ce"]
)
def test_a_regression_trains_with_each_loss(loss_name):
    """A linear model fit by SGD: each loss's gradient flows through fc to its parameters."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((64, 3))
    w_true = np.array([[1.5], [-2.0], [0.5]])
    ys = xs @ w_true
    x = nf.data("x", [64, 3], "float64")
    y = nf.data("y", [64, 1], "float64")
    pred = L.fc(x, size=1, name="fc")
    if loss_name == "square_error_cost":
        per_row = L.square_error_cost(pred, y)
    elif loss_name == "huber_loss":
        per_row = L.huber_loss(pred, y, delta=1.0)
    elif loss_name == "smooth_l1":
        per_row = L.smooth_l1(pred, y)
    elif loss_name == "log_loss":
        ys = (ys > 0) * 1.0
        per_row = L.log_loss(L.sigmoid(pred), y)
    else:
        ys = (ys > 0) * 1.0
        per_row = L.sigmoid_cross_entropy_with_logits(pred, y)
    loss = L.mean(per_row)
    classifying = loss_name in ("log_loss", "sigmoid_ce")
    nf.optimizer.SGD(learning_rate=2.0 if classifying else 0.1).minimize(loss)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    losses = [
        exe.run(feed={"x": xs, "y": ys}, fetch_list=[loss], scope=scope)[0] for _ in range(150)
    ]
    if classifying:  # separable classes: the loss keeps falling, slowly
        assert losses[-1] < 0.3 * losses[0]
        (p,) = exe.run(feed={"x": xs, "y": ys}, fetch_list=[pred], scope=scope)
        assert np.mean((p > 0) == (ys > 0)) >= 0.98
    else:
        assert losses[-1] < 1e-3 * losses[0]
        w = scope.find_var("fc.w").get(nf.Tensor).numpy()
        np.testing.assert_allclose(w, w_true, atol=0.05)
