"""Reductions, indexing and shape layers (Fluid 1.8's signatures and defaults)."""

from __future__ import annotations

import numbers
from typing import Any

from nestflow.framework.program import VarDesc
from nestflow.layers.helper import append_op, as_float


def _constant_like(value: Any, dtype: str) -> VarDesc:
    attrs = {"shape": [1], "dtype": dtype, "value": as_float(value, "where: x/y")}
    return append_op("fill_constant", {}, attrs, stop_gradient=True)


def where(condition: VarDesc, x: Any = None, y: Any = None, name: str | None = None) -> VarDesc:
    """x where `condition` (bool) holds, else y, elementwise with broadcasting; x or y may be a
    Python number (taking the other's dtype). With neither x nor y, Fluid 1.8's
    `where(condition)`: the int64 coordinates [count, rank] of the true elements.

    >>> import nestflow as nf
    >>> c = nf.layers.data("c", [-1, 3], "bool"); a = nf.layers.data("a", [-1, 3])
    >>> nf.layers.where(c, a, 0.0).shape
    (-1, 3)
    """
    if x is None and y is None:
        return append_op("where_index", {"Condition": condition}, name=name, stop_gradient=True)
    if isinstance(x, numbers.Real) and isinstance(y, VarDesc):
        x = _constant_like(x, y.dtype)
    if isinstance(y, numbers.Real) and isinstance(x, VarDesc):
        y = _constant_like(y, x.dtype)
    return append_op("where", {"Condition": condition, "X": x, "Y": y}, name=name)


__all__: list[str] = ["where"]
