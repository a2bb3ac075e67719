"""nf.layers learning-rate schedules: each equals its closed form (Fluid 1.8's formulas) for steps
0..1000; piecewise_decay and linear_lr_warmup at their boundaries; the global step counter;
composition; errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nestflow as nf

L = nf.layers
STEPS = 1001


def exponential(s, lr=0.5, ds=40.0, rate=0.6, stair=False):
    return lr * rate ** (math.floor(s / ds) if stair else s / ds)


def natural_exp(s, lr=0.5, ds=40.0, rate=0.6, stair=False):
    return lr * math.exp(-rate * (math.floor(s / ds) if stair else s / ds))


def inverse_time(s, lr=0.5, ds=40.0, rate=0.6, stair=False):
    return lr / (1 + rate * (math.floor(s / ds) if stair else s / ds))


def polynomial(s, lr=0.5, ds=300.0, end=0.01, power=2.0, cycle=False):
    if cycle:
        ds = ds * (math.ceil(s / ds) if s > 0 else 1)
    else:
        s = min(s, ds)
    return (lr - end) * (1 - s / ds) ** power + end


def cosine(s, lr=0.5, per_epoch=30.0, epochs=20.0):
    return lr * 0.5 * (math.cos(math.floor(s / per_epoch) * math.pi / epochs) + 1)


def noam(s, d_model=64.0, warmup=100.0, lr=2.0):
    n = s + 1  # Fluid's noam counter begins at 1
    return lr * d_model**-0.5 * min(n**-0.5, warmup**-1.5 * n)


def piecewise(s, boundaries=(100, 250, 600), values=(1.0, 0.5, 0.1, 0.02)):
    return next((v for b, v in zip(boundaries, values) if s < b), values[-1])


def warmup(s, lr=0.3, steps=50, start=0.01, end=0.2):
    return start + (end - start) * s / steps if s < steps else lr


SCHEDULES = {
    "exponential": (lambda: L.exponential_decay(0.5, 40, 0.6, dtype="float64"), exponential),
    "exponential-staircase": (
        lambda: L.exponential_decay(0.5, 40, 0.6, staircase=True, dtype="float64"),
        lambda s: exponential(s, stair=True),
    ),
    "natural_exp": (lambda: L.natural_exp_decay(0.5, 40, 0.6, dtype="float64"), natural_exp),
    "natural_exp-staircase": (
        lambda: L.natural_exp_decay(0.5, 40, 0.6, True, dtype="float64"),
        lambda s: natural_exp(s, stair=True),
    ),
    "inverse_time": (lambda: L.inverse_time_decay(0.5, 40, 0.6, dtype="float64"), inverse_time),
    "inverse_time-staircase": (
        lambda: L.inverse_time_decay(0.5, 40, 0.6, staircase=True, dtype="float64"),
        lambda s: inverse_time(s, stair=True),
    ),
    "polynomial": (
        lambda: L.polynomial_decay(0.5, 300, end_learning_rate=0.01, power=2.0, dtype="float64"),
        polynomial,
    ),
    "polynomial-cycle": (
        lambda: L.polynomial_decay(0.5, 300, 0.01, 2.0, cycle=True, dtype="float64"),
        lambda s: polynomial(s, cycle=True),
    ),
    "polynomial-defaults": (
        lambda: L.polynomial_decay(0.5, 300, dtype="float64"),
        lambda s: polynomial(s, end=0.0001, power=1.0),
    ),
    "cosine": (lambda: L.cosine_decay(0.5, 30, 20, dtype="float64"), cosine),
    "noam": (lambda: L.noam_decay(64, 100, learning_rate=2.0, dtype="float64"), noam),
    "piecewise": (
        lambda: L.piecewise_decay([100, 250, 600], [1.0, 0.5, 0.1, 0.02], dtype="float64"),
        piecewise,
    ),
    "linear_lr_warmup": (
        lambda: L.linear_lr_warmup(0.3, 50, 0.01, 0.2, dtype="float64"),
        warmup,
    ),
    "warmup-over-piecewise": (
        lambda: L.linear_lr_warmup(
            L.piecewise_decay([100, 250, 600], [1.0, 0.5, 0.1, 0.02], dtype="float64"),
            120,
            0.0,
            1.0,
        ),
        lambda s: warmup(s, lr=piecewise(s), steps=120, start=0.0, end=1.0),
    ),
    "exponential-of-cosine": (
        lambda: L.exponential_decay(L.cosine_decay(0.5, 30, 20, dtype="float64"), 40, 0.6),
        lambda s: exponential(s, lr=cosine(s)),
    ),
}


def _run_steps(fetch, steps=STEPS, scope=None):
    scope = scope or nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return np.array(
        [[v.item() for v in exe.run(fetch_list=fetch, scope=scope)] for _ in range(steps)]
    )


def test_every_schedule_equals_its_closed_form_for_steps_0_to_1000():
    """All schedules in one program share the step counter: one run per step."""
    made = {name: make() for name, (make, _) in SCHEDULES.items()}
    for name, var in made.items():
        assert var.dtype == "float64" and var.shape == (1,), name
    got = _run_steps(list(made.values()))
    for column, (name, (_, formula)) in enumerate(SCHEDULES.items()):
        want = np.array([formula(s) for s in range(STEPS)])
        np.testing.assert_allclose(got[:, column], want, rtol=1e-13, atol=0, err_msg=name)


def test_float32_by_default_as_fluid():
    lr = L.exponential_decay(0.1, 10, 0.5)
    assert lr.dtype == "float32"
    got = _run_steps([lr], steps=30)[:, 0]
    want = [np.float32(0.1 * 0.5 ** (s / 10)) for s in range(30)]
    np.testing.assert_allclose(got, want, rtol=1e-7)
    assert L.linear_lr_warmup(
        L.exponential_decay(0.1, 10, 0.5, dtype="float64"), 5, 0, 1
    ).dtype == ("float64")


def test_piecewise_changes_value_at_each_boundary_as_fluid():
    """Fluid: step < boundaries[i] -> values[i]; the boundary step itself takes the next."""
    lr = L.piecewise_decay([3, 7], [0.3, 0.2, 0.1])
    got = _run_steps([lr], steps=10)[:, 0]
    np.testing.assert_allclose(got, np.float32([0.3] * 3 + [0.2] * 4 + [0.1] * 3))


def test_linear_warmup_hands_over_at_warmup_steps_as_fluid():
    """Fluid: step < warmup_steps -> start + (end - start) * step / warmup_steps, else the
    wrapped rate at that step (here an exponential decay already running)."""
    inner = L.exponential_decay(1.0, 2, 0.5, dtype="float64")
    lr = L.linear_lr_warmup(inner, 4, 0.2, 1.0)
    got = _run_steps([lr, inner], steps=7)
    np.testing.assert_allclose(got[:4, 0], [0.2, 0.4, 0.6, 0.8], rtol=1e-15)
    np.testing.assert_allclose(got[4:, 0], [0.5**2, 0.5**2.5, 0.5**3], rtol=1e-15)
    np.testing.assert_array_equal(got[4:, 0], got[4:, 1])


def test_global_step_counter_is_shared_persistable_and_starts_at_zero():
    a = L.exponential_decay(1.0, 1, 0.5, dtype="float64")
    b = L.noam_decay(4, 2, dtype="float64")
    main = nf.default_main_program().global_block()
    counter = main.var("@LR_DECAY_COUNTER@")
    assert counter.persistable and counter.dtype == "int64" and counter.shape == (1,)
    assert [op.type for op in main.ops].count("increment") == 1
    assert main.ops[0].type == "increment"  # before every reader
    scope = nf.Scope()
    got = _run_steps([a, b], steps=3, scope=scope)
    np.testing.assert_allclose(got[:, 0], [1.0, 0.5, 0.25])
    np.testing.assert_allclose(got[:, 1], [noam(s, 4, 2, 1.0) for s in range(3)])
    assert scope.find_var("@LR_DECAY_COUNTER@").get(nf.Tensor).numpy().tolist() == [2]


def test_a_failed_run_does_not_advance_the_step():
    lr = L.exponential_decay(1.0, 1, 0.5, dtype="float64")
    x = L.data("x", [-1, 2], "float64")
    bad = L.elementwise_add(x, L.data("y", [-1, 2], "float64"))
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    ok = {"x": np.ones((1, 2)), "y": np.ones((1, 2))}
    exe.run(feed=ok, fetch_list=[lr, bad], scope=scope)
    with pytest.raises(nf.errors.NestflowError):
        exe.run(
            feed={"x": np.ones((3, 2)), "y": np.ones((2, 2))}, fetch_list=[lr, bad], scope=scope
        )
    (value, _) = exe.run(feed=ok, fetch_list=[lr, bad], scope=scope)
    assert value.tolist() == [0.5]  # step 1, not 2


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: L.piecewise_decay([10, 10], [1.0, 0.5, 0.1]), "AttrError", "increase strictly"),
        (
            lambda: L.piecewise_decay([20, 10], [1.0, 0.5, 0.1]),
            "AttrError",
            r"boundaries\[1\] = 10",
        ),
        (lambda: L.piecewise_decay([10], [1.0]), "AttrError", "one more value than boundaries"),
        (lambda: L.piecewise_decay(10, [1.0]), "AttrError", "must be lists"),
        (lambda: L.piecewise_decay([10], [1.0, "x"]), "AttrError", "values must be a number"),
        (lambda: L.exponential_decay(0.1, 0, 0.5), "AttrError", "decay_steps must be > 0"),
        (
            lambda: L.exponential_decay("fast", 10, 0.5),
            "AttrError",
            "learning_rate must be a number",
        ),
        (lambda: L.cosine_decay(0.1, 0, 10), "AttrError", "step_each_epoch must be > 0"),
        (lambda: L.noam_decay(0, 10), "AttrError", "d_model must be > 0"),
        (lambda: L.linear_lr_warmup(0.1, -1, 0.0, 0.1), "AttrError", "warmup_steps must be >= 0"),
        (
            lambda: L.linear_lr_warmup(L.fill_constant([2], "float32", 0.1), 5, 0.0, 0.1),
            "ShapeError",
            "LearningRate must hold one value",
        ),
        (lambda: L.exponential_decay(0.1, 10, 0.5, dtype="int64"), "DTypeError", "floating"),
    ],
)
def test_bad_schedules_are_build_errors(make, error, message):
    with pytest.raises(getattr(nf.errors, error), match=message):
        make()
