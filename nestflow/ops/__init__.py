"""Operators: one class per op, registered with attrs, shape inference, kernel and gradient."""

from nestflow.ops import activation, math, tensor  # noqa: F401  (registers the ops)
from nestflow.ops.random_state import seed
from nestflow.ops.registry import (
    GradOpSpec,
    OpDef,
    Required,
    VarInfo,
    get_op_def,
    has_op,
    register_op,
    registered_ops,
)

__all__ = [
    "GradOpSpec",
    "OpDef",
    "Required",
    "VarInfo",
    "get_op_def",
    "has_op",
    "register_op",
    "registered_ops",
    "seed",
]
