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
    """A [N, 1] minibatch variable holding `rows` (declared [-1, 1]: N is a batch dim).

    >>> x = nf.minibatch([10, 20, 30])  # a [N, 1] minibatch with these rows
    >>> tuple(x.shape)
    (-1, 1)
    >>> nf.Executor().run(fetch_list=[nf.add(x, nf.var(1))])[0].ravel().tolist()
    [11.0, 21.0, 31.0]
    """
    values = literal_array(rows, dtype, "minibatch")
    values = values.reshape(len(values), -1)
    return _literal(values, [-1, *values.shape[1:]], "minibatch", stop_gradient=True)


def sequence(steps: Sequence[Any], dtype: Any = "float32") -> VarDesc:
    """One sequence of len(steps) time steps: a [1, T, F] batch of sequences (F = 1 for
    scalars), declared [-1, -1, F] and marked is_sequence so an RNN slices it per step.

    >>> s = nf.sequence([1, 2, 3, 4])  # one sequence of 4 steps, 1 feature
    >>> tuple(s.shape), s.is_sequence
    ((-1, -1, 1), True)
    >>> nf.Executor().run(fetch_list=[s])[0].shape
    (1, 4, 1)
    """
    values = literal_array(steps, dtype, "sequence")
    values = values.reshape(1, len(values), -1)
    return _literal(
        values, [-1, -1, *values.shape[2:]], "sequence", stop_gradient=True, is_sequence=True
    )


def var(
    value: Any = 0.0, param: bool = False, dtype: Any = "float32", name: str | None = None
) -> VarDesc:
    """A [1] variable holding `value`; with param=True a trainable parameter initialised to it.

    >>> y = nf.var(1)  # a [1] variable
    >>> w = nf.var(0.5, param=True, name="w")  # a trainable parameter
    >>> y.persistable, w.persistable
    (False, True)
    >>> exe = nf.Executor()
    >>> _ = exe.run(nf.default_startup_program())  # initialises w
    >>> exe.run(fetch_list=[y, w])
    [array([1.], dtype=float32), array([0.5], dtype=float32)]
    """
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
    """The variable `name` as seen from the current block (parents searched, seed 002).

    >>> w = nf.var(0.5, param=True, name="w")
    >>> nf.get_variable("w") is w
    True
    >>> try:
    ...     nf.get_variable("nowhere")
    ... except nf.errors.NestflowError as err:
    ...     print(err)
    no variable named 'nowhere' is visible from the current block
    """
    found = current_block().find_var(name, recursive=True)
    if found is None:
        raise NestflowError(f"no variable named '{name}' is visible from the current block")
    return found
