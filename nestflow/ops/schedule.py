"""Learning-rate schedule ops: the learning rate at the current global step, one op a schedule.

Each reads `Step`, the global step (nf.layers' persistable int64 [1] counter
`@LR_DECAY_COUNTER@`: 0 in a program's first run, incremented once per run), and where the
schedule scales a base rate, that rate from the `LearningRate` input (another schedule's
output, so schedules compose) or else from the `learning_rate` attr. Out is [1] of `dtype`.
The value is computed in float64 with Fluid 1.8's formulas (layers/learning_rate_scheduler.py),
then cast to `dtype`. None has a gradient: a learning rate is an input to the update, not a
function the loss depends on.

On a device the schedule still runs on the host: Step (and LearningRate) are read there, one
number each per run, and Out is copied to the device.
"""

from __future__ import annotations

import math

import numpy as np

from nestflow.errors import AttrError, DTypeError
from nestflow.ops.registry import Required, VarInfo, fail, register_op


def _one_value(name: str, info: VarInfo | None) -> None:
    if info is None:
        return
    if all(d >= 0 for d in info.shape) and math.prod(info.shape) != 1:
        fail(f"{name} must hold one value ([1] or 0-d), got {list(info.shape)}")
    if info.dtype == "bool":
        raise DTypeError(f"{name} must be a number, got {info.dtype}")


def _positive(**attrs: float) -> None:
    for name, value in attrs.items():
        if not value > 0:
            raise AttrError(f"{name} must be > 0, got {value}")


def _infer(Step: VarInfo, LearningRate: VarInfo | None = None, *, dtype: str, **_attrs):
    _one_value("Step", Step)
    _one_value("LearningRate", LearningRate)
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise DTypeError(f"dtype must be floating point, got {dtype}")
    return VarInfo((1,), dtype)


def _step(Step: np.ndarray) -> float:
    # A host read: the schedule is Fluid's float64 formula of one number.
    return float(Step.reshape(()))


def _base(LearningRate: np.ndarray | None, learning_rate: float) -> float:
    return learning_rate if LearningRate is None else float(LearningRate.reshape(()))


def _out(value: float, dtype: str, xp) -> np.ndarray:
    return xp.asarray([value], dtype=dtype)


def _decay_ratio(step: float, decay_steps: float, staircase: bool) -> float:
    ratio = step / decay_steps
    return math.floor(ratio) if staircase else ratio


_DECAY_ATTRS = {
    "learning_rate": 1.0,
    "decay_steps": Required(float),
    "decay_rate": Required(float),
    "staircase": False,
    "dtype": "float32",
}


def _infer_decay(Step, LearningRate, decay_steps, dtype, **attrs):
    _positive(decay_steps=decay_steps)
    return _infer(Step, LearningRate, dtype=dtype)


def _decay_kernel(formula):
    """The kernel of a schedule lr * f(decay_rate, ratio), ratio = step / decay_steps
    (floored with staircase)."""

    def forward(Step, LearningRate, learning_rate, decay_steps, decay_rate, staircase, dtype, xp):
        ratio = _decay_ratio(_step(Step), decay_steps, staircase)
        return _out(formula(_base(LearningRate, learning_rate), decay_rate, ratio), dtype, xp)

    return forward


@register_op
class exponential_decay:
    """Out = lr * decay_rate ^ (step / decay_steps) (the exponent floored with staircase)."""

    inputs, outputs = ("Step", "LearningRate?"), ("Out",)
    attrs = dict(_DECAY_ATTRS)
    infer = _infer_decay
    forward = _decay_kernel(lambda lr, rate, ratio: lr * rate**ratio)


@register_op
class natural_exp_decay:
    """Out = lr * exp(-decay_rate * (step / decay_steps)) (the ratio floored with staircase)."""

    inputs, outputs = ("Step", "LearningRate?"), ("Out",)
    attrs = dict(_DECAY_ATTRS)
    infer = _infer_decay
    forward = _decay_kernel(lambda lr, rate, ratio: lr * math.exp(-rate * ratio))


@register_op
class inverse_time_decay:
    """Out = lr / (1 + decay_rate * (step / decay_steps)) (the ratio floored with staircase)."""

    inputs, outputs = ("Step", "LearningRate?"), ("Out",)
    attrs = dict(_DECAY_ATTRS)
    infer = _infer_decay
    forward = _decay_kernel(lambda lr, rate, ratio: lr / (1.0 + rate * ratio))


