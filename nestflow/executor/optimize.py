"""Optimizer ops for (param, grad) pairs, with the state they keep (seed 003's AddOptimizerOps).

`Net.add_optimizer_ops` and the nf.optimizer frontend both append updates through
`append_optimizer_ops`, so the update rules live below the frontend that names them.

The update ops (`sgd`, `momentum`, `adam` in nestflow/ops/optimizer.py) write each parameter
and its state in place, after the backward ops. Optimizer state (velocity, moments, beta
powers) and the learning rate are persistable variables of the main program's global block,
initialised by fill_constant ops in the startup program, so they live in the scope across runs
and are saved with the parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from nestflow.errors import AttrError
from nestflow.framework import unique_name
from nestflow.framework.program import Block, OpDesc, Program, VarDesc, default_startup_program

ParamsGrads = Sequence[tuple[VarDesc, VarDesc | None]]


class _Updates:
    """Where one optimizer's state lives: `name`-prefixed persistables of `block`, initialised
    by ops of `startup`."""

    def __init__(self, name: str, block: Block, startup: Block):
        self.name, self.block, self.startup = name, block, startup

    def state(self, what: str, shape, dtype: str, value: float) -> VarDesc:
        """A persistable state variable, set to `value` by the startup program."""
        name = f"{self.name}.{what}"
        found = self.block.find_var(name)
        if found is not None:
            return found
        var = self.block.create_var(name, shape, dtype, persistable=True, stop_gradient=True)
        out = self.startup.create_var(name, shape, dtype, persistable=True)
        attrs = {"shape": list(shape), "dtype": dtype, "value": float(value)}
        self.startup.append_op("fill_constant", {}, {"Out": [out]}, attrs)
        return var

    def slot(self, param: VarDesc, what: str, value: float = 0.0) -> VarDesc:
        """Per-parameter state shaped like the parameter."""
        return self.state(f"{param.name}.{what}", param.shape, param.dtype, value)


def _sgd(states: _Updates, param, grad, lr) -> OpDesc:
    """param -= learning_rate * grad."""
    return states.block.append_op(
        "sgd", {"Param": [param], "Grad": [grad], "LearningRate": [lr]}, {"ParamOut": [param]}
    )


def _momentum(states: _Updates, param, grad, lr, momentum=0.9, use_nesterov=False) -> OpDesc:
    """torch.optim.SGD(momentum=mu, nesterov=use_nesterov)."""
    velocity = states.slot(param, "velocity")
    return states.block.append_op(
        "momentum",
        {"Param": [param], "Grad": [grad], "Velocity": [velocity], "LearningRate": [lr]},
        {"ParamOut": [param], "VelocityOut": [velocity]},
        {"mu": float(momentum), "use_nesterov": bool(use_nesterov)},
    )


def _adam(states: _Updates, param, grad, lr, beta1=0.9, beta2=0.999, epsilon=1e-8) -> OpDesc:
    """torch.optim.Adam, bias-corrected."""
    m1 = states.slot(param, "moment1")
    m2 = states.slot(param, "moment2")
    # b^t for the step being taken: starts at b (t = 1), float64 like torch's Python floats.
    pow1 = states.state(f"{param.name}.beta1_pow", [1], "float64", beta1)
    pow2 = states.state(f"{param.name}.beta2_pow", [1], "float64", beta2)
    return states.block.append_op(
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
        {"beta1": float(beta1), "beta2": float(beta2), "epsilon": float(epsilon)},
    )


# optimizer type -> (update builder, its hyper-parameters with defaults)
UPDATE_RULES: dict[str, tuple[Callable[..., OpDesc], dict[str, Any]]] = {
    "sgd": (_sgd, {}),
    "momentum": (_momentum, {"momentum": 0.9, "use_nesterov": False}),
    "adam": (_adam, {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
}


def is_number(value: Any) -> bool:
    """A real number (Python or NumPy scalar), not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def check_hyper_parameters(kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` completed with the rule's defaults; AttrError for an unknown type or key."""
    if kind not in UPDATE_RULES:
        raise AttrError(f"unknown optimizer type '{kind}'; known: {sorted(UPDATE_RULES)}")
    defaults = UPDATE_RULES[kind][1]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise AttrError(
            f"optimizer '{kind}' has no option {unknown}; its options: "
            f"['learning_rate', 'weight_decay'{''.join(f', {k!r}' for k in defaults)}]"
        )
    return {**defaults, **options}


def append_optimizer_ops(
    params_grads: ParamsGrads,
    kind: str,
    learning_rate: float,
    *,
    name: str | None = None,
    startup_program: Program | None = None,
    weight_decay: float | None = None,
    **options: Any,
) -> tuple[list[OpDesc], VarDesc | None]:
    """Append one `kind` update op per (param, grad) with a gradient (after weight decay, if
    set) and the startup ops of its state; returns (update ops, learning-rate variable).

    The learning rate is a persistable [1] variable `<name>.learning_rate` so it can change
    between runs without rebuilding the program."""
    options = check_hyper_parameters(kind, options)
    rule = UPDATE_RULES[kind][0]
    if not is_number(learning_rate) or learning_rate < 0:
        raise AttrError(f"learning_rate must be a number >= 0, got {learning_rate!r}")
    pairs = [(p, g) for p, g in params_grads if g is not None]
    if not pairs:
        return [], None
    block = pairs[0][0].block.program.global_block()
    startup = (startup_program or default_startup_program()).global_block()
    states = _Updates(name or unique_name.generate(kind), block, startup)
    wide = any(np.dtype(p.dtype) == np.float64 for p, _ in pairs)
    lr = states.state("learning_rate", [1], "float64" if wide else "float32", learning_rate)
    ops = []
    for param, grad in pairs:
        if weight_decay:
            grad = _with_weight_decay(block, param, grad, float(weight_decay))
        ops.append(rule(states, param, grad, lr, **options))
    return ops, lr


def _with_weight_decay(block: Block, param: VarDesc, grad: VarDesc, decay: float) -> VarDesc:
    """grad + decay * param (L2 regularisation, torch's weight_decay), as ops."""
    scaled = block.create_var(unique_name.generate(f"{param.name}.decay"), param.shape, param.dtype)
    block.append_op("scale", {"X": [param]}, {"Out": [scaled]}, {"scale": decay})
    total = block.create_var(unique_name.generate(f"{grad.name}.decayed"), grad.shape, grad.dtype)
    block.append_op("sum", {"X": [grad, scaled]}, {"Out": [total]})
    return total
