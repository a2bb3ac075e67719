"""Optimizer front ends (Fluid 1.8's fluid.optimizer): `minimize(loss)` appends the backward
ops, then the gradient clip, the regularization and one update op per parameter.

    loss = nf.layers.mean(...)
    nf.optimizer.Adam(learning_rate=1e-3, grad_clip=nf.clip.GradientClipByGlobalNorm(1.0),
                      regularization=nf.regularizer.L2Decay(1e-4)).minimize(loss)

The ops and their state are built by nestflow.executor.optimize (shared with
Net.add_optimizer_ops): optimizer state and a number learning rate are persistable variables
initialised by the startup program (`state_vars` lists them once minimize ran). A learning
rate may also be a schedule's variable (nf.layers.exponential_decay(...) etc.). Change a number
learning rate between steps with `set_learning_rate(value, scope)`.

Update rules are torch.optim's for the same settings; constructor arguments and defaults are
Fluid 1.8's (each class also under Fluid's name, e.g. AdagradOptimizer). `weight_decay` is
torch's: L2 decay added to the gradient (regularization=L2Decay(c) is the same), except in
AdamW where it is decoupled. An unknown keyword is an AttrError naming it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from nestflow.core.scope import Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import AttrError, NestflowError
from nestflow.executor.backward import append_backward
from nestflow.executor.optimize import (
    append_optimizer_ops,
    check_gradient_transforms,
    check_hyper_parameters,
    check_learning_rate,
)
from nestflow.framework import unique_name
from nestflow.framework.program import OpDesc, Program, VarDesc

ParamsGrads = list[tuple[VarDesc, VarDesc]]
LearningRate = float | VarDesc


def _rejecting_unknown_options(init: Callable) -> Callable:
    """`init` that raises AttrError (naming the keyword and the known ones) where Python would
    raise TypeError for arguments its signature does not take."""
    signature = inspect.signature(init)
    known = [
        name
        for name, p in signature.parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]

    @functools.wraps(init)
    def checked(self, *args: Any, **kwargs: Any) -> None:
        try:
            signature.bind(self, *args, **kwargs)
        except TypeError as exc:
            unknown = sorted(set(kwargs) - set(known))
            what = f"unknown option {unknown}" if unknown else str(exc)
            raise AttrError(f"{type(self).__name__}: {what}; its options: {known}") from None
        init(self, *args, **kwargs)

    return checked


def _arguments(scope: dict[str, Any]) -> dict[str, Any]:
    """A subclass constructor's arguments (its locals() on entry) for Optimizer.__init__."""
    return {k: v for k, v in scope.items() if k not in ("self", "__class__")}


class Optimizer:
    """Base class: `minimize` = `backward` (append_backward) + `apply_gradients` (clip,
    regularization, update ops). Subclasses set `type` (an nestflow.executor.optimize rule).

    >>> x = nf.data("x", [-1, 2])
    >>> loss = nf.layers.mean(nf.layers.fc(x, 1))
    >>> opt = nf.optimizer.Adam(learning_rate=0.01)
    >>> ops, params_grads = opt.minimize(loss)
    >>> sorted(p.name for p, _ in params_grads)
    ['fc_0.b', 'fc_0.w']
    """

    type = ""

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _rejecting_unknown_options(cls.__dict__["__init__"])

    def __init__(
        self,
        learning_rate: LearningRate | None,
        parameter_list: Sequence[VarDesc | str] | None = None,
        regularization: Callable | None = None,
        grad_clip: Callable | None = None,
        name: str | None = None,
        **hyper: Any,
    ):
        self.hyper = check_hyper_parameters(self.type, hyper)
        self.learning_rate = check_learning_rate(self.type, learning_rate)
        check_gradient_transforms(self.type, regularization, grad_clip, self.hyper)
        for key, value in self.hyper.items():
            setattr(self, key, value)
        self.parameter_list = list(parameter_list) if parameter_list is not None else None
        self.regularization = regularization
        self.grad_clip = grad_clip
        self.name = unique_name.generate(name or self.type)
        self.learning_rate_var: VarDesc | None = None
        self.state_vars: list[VarDesc] = []
        self._startup: Program | None = None

    def minimize(
        self,
        loss: VarDesc,
        startup_program: Program | None = None,
        parameter_list: Sequence[VarDesc | str] | None = None,
        no_grad_set: Iterable[VarDesc | str] | None = None,
    ) -> tuple[list[OpDesc], ParamsGrads]:
        """Append the backward ops of `loss`, then clip, regularization and an update op per
        parameter that got a gradient; returns (update ops, [(param, grad)]) as Fluid does
        (the gradients as backward made them). `parameter_list` defaults to the one given to
        the constructor, then to every trainable parameter."""
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
        parameters = parameter_list if parameter_list is not None else self.parameter_list
        return append_backward(loss, parameters, no_grad_set)

    def apply_gradients(self, params_grads: ParamsGrads) -> list[OpDesc]:
        """Append the clip, regularization and one update op per (param, grad); returns the
        update ops."""
        update = append_optimizer_ops(
            params_grads,
            self.type,
            self.learning_rate,
            name=self.name,
            startup_program=self._startup,
            regularization=self.regularization,
            grad_clip=self.grad_clip,
            **self.hyper,
        )
        if update.learning_rate is not None:
            self.learning_rate_var = update.learning_rate
        self.state_vars.extend(update.state)
        return update.ops

    def set_learning_rate(self, value: float, scope: Scope) -> None:
        """Set the learning rate the update ops read from `scope` (takes effect next run)."""
        if isinstance(self.learning_rate, VarDesc):
            raise NestflowError(
                f"{self.name}: the learning rate is the variable '{self.learning_rate.name}' "
                "(a schedule); it cannot be set"
            )
        if self.learning_rate_var is None:
            raise NestflowError(f"{self.name}: call minimize/apply_gradients first")
        value = check_learning_rate(self.type, value)
        var = self.learning_rate_var
        tensor = scope.var(var.name).get_mutable(Tensor)
        tensor.set(np.full(var.shape, value, dtype=var.dtype))
        self.learning_rate = value