@register_op
class polynomial_decay:
    """Out = (lr - end_lr) * (1 - step / steps) ^ power + end_lr. Without `cycle`,
    steps = decay_steps and step stops at decay_steps; with it, steps = decay_steps *
    ceil(step / decay_steps) (decay_steps at step 0), so the decay restarts every period."""

    inputs, outputs = ("Step", "LearningRate?"), ("Out",)
    attrs = {
        "learning_rate": 1.0,
        "decay_steps": Required(float),
        "end_learning_rate": 0.0001,
        "power": 1.0,
        "cycle": False,
        "dtype": "float32",
    }

    def infer(Step, LearningRate, decay_steps, dtype, **_attrs):
        _positive(decay_steps=decay_steps)
        return _infer(Step, LearningRate, dtype=dtype)

    def forward(
        Step, LearningRate, learning_rate, decay_steps, end_learning_rate, power, cycle, dtype, xp
    ):
        step = _step(Step)
        if cycle:
            steps = decay_steps * (math.ceil(step / decay_steps) if step > 0 else 1.0)
        else:
            step, steps = min(step, decay_steps), decay_steps
        base = _base(LearningRate, learning_rate)
        value = (base - end_learning_rate) * (1.0 - step / steps) ** power + end_learning_rate
        return _out(value, dtype, xp)


@register_op
class piecewise_decay:
    """Out = values[i] for the first i with step < boundaries[i], else values[-1]: the value
    changes at each boundary itself (step == boundaries[i] takes values[i + 1])."""

    inputs, outputs = ("Step",), ("Out",)
    attrs = {"boundaries": Required(list), "values": Required(list), "dtype": "float32"}

    def infer(Step, boundaries, values, dtype):
        if len(values) != len(boundaries) + 1:
            raise AttrError(
                f"piecewise_decay needs one more value than boundaries, got {len(values)} "
                f"values for {len(boundaries)} boundaries"
            )
        for name, items in (("boundaries", boundaries), ("values", values)):
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
                raise AttrError(f"{name} must be numbers, got {items!r}")
        for i in range(1, len(boundaries)):
            if not boundaries[i] > boundaries[i - 1]:
                raise AttrError(
                    f"boundaries must increase strictly, but boundaries[{i}] = {boundaries[i]} "
                    f"follows {boundaries[i - 1]}: {boundaries}"
                )
        return _infer(Step, dtype=dtype)

    def forward(Step, boundaries, values, dtype, xp):
        step = _step(Step)
        index = next((i for i, b in enumerate(boundaries) if step < b), len(boundaries))
        return _out(values[index], dtype, xp)


@register_op
class cosine_decay:
    """Out = lr * 0.5 * (cos(floor(step / step_each_epoch) * pi / epochs) + 1)."""

    inputs, outputs = ("Step", "LearningRate?"), ("Out",)
    attrs = {
        "learning_rate": 1.0,
        "step_each_epoch": Required(float),
        "epochs": Required(float),
        "dtype": "float32",
    }

    def infer(Step, LearningRate, step_each_epoch, epochs, dtype, **_attrs):
        _positive(step_each_epoch=step_each_epoch, epochs=epochs)
        return _infer(Step, LearningRate, dtype=dtype)

    def forward(Step, LearningRate, learning_rate, step_each_epoch, epochs, dtype, xp):
        epoch = math.floor(_step(Step) / step_each_epoch)
        base = _base(LearningRate, learning_rate)
        return _out(base * 0.5 * (math.cos(epoch * math.pi / epochs) + 1.0), dtype, xp)


@register_op
class noam_decay:
    """Out = lr * d_model^-0.5 * min(n^-0.5, warmup_steps^-1.5 * n) with n = step + 1: Fluid's
    noam counts its steps from 1 (its counter begins at 1 for noam), the others from 0."""

    inputs, outputs = ("Step", "LearningRate?"), ("Out",)
    attrs = {
        "d_model": Required(float),
        "warmup_steps": Required(float),
        "learning_rate": 1.0,
        "dtype": "float32",
    }

    def infer(Step, LearningRate, d_model, warmup_steps, dtype, **_attrs):
        _positive(d_model=d_model, warmup_steps=warmup_steps)
        return _infer(Step, LearningRate, dtype=dtype)

    def forward(Step, LearningRate, d_model, warmup_steps, learning_rate, dtype, xp):
        n = _step(Step) + 1.0
        factor = min(n**-0.5, warmup_steps**-1.5 * n)
        return _out(_base(LearningRate, learning_rate) * d_model**-0.5 * factor, dtype, xp)


@register_op
class linear_lr_warmup:
    """Out = start_lr + (end_lr - start_lr) * step / warmup_steps while step < warmup_steps,
    then lr (the rate after warm-up: a number or another schedule's LearningRate)."""

    inputs, outputs = ("Step", "LearningRate?"), ("Out",)
    attrs = {
        "learning_rate": 1.0,
        "warmup_steps": Required(float),
        "start_lr": Required(float),
        "end_lr": Required(float),
        "dtype": "float32",
    }

    def infer(Step, LearningRate, warmup_steps, dtype, **_attrs):
        if warmup_steps < 0:
            raise AttrError(f"warmup_steps must be >= 0, got {warmup_steps}")
        return _infer(Step, LearningRate, dtype=dtype)

    def forward(Step, LearningRate, learning_rate, warmup_steps, start_lr, end_lr, dtype, xp):
        step = _step(Step)
        if step < warmup_steps:
            return _out(start_lr + (end_lr - start_lr) * (step / warmup_steps), dtype, xp)
        return _out(_base(LearningRate, learning_rate), dtype, xp)
