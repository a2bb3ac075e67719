"""Atomic file writes: a crash mid-save never leaves a truncated file where a good one was."""

from __future__ import annotations

import os
import tempfile

from nestflow.errors import FileWriteError

_CHUNK = 1 << 20


def write_chunks(file, data: bytes) -> None:
    """Write `data` to the open `file` piece by piece (a separate function so tests can make
    it fail half-way)."""
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        file.write(view[start : start + _CHUNK])


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file next to `path`, flush it to disk, then rename it over
    `path` (os.replace is atomic on one filesystem). On any error `path` is untouched and the
    temporary file is removed."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory
        )
    except OSError as exc:
        raise FileWriteError(f"cannot write '{path}': {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as file:
            write_chunks(file, data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, FileWriteError):
            raise FileWriteError(f"cannot write '{path}': {exc.strerror or exc}") from exc
        raise