class SGD(Optimizer):
    """param -= learning_rate * grad (torch.optim.SGD).

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "sgd"

    def __init__(
        self,
        learning_rate: LearningRate,
        parameter_list=None,
        regularization=None,
        grad_clip=None,
        name=None,
        weight_decay: float | None = None,
    ):
        super().__init__(**_arguments(locals()))


class Momentum(Optimizer):
    """torch.optim.SGD(momentum=mu, nesterov=use_nesterov): v = mu*v + g, then
    param -= lr * (g + mu*v) with Nesterov, else lr * v. Fluid's momentum op keeps the same
    velocity (its lr * v step is equal).

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.Momentum(learning_rate=0.1, momentum=0.9).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "momentum"

    def __init__(
        self,
        learning_rate: LearningRate,
        momentum: float = 0.9,
        parameter_list=None,
        use_nesterov: bool = False,
        regularization=None,
        grad_clip=None,
        name=None,
        weight_decay: float | None = None,
    ):
        super().__init__(**_arguments(locals()))


class Adagrad(Optimizer):
    """torch.optim.Adagrad (lr_decay 0) and Fluid's adagrad: moment += g^2;
    param -= lr * g / (sqrt(moment) + epsilon); moment starts at initial_accumulator_value.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.Adagrad(learning_rate=0.1).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "adagrad"

    def __init__(
        self,
        learning_rate: LearningRate,
        epsilon: float = 1e-6,
        parameter_list=None,
        regularization=None,
        grad_clip=None,
        name=None,
        initial_accumulator_value: float = 0.0,
        weight_decay: float | None = None,
    ):
        super().__init__(**_arguments(locals()))


class Adam(Optimizer):
    """torch.optim.Adam (bias-corrected, no amsgrad); Fluid's adam is the same rule.
    `lazy_mode` (Fluid's) acts on sparse gradients (`embedding(is_sparse=True)`): only the
    rows they hold are updated, the other rows' moments left as they are (torch's SparseAdam);
    without it every row is updated as with the dense gradient.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.Adam(learning_rate=0.1).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "adam"

    def __init__(
        self,
        learning_rate: LearningRate = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        parameter_list=None,
        regularization=None,
        grad_clip=None,
        name=None,
        weight_decay: float | None = None,
        lazy_mode: bool = False,
    ):
        super().__init__(**_arguments(locals()))


