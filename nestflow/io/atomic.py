"""All-or-nothing file writes: a crash at any instant of a save (an exception, kill -9, a power
cut after the last fsync) leaves either the old file or the new one, whole, never a mix.

- `write_atomic(path, data)`: the new content goes to a temporary file `.NAME.XXXXXXXX.tmp`
  beside `path`, is flushed to disk, then renamed over `path` (os.replace is atomic on one
  filesystem). Temporary files left by earlier writes of `path` that were killed are removed
  first.
- `write_new(path, data)`: a file under a name nobody uses yet, flushed to disk (the pieces of
  a larger save that one atomic rename makes current, see inference.py).
- `directory_lock(directory)`: writers of one directory take turns (an flock on the directory
  itself, released by the kernel when the holder dies, so a killed save never leaves a stale
  lock). A writer holding it may remove what earlier killed writers left behind: no other
  writer is half way through a file there. Readers never need it.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator

from nestflow.errors import FileWriteError

_CHUNK = 1 << 20
# mkstemp's names: the prefix, 8 characters of this alphabet, the suffix.
_TEMP_TAIL = r"\.[a-z0-9_]{8}\.tmp"


def write_chunks(file, data: bytes) -> None:
    """Write `data` to the open `file` piece by piece (a separate function so tests can make
    it fail, or stop the world, half way)."""
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        file.write(view[start : start + _CHUNK])


def replace_file(source: str, target: str) -> None:
    """Rename `source` over `target` in one atomic step (a function of its own so tests can
    stop the world right before or after it)."""
    os.replace(source, target)


def remove_file(path: str) -> None:
    """Remove `path` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sync_directory(directory: str) -> None:
    """Flush `directory`'s entries (new names, renames) to disk; a no-op where the platform
    or filesystem cannot."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_error(path: str, exc: BaseException) -> FileWriteError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    return FileWriteError(f"cannot write '{path}': {reason}")


def temp_file_pattern(basename: str) -> re.Pattern[str]:
    """The names write_atomic gives its temporary files for a file named `basename`."""
    return re.compile(re.escape(f".{basename}") + _TEMP_TAIL)


def remove_temp_files(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files that killed write_atomic calls for `path` left beside it;
    the caller holds the directory lock (no write of `path` is under way). Returns their
    names."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    pattern = temp_file_pattern(os.path.basename(path))
    try:
        names = [n for n in os.listdir(directory) if pattern.fullmatch(n)]
    except OSError:
        return []
    for name in names:
        with contextlib.suppress(OSError):
            remove_file(os.path.join(directory, name))
    return names


def write_atomic(path: str | os.PathLike, data: bytes, *, lock: bool = True) -> None:
    """Replace the file at `path` by `data` all at once: a reader (or a crash) sees the old
    content or the new, whole. Temporary files of earlier writes of `path` that were killed
    are removed first. With lock=False the caller already holds directory_lock. On an error
    `path` is untouched, the temporary file is removed, and FileWriteError (an OSError) says
    why."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    held = directory_lock(directory) if lock else contextlib.nullcontext(True)
    try:
        with held:
            remove_temp_files(path)
            _write_replace(path, directory, data)
    except OSError as exc:
        if isinstance(exc, FileWriteError):
            raise
        raise _write_error(path, exc) from exc


def _write_replace(path: str, directory: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            write_chunks(file, data)
            file.flush()
            os.fsync(file.fileno())
        replace_file(tmp, path)
    except BaseException:
        remove_file(tmp)
        raise
    sync_directory(directory)


def write_new(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a new file at `path` (an existing one is an error, never overwritten)
    and flush it to disk. On an error the partial file is removed and FileWriteError says
    why."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise _write_error(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as file:
            write_chunks(file, data)
            file.flush()
            os.fsync(file.fileno())
    except BaseException as exc:
        remove_file(path)
        if isinstance(exc, OSError) and not isinstance(exc, FileWriteError):
            raise _write_error(path, exc) from exc
        raise


_held = threading.local()  # (device, inode) of the directories this thread holds locked


@contextlib.contextmanager
def directory_lock(directory: str | os.PathLike, blocking: bool = True) -> Iterator[bool]:
    """Hold `directory`'s writer lock for the block; yields whether it is held (always True
    when blocking; False without waiting when another process or thread holds it). Nested use
    in one thread is allowed. Where the platform has no flock (Windows) nothing is locked and
    True is yielded: concurrent saves into one directory are then the caller's business."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield True
        return
    directory = os.fspath(directory)
    try:
        fd = os.open(directory, os.O_RDONLY)
    except PermissionError:
        # A directory one may write but not read (mode -wx) cannot be locked, nor listed for
        # leftovers: the write itself can still be all or nothing.
        yield True
        return
    except OSError as exc:
        raise _write_error(directory, exc) from exc
    try:
        stat = os.fstat(fd)
        key = (stat.st_dev, stat.st_ino)
        held = _held.__dict__.setdefault("dirs", set())
        if key in held:
            yield True
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        held.add(key)
        try:
            yield True
        finally:
            held.discard(key)
    finally:
        os.close(fd)  # closing the descriptor releases the flock
