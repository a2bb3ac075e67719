"""Optimizer front ends: append backward ops, then one update op per parameter.

    loss = nf.layers.mean(...)
    nf.optimizer.Adam(learning_rate=1e-3).minimize(loss)

The update ops and their state are built by nestflow.executor.optimize (shared with
Net.add_optimizer_ops): optimizer state and the learning rate are persistable variables
initialised by the startup program. Change the learning rate between steps with
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
from nestflow.executor.optimize import append_optimizer_ops, check_hyper_parameters, is_number
from nestflow.framework import unique_name
from nestflow.framework.program import OpDesc, Program, VarDesc

ParamsGrads = list[tuple[VarDesc, VarDesc]]


class Optimizer:
    """Base class: `minimize` = `backward` (append_backward) + `apply_gradients`."""

    type = ""

    def __init__(self, learning_rate: float, weight_decay: float | None = None, **hyper: Any):
        if not is_number(learning_rate) or learning_rate < 0:
            raise NestflowError(f"learning_rate must be a number >= 0, got {learning_rate!r}")
        if weight_decay is not None and not is_number(weight_decay):
            raise NestflowError(f"weight_decay must be a float or None, got {weight_decay!r}")
        self.learning_rate = float(learning_rate)
        self.weight_decay = float(weight_decay) if weight_decay else None
        self.hyper = check_hyper_parameters(self.type, hyper)
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
        ops, lr = append_optimizer_ops(
            params_grads,
            self.type,
            self.learning_rate,
            name=self.name,
            startup_program=self._startup,
            weight_decay=self.weight_decay,
            **self.hyper,
        )
        if lr is not None:
            self.learning_rate_var = lr
        return ops

    def set_learning_rate(self, value: float, scope: Scope) -> None:
        """Set the learning rate the update ops read from `scope` (takes effect next run)."""
        if self.learning_rate_var is None:
            raise NestflowError(f"{self.name}: call minimize/apply_gradients first")
        var = self.learning_rate_var
        tensor = scope.var(var.name).get_mutable(Tensor)
        tensor.set(np.full(var.shape, value, dtype=var.dtype))
        self.learning_rate = float(value)


class SGD(Optimizer):
    """param -= learning_rate * grad."""

    type = "sgd"

    def __init__(self, learning_rate: float, weight_decay: float | None = None):
        super().__init__(learning_rate, weight_decay)


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
        super().__init__(
            learning_rate, weight_decay, momentum=float(momentum), use_nesterov=bool(use_nesterov)
        )
        self.momentum, self.use_nesterov = self.hyper["momentum"], self.hyper["use_nesterov"]


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
        super().__init__(
            learning_rate,
            weight_decay,
            beta1=float(beta1),
            beta2=float(beta2),
            epsilon=float(epsilon),
        )
        self.beta1, self.beta2, self.epsilon = (
            self.hyper[k] for k in ("beta1", "beta2", "epsilon")
        )
