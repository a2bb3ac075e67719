"""Optimizer ops for (param, grad) pairs, with the state they keep (seed 003's AddOptimizerOps).

`Net.add_optimizer_ops` and the nf.optimizer frontend both append updates through
`append_optimizer_ops`, so the update rules live below the frontend that names them.

After the backward ops come, in Fluid's order: the gradient clip (`grad_clip`, a callable
taking and returning [(param, grad)] that appends its ops, e.g. nf.clip.GradientClipByNorm),
the regularization (a parameter's own `regularizer`, set through ParamAttr, else the
optimizer's `regularization`: a callable (param, grad, block) -> decay term such as
nf.regularizer.L2Decay; a `sum` op adds the term to the gradient), then one update op per
parameter (nestflow/ops/optimizer.py). Optimizer state (velocity, moments, beta powers) and
the learning rate are persistable variables `<optimizer name>.<param>.<what>` of the main
program's global block, initialised by fill_constant ops in the startup program, so they live
in the scope across runs and are saved with the parameters. A learning rate given as a
variable (a schedule's output, nf.layers.exponential_decay etc.) is read as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError
from nestflow.framework import unique_name
from nestflow.framework.program import (
    Block,
    OpDesc,
    OpRole,
    Program,
    VarDesc,
    default_startup_program,
)

ParamsGrads = Sequence[tuple[VarDesc, VarDesc | None]]


class _Updates:
    """Where one optimizer's state lives: `name`-prefixed persistables of `block`, initialised
    by ops of `startup`; `created` lists the ones made."""

    def __init__(self, name: str, block: Block, startup: Block):
        self.name, self.block, self.startup = name, block, startup
        self.created: list[VarDesc] = []

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
        self.created.append(var)
        return var

    def slot(self, param: VarDesc, what: str, value: float = 0.0) -> VarDesc:
        """Per-parameter state shaped like the parameter."""
        return self.state(f"{param.name}.{what}", param.shape, param.dtype, value)

    def power(self, param: VarDesc, what: str, beta: float) -> VarDesc:
        """beta^t for the step being taken: starts at beta (t = 1), float64 like torch's
        Python floats."""
        return self.state(f"{param.name}.{what}", [1], "float64", beta)

    def update(self, op_type: str, param, grad, lr, state: Mapping[str, VarDesc], attrs) -> OpDesc:
        """The update op: Param/Grad/LearningRate and each state slot in, ParamOut and
        `<slot>Out` written back to the same variables."""
        inputs = {"Param": [param], "Grad": [grad], "LearningRate": [lr]}
        outputs = {"ParamOut": [param]}
        for slot, var in state.items():
            inputs[slot], outputs[f"{slot}Out"] = [var], [var]
        return self.block.append_op(op_type, inputs, outputs, attrs)


def _sgd(u: _Updates, param, grad, lr) -> OpDesc:
    return u.update("sgd", param, grad, lr, {}, {})


def _momentum(u: _Updates, param, grad, lr, momentum, use_nesterov) -> OpDesc:
    attrs = {"mu": momentum, "use_nesterov": use_nesterov}
    return u.update("momentum", param, grad, lr, {"Velocity": u.slot(param, "velocity")}, attrs)


def _adam_state(u: _Updates, param, beta1: float, beta2: float) -> dict[str, VarDesc]:
    return {
        "Moment1": u.slot(param, "moment1"),
        "Moment2": u.slot(param, "moment2"),
        "Beta1Pow": u.power(param, "beta1_pow", beta1),
        "Beta2Pow": u.power(param, "beta2_pow", beta2),
    }


def _adam(u: _Updates, param, grad, lr, beta1, beta2, epsilon, lazy_mode) -> OpDesc:
    attrs = {"beta1": beta1, "beta2": beta2, "epsilon": epsilon, "lazy_mode": lazy_mode}
    return u.update("adam", param, grad, lr, _adam_state(u, param, beta1, beta2), attrs)


def _adamw(
    u: _Updates, param, grad, lr, beta1, beta2, epsilon, weight_decay, apply_decay_param_fun
) -> OpDesc:
    decayed = apply_decay_param_fun is None or apply_decay_param_fun(param.name)
    coeff = weight_decay if decayed else 0.0
    attrs = {"beta1": beta1, "beta2": beta2, "epsilon": epsilon, "coeff": coeff}
    return u.update("adamw", param, grad, lr, _adam_state(u, param, beta1, beta2), attrs)


def _adagrad(u: _Updates, param, grad, lr, epsilon, initial_accumulator_value) -> OpDesc:
    state = {"Moment": u.slot(param, "moment", initial_accumulator_value)}
    return u.update("adagrad", param, grad, lr, state, {"epsilon": epsilon})


def _rmsprop(u: _Updates, param, grad, lr, rho, epsilon, momentum, centered) -> OpDesc:
    state = {"MeanSquare": u.slot(param, "mean_square"), "Moment": u.slot(param, "moment")}
    if centered:
        state["MeanGrad"] = u.slot(param, "mean_grad")
    attrs = {"decay": rho, "epsilon": epsilon, "momentum": momentum, "centered": centered}
    return u.update("rmsprop", param, grad, lr, state, attrs)


def _adadelta(u: _Updates, param, grad, lr, epsilon, rho) -> OpDesc:
    state = {
        "AvgSquaredGrad": u.slot(param, "avg_squared_grad"),
        "AvgSquaredUpdate": u.slot(param, "avg_squared_update"),
    }
    return u.update("adadelta", param, grad, lr, state, {"rho": rho, "epsilon": epsilon})


def _adamax(u: _Updates, param, grad, lr, beta1, beta2, epsilon) -> OpDesc:
    state = {
        "Moment": u.slot(param, "moment"),
        "InfNorm": u.slot(param, "inf_norm"),
        "Beta1Pow": u.power(param, "beta1_pow", beta1),
    }
    attrs = {"beta1": beta1, "beta2": beta2, "epsilon": epsilon}
    return u.update("adamax", param, grad, lr, state, attrs)


def _lamb(
    u: _Updates,
    param,
    grad,
    lr,
    lamb_weight_decay,
    beta1,
    beta2,
    epsilon,
    exclude_from_weight_decay_fn,
) -> OpDesc:
    excluded = exclude_from_weight_decay_fn is not None and exclude_from_weight_decay_fn(param)
    attrs = {
        "weight_decay": 0.0 if excluded else lamb_weight_decay,
        "beta1": beta1,
        "beta2": beta2,
        "epsilon": epsilon,
    }
    return u.update("lamb", param, grad, lr, _adam_state(u, param, beta1, beta2), attrs)


@dataclass(frozen=True)
class UpdateRule:
    """An optimizer type: its update builder, its hyper-parameters with their defaults, its
    default learning rate (None: the caller must give one) and whether it takes torch's
    `weight_decay` (L2 decay added to the gradient) besides its own options."""

    build: Callable[..., OpDesc]
    options: dict[str, Any] = field(default_factory=dict)
    learning_rate: float | None = None
    coupled_decay: bool = True


_BETAS = {"beta1": 0.9, "beta2": 0.999}

UPDATE_RULES: dict[str, UpdateRule] = {
    "sgd": UpdateRule(_sgd),
    "momentum": UpdateRule(_momentum, {"momentum": 0.9, "use_nesterov": False}),
    "adam": UpdateRule(_adam, {**_BETAS, "epsilon": 1e-8, "lazy_mode": False}, 1e-3),
    "adamw": UpdateRule(
        _adamw,
        {**_BETAS, "epsilon": 1e-8, "weight_decay": 0.01, "apply_decay_param_fun": None},
        1e-3,
        coupled_decay=False,
    ),
    "adagrad": UpdateRule(_adagrad, {"epsilon": 1e-6, "initial_accumulator_value": 0.0}),
    "rmsprop": UpdateRule(
        _rmsprop, {"rho": 0.95, "epsilon": 1e-6, "momentum": 0.0, "centered": False}
    ),
    "adadelta": UpdateRule(_adadelta, {"epsilon": 1e-6, "rho": 0.95}),
    "adamax": UpdateRule(_adamax, {**_BETAS, "epsilon": 1e-8}, 1e-3),
    "lamb": UpdateRule(
        _lamb,
        {
            "lamb_weight_decay": 0.01,
            **_BETAS,
            "epsilon": 1e-6,
            "exclude_from_weight_decay_fn": None,
        },
        1e-3,
        coupled_decay=False,
    ),
}

# Options that must lie in [0, 1) (betas) or [0, 1] (rho); every other number must be >= 0.
_BELOW_ONE = {"beta1", "beta2"}
_AT_MOST_ONE = {"rho"}


def is_number(value: Any) -> bool:
    """A real number (Python or NumPy scalar), not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def _check_option(kind: str, key: str, value: Any, default: Any) -> Any:
    where = f"optimizer '{kind}': {key}"
    if isinstance(default, bool):
        if not isinstance(value, (bool, np.bool_)):
            raise AttrError(f"{where} must be a bool, got {value!r}")
        return bool(value)
    if default is None and key != "weight_decay":
        if value is not None and not callable(value):
            raise AttrError(f"{where} must be a function of the parameter or None, got {value!r}")
        return value
    if value is None and key == "weight_decay":
        return None
    if not is_number(value) or not math.isfinite(value) or value < 0:
        raise AttrError(f"{where} must be a number >= 0, got {value!r}")
    if key in _BELOW_ONE and not value < 1:
        raise AttrError(f"{where} must be in [0, 1), got {value!r}")
    if key in _AT_MOST_ONE and not value <= 1:
        raise AttrError(f"{where} must be in [0, 1], got {value!r}")
    return float(value)


