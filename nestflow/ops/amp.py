"""Mixed-precision ops (Fluid's names, slots and attrs): check_finite_and_unscale divides the
scaled gradients by the loss scale and says whether any of them holds an inf or NaN;
update_loss_scaling moves the loss scale and its counters, and zeroes the gradients of a bad
step. nf.amp.decorate builds them; neither has a gradient.

Both keep every value on the place (no host read): the found-inf flag is a bool [1] array the
later ops take as an input.
"""

from __future__ import annotations

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError
from nestflow.ops.registry import VarInfo, fail, register_op


def _check_scale(name: str, info: VarInfo) -> None:
    if not is_floating(info.dtype):
        raise DTypeError(f"{name} must be a float tensor of one element, got {info.dtype}")
    if -1 not in info.shape and len(info.shape) and any(d != 1 for d in info.shape):
        fail(f"{name} must hold one element, got shape {list(info.shape)}")


def _check_grads(X: list[VarInfo]) -> None:
    for i, info in enumerate(X):
        if not is_floating(info.dtype):
            raise DTypeError(f"X[{i}] must be a floating-point gradient, got {info.dtype}")


@register_op
class check_finite_and_unscale:
    """Out[i] = X[i] / Scale; FoundInfinite ([1] bool) = whether any X holds an inf or NaN.
    Out has X's dtype (the division runs in X's dtype: float32 master gradients)."""

    inputs, outputs = ("X*", "Scale"), ("Out*", "FoundInfinite")

    def infer(X, Scale):
        _check_grads(X)
        _check_scale("Scale", Scale)
        return [VarInfo(x.shape, x.dtype) for x in X], VarInfo((1,), "bool")

    def forward(X, Scale, xp):
        found = xp.zeros((1,), dtype=bool)
        outs = []
        for x in X:
            found |= ~xp.isfinite(x).all()
            outs.append(x / Scale.reshape(()).astype(x.dtype))
        return outs, found


@register_op
class update_loss_scaling:
    """The dynamic loss scale after one step (Fluid's update_loss_scaling). A bad step
    (FoundInfinite) zeroes the good-step count, adds one bad step, and at
    decr_every_n_nan_or_inf bad steps multiplies the scale by decr_ratio (never below 1) and
    restarts the count; a clean step adds one good step, and at incr_every_n_steps multiplies
    the scale by incr_ratio (kept where the product would be inf) and restarts the count.
    Out[i] = X[i], or zeros on a bad step; with stop_update the scale and counters stay."""

    inputs = ("X*", "FoundInfinite", "PrevLossScaling", "InGoodSteps", "InBadSteps")
    outputs = ("Out*", "LossScaling", "OutGoodSteps", "OutBadSteps")
    attrs = {
        "incr_every_n_steps": 1000,
        "decr_every_n_nan_or_inf": 2,
        "incr_ratio": 2.0,
        "decr_ratio": 0.5,
        "stop_update": False,
    }

    def infer(X, FoundInfinite, PrevLossScaling, InGoodSteps, InBadSteps, **attrs):
        _check_grads(X)
        _check_scale("PrevLossScaling", PrevLossScaling)
        if FoundInfinite.dtype != "bool":
            raise DTypeError(f"FoundInfinite must be bool, got {FoundInfinite.dtype}")
        for name, info in (("InGoodSteps", InGoodSteps), ("InBadSteps", InBadSteps)):
            if info.dtype != "int32":
                raise DTypeError(f"{name} must be int32, got {info.dtype}")
        if attrs["incr_every_n_steps"] < 1 or attrs["decr_every_n_nan_or_inf"] < 1:
            raise AttrError(
                "update_loss_scaling: incr_every_n_steps and decr_every_n_nan_or_inf must be "
                f">= 1, got {attrs['incr_every_n_steps']} and {attrs['decr_every_n_nan_or_inf']}"
            )
        if not (attrs["incr_ratio"] > 1.0 and 0.0 < attrs["decr_ratio"] < 1.0):
            raise AttrError(
                "update_loss_scaling: incr_ratio must be > 1 and decr_ratio in (0, 1), got "
                f"{attrs['incr_ratio']} and {attrs['decr_ratio']}"
            )
        return (
            [VarInfo(x.shape, x.dtype) for x in X],
            PrevLossScaling,
            InGoodSteps,
            InBadSteps,
        )

    def forward(X, FoundInfinite, PrevLossScaling, InGoodSteps, InBadSteps, xp, **attrs):
        found = FoundInfinite.reshape(-1)[:1].reshape(InGoodSteps.shape)
        outs = [xp.where(found.reshape(()), xp.zeros((), x.dtype), x) for x in X]
        if attrs["stop_update"]:
            return outs, PrevLossScaling.copy(), InGoodSteps.copy(), InBadSteps.copy()
        scale = PrevLossScaling
        good = xp.where(found, 0, InGoodSteps + 1).astype(InGoodSteps.dtype)
        bad = xp.where(found, InBadSteps + 1, 0).astype(InBadSteps.dtype)
        lower = bad >= attrs["decr_every_n_nan_or_inf"]
        raise_ = good >= attrs["incr_every_n_steps"]
        lowered = xp.maximum(scale * scale.dtype.type(attrs["decr_ratio"]), scale.dtype.type(1))
        with np.errstate(over="ignore"):  # a raise past float32's range keeps the scale
            raised = scale * scale.dtype.type(attrs["incr_ratio"])
        raised = xp.where(xp.isfinite(raised), raised, scale)
        new_scale = xp.where(lower, lowered, xp.where(raise_, raised, scale))
        good = xp.where(raise_, 0, good).astype(good.dtype)
        bad = xp.where(lower, 0, bad).astype(bad.dtype)
        return outs, new_scale.astype(scale.dtype), good, bad
