"""Operators: one class per op, registered with attrs, shape inference, kernel and gradient."""

from nestflow.ops import (  # noqa: F401  (registers the ops)
    activation,
    attention,
    block,
    clip,
    collective,
    conditional_block,
    constant,
    debug,
    decode,
    ifelse,
    indexing,
    logic,
    loss,
    math,
    nn,
    norm,
    onnx_compat,
    optimizer,
    recurrent,
    reduce,
    rnn_unit,
    schedule,
    sequence,
    tensor,
    while_loop,
)
from nestflow.ops.random_state import seed
from nestflow.ops.registry import (
    GradContext,
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
    "GradContext",
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
