"""Activations: relu, sigmoid, tanh, softmax."""

from __future__ import annotations

import numpy as np

from nestflow.ops.registry import register_op, same_as


@register_op
class relu:
    """Out = max(X, 0)."""

    inputs, outputs = ("X",), ("Out",)
    infer = same_as(0)

    def forward(X):
        return np.maximum(X, 0)

    def backward(X, Out, Out_grad):
        return (Out_grad * (Out > 0),)


@register_op
class sigmoid:
    """Out = 1 / (1 + exp(-X))."""

    inputs, outputs = ("X",), ("Out",)
    infer = same_as(0)

    def forward(X):
        # tanh form: no overflow warning for large |X|, same value as 1/(1+exp(-X)).
        return (np.tanh(X * 0.5) + 1) * np.asarray(0.5, X.dtype)

    def backward(X, Out, Out_grad):
        return (Out_grad * Out * (1 - Out),)


@register_op
class tanh:
    """Out = tanh(X)."""

    inputs, outputs = ("X",), ("Out",)
    infer = same_as(0)

    def forward(X):
        return np.tanh(X)

    def backward(X, Out, Out_grad):
        return (Out_grad * (1 - Out * Out),)


@register_op
class softmax:
    """Out = exp(X) / sum(exp(X)) along `axis` (default: the last)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"axis": -1}
    infer = same_as(0)

    def forward(X, axis):
        shifted = np.exp(X - X.max(axis=axis, keepdims=True)) if X.size else X.copy()
        return shifted / shifted.sum(axis=axis, keepdims=True) if X.size else shifted

    def backward(X, Out, Out_grad, axis):
        return (Out * (Out_grad - (Out_grad * Out).sum(axis=axis, keepdims=True)),)
