"""Dtype names: every dtype in nestflow is spelled as NumPy's canonical name ("float32").

bfloat16 is ml_dtypes' NumPy dtype (what JAX and TensorFlow use on the CPU; CuPy arrays take
it too): importing it here registers the name, so np.dtype("bfloat16") works everywhere. NumPy
files it under kind "V", so "is this a float?" goes through `is_floating`, never `dtype.kind`.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from nestflow.errors import DTypeError

_ALIASES = {
    "float": "float32",
    "double": "float64",
    "int": "int32",
    "long": "int64",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# The floating dtypes mixed precision computes in (nf.amp), narrowest range first.
LOW_PRECISION = ("float16", "bfloat16")


def is_low_precision(dtype: np.dtype) -> bool:
    """Whether a NumPy/CuPy dtype is float16 or bfloat16 (ml_dtypes files it under kind "V"):
    a kernel's per-call test, ~0.04 us where `dtype.name in LOW_PRECISION` takes ~1.5 us."""
    return dtype.itemsize == 2 and (dtype.kind == "f" or dtype == BFLOAT16)


def rounded_to(result, dtype):
    """A result computed in float32 (in_float32) rounded back to `dtype` (None stays None)."""
    return result if result is None or result.dtype == dtype else result.astype(dtype)


def in_float32(array):
    """A float16/bfloat16 array in float32 (others as they are): what kernels accumulate sums
    of low-precision values in, as Fluid's and PyTorch's half kernels do. NumPy's float16
    matrix product is a scalar loop (~200x slower than float32 here), and CuPy 14 has no
    bfloat16 batched matrix product."""
    return array.astype(np.float32) if is_low_precision(array.dtype) else array


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
    22: "bfloat16",
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
    """Whether `dtype` (any spelling) is a real floating dtype, bfloat16 included.

    >>> is_floating("bfloat16"), is_floating("float16"), is_floating("int32")
    (True, True, False)
    """
    resolved = np.dtype(dtype)
    return resolved == BFLOAT16 or np.issubdtype(resolved, np.floating)


def is_inexact(dtype) -> bool:
    """Floating (bfloat16 included) or complex: the dtypes that carry gradients."""
    resolved = np.dtype(dtype)
    return resolved == BFLOAT16 or resolved.kind in "fc"


def finfo(dtype):
    """np.finfo, bfloat16 included (NumPy's own refuses it)."""
    return ml_dtypes.finfo(np.dtype(dtype))
