"""Initializers: each appends the op that fills a parameter to the startup program."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nestflow.errors import AttrError
from nestflow.framework.program import VarDesc


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    # fc weights are [in, out]; conv weights [out, in, kh, kw]
    if len(shape) == 2:
        return shape[0], shape[1]
    return shape[1] * receptive, shape[0] * receptive


class Initializer:
    """Appends to `block` (of the startup program) the op that initialises `var`."""

    def __call__(self, var: VarDesc, block) -> None:
        raise NotImplementedError


@dataclass
class Constant(Initializer):
    value: float = 0.0

    def __call__(self, var, block):
        block.append_op(
            "fill_constant",
            outputs={"Out": [var.name]},
            attrs={"shape": list(var.shape), "dtype": var.dtype, "value": float(self.value)},
        )


@dataclass
class Uniform(Initializer):
    low: float = -1.0
    high: float = 1.0
    seed: int = 0

    def __call__(self, var, block):
        block.append_op(
            "uniform_random",
            outputs={"Out": [var.name]},
            attrs={
                "shape": list(var.shape),
                "dtype": var.dtype,
                "min": float(self.low),
                "max": float(self.high),
                "seed": self.seed,
            },
        )


@dataclass
class Normal(Initializer):
    mean: float = 0.0
    std: float = 1.0
    seed: int = 0

    def __call__(self, var, block):
        block.append_op(
            "gaussian_random",
            outputs={"Out": [var.name]},
            attrs={
                "shape": list(var.shape),
                "dtype": var.dtype,
                "mean": float(self.mean),
                "std": float(self.std),
                "seed": self.seed,
            },
        )


@dataclass
class Xavier(Initializer):
    """Glorot: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)), or the normal variant."""

    uniform: bool = True
    seed: int = 0

    def __call__(self, var, block):
        fan_in, fan_out = _fans(var.shape)
        if self.uniform:
            limit = math.sqrt(6.0 / (fan_in + fan_out))
            Uniform(-limit, limit, self.seed)(var, block)
        else:
            Normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), self.seed)(var, block)


@dataclass
class Kaiming(Initializer):
    """He: N(0, 2 / fan_in), or U(-a, a) with a = sqrt(6 / fan_in)."""

    uniform: bool = False
    seed: int = 0

    def __call__(self, var, block):
        fan_in, _ = _fans(var.shape)
        if self.uniform:
            limit = math.sqrt(6.0 / fan_in)
            Uniform(-limit, limit, self.seed)(var, block)
        else:
            Normal(0.0, math.sqrt(2.0 / fan_in), self.seed)(var, block)


GlorotUniform = Xavier
MSRA = Kaiming


@dataclass
class ParamAttr:
    """How a layer makes its parameter: name, initializer, trainable, and the regularizer
    (an nf.regularizer object) that overrides the optimizer's for this parameter.

    >>> x = nf.data("x", shape=[-1, 3], dtype="float32")
    >>> attr = nf.ParamAttr(name="w", initializer=nf.initializer.Constant(0.5))
    >>> y = nf.layers.fc(x, size=2, param_attr=attr)
    >>> w = nf.default_main_program().global_block().var("w")
    >>> tuple(w.shape), w.persistable
    ((3, 2), True)
    """

    name: str | None = None
    initializer: Initializer | None = None
    trainable: bool = True
    regularizer: Any = None

    def __post_init__(self):
        if self.regularizer is not None and not callable(self.regularizer):
            raise AttrError(
                f"ParamAttr: regularizer must be an nf.regularizer object, not {self.regularizer!r}"
            )

    @staticmethod
    def of(attr) -> ParamAttr | None:
        """Normalise a user's param_attr: None, a name, an Initializer, a ParamAttr, or False."""
        if attr is False:
            return None
        if attr is None or attr is True:
            return ParamAttr()
        if isinstance(attr, str):
            return ParamAttr(name=attr)
        if isinstance(attr, Initializer):
            return ParamAttr(initializer=attr)
        if isinstance(attr, ParamAttr):
            return attr
        raise AttrError(f"param_attr must be a name, Initializer, ParamAttr or False, not {attr!r}")
