"""Optimizer update ops: sgd, momentum (optionally Nesterov), adam (bias-corrected).

Each computes the new parameter (and new optimizer state) from the old ones and returns them;
kernels never write into their inputs. The program names the parameter itself as ParamOut
(and each state variable as its own ...Out), and since the executor stores persistables back
only after a whole run succeeded, a failed step leaves parameters and state as they were.
LearningRate is a variable of one element ([1] or 0-d) so it can be changed between steps.
The formulas are torch.optim's (SGD with momentum/dampening 0, Adam without amsgrad).
"""

from __future__ import annotations

import numpy as np

from nestflow.errors import DTypeError
from nestflow.ops.registry import VarInfo, fail, register_op


def _check_update(Param: VarInfo, Grad: VarInfo, LearningRate: VarInfo, **state: VarInfo) -> None:
    if not np.issubdtype(np.dtype(Param.dtype), np.floating):
        raise DTypeError(f"Param must be floating point, got {Param.dtype}")
    for name, info in {"Grad": Grad, **state}.items():
        if info.dtype != Param.dtype:
            raise DTypeError(f"{name} is {info.dtype} but Param is {Param.dtype}")
        same = len(info.shape) == len(Param.shape) and all(
            a == b or -1 in (a, b) for a, b in zip(info.shape, Param.shape)
        )
        if not same:
            fail(f"{name} {list(info.shape)} must have Param's shape {list(Param.shape)}")
    if all(d >= 0 for d in LearningRate.shape) and int(np.prod(LearningRate.shape)) != 1:
        fail(f"LearningRate must hold one value ([1] or 0-d), got {list(LearningRate.shape)}")


def _scalar(value: np.ndarray, dtype) -> np.ndarray:
    """A one-element array as a 0-d array of `dtype` (so a 0-d Param stays 0-d)."""
    return np.asarray(value, dtype=dtype).reshape(())


@register_op
class sgd:
    """ParamOut = Param - lr * Grad."""

    inputs, outputs = ("Param", "Grad", "LearningRate"), ("ParamOut",)
    inplace = {"ParamOut": "Grad"}

    def infer(Param, Grad, LearningRate):
        _check_update(Param, Grad, LearningRate)
        return Param

    def forward(Param, Grad, LearningRate, out=None):
        if not Param.ndim:
            return np.asarray(Param - _scalar(LearningRate, Param.dtype) * Grad)
        # One new array at most (none when the executor lends Grad's buffer as `out`).
        step = np.multiply(Grad, _scalar(LearningRate, Param.dtype), out=out)
        return np.subtract(Param, step, out=step)


@register_op
class momentum:
    """VelocityOut = mu * Velocity + Grad; ParamOut = Param - lr * (Grad + mu * VelocityOut)
    with use_nesterov, else Param - lr * VelocityOut (torch.optim.SGD, dampening 0)."""

    inputs = ("Param", "Grad", "Velocity", "LearningRate")
    outputs = ("ParamOut", "VelocityOut")
    attrs = {"mu": 0.9, "use_nesterov": False}
    inplace = {"ParamOut": "Grad"}

    def infer(Param, Grad, Velocity, LearningRate, mu, use_nesterov):
        _check_update(Param, Grad, LearningRate, Velocity=Velocity)
        return Param, Param

    def forward(Param, Grad, Velocity, LearningRate, mu, use_nesterov, out=None):
        dtype = Param.dtype
        lr, mu = _scalar(LearningRate, dtype), _scalar(mu, dtype)
        if not Param.ndim:
            velocity = np.asarray(mu * Velocity + Grad)
            step = Grad + mu * velocity if use_nesterov else velocity
            return np.asarray(Param - lr * step), velocity
        velocity = np.multiply(Velocity, mu)
        velocity += Grad
        if use_nesterov:
            step = np.multiply(velocity, mu)
            step += Grad
            step *= lr
        else:
            step = np.multiply(velocity, lr, out=out)
        return np.subtract(Param, step, out=step), velocity


@register_op
class adam:
    """Moment1Out = b1*m + (1-b1)*g; Moment2Out = b2*v + (1-b2)*g^2; with Beta1Pow = b1^t,
    ParamOut = Param - lr/(1-b1^t) * m' / (sqrt(v')/sqrt(1-b2^t) + epsilon) (torch.optim.Adam).
    Beta1Pow/Beta2Pow start at beta1/beta2 and are multiplied by them each step."""

    inputs = ("Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow")
    outputs = ("ParamOut", "Moment1Out", "Moment2Out", "Beta1PowOut", "Beta2PowOut")
    attrs = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
    inplace = {"ParamOut": "Grad"}

    def infer(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, **_attrs):
        _check_update(Param, Grad, LearningRate, Moment1=Moment1, Moment2=Moment2)
        for name, info in (("Beta1Pow", Beta1Pow), ("Beta2Pow", Beta2Pow)):
            if all(d >= 0 for d in info.shape) and int(np.prod(info.shape)) != 1:
                fail(f"{name} must hold one value ([1] or 0-d), got {list(info.shape)}")
        return Param, Moment1, Moment2, Beta1Pow, Beta2Pow

    def forward(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, out=None, **attrs):
        beta1, beta2, epsilon = attrs["beta1"], attrs["beta2"], attrs["epsilon"]
        dtype = Param.dtype
        # Bias corrections in float64 (like torch's Python floats), applied in Param's dtype.
        correction1 = 1.0 - float(np.asarray(Beta1Pow).reshape(()))
        correction2 = 1.0 - float(np.asarray(Beta2Pow).reshape(()))
        step = _scalar(float(np.asarray(LearningRate).reshape(())) / correction1, dtype)
        b1, b2 = _scalar(beta1, dtype), _scalar(beta2, dtype)
        # torch.optim.Adam's order of operations, with one scratch array (Grad's buffer when
        # the executor lends it) instead of a temporary per operation.
        m = np.multiply(Moment1, b1)
        scratch = np.multiply(Grad, _scalar(1.0 - beta1, dtype))
        m += scratch
        v = np.multiply(Moment2, b2)
        np.multiply(Grad, Grad, out=scratch)
        scratch *= _scalar(1.0 - beta2, dtype)
        v += scratch
        if out is not None and Param.ndim:
            scratch = out
        denom = np.sqrt(v, out=scratch) if Param.ndim else np.sqrt(v)
        denom /= _scalar(np.sqrt(correction2), dtype)
        denom += _scalar(epsilon, dtype)
        update = np.divide(m, denom, out=denom) if Param.ndim else m / denom
        update *= step
        param = np.subtract(Param, update, out=update) if Param.ndim else Param - update
        return (
            np.asarray(param, dtype),
            np.asarray(m, dtype),
            np.asarray(v, dtype),
            np.asarray(Beta1Pow * beta1, Beta1Pow.dtype),
            np.asarray(Beta2Pow * beta2, Beta2Pow.dtype),
        )
