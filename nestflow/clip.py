"""Gradient clipping (Fluid 1.8's fluid.clip): GradientClipByValue, GradientClipByNorm,
GradientClipByGlobalNorm.

Give one to an optimizer as `grad_clip=`: its ops go between the backward ops and the
regularization and update ops, and the update reads the clipped gradients. `need_clip(param)`
(optional) picks the parameters whose gradients are clipped; the others pass unchanged.

    >>> import nestflow as nf
    >>> opt = nf.optimizer.Adam(1e-3, grad_clip=nf.clip.GradientClipByGlobalNorm(1.0))

Formulas are Fluid's: ByValue is torch.nn.utils.clip_grad_value_; ByNorm and ByGlobalNorm
scale by clip_norm / norm when norm > clip_norm, where torch's clip_grad_norm_ divides by
norm + 1e-6 (a relative difference of 1e-6 / norm).
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from nestflow.errors import AttrError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc

__all__ = [
    "GradientClipBase",
    "GradientClipByGlobalNorm",
    "GradientClipByNorm",
    "GradientClipByValue",
]

ParamsGrads = Sequence[tuple[VarDesc, VarDesc | None]]


def _finite(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise AttrError(f"{owner}: {name} must be a finite number, got {value!r}")
    return float(value)


class GradientClipBase(ABC):
    """`clip(params_grads)` appends the clipping ops and returns [(param, clipped grad)].

    >>> x = nf.data("x", [-1, 2])
    >>> loss = nf.layers.mean(nf.layers.fc(x, 1))
    >>> clip = nf.clip.GradientClipByGlobalNorm(clip_norm=1.0)
    >>> isinstance(clip, nf.clip.GradientClipBase)
    True
    >>> _ = nf.optimizer.SGD(learning_rate=0.1, grad_clip=clip).minimize(loss)
    """

    def __init__(self, need_clip: Callable[[VarDesc], bool] | None = None):
        if need_clip is not None and not callable(need_clip):
            raise AttrError(f"{type(self).__name__}: need_clip must be a function of the param")
        self.need_clip = need_clip

    def __call__(self, params_grads: ParamsGrads) -> list[tuple[VarDesc, VarDesc | None]]:
        chosen = [
            i
            for i, (param, grad) in enumerate(params_grads)
            if grad is not None and (self.need_clip is None or self.need_clip(param))
        ]
        clipped = self._clip([params_grads[i][1] for i in chosen]) if chosen else []
        result = list(params_grads)
        for i, grad in zip(chosen, clipped):
            result[i] = (result[i][0], grad)
        return result

    @abstractmethod
    def _clip(self, grads: list[VarDesc]) -> list[VarDesc]:
        """Append the ops clipping `grads` (all in one block); return the clipped ones."""

    @staticmethod
    def _output(grad: VarDesc) -> VarDesc:
        name = unique_name.generate(f"{grad.name}.clipped")
        return grad.block.create_var(name, grad.shape, grad.dtype, type=grad.type)

    @classmethod
    def _each(cls, grads: list[VarDesc], op_type: str, attrs: dict[str, float]) -> list[VarDesc]:
        """One `op_type` op (X -> Out) per gradient."""
        outs = [cls._output(grad) for grad in grads]
        for grad, out in zip(grads, outs):
            grad.block.append_op(op_type, {"X": [grad]}, {"Out": [out]}, attrs)
        return outs


class GradientClipByValue(GradientClipBase):
    """Each gradient element clipped to [min, max]; min defaults to -max (then max must be
    > 0). torch.nn.utils.clip_grad_value_(params, max) for min = -max.

    >>> x = nf.data("x", [-1, 2])
    >>> w = nf.ParamAttr(initializer=nf.initializer.Constant(2.0))
    >>> params_grads = nf.append_backward(nf.layers.reduce_sum(nf.layers.fc(x, 1, param_attr=w)))
    >>> out = nf.clip.GradientClipByValue(max=1.0)(params_grads)  # the raw grads: 15s and 3
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> grads = exe.run(feed={"x": np.full((3, 2), 5, "float32")}, fetch_list=[g for _, g in out])
    >>> [g.ravel().tolist() for g in grads]
    [[1.0, 1.0], [1.0]]
    """

    def __init__(self, max: float, min: float | None = None, need_clip=None):
        super().__init__(need_clip)
        high = _finite(type(self).__name__, "max", max)
        if min is None and not high > 0:
            raise AttrError(f"GradientClipByValue: max must be > 0 when min is None, got {max}")
        low = -high if min is None else _finite(type(self).__name__, "min", min)
        if low > high:
            raise AttrError(f"GradientClipByValue: min ({low}) must not exceed max ({high})")
        self.min, self.max = low, high

    def _clip(self, grads: list[VarDesc]) -> list[VarDesc]:
        return self._each(grads, "clip", {"min": self.min, "max": self.max})

    def __repr__(self) -> str:
        return f"GradientClipByValue(max={self.max}, min={self.min})"


class GradientClipByNorm(GradientClipBase):
    """Each gradient scaled by clip_norm / ||grad|| when its own L2 norm exceeds clip_norm
    (Fluid's clip_by_norm op).

    >>> x = nf.data("x", [-1, 2])
    >>> w = nf.ParamAttr(initializer=nf.initializer.Constant(2.0))
    >>> params_grads = nf.append_backward(nf.layers.reduce_sum(nf.layers.fc(x, 1, param_attr=w)))
    >>> out = nf.clip.GradientClipByNorm(clip_norm=1.0)(params_grads)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> grads = exe.run(feed={"x": np.full((3, 2), 5, "float32")}, fetch_list=[g for _, g in out])
    >>> [round(float(np.linalg.norm(g)), 4) for g in grads]
    [1.0, 1.0]
    """

    def __init__(self, clip_norm: float, need_clip=None):
        super().__init__(need_clip)
        self.clip_norm = _finite(type(self).__name__, "clip_norm", clip_norm)
        if not self.clip_norm > 0:
            raise AttrError(f"GradientClipByNorm: clip_norm must be > 0, got {clip_norm}")

    def _clip(self, grads: list[VarDesc]) -> list[VarDesc]:
        return self._each(grads, "clip_by_norm", {"max_norm": self.clip_norm})

    def __repr__(self) -> str:
        return f"GradientClipByNorm(clip_norm={self.clip_norm})"


class GradientClipByGlobalNorm(GradientClipBase):
    """Every gradient scaled by clip_norm / max(global_norm, clip_norm), global_norm being the
    L2 norm of all the clipped gradients together (one clip_by_global_norm op).

    >>> x = nf.data("x", [-1, 2])
    >>> w = nf.ParamAttr(initializer=nf.initializer.Constant(2.0))
    >>> params_grads = nf.append_backward(nf.layers.reduce_sum(nf.layers.fc(x, 1, param_attr=w)))
    >>> out = nf.clip.GradientClipByGlobalNorm(clip_norm=1.0)(params_grads)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> grads = exe.run(feed={"x": np.full((3, 2), 5, "float32")}, fetch_list=[g for _, g in out])
    >>> round(float(np.sqrt(sum((g ** 2).sum() for g in grads))), 4)
    1.0
    """

    def __init__(self, clip_norm: float, group_name: str = "default_group", need_clip=None):
        super().__init__(need_clip)
        self.clip_norm = _finite(type(self).__name__, "clip_norm", clip_norm)
        if not self.clip_norm > 0:
            raise AttrError(f"GradientClipByGlobalNorm: clip_norm must be > 0, got {clip_norm}")
        self.group_name = str(group_name)

    def _clip(self, grads: list[VarDesc]) -> list[VarDesc]:
        outs = [self._output(grad) for grad in grads]
        attrs = {"max_global_norm": self.clip_norm}
        grads[0].block.append_op("clip_by_global_norm", {"X": grads}, {"Out": outs}, attrs)
        return outs

    def __repr__(self) -> str:
        return f"GradientClipByGlobalNorm(clip_norm={self.clip_norm})"
