"""Dtype names: every dtype in nestflow is spelled as NumPy's canonical name ("float32")."""

from __future__ import annotations

import numpy as np

from nestflow.errors import DTypeError

_ALIASES = {
    "float": "float32",
    "double": "float64",
    "int": "int32",
    "long": "int64",
    "fp16": "float16",
}


# Fluid's VarType.Type codes of the tensor dtypes (framework.proto of Paddle 1.x).
FLUID_VAR_TYPES = {
    0: "bool",
    1: "int16",
    2: "int32",
    3: "int64",
    4: "float16",
    5: "float32",
    6: "float64",
    20: "uint8",
    21: "int8",
}


def dtype_name(dtype) -> str:
    """The canonical name of any dtype spelling (str, NumPy type, np.dtype, torch-like name)."""
    if isinstance(dtype, str):
        dtype = _ALIASES.get(dtype, dtype)
    elif isinstance(dtype, int) and not isinstance(dtype, bool):
        # Fluid programs and op tests give dtype attrs as VarType enum values.
        if dtype not in FLUID_VAR_TYPES:
            raise DTypeError(
                f"{dtype} is not a Fluid VarType dtype code (known: {sorted(FLUID_VAR_TYPES)})"
            )
        return FLUID_VAR_TYPES[dtype]
    try:
        return np.dtype(dtype).name
    except TypeError as exc:
        raise DTypeError(f"'{dtype}' is not a dtype nestflow knows") from exc


def is_floating(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating)
