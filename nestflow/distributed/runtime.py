"""The process's place in the MPI job: init, rank, world size, barrier, small broadcasts, the
counters of MPI calls, and the abort that ends every rank when one fails.

mpi4py is imported by `init()` (or by an abort), never by importing this module.
"""

from __future__ import annotations

import sys
import traceback
from types import TracebackType

import numpy as np

from nestflow.errors import AttrError
from nestflow.ops.collective import WORLD, CommStats, launched_rank, launched_world_size


def init() -> None:
    """Initialise MPI (mpi4py) for this process, one rank of the job `mpiexec -n N` started;
    every rank must call it, before any program with collective ops runs. Calling it again does
    nothing. From then on an exception that reaches the top of the program on any rank prints
    that rank's traceback and aborts every rank (MPI_Abort), so a failure never leaves the
    other ranks waiting in an all-reduce; and a rank whose program ends tells the others, so
    that one still waiting for it in a collective op (the ranks ran different numbers of
    steps) fails after a few seconds instead of hanging. Without mpiexec the world is this
    process alone.
    UninitializedError if mpi4py or MPI is missing (pip install 'nestflow[distributed]').

    >>> import nestflow as nf
    >>> nf.distributed.init()  # doctest: +SKIP
    """
    if WORLD.initialized:
        return
    leave_launch_note("joining", "calls nf.distributed.init()")
    WORLD.init()
    if WORLD.size > 1 and sys.excepthook is not _abort_on_uncaught:
        global _previous_hook
        _previous_hook = sys.excepthook
        sys.excepthook = _abort_on_uncaught


def is_initialized() -> bool:
    """Whether init() ran in this process.

    >>> import nestflow as nf
    >>> nf.distributed.is_initialized()  # a process that did not call init()
    False
    """
    return WORLD.initialized


def rank() -> int:
    """This process's rank, 0 .. world_size() - 1 (0 before init()).

    >>> rank()
    0
    """
    return WORLD.rank


def world_size() -> int:
    """The number of ranks in the job (1 before init(), and for a process mpiexec did not
    start).

    >>> world_size()
    1
    """
    return WORLD.size


def barrier() -> None:
    """Wait until every rank reaches this call (nothing to wait for with one rank).

    >>> barrier()  # one rank: returns at once
    """
    WORLD.checked().barrier()


def broadcast(array: np.ndarray, root: int = 0) -> np.ndarray:
    """Rank `root`'s `array` on every rank (a new array; the others' values are ignored, their
    shape and dtype must be the root's). MPI Bcast on the array's own memory.

    >>> broadcast(np.arange(3))  # one rank: the array itself
    array([0, 1, 2])
    """
    array = np.ascontiguousarray(array)
    world = WORLD.checked()
    if world.size == 1:
        return array
    _check_root(root, world.size)
    buffer = array.copy() if world.rank == root else np.empty_like(array)
    world.bcast(buffer, root)
    return buffer


def allgather(array: np.ndarray) -> np.ndarray:
    """Every rank's `array` stacked in rank order ([world_size, *shape]; the shapes and dtypes
    must be equal). MPI Allgather on the arrays' own memory.

    >>> allgather(np.arange(3))  # one rank
    array([[0, 1, 2]])
    """
    array = np.ascontiguousarray(array)
    world = WORLD.checked()
    if world.size == 1:
        return array[None].copy()
    every = np.empty((world.size, *array.shape), array.dtype)
    world.allgather(array, every)
    return every


def broadcast_bytes(data: bytes | None, root: int = 0) -> bytes | None:
    """Rank `root`'s `data` on every rank (the others pass anything, e.g. None); None from the
    root gives None everywhere, so a root that failed to read a file can tell every rank.

    >>> broadcast_bytes(b"checkpoint")  # one rank
    b'checkpoint'
    """
    world = WORLD.checked()
    if world.size == 1:
        return data
    _check_root(root, world.size)
    mine = world.rank == root
    length = np.array([-1 if data is None else len(data)] if mine else [0], np.int64)
    world.bcast(length, root)
    if length[0] < 0:
        return None
    payload = np.frombuffer(data, np.uint8).copy() if mine else np.empty(int(length[0]), np.uint8)
    world.bcast(payload, root)
    return payload.tobytes()


def stats(reset: bool = False) -> CommStats:
    """The MPI calls this process's collective ops made (counts per MPI function, bytes, time
    waiting for all-reduces) since the start or the last reset; `reset` starts counting anew.

    >>> stats().calls  # no collective op has run in this process
    {}
    """
    return WORLD.stats(reset)


def abort(message: str = "", code: int = 1) -> None:
    """Print `message` (prefixed with this rank) to stderr and end every rank of the job with
    exit status `code` (MPI_Abort). Without MPI, exit this process with `code`.

    >>> abort("the data is missing", 2)  # doctest: +SKIP
    """
    if message:
        sys.stderr.write(f"[nestflow rank {_rank_label()}] {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    if not WORLD.initialized and launched_world_size() == 1:
        raise SystemExit(code)
    from mpi4py import MPI  # initialises MPI when the program had not: Abort needs it

    MPI.COMM_WORLD.Abort(code)


# The directory `nestflow launch` gives its ranks for notes on how they start and end (see
# nestflow.cli.launch.watch): a rank that exits without joining MPI while another one waits
# in init() for it is a job that can never start.
LAUNCH_NOTES_ENV = "NESTFLOW_LAUNCH_NOTES"


def leave_launch_note(kind: str, text: str) -> None:
    """Tell `nestflow launch` (when it started this rank) that this rank is `kind` ("joining",
    or "left" without joining); `text` says how, for its message. Best effort: a note that
    cannot be written (a rank on another host than the launcher) is skipped."""
    import os

    directory = os.environ.get(LAUNCH_NOTES_ENV)
    if not directory or launched_world_size() == 1:
        return
    try:
        with open(os.path.join(directory, f"{kind}-{launched_rank()}"), "w") as note:
            note.write(text)
    except OSError:
        pass


def joined_mpi() -> bool:
    """Whether this process initialised MPI (through init() or mpi4py itself)."""
    mpi = sys.modules.get("mpi4py.MPI")
    return WORLD.initialized or (mpi is not None and mpi.Is_initialized())


def _check_root(root: int, size: int) -> None:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise AttrError(f"root must be a rank in 0..{size - 1}, got {root!r}")


def _rank_label() -> str:
    if WORLD.initialized:
        return f"{WORLD.rank} of {WORLD.size}"
    return f"{launched_rank()} of {launched_world_size()}"


_previous_hook = sys.excepthook


def _abort_on_uncaught(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    """sys.excepthook under MPI: this rank's traceback first, then MPI_Abort for everyone."""
    text = "".join(traceback.format_exception(kind, value, tb))
    abort(f"failed; aborting every rank of the job:\n{text.rstrip()}", 1)


__all__ = [
    "abort",
    "allgather",
    "barrier",
    "broadcast",
    "broadcast_bytes",
    "init",
    "is_initialized",
    "rank",
    "stats",
    "world_size",
]
