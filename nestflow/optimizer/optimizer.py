"""Optimizer front ends: append backward ops, then one update op per parameter.

    loss = nf.layers.mean(...)
    nf.optimizer.Adam(learning_rate=1e-3).minimize(loss)

The update ops (`sgd`, `momentum`, `adam` in nestflow/ops/optimizer.py) write each parameter
and its state in place, after the backward ops. Optimizer state (velocity, moments, beta
powers) and the learning rate are persistable variables of the main program's global block,
initialised by fill_constant ops in the startup program, so they live in the scope across runs
and are saved with the parameters. Change the learning rate between steps with
`set_learning_rate(value, scope)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from nestflow.core.scope import Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import NestflowError
from nestflow.executor.backward import append_backward
from nestflow.framework import unique_name
from nestflow.framework.program import (
    Block,
    OpDesc,
    Program,
    VarDesc,
    default_startup_program,
)

ParamsGrads = list[tuple[VarDesc, VarDesc]]


class Optimizer:
    """Base class: `minimize` = `backward` (append_backward) + `apply_gradients`."""

    type = ""

    def __init__(self, learning_rate: float, weight_decay: float | None = None):
        if not isinstance(learning_rate, (int, float)) or learning_rate < 0:
            raise NestflowError(f"learning_rate must be a number >= 0, got {learning_rate!r}")
        if weight_decay is not None and not isinstance(weight_decay, (int, float)):
            raise NestflowError(f"weight_decay must be a float or None, got {weight_decay!r}")
        self.learning_rate = float(learning_rate)
        self.weight_decay = float(weight_decay) if weight_decay else None
        self.name = unique_name.generate(self.type)
        self.learning_rate_var: VarDesc | None = None
        self._startup: Program | None = None

    def minimize(
        self,
        loss: VarDesc,
        startup_program: Program | None = None,
        parameter_list: Sequence[VarDesc | str] | None = None,
        no_grad_set: Iterable[VarDesc | str] | None = None,
    ) -> tuple[list[OpDesc], ParamsGrads]:
        """Append the backward ops of `loss` and an update op per parameter that got a
        gradient; returns (update ops, [(param, grad)])."""
        params_grads = self.backward(loss, startup_program, parameter_list, no_grad_set)
        return self.apply_gradients(params_grads), params_grads

    def backward(
        self,
        loss: VarDesc,
        startup_program: Program | None = None,
        parameter_list: Sequence[VarDesc | str] | None = None,
        no_grad_set: Iterable[VarDesc | str] | None = None,
    ) -> ParamsGrads:
        """nf.append_backward(loss, parameter_list, no_grad_set); remembers startup_program
        (default: nf.default_startup_program()) for the state's initialisers."""
        self._startup = startup_program
        return append_backward(loss, parameter_list, no_grad_set)

    def apply_gradients(self, params_grads: ParamsGrads) -> list[OpDesc]:
        """Append one update op per (param, grad) (after weight decay, if set); returns them."""
        pairs = [(p, g) for p, g in params_grads if g is not None]
        if not pairs:
            return []
        block = pairs[0][0].block.program.global_block()
        startup = (self._startup or default_startup_program()).global_block()
        wide = any(np.dtype(p.dtype) == np.float64 for p, _ in pairs)
        dtype = "float64" if wide else "float32"
        lr = self._state(block, startup, "learning_rate", [1], dtype, self.learning_rate)
        self.learning_rate_var = lr
        ops = []
        for param, grad in pairs:
            if self.weight_decay:
                grad = _with_weight_decay(block, param, grad, self.weight_decay)
            ops.append(self._append_update(block, startup, param, grad, lr))
        return ops

    def set_learning_rate(self, value: float, scope: Scope) -> None:
        """Set the learning rate the update ops read from `scope` (takes effect next run)."""
        if self.learning_rate_var is None:
            raise NestflowError(f"{self.name}: call minimize/apply_gradients first")
        var = self.learning_rate_var
        tensor = scope.var(var.name).get_mutable(Tensor)
        tensor.set(np.full(var.shape, value, dtype=var.dtype))
        self.learning_rate = float(value)

    def _append_update(
        self, block: Block, startup: Block, param: VarDesc, grad: VarDesc, lr: VarDesc
    ) -> OpDesc:
        raise NotImplementedError

    def _state(
        self, block: Block, startup: Block, what: str, shape, dtype: str, value: float
    ) -> VarDesc:
        """A persistable state variable in `block`, set to `value` by the startup program."""
        name = f"{self.name}.{what}"
        if block.find_var(name) is not None:
            return block.find_var(name)
        var = block.create_var(name, shape, dtype, persistable=True, stop_gradient=True)
        out = startup.create_var(name, shape, dtype, persistable=True)
        attrs = {"shape": list(shape), "dtype": dtype, "value": float(value)}
        startup.append_op("fill_constant", {}, {"Out": [out]}, attrs)
        return var

    def _slot(self, block, startup, param: VarDesc, what: str, value: float = 0.0) -> VarDesc:
        """Per-parameter state shaped like the parameter."""
        return self._state(block, startup, f"{param.name}.{what}", param.shape, param.dtype, value)


