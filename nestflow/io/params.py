"""Parameters (every persistable tensor of a program) saved as one safetensors file by name."""

from __future__ import annotations

import json
import os

import numpy as np
import safetensors.numpy

from nestflow.core.scope import Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import ParameterFileError, UninitializedError
from nestflow.framework.program import Program, VarDesc
from nestflow.io.atomic import write_atomic

_FORMAT = {"format": "nestflow.params", "version": "1"}


def persistable_vars(program: Program) -> list[VarDesc]:
    """The program's persistable tensor variables (parameters, optimizer state), by name."""
    found: dict[str, VarDesc] = {}
    for var in program.list_vars():
        if var.persistable and var.type == "lod_tensor":
            found.setdefault(var.name, var)
    return list(found.values())


def save_params(scope: Scope, program: Program, path: str | os.PathLike) -> None:
    """Write the values in `scope` of `program`'s persistable variables to `path` (safetensors),
    atomically. Raises UninitializedError naming any the scope does not hold."""
    write_params(scope, program, path, {})


def write_params(
    scope: Scope, program: Program, path: str | os.PathLike, metadata: dict[str, str]
) -> None:
    """save_params, with `metadata` added to the file's header."""
    tensors: dict[str, np.ndarray] = {}
    missing = []
    for var in persistable_vars(program):
        found = scope.find_var(var.name)
        held = None if found is None else found._value
        if isinstance(held, Tensor):
            held = held._array
        if held is None:
            missing.append(var.name)
            continue
        tensors[var.name] = np.ascontiguousarray(np.asarray(held))
    if missing:
        raise UninitializedError(
            f"cannot save parameters: the scope holds no value for {missing} "
            "(run the startup program first)"
        )
    write_atomic(path, safetensors.numpy.save(tensors, metadata=_FORMAT | metadata))


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata in a safetensors file's header ({} if unreadable: loading the
    tensors reports that)."""
    try:
        with open(path, "rb") as file:
            size = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(size)) if 0 < size < 1 << 24 else {}
        metadata = header.get("__metadata__") or {}
        return {str(k): str(v) for k, v in metadata.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def read_params(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file; ParameterFileError if it cannot be read or parsed."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ParameterFileError(f"cannot read parameter file '{path}': {exc}") from None
    try:
        return safetensors.numpy.load(data)
    except Exception as exc:  # the Rust parser raises its own SafetensorError types
        raise ParameterFileError(
            f"'{path}' is not a valid safetensors file ({len(data)} bytes): {exc}"
        ) from None


def load_params(
    scope: Scope, program: Program, path: str | os.PathLike, strict: bool = True
) -> None:
    """Set `program`'s persistable variables in `scope` from the safetensors file at `path`.

    Every problem is reported at once, and nothing is set unless all tensors fit: a
    ParameterFileError names tensors the program needs but the file lacks, tensors the file has
    but the program does not declare (unless strict=False), and tensors whose shape or dtype
    differs from the declaration (-1 dims match any size).
    """
    tensors = read_params(path)
    wanted = {v.name: v for v in persistable_vars(program)}
    missing = sorted(set(wanted) - set(tensors))
    extra = sorted(set(tensors) - set(wanted)) if strict else []
    misfit = []
    for name, var in wanted.items():
        array = tensors.get(name)
        if array is None:
            continue
        declared = var.shape
        fits = len(declared) == array.ndim and all(
            d in (-1, a) for d, a in zip(declared, array.shape)
        )
        if not fits or array.dtype != np.dtype(var.dtype):
            misfit.append(
                f"'{name}' is {array.dtype}{list(array.shape)} in the file but "
                f"{var.dtype}{list(declared)} in the program"
            )
    problems = []
    if missing:
        problems.append(f"missing from the file: {missing}")
    if extra:
        problems.append(f"not in the program: {extra}")
    if misfit:
        problems.append("shape/dtype mismatch: " + "; ".join(misfit))
    if problems:
        raise ParameterFileError(
            f"parameter file '{path}' does not fit the program: " + "; ".join(problems)
        )
    for name in wanted:
        # A copy: arrays parsed from the file are read-only views of its bytes.
        scope.var(name).get_mutable(Tensor)._array = np.array(tensors[name])


__all__ = ["load_params", "persistable_vars", "read_params", "save_params"]