def check_hyper_parameters(kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` completed with the rule's defaults and checked; AttrError for an unknown type,
    an unknown key (naming it) or a bad value. Rules without a weight_decay of their own take
    `weight_decay` as torch's (coupled) one: L2 decay added to the gradient (AdamW's is its
    own, decoupled; Lamb has lamb_weight_decay)."""
    if kind not in UPDATE_RULES:
        raise AttrError(f"unknown optimizer type '{kind}'; known: {sorted(UPDATE_RULES)}")
    rule = UPDATE_RULES[kind]
    defaults = dict(rule.options)
    if rule.coupled_decay:
        defaults["weight_decay"] = None
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise AttrError(
            f"optimizer '{kind}' has no option {unknown}; its options: ['learning_rate', "
            f"'regularization', 'grad_clip'{''.join(f', {k!r}' for k in defaults)}]"
        )
    return {k: _check_option(kind, k, options.get(k, v), v) for k, v in defaults.items()}


def check_learning_rate(kind: str, learning_rate: Any) -> float | VarDesc:
    """A number >= 0 or a one-element floating variable (a schedule's output); None takes the
    rule's default. AttrError otherwise."""
    if learning_rate is None:
        learning_rate = UPDATE_RULES[kind].learning_rate
        if learning_rate is None:
            raise AttrError(f"optimizer '{kind}' needs a 'learning_rate'")
    if isinstance(learning_rate, VarDesc):
        var = learning_rate
        if not is_floating(var.dtype) or (
            all(d >= 0 for d in var.shape) and int(np.prod(var.shape)) != 1
        ):
            raise AttrError(
                f"learning_rate variable '{var.name}' must be floating point with one value, "
                f"got {var.dtype} {list(var.shape)}"
            )
        return var
    if not is_number(learning_rate) or not math.isfinite(learning_rate) or learning_rate < 0:
        raise AttrError(
            f"learning_rate must be a number >= 0 or a one-value variable (a schedule's), got "
            f"{learning_rate!r}"
        )
    return float(learning_rate)


def check_gradient_transforms(
    kind: str, regularization: Any, grad_clip: Any, options: Mapping[str, Any]
) -> None:
    """AttrError unless regularization and grad_clip are None or callables (nf.regularizer /
    nf.clip objects), and unless at most one of regularization and torch's (coupled)
    weight_decay is among the rule's `options`."""
    weight_decay = options.get("weight_decay") if UPDATE_RULES[kind].coupled_decay else None
    for what, value in (("regularization", regularization), ("grad_clip", grad_clip)):
        if value is not None and not callable(value):
            module = "regularizer" if what == "regularization" else "clip"
            raise AttrError(
                f"optimizer '{kind}': {what} must be an nf.{module} object, got {value!r}"
            )
    if weight_decay and regularization is not None:
        raise AttrError(
            f"optimizer '{kind}': give weight_decay (L2 decay) or regularization, not both"
        )


def decay_term(
    param: VarDesc, block: Block, coeff: float, l1: bool = False, grad: VarDesc | None = None
) -> VarDesc:
    """The term weight decay adds to `param`'s gradient, as ops of `block`: coeff * param (L2)
    or coeff * sign(param) (L1), Fluid's L2Decay/L1Decay. For a sparse `grad` (a SelectedRows)
    the term is a SelectedRows too, of the gradient's rows only, as Fluid decays them."""
    if grad is not None and grad.type == "selected_rows":
        name = unique_name.generate(f"{param.name}.decay")
        term = block.create_var(name, param.shape, param.dtype, type="selected_rows")
        attrs = {"coeff": float(coeff), "l1": l1}
        block.append_op(
            "selected_rows_decay", {"Param": [param], "Grad": [grad]}, {"Out": [term]}, attrs
        )
        return term
    source = param
    if l1:
        sign = unique_name.generate(f"{param.name}.sign")
        source = block.create_var(sign, param.shape, param.dtype)
        block.append_op("sign", {"X": [param]}, {"Out": [source]})
    term = block.create_var(unique_name.generate(f"{param.name}.decay"), param.shape, param.dtype)
    block.append_op("scale", {"X": [source]}, {"Out": [term]}, {"scale": float(coeff)})
    return term


def regularized_gradient(block: Block, param: VarDesc, grad: VarDesc, default) -> VarDesc:
    """grad + the decay term of param's own regularizer (ParamAttr(regularizer=...)), else of
    `default`, as a `sum` op of `block`; grad itself when neither gives a term."""
    regularizer = getattr(param, "regularizer", None) or default
    term = None if regularizer is None else regularizer(param, grad, block)
    if term is None:
        return grad
    name = unique_name.generate(f"{grad.name}.regularized")
    total = block.create_var(name, grad.shape, grad.dtype)
    block.append_op("sum", {"X": [grad, term]}, {"Out": [total]})
    return total


@dataclass
class UpdatePass:
    """What append_optimizer_ops appended: the update ops, the learning-rate variable, the
    persistable state it created (learning rate included when it made it) and the
    (param, grad) pairs the updates read (after clipping and regularization)."""

    ops: list[OpDesc]
    learning_rate: VarDesc | None
    state: list[VarDesc]
    params_grads: list[tuple[VarDesc, VarDesc]]


def append_optimizer_ops(
    params_grads: ParamsGrads,
    kind: str,
    learning_rate: float | VarDesc | None = None,
    *,
    name: str | None = None,
    startup_program: Program | None = None,
    regularization: Callable | None = None,
    grad_clip: Callable | None = None,
    **options: Any,
) -> UpdatePass:
    """Append, for the (param, grad) pairs with a gradient, the gradient clip, regularization
    and one `kind` update op each, and the startup ops of their state. Everything is checked
    before anything is appended (AttrError naming the bad option).

    A number learning rate becomes a persistable [1] variable `<name>.learning_rate` (float64
    when a parameter is) so it can change between runs without rebuilding the program."""
    options = check_hyper_parameters(kind, options)
    rule = UPDATE_RULES[kind]
    learning_rate = check_learning_rate(kind, learning_rate)
    check_gradient_transforms(kind, regularization, grad_clip, options)
    coupled_decay = options.pop("weight_decay") if rule.coupled_decay else None
    pairs = [(p, g) for p, g in params_grads if g is not None]
    if not pairs:
        return UpdatePass([], learning_rate if isinstance(learning_rate, VarDesc) else None, [], [])
    block = pairs[0][0].block.program.global_block()
    if isinstance(learning_rate, VarDesc) and learning_rate.block.program is not block.program:
        raise AttrError(
            f"learning_rate variable '{learning_rate.name}' belongs to another program than "
            f"the parameters"
        )
    startup = (startup_program or default_startup_program()).global_block()
    states = _Updates(name or unique_name.generate(kind), block, startup)
    if isinstance(learning_rate, VarDesc):
        lr = learning_rate
    else:
        wide = any(np.dtype(p.dtype) == np.float64 for p, _ in pairs)
        lr = states.state("learning_rate", [1], "float64" if wide else "float32", learning_rate)
    if coupled_decay:

        def regularization(param: VarDesc, grad: VarDesc, blk: Block) -> VarDesc:
            return decay_term(param, blk, coupled_decay)

    with block.program.op_role_guard(OpRole.OPTIMIZE):
        if grad_clip is not None:
            pairs = [(p, g) for p, g in grad_clip(pairs)]
        pairs = [(p, regularized_gradient(block, p, g, regularization)) for p, g in pairs]
        ops = [rule.build(states, p, g, lr, **options) for p, g in pairs]
    return UpdatePass(ops, lr, states.created, pairs)
