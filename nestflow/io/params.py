"""Parameters (every persistable tensor of a program) saved as one safetensors file by name.

The file's header metadata carries a SHA-256 over its tensors (names, dtypes, shapes and
bytes, `tensors_sha256`): a file changed after it was written (a flipped bit, a cut) is a
ParameterFileError naming it, never parameters that load with other values. Files written
before the checksum existed (no `sha256` in the header) still load.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import safetensors
import safetensors.numpy

from nestflow.core.device_context import device_context
from nestflow.core.dtype import BFLOAT16
from nestflow.core.place import Place, place_of
from nestflow.core.scope import Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import ParameterFileError, UninitializedError
from nestflow.framework.program import Program, VarDesc
from nestflow.io.atomic import write_atomic

_FORMAT = {"format": "nestflow.params", "version": "1"}
CHECKSUM = "sha256"


def persistable_vars(program: Program) -> list[VarDesc]:
    """The program's persistable tensor variables (parameters, optimizer state), by name.

    >>> x = nf.data("x", [-1, 2])
    >>> _ = nf.layers.fc(x, 1)
    >>> [v.name for v in nf.io.persistable_vars(nf.default_main_program())]
    ['fc_0.w', 'fc_0.b']
    """
    found: dict[str, VarDesc] = {}
    for var in program.list_vars():
        if var.persistable and var.type == "lod_tensor":
            found.setdefault(var.name, var)
    return list(found.values())


def save_params(scope: Scope, program: Program, path: str | os.PathLike) -> None:
    """Write the values in `scope` of `program`'s persistable variables to `path` (safetensors),
    all or nothing (see atomic.write_atomic): a save cut short at any instant leaves the old
    file or the new one, whole. Raises UninitializedError naming any the scope does not hold
    (before anything is written) and FileWriteError when the file cannot be written.

    >>> import tempfile, nestflow as nf
    >>> main, startup = nf.Program(), nf.Program()
    >>> with nf.program_guard(main, startup):
    ...     _ = nf.layers.fc(nf.data("x", [-1, 2]), 3, name="fc")
    >>> scope = nf.Scope(); _ = nf.Executor().run(startup, scope=scope)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     nf.io.save_params(scope, main, d + "/params.safetensors")
    ...     nf.io.load_params(nf.Scope(), main, d + "/params.safetensors")
    """
    write_atomic(path, params_file_bytes(scope, program))


def params_file_bytes(
    scope: Scope, program: Program, metadata: dict[str, str] | None = None
) -> bytes:
    """The safetensors file save_params writes, with `metadata` added to its header."""
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
        array = place_of(held).to_host(held)  # a parameter on a GPU is copied to the host
        # Little-endian and contiguous: the bytes safetensors stores are the array's own.
        tensors[var.name] = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    if missing:
        raise UninitializedError(
            f"cannot save parameters: the scope holds no value for {missing} "
            "(run the startup program first)"
        )
    header = _FORMAT | (metadata or {}) | {CHECKSUM: tensors_sha256(tensors)}
    return safetensors.numpy.save(tensors, metadata=header)


def tensors_sha256(tensors: dict[str, np.ndarray]) -> str:
    """SHA-256 over the tensors' names, dtypes, shapes and bytes (in name order): the same for
    the arrays saved and the arrays a good file loads as, whatever the file's layout."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = tensors[name]
        digest.update(f"{name}\0{array.dtype.str}\0{list(array.shape)}\0".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def read_metadata(data: bytes) -> dict[str, str]:
    """The string metadata in a safetensors file's header ({} if unreadable: decoding the
    tensors reports that)."""
    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size]) if 0 < size < 1 << 24 else {}
        metadata = header.get("__metadata__") or {}
        return {str(k): str(v) for k, v in metadata.items()}
    except (ValueError, AttributeError, RecursionError):
        return {}


def read_params(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file; ParameterFileError if it cannot be read or parsed, or
    its tensors do not match the checksum in its header."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ParameterFileError(f"cannot read parameter file '{path}': {exc}") from None
    return decode_params(data, path)


def decode_params(data: bytes, path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of the safetensors file `data` read from `path` (named in errors);
    ParameterFileError if it does not parse or its tensors do not match its checksum."""
    try:
        tensors = _load_tensors(data)
    except Exception as exc:  # the Rust parser raises its own SafetensorError types
        raise ParameterFileError(
            f"'{path}' is not a valid safetensors file ({len(data)} bytes): {exc}"
        ) from None
    recorded = read_metadata(data).get(CHECKSUM)
    if recorded is not None:
        actual = tensors_sha256(tensors)
        if actual != recorded:
            raise ParameterFileError(
                f"parameter file '{path}' is corrupt: its tensors' SHA-256 is {actual}, but "
                f"{recorded} was recorded when it was saved (the file changed since)"
            )
    return tensors


def _load_tensors(data: bytes) -> dict[str, np.ndarray]:
    """safetensors.numpy.load, bfloat16 ("BF16", which safetensors' NumPy loader does not
    map) included; saving needs nothing: it names ml_dtypes' bfloat16 BF16 itself."""
    tensors = {}
    for name, view in safetensors.deserialize(data):
        kind = view["dtype"]
        dtype = BFLOAT16 if kind == "BF16" else safetensors.numpy._getdtype(kind)
        tensors[name] = np.frombuffer(view["data"], dtype=dtype).reshape(view["shape"])
    return tensors


def load_params(
    scope: Scope,
    program: Program,
    path: str | os.PathLike,
    strict: bool = True,
    place: Place | None = None,
) -> None:
    """Set `program`'s persistable variables in `scope` from the safetensors file at `path`,
    on `place` (default: the host; an executor of another place moves them there on its first
    run).

    Every problem is reported at once, and nothing is set unless all tensors fit: a
    ParameterFileError names a file that is unreadable or fails its checksum, tensors the
    program needs but the file lacks, tensors the file has but the program does not declare
    (unless strict=False), and tensors whose shape or dtype differs from the declaration (-1
    dims match any size).

    >>> import tempfile
    >>> x = nf.data("x", [-1, 2])
    >>> y = nf.layers.fc(x, 1)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((1, 2), "float32")}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     nf.io.save_params(nf.global_scope(), nf.default_main_program(), d + "/params.safetensors")
    ...     restored = nf.Scope()
    ...     nf.io.load_params(restored, nf.default_main_program(), d + "/params.safetensors")
    >>> sorted(restored.local_var_names())
    ['fc_0.b', 'fc_0.w']
    >>> np.array_equal(exe.run(feed=feed, fetch_list=[y], scope=restored)[0],
    ...                exe.run(feed=feed, fetch_list=[y])[0])
    True
    """
    set_params(scope, program, read_params(path), path, strict, place)


def set_params(
    scope: Scope,
    program: Program,
    tensors: dict[str, np.ndarray],
    path: str | os.PathLike,
    strict: bool = True,
    place: Place | None = None,
) -> None:
    """load_params, with the file's tensors already read (`path` names the file in errors)."""
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
    to_device = device_context(place).to_device
    for name in wanted:
        # A copy: arrays parsed from the file are read-only views of its bytes.
        tensor = scope.var(name).get_mutable(Tensor)
        tensor._array = to_device(np.array(tensors[name]))
        tensor.place = place_of(tensor._array)


__all__ = [
    "decode_params",
    "load_params",
    "params_file_bytes",
    "persistable_vars",
    "read_params",
    "save_params",
    "tensors_sha256",
]
