"""Weight regularizers (Fluid 1.8's fluid.regularizer): L2Decay, L1Decay.

A regularizer adds a decay term to a parameter's gradient before the update, as ops appended
after the backward ops (and after gradient clipping): L2Decay(c) makes it grad + c * param
(torch's `weight_decay`), L1Decay(c) grad + c * sign(param). Give one to an optimizer
(`regularization=`, for every parameter) or to one parameter through
`ParamAttr(regularizer=...)`, which takes precedence over the optimizer's.

    >>> import nestflow as nf
    >>> opt = nf.optimizer.SGD(0.1, regularization=nf.regularizer.L2Decay(1e-4))
"""

from __future__ import annotations

import math
import numbers

from nestflow.errors import AttrError
from nestflow.executor.optimize import ParamsGrads, decay_term, regularized_gradient
from nestflow.framework.program import Block, VarDesc

__all__ = [
    "L1Decay",
    "L1DecayRegularizer",
    "L2Decay",
    "L2DecayRegularizer",
    "WeightDecayRegularizer",
    "append_regularization_ops",
]


class WeightDecayRegularizer:
    """Base class: `regularizer(param, grad, block)` appends the ops computing param's decay
    term to `block` and returns the term's variable (param's shape and dtype)."""

    l1 = False

    def __init__(self, regularization_coeff: float = 0.0):
        coeff = regularization_coeff
        if isinstance(coeff, bool) or not isinstance(coeff, numbers.Real):
            raise AttrError(f"{type(self).__name__}: regularization_coeff must be a number")
        if not math.isfinite(coeff) or coeff < 0:
            raise AttrError(
                f"{type(self).__name__}: regularization_coeff must be >= 0, got {coeff!r}"
            )
        self.regularization_coeff = float(coeff)

    def __call__(self, param: VarDesc, grad: VarDesc, block: Block) -> VarDesc:
        return decay_term(param, block, self.regularization_coeff, l1=self.l1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(regularization_coeff={self.regularization_coeff})"


class L2DecayRegularizer(WeightDecayRegularizer):
    """The term regularization_coeff * param (the gradient of coeff/2 * ||param||^2)."""


class L1DecayRegularizer(WeightDecayRegularizer):
    """The term regularization_coeff * sign(param) (the gradient of coeff * ||param||_1)."""

    l1 = True


L2Decay = L2DecayRegularizer
L1Decay = L1DecayRegularizer


def append_regularization_ops(
    parameters_and_grads: ParamsGrads, regularization: WeightDecayRegularizer | None = None
) -> list[tuple[VarDesc, VarDesc | None]]:
    """[(param, grad + decay term)], the term from param's own regularizer, else from
    `regularization` (Fluid's function of that name); pairs without a gradient, or without a
    regularizer, are returned as they are."""
    result = []
    for param, grad in parameters_and_grads:
        if grad is not None:
            grad = regularized_gradient(grad.block, param, grad, regularization)
        result.append((param, grad))
    return result
