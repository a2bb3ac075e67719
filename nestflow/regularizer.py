"""Weight regularizers (Fluid 1.8's fluid.regularizer): L2Decay, L1Decay.

A regularizer adds a decay term to a parameter's gradient before the update, as ops appended
after the backward ops (and after gradient clipping): L2Decay(c) makes it grad + c * param
(torch's `weight_decay`), L1Decay(c) grad + c * sign(param). Give one to an optimizer
(`regularization=`, for every parameter) or to one parameter through
`ParamAttr(regularizer=...)`, which takes precedence over the optimizer's. A sparse gradient
(a SelectedRows, `embedding(is_sparse=True)`) is decayed on its rows only, as Fluid does
(once per occurrence of a row, as Fluid's term is looked up by the gradient's rows); it stays
a SelectedRows, where Fluid writes the sum dense (the same values).

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
    term to `block` and returns the term's variable (param's shape and dtype).

    >>> x = nf.data("x", [-1, 2])
    >>> loss = nf.layers.mean(nf.layers.fc(x, 1))
    >>> reg = nf.regularizer.L2Decay(1e-4)
    >>> isinstance(reg, nf.regularizer.WeightDecayRegularizer)
    True
    >>> _ = nf.optimizer.SGD(learning_rate=0.1, regularization=reg).minimize(loss)
    """

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
        return decay_term(param, block, self.regularization_coeff, l1=self.l1, grad=grad)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(regularization_coeff={self.regularization_coeff})"


class L2DecayRegularizer(WeightDecayRegularizer):
    """The term regularization_coeff * param (the gradient of coeff/2 * ||param||^2).

    >>> x = nf.data("x", [-1, 2])
    >>> w = nf.ParamAttr(initializer=nf.initializer.Constant(2.0))
    >>> params_grads = nf.append_backward(nf.layers.reduce_sum(nf.layers.fc(x, 1, param_attr=w)))
    >>> out = nf.regularizer.append_regularization_ops(params_grads, nf.regularizer.L2Decay(0.5))
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> grads = exe.run(feed={"x": np.full((3, 2), 5, "float32")}, fetch_list=[g for _, g in out])
    >>> [g.ravel().tolist() for g in grads]  # 15 + 0.5 * 2 for the weights
    [[16.0, 16.0], [3.0]]
    """


class L1DecayRegularizer(WeightDecayRegularizer):
    """The term regularization_coeff * sign(param) (the gradient of coeff * ||param||_1).

    >>> x = nf.data("x", [-1, 2])
    >>> w = nf.ParamAttr(initializer=nf.initializer.Constant(2.0))
    >>> params_grads = nf.append_backward(nf.layers.reduce_sum(nf.layers.fc(x, 1, param_attr=w)))
    >>> out = nf.regularizer.append_regularization_ops(params_grads, nf.regularizer.L1Decay(0.5))
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> grads = exe.run(feed={"x": np.full((3, 2), 5, "float32")}, fetch_list=[g for _, g in out])
    >>> [g.ravel().tolist() for g in grads]  # 15 + 0.5 * sign(2) for the weights
    [[15.5, 15.5], [3.0]]
    """

    l1 = True


L2Decay = L2DecayRegularizer
L1Decay = L1DecayRegularizer


def append_regularization_ops(
    parameters_and_grads: ParamsGrads, regularization: WeightDecayRegularizer | None = None
) -> list[tuple[VarDesc, VarDesc | None]]:
    """[(param, grad + decay term)], the term from param's own regularizer, else from
    `regularization` (Fluid's function of that name); pairs without a gradient, or without a
    regularizer, are returned as they are.

    >>> x = nf.data("x", [-1, 2])
    >>> w = nf.ParamAttr(initializer=nf.initializer.Constant(2.0))
    >>> params_grads = nf.append_backward(nf.layers.reduce_sum(nf.layers.fc(x, 1, param_attr=w)))
    >>> out = nf.regularizer.append_regularization_ops(params_grads, nf.regularizer.L2Decay(1.0))
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> grads = exe.run(feed={"x": np.full((3, 2), 5, "float32")}, fetch_list=[g for _, g in out])
    >>> [g.ravel().tolist() for g in grads]  # the bias is regularized too: 3 + 1.0 * 0
    [[17.0, 17.0], [3.0]]
    """
    result = []
    for param, grad in parameters_and_grads:
        if grad is not None:
            grad = regularized_gradient(grad.block, param, grad, regularization)
        result.append((param, grad))
    return result