def _with_weight_decay(block: Block, param: VarDesc, grad: VarDesc, decay: float) -> VarDesc:
    """grad + decay * param (L2 regularisation, torch's weight_decay), as ops."""
    scaled = block.create_var(unique_name.generate(f"{param.name}.decay"), param.shape, param.dtype)
    block.append_op("scale", {"X": [param]}, {"Out": [scaled]}, {"scale": decay})
    total = block.create_var(unique_name.generate(f"{grad.name}.decayed"), grad.shape, grad.dtype)
    block.append_op("sum", {"X": [grad, scaled]}, {"Out": [total]})
    return total


class SGD(Optimizer):
    """param -= learning_rate * grad."""

    type = "sgd"

    def _append_update(self, block, startup, param, grad, lr) -> OpDesc:
        return block.append_op(
            "sgd",
            {"Param": [param], "Grad": [grad], "LearningRate": [lr]},
            {"ParamOut": [param]},
        )


class Momentum(Optimizer):
    """torch.optim.SGD(momentum=mu, nesterov=use_nesterov): v = mu*v + g, then
    param -= lr * (g + mu*v) with Nesterov, else lr * v."""

    type = "momentum"

    def __init__(
        self,
        learning_rate: float,
        momentum: float = 0.9,
        use_nesterov: bool = False,
        weight_decay: float | None = None,
    ):
        super().__init__(learning_rate, weight_decay)
        self.momentum = float(momentum)
        self.use_nesterov = bool(use_nesterov)

    def _append_update(self, block, startup, param, grad, lr) -> OpDesc:
        velocity = self._slot(block, startup, param, "velocity")
        return block.append_op(
            "momentum",
            {"Param": [param], "Grad": [grad], "Velocity": [velocity], "LearningRate": [lr]},
            {"ParamOut": [param], "VelocityOut": [velocity]},
            {"mu": self.momentum, "use_nesterov": self.use_nesterov},
        )


class Adam(Optimizer):
    """torch.optim.Adam (bias-corrected; weight_decay adds wd * param to the gradient)."""

    type = "adam"

    def __init__(
        self,
        learning_rate: float = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        weight_decay: float | None = None,
    ):
        super().__init__(learning_rate, weight_decay)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _append_update(self, block, startup, param, grad, lr) -> OpDesc:
        m1 = self._slot(block, startup, param, "moment1")
        m2 = self._slot(block, startup, param, "moment2")
        # b^t for the step being taken: starts at b (t = 1), float64 like torch's Python floats.
        pow1 = self._state(block, startup, f"{param.name}.beta1_pow", [1], "float64", self.beta1)
        pow2 = self._state(block, startup, f"{param.name}.beta2_pow", [1], "float64", self.beta2)
        attrs: dict[str, Any] = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}
        return block.append_op(
            "adam",
            {
                "Param": [param],
                "Grad": [grad],
                "LearningRate": [lr],
                "Moment1": [m1],
                "Moment2": [m2],
                "Beta1Pow": [pow1],
                "Beta2Pow": [pow2],
            },
            {
                "ParamOut": [param],
                "Moment1Out": [m1],
                "Moment2Out": [m2],
                "Beta1PowOut": [pow1],
                "Beta2PowOut": [pow2],
            },
            attrs,
        )