class Adamax(Optimizer):
    """torch.optim.Adamax: m = b1*m + (1-b1)*g; u = max(b2*u, |g| + epsilon);
    param -= lr / (1 - b1^t) * m / u. Departure from Fluid's adamax op, which takes
    max(b2*u + epsilon, |g|): torch's placement of epsilon governs.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.Adamax(learning_rate=0.1).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "adamax"

    def __init__(
        self,
        learning_rate: LearningRate = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        parameter_list=None,
        regularization=None,
        grad_clip=None,
        name=None,
        weight_decay: float | None = None,
    ):
        super().__init__(**_arguments(locals()))


class RMSProp(Optimizer):
    """torch.optim.RMSprop(alpha=rho, eps=epsilon, momentum, centered):
    ms = rho*ms + (1-rho)*g^2; avg = sqrt(ms - mg^2) + epsilon with `centered` (mg the moving
    average of g), else sqrt(ms) + epsilon; v = momentum*v + g/avg; param -= lr * v.
    Departure from Fluid's rmsprop op, which puts epsilon inside the square root and the
    learning rate inside v: torch's rule governs.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.RMSProp(learning_rate=0.01).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "rmsprop"

    def __init__(
        self,
        learning_rate: LearningRate,
        rho: float = 0.95,
        epsilon: float = 1e-6,
        momentum: float = 0.0,
        centered: bool = False,
        parameter_list=None,
        regularization=None,
        grad_clip=None,
        name=None,
        weight_decay: float | None = None,
    ):
        super().__init__(**_arguments(locals()))


class Adadelta(Optimizer):
    """torch.optim.Adadelta: Eg2 = rho*Eg2 + (1-rho)*g^2;
    delta = sqrt(Edx2 + epsilon) / sqrt(Eg2 + epsilon) * g; Edx2 = rho*Edx2 + (1-rho)*delta^2;
    param -= learning_rate * delta. Departure from Fluid, whose adadelta ignores the learning
    rate (learning_rate=1.0 gives Fluid's rule): torch's rule governs.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.Adadelta(learning_rate=1.0).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "adadelta"

    def __init__(
        self,
        learning_rate: LearningRate,
        epsilon: float = 1e-6,
        rho: float = 0.95,
        parameter_list=None,
        regularization=None,
        grad_clip=None,
        name=None,
        weight_decay: float | None = None,
    ):
        super().__init__(**_arguments(locals()))


class AdamW(Optimizer):
    """torch.optim.AdamW: param *= 1 - lr * weight_decay (decoupled decay), then Adam's update.
    `apply_decay_param_fun(param_name) -> bool` (Paddle 2's) limits the decay to the
    parameters it accepts. Fluid 1.8 has no AdamW; arguments follow paddle.optimizer.AdamW.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.AdamW(learning_rate=0.1, weight_decay=0.01).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "adamw"

    def __init__(
        self,
        learning_rate: LearningRate = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        parameter_list=None,
        weight_decay: float = 0.01,
        apply_decay_param_fun: Callable[[str], bool] | None = None,
        regularization=None,
        grad_clip=None,
        name=None,
    ):
        super().__init__(**_arguments(locals()))


class Lamb(Optimizer):
    """LAMB (You et al., 2019), Fluid's lamb op: Adam's bias-corrected moments give
    r = m_hat / (sqrt(v_hat) + epsilon) + lamb_weight_decay * param and
    param -= lr * (||param|| / ||r||) * r, the ratio 1 where a norm is 0. Parameters for which
    exclude_from_weight_decay_fn(param) is true get no weight decay.

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 1])
    >>> loss = nf.layers.mean(nf.layers.square_error_cost(nf.layers.fc(x, 1), y))
    >>> _ = nf.optimizer.Lamb(learning_rate=0.1).minimize(loss)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    >>> losses = [float(exe.run(feed=feed, fetch_list=[loss])[0]) for _ in range(10)]
    >>> losses[-1] < losses[0]
    True
    """

    type = "lamb"

    def __init__(
        self,
        learning_rate: LearningRate = 1e-3,
        lamb_weight_decay: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-6,
        parameter_list=None,
        regularization=None,
        grad_clip=None,
        exclude_from_weight_decay_fn: Callable[[VarDesc], bool] | None = None,
        name=None,
    ):
        super().__init__(**_arguments(locals()))


# Fluid 1.8's names.
SGDOptimizer = SGD
MomentumOptimizer = Momentum
AdagradOptimizer = Adagrad
AdamOptimizer = Adam
AdamaxOptimizer = Adamax
RMSPropOptimizer = RMSProp
AdadeltaOptimizer = Adadelta
LambOptimizer = Lamb
