"""The seeds' spelling of variables: `minibatch`, `var`, `sequence`, `get_variable`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nestflow.errors import NestflowError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers.helper import create_parameter, current_block, literal_array
from nestflow.layers.initializer import Constant


def _literal(values: np.ndarray, declared_shape: Sequence[int], prefix: str, **flags) -> VarDesc:
    block = current_block()
    out = block.create_var(unique_name.generate(prefix), declared_shape, values.dtype, **flags)
    block.append_op(
        "assign_value",
        outputs={"Out": [out]},
        attrs={
            "shape": list(values.shape),
            "dtype": values.dtype.name,
            "values": values.ravel().tolist(),
        },
    )
    out.shape = tuple(declared_shape)  # the batch dims stay unknown to shape inference
    return out


def minibatch(rows: Sequence[Any], dtype: Any = "float32") -> VarDesc:
    """A [N, 1] minibatch variable holding `rows` (declared [-1, 1]: N is a batch dim)."""
    values = literal_array(rows, dtype, "minibatch")
    values = values.reshape(len(values), -1)
    return _literal(values, [-1, *values.shape[1:]], "minibatch", stop_gradient=True)


def sequence(steps: Sequence[Any], dtype: Any = "float32") -> VarDesc:
    """One sequence of len(steps) time steps: a [1, T, F] batch of sequences (F = 1 for
    scalars), declared [-1, -1, F] and marked is_sequence so an RNN slices it per step."""
    values = literal_array(steps, dtype, "sequence")
    values = values.reshape(1, len(values), -1)
    return _literal(
        values, [-1, -1, *values.shape[2:]], "sequence", stop_gradient=True, is_sequence=True
    )


def var(
    value: Any = 0.0, param: bool = False, dtype: Any = "float32", name: str | None = None
) -> VarDesc:
    """A [1] variable holding `value`; with param=True a trainable parameter initialised to it."""
    values = literal_array(value, dtype, "var").reshape(-1)
    if param:
        return create_parameter(
            list(values.shape),
            values.dtype.name,
            name=name or unique_name.generate("param"),
            initializer=Constant(float(values[0])) if values.size == 1 else None,
        )
    return _literal(values, list(values.shape), name or "var", stop_gradient=True)


def get_variable(name: str) -> VarDesc:
    """The variable `name` as seen from the current block (parents searched, seed 002)."""
    found = current_block().find_var(name, recursive=True)
    if found is None:
        raise NestflowError(f"no variable named '{name}' is visible from the current block")
    return found
