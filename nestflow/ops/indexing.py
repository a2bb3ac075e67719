"""Indexing and shape ops: where, arg_max/arg_min, top_k, gather, gather_nd, scatter, one_hot,
pad, expand, squeeze/unsqueeze, stack/unstack, cumsum, range, shape,
fill_constant_batch_size_like and strided_slice.

Slot names, attrs and defaults follow PaddlePaddle Fluid 1.8's operators of the same names.
An index outside its tensor (gather, gather_nd, scatter, one_hot) is an ExecutionError at run
time naming the offending value and its position in the index tensor.
"""

from __future__ import annotations

import numpy as np

from nestflow.errors import DTypeError
from nestflow.ops.math import unbroadcast
from nestflow.ops.registry import VarInfo, broadcast_shapes, register_op

# ---- selection: where ----


@register_op
class where:
    """Out = X where Condition holds, else Y (elementwise; Condition bool). Fluid 1.8 needs
    equal shapes; here the three broadcast (NumPy rules) and gradients are summed back."""

    inputs, outputs = ("Condition", "X", "Y"), ("Out",)
    no_grad_inputs = ("Condition",)

    def infer(Condition, X, Y):
        if Condition.dtype != "bool":
            raise DTypeError(f"Condition must be bool, got {Condition.dtype}")
        if X.dtype != Y.dtype:
            raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them")
        shape = broadcast_shapes(X.shape, Y.shape)
        return VarInfo(broadcast_shapes(Condition.shape, shape, "Condition and X/Y"), X.dtype)

    def specialize(Condition, X, Y):
        return np.where  # already returns an array of X's dtype, 0-d included

    def forward(Condition, X, Y):
        return np.where(Condition, X, Y)

    def backward(Condition, X, Y, Out, Out_grad, needs=(True, True)):
        zero = np.zeros((), Out_grad.dtype)
        dx = unbroadcast(np.where(Condition, Out_grad, zero), X.shape) if needs[0] else None
        dy = unbroadcast(np.where(Condition, zero, Out_grad), Y.shape) if needs[1] else None
        return dx, dy


@register_op
class where_index:
    """Out = the coordinates of Condition's true elements, int64 [count, rank], in row-major
    order (Fluid 1.8's `layers.where(condition)`)."""

    inputs, outputs = ("Condition",), ("Out",)

    def infer(Condition):
        return VarInfo((-1, Condition.ndim), "int64")

    def forward(Condition):
        return np.argwhere(Condition).astype(np.int64)
