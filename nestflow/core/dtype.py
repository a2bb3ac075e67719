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


def dtype_name(dtype) -> str:
    """The canonical name of any dtype spelling (str, NumPy type, np.dtype, torch-like name)."""
    if isinstance(dtype, str):
        dtype = _ALIASES.get(dtype, dtype)
    try:
        return np.dtype(dtype).name
    except TypeError as exc:
        raise DTypeError(f"'{dtype}' is not a dtype nestflow knows") from exc


def is_floating(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating)
