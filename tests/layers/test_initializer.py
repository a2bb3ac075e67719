"""Initializers (issue 3 item 3): constant, uniform, normal, Xavier/Glorot and Kaiming, each
selectable per parameter, with the scale their fans give, and deterministic given a seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError

L = nf.layers
I = nf.initializer  # noqa: E741


def _init_values(startup: nf.Program | None = None) -> nf.Scope:
    scope = nf.Scope()
    nf.Executor().run(startup or nf.default_startup_program(), scope=scope)
    return scope


def _value(scope: nf.Scope, name: str) -> np.ndarray:
    return scope.find_var(name).get(nf.Tensor).numpy()


def _startup_op(name: str):
    block = nf.default_startup_program().global_block()
    (op,) = [op for op in block.ops if op.output_names() == [name]]
    return op


@pytest.mark.parametrize(
    ("init", "op_type", "attrs"),
    [
        (I.Constant(0.25), "fill_constant", {"value": 0.25}),
        (I.Uniform(-0.3, 0.7, seed=5), "uniform_random", {"min": -0.3, "max": 0.7, "seed": 5}),
        (I.Normal(1.0, 0.2, seed=6), "gaussian_random", {"mean": 1.0, "std": 0.2, "seed": 6}),
        # fc-style weight [in=30, out=20]: Glorot a = sqrt(6 / 50), std = sqrt(2 / 50)
        (I.Xavier(), "uniform_random", {"min": -math.sqrt(6 / 50), "max": math.sqrt(6 / 50)}),
        (I.Xavier(uniform=False), "gaussian_random", {"mean": 0.0, "std": math.sqrt(2 / 50)}),
        # He: std = sqrt(2 / fan_in), a = sqrt(6 / fan_in)
        (I.Kaiming(), "gaussian_random", {"mean": 0.0, "std": math.sqrt(2 / 30)}),
        (I.Kaiming(uniform=True), "uniform_random", {"min": -0.4472135955, "max": 0.4472135955}),
    ],
    ids=["constant", "uniform", "normal", "xavier", "xavier-normal", "kaiming", "kaiming-uniform"],
)
def test_each_initializer_appends_its_op_with_the_scale_of_the_fans(init, op_type, attrs):
    L.create_parameter([30, 20], "float64", name="w", initializer=init)
    op = _startup_op("w")
    assert op.type == op_type
    assert op.attrs["shape"] == [30, 20] and op.attrs["dtype"] == "float64"
    for key, want in attrs.items():
        assert op.attrs[key] == pytest.approx(want), key


def test_initialised_values_follow_the_asked_distribution():
    """Values drawn by the startup program: constants exact, uniform within its bounds, the
    normal ones with the asked mean and std (400 x 300 draws, fixed seed)."""
    shape = [400, 300]
    L.create_parameter(shape, "float64", name="c", initializer=I.Constant(-1.5))
    L.create_parameter(shape, "float64", name="u", initializer=I.Uniform(2.0, 3.0))
    L.create_parameter(shape, "float64", name="x", initializer=I.Xavier())
    L.create_parameter(shape, "float64", name="k", initializer=I.Kaiming())
    scope = _init_values()
    assert np.all(_value(scope, "c") == -1.5)
    u = _value(scope, "u")
    assert u.min() >= 2.0 and u.max() < 3.0 and abs(u.mean() - 2.5) < 0.01
    limit = math.sqrt(6 / 700)
    x = _value(scope, "x")
    assert x.min() >= -limit and x.max() <= limit and x.max() > 0.99 * limit
    k = _value(scope, "k")
    assert abs(k.mean()) < 0.005 and k.std() == pytest.approx(math.sqrt(2 / 400), rel=0.01)


def test_conv_shaped_fans_count_the_receptive_field():
    """A [out, in, kh, kw] weight: fan_in = in * kh * kw, fan_out = out * kh * kw."""
    L.create_parameter([8, 4, 3, 3], "float32", name="conv", initializer=I.Kaiming())
    assert _startup_op("conv").attrs["std"] == pytest.approx(math.sqrt(2 / 36))
    L.create_parameter([8, 4, 3, 3], "float32", name="conv2", initializer=I.Xavier())
    assert _startup_op("conv2").attrs["max"] == pytest.approx(math.sqrt(6 / (36 + 72)))


def test_initializers_are_selectable_per_parameter():
    """fc's weight and bias each take their own initializer (an Initializer or a ParamAttr);
    by default the weight is Xavier and the bias zeros."""
    x = L.data("x", [-1, 6], "float64")
    L.fc(x, 4, name="a", param_attr=I.Kaiming(seed=3), bias_attr=I.Constant(0.5))
    L.fc(x, 4, name="b", param_attr=nf.ParamAttr(initializer=I.Normal(0.0, 0.01)))
    L.fc(x, 4, name="c")
    ops = {n: _startup_op(n) for n in ("a.w", "a.b", "b.w", "b.b", "c.w", "c.b")}
    assert ops["a.w"].type == "gaussian_random" and ops["a.w"].attrs["seed"] == 3
    assert ops["a.w"].attrs["std"] == pytest.approx(math.sqrt(2 / 6))
    assert ops["b.w"].type == "gaussian_random" and ops["b.w"].attrs["std"] == 0.01
    assert ops["c.w"].type == "uniform_random"
    assert ops["c.w"].attrs["max"] == pytest.approx(math.sqrt(6 / 10))
    for name in ("b.b", "c.b"):
        assert ops[name].type == "fill_constant" and ops[name].attrs["value"] == 0.0
    scope = _init_values()
    np.testing.assert_array_equal(_value(scope, "a.b"), np.full(4, 0.5))
    np.testing.assert_array_equal(_value(scope, "c.b"), np.zeros(4))


def test_a_bad_param_attr_is_an_attr_error():
    x = L.data("x", [-1, 6], "float64")
    with pytest.raises(AttrError, match="param_attr"):
        L.fc(x, 4, param_attr=0.5)


def test_initial_values_are_deterministic_given_a_seed():
    """nf.seed(n) fixes every seed-0 initializer; an initializer's own seed fixes it alone."""
    L.create_parameter([5, 4], "float64", name="w", initializer=I.Xavier())
    L.create_parameter([5, 4], "float64", name="v", initializer=I.Normal(seed=17))
    nf.seed(42)
    first = _init_values()
    nf.seed(42)
    second = _init_values()
    np.testing.assert_array_equal(_value(first, "w"), _value(second, "w"))
    nf.seed(43)
    third = _init_values()
    assert not np.array_equal(_value(third, "w"), _value(first, "w"))
    # The own-seeded one is the same whatever nf.seed says, and is NumPy's draw for that seed.
    np.testing.assert_array_equal(_value(third, "v"), _value(first, "v"))
    np.testing.assert_array_equal(
        _value(first, "v"), np.random.default_rng(17).normal(0.0, 1.0, size=(5, 4))
    )
