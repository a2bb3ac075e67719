"""Activations: relu, sigmoid, tanh, softmax.

NumPy ufuncs return scalars for 0-d arrays, hence the np.asarray around elementwise results.
"""

from __future__ import annotations

import functools

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import DTypeError
from nestflow.ops.registry import VarInfo, fail, numeric_same_as, register_op


def _require_float(X: VarInfo, op: str) -> VarInfo:
    """X, if it is floating point: these kernels make floats, and Out has X's dtype."""
    if not is_floating(X.dtype):
        raise DTypeError(f"{op} needs a floating-point X, got {X.dtype}; cast it first")
    return X


@register_op
class relu:
    """Out = max(X, 0)."""

    inputs, outputs = ("X",), ("Out",)
    infer = numeric_same_as(0)
    inplace = {"Out": "X"}
    grad_inplace = {"X@GRAD": "Out@GRAD"}

    def specialize(X):
        # maximum(0, X) as a C-level partial: no Python frame per call.
        return functools.partial(np.maximum, 0) if X is not None and X.ndim else None

    def forward(X):
        return np.asarray(np.maximum(X, 0))

    def backward(X, Out, Out_grad, out=None):
        if not Out.ndim:
            return (np.asarray(Out_grad * (Out > 0)),)
        return (np.multiply(Out_grad, Out > 0, out=out),)


@register_op
class sigmoid:
    """Out = 1 / (1 + exp(-X))."""

    inputs, outputs = ("X",), ("Out",)
    grad_inplace = {"X@GRAD": "Out@GRAD"}

    def infer(X):
        return _require_float(X, "sigmoid")

    def forward(X):
        # tanh form: no overflow warning for large |X|, same value as 1/(1+exp(-X)).
        return np.asarray((np.tanh(X * 0.5) + 1) * np.asarray(0.5, X.dtype))

    def backward(X, Out, Out_grad, out=None):
        if not Out.ndim:
            return (np.asarray(Out_grad * Out * (1 - Out)),)
        grad = np.multiply(Out_grad, Out, out=out)
        return (np.multiply(grad, 1 - Out, out=grad),)


@register_op
class tanh:
    """Out = tanh(X)."""

    inputs, outputs = ("X",), ("Out",)
    inplace = {"Out": "X"}
    grad_inplace = {"X@GRAD": "Out@GRAD"}

    def infer(X):
        return _require_float(X, "tanh")

    def specialize(X):
        return np.tanh if X is not None and X.ndim else None

    def forward(X):
        return np.asarray(np.tanh(X))

    def backward(X, Out, Out_grad, out=None):
        if not Out.ndim:
            return (np.asarray(Out_grad * (1 - Out * Out)),)
        return (np.multiply(Out_grad, 1 - Out * Out, out=out),)


@register_op
class softmax:
    """Out = exp(X) / sum(exp(X)) along `axis` (default: the last)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"axis": -1}

    def infer(X, axis):
        if X.ndim and not -X.ndim <= axis < X.ndim:  # rank 0: not known yet (a Net's var)
            fail(f"axis {axis} is out of range for X {list(X.shape)}")
        return _require_float(X, "softmax")

    def forward(X, axis):
        shifted = np.exp(X - X.max(axis=axis, keepdims=True)) if X.size else X.copy()
        return shifted / shifted.sum(axis=axis, keepdims=True) if X.size else shifted

    def backward(X, Out, Out_grad, axis):
        return (Out * (Out_grad - (Out_grad * Out).sum(axis=axis, keepdims=True)),)
