"""Collective ops (Fluid 1.8's c_* family) and the MPI communicator they run on.

A data-parallel program is an ordinary Program: its collective ops are ops like any other, so it
prints, saves, prunes and shows in the profiler. Their kernels call MPI through mpi4py on the
NumPy buffers themselves (Allreduce, Iallreduce, Bcast, Allgather; never pickled objects) over
a duplicate of MPI.COMM_WORLD made by nf.distributed.init() (ring_id 0, the only ring). In a
process that did not initialise MPI and was not started by mpiexec as one of several ranks, the
world has one rank and every collective op is the identity: the same program runs alone. A
process mpiexec started as one of several ranks that runs a collective op before init() gets an
UninitializedError rather than training alone unnoticed.

On a device place (CuPy, the stand-in) the kernels stage through the host: MPI reads host
memory, so a device X is copied to the host before the MPI call and the result copied back
(`_on_host`, `_on_place`; a CUDA-aware MPI could take device buffers, not done here). On
CPUPlace the kernels run on the NumPy arrays themselves, no copy added; alone (one rank) every
op is the identity on any place.

Fluid 1.8's ops, with its slots and attrs:
- c_allreduce_sum / c_allreduce_max / c_allreduce_min / c_allreduce_prod (X -> Out; ring_id,
  use_calc_stream): Out = the elementwise reduction of X over every rank.
- c_broadcast (X -> Out; ring_id, root, use_calc_stream): Out = X of rank `root`.
- c_allgather (X -> Out; nranks, ring_id, use_calc_stream): the ranks' X stacked on dim 0.
- c_sync_calc_stream (X -> Out), c_sync_comm_stream (X* -> Out*; ring_id): identities. Fluid
  runs collectives on a CUDA stream and these wait for it; here the ops above return when MPI
  is done, so there is nothing to wait for (use_calc_stream is accepted and changes nothing).

nestflow's own, for data-parallel training (nf.distributed.DistributedOptimizer):
- c_allreduce_start (X*, Param*, Weight? -> Out; ring_id): one bucket of gradients flattened
  into one buffer and a sum over the ranks started on it; Out is the handle (a RAW variable).
  When every rank runs on one node the buffer is the rank's part of an MPI-3 shared-memory
  window and the ranks sum it between two MPI barriers (NodeWindows); otherwise it is one
  non-blocking MPI_Iallreduce.
- c_allreduce_wait (Request, X* -> Out*; ring_id): waits for the sum; Out[i] = X[i] averaged
  over the ranks (weighted by Weight when the start op had one).
- c_check_layout (-> Out; layout, ring_id): every rank's `layout` text (what its program
  synchronises) must equal rank 0's, else ProgramMismatchError on every rank.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import time
from collections import Counter
from dataclasses import dataclass
from sys import getrefcount
from time import perf_counter_ns
from typing import Any

import numpy as np

from nestflow.core.device_context import DeviceContext
from nestflow.core.selected_rows import SelectedRows
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError, UninitializedError
from nestflow.framework.program import OpDesc
from nestflow.ops.registry import GradContext, GradOpSpec, Required, VarInfo, register_op

# Environment variables in which mpiexec (Open MPI, MPICH/Hydra, MVAPICH) announces the world.
_LAUNCHER_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_LAUNCHER_RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
# The tag of the message a rank sends every other one when its program ends, and how long a
# collective may go on after such a message before it counts as never finishing (a rank that
# ended after its last collective lets the others finish theirs at once).
EXIT_TAG = 7215
EXIT_GRACE_S = 5.0
# The bytes of bucket buffers kept for reuse (over every size and dtype): a buffer made once
# the pool holds this much is used once and dropped.
BUCKET_POOL_BYTES = 512 << 20
# Set to "mpi" to average gradients with MPI_Iallreduce even when every rank shares one node
# (the default there is the shared-memory window sum, see NodeWindows).
ALLREDUCE_ENV = "NESTFLOW_ALLREDUCE"


def _unheld_count() -> int:
    """getrefcount of a pooled buffer nothing else holds, read by the same code as in
    Communicator.bucket_buffer: what the pool, the loop variable and the call's argument
    count for depends on the interpreter (CPython 3.14 borrows references to locals)."""
    pool = [np.empty(0)]
    for buffer in pool:
        return getrefcount(buffer)
    raise AssertionError("unreachable")


_UNHELD = _unheld_count()


def allreduce_choice() -> str:
    """How gradients are averaged when every rank shares a node, from NESTFLOW_ALLREDUCE:
    "shared" (the default: MPI-3 shared memory, NodeWindows) or "mpi" (MPI_Iallreduce);
    AttrError for anything else."""
    choice = os.environ.get(ALLREDUCE_ENV, "").strip().lower() or "shared"
    if choice not in ("shared", "mpi"):
        raise AttrError(f"{ALLREDUCE_ENV}={choice!r}: use 'shared' or 'mpi'")
    return choice


def _launcher_value(keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        value = os.environ.get(key)
        if value is not None and value.strip().isdigit():
            return int(value)
    return default


def launched_world_size() -> int:
    """The number of ranks mpiexec started this process among (1 when it did not)."""
    return _launcher_value(_LAUNCHER_SIZE, 1)


def launched_rank() -> int:
    """This process's rank as mpiexec announced it (0 when not started by mpiexec)."""
    return _launcher_value(_LAUNCHER_RANK, 0)


class ProgramMismatchError(ExecutionError):
    """The ranks of a data-parallel job run different programs (other parameters, shapes,
    dtypes or gradient buckets): raised on every rank by the startup program's check."""


@dataclass(frozen=True)
class CommStats:
    """What this process's collective ops asked of MPI since the last reset: `calls` per MPI
    function, the `bytes` of the buffers they moved (each call's buffer counted once), and
    `wait_seconds` spent waiting for non-blocking all-reduces (c_allreduce_wait)."""

    calls: dict[str, int]
    bytes: int
    wait_seconds: float


class Communicator:
    """The MPI world the collective ops run on: rank 0 of 1 until `init()` (mpi4py imported
    then, never before), with counters of the MPI calls made."""

    def __init__(self) -> None:
        self.comm: Any = None
        self.rank, self.size = 0, 1
        self.calls: Counter[str] = Counter()
        self.nbytes = 0
        self.wait_ns = 0
        # started non-blocking all-reduces not yet waited for, with the buffers they sum into
        # (MPI's request holds no Python reference to its buffer)
        self.inflight: list[tuple[Any, np.ndarray]] = []
        self.buffers: dict[tuple[int, np.dtype], list[np.ndarray]] = {}
        self.pooled_bytes = 0
        # the ranks' shared-memory windows when they all share one node (None: MPI's sum)
        self.shared: NodeWindows | None = None

    @property
    def initialized(self) -> bool:
        return self.comm is not None

    def init(self) -> Communicator:
        """Initialise MPI (once) and take a duplicate of COMM_WORLD, so nestflow's messages
        never mix with the program's own MPI traffic. Every rank must call it."""
        if self.comm is None:
            choice = allreduce_choice()
            # Open MPI reads its settings when MPI starts (on importing mpi4py): the ring for
            # non-blocking all-reduce unless the user chose (see nestflow.cli.launch).
            os.environ.setdefault("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1")
            os.environ.setdefault("OMPI_MCA_osc", "^ucx")
            try:
                from mpi4py import MPI
            except ImportError as exc:
                raise UninitializedError(
                    f"nf.distributed needs mpi4py and an MPI library ({exc}); install them "
                    "with: pip install 'nestflow[distributed]'"
                ) from None
            comm = MPI.COMM_WORLD.Dup()
            self.rank, self.size = comm.Get_rank(), comm.Get_size()
            self.comm = comm
            if self.size > 1:
                atexit.register(self._announce_exit)
                self.shared = NodeWindows.for_world(self, choice)
        return self

    def _announce_exit(self) -> None:
        """At the normal end of this process: tell every other rank (one small message
        each), so that a rank still waiting for this one in a collective stops waiting."""
        from mpi4py import MPI

        if MPI.Is_finalized():
            return
        note = np.array([self.rank], np.int64)
        for rank in range(self.size):
            if rank != self.rank:
                self.comm.Send(note, dest=rank, tag=EXIT_TAG)

    def _complete(self, request: Any) -> None:
        """Wait for `request`, progressing MPI; ExecutionError when another rank's program
        ended (normally) and this collective still cannot finish after EXIT_GRACE_S: the ranks
        ran different numbers of collective ops (say, of steps), which would hang for ever."""
        from mpi4py import MPI

        status, seen = MPI.Status(), None
        while not request.Test():
            if seen is None:
                if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=EXIT_TAG, status=status):
                    seen = time.monotonic()
            elif time.monotonic() - seen > EXIT_GRACE_S:
                raise ExecutionError(
                    f"rank {status.Get_source()} ended its program while rank {self.rank} "
                    "waits for it in a collective op: the ranks ran different numbers of "
                    "steps (give every rank the same number of batches, as "
                    "DistributedBatchSampler does)"
                )

    def checked(self) -> Communicator:
        """Self, for a kernel about to communicate; UninitializedError when mpiexec started
        this process as one of several ranks and init() has not run (the op would otherwise
        quietly act as if alone)."""
        if self.comm is None and launched_world_size() > 1:
            raise UninitializedError(
                f"this process is rank {launched_rank()} of {launched_world_size()} started by "
                "mpiexec, but MPI is not initialised: call nf.distributed.init() before running "
                "a program with collective ops"
            )
        return self

    # ---- MPI calls on NumPy buffers (counted) ----

    def _count(self, name: str, buffer: np.ndarray) -> None:
        self.calls[name] += 1
        self.nbytes += buffer.nbytes

    # Each call is the non-blocking one completed by _complete, so no rank waits for ever.

    def allreduce(self, buffer: np.ndarray, kind: str) -> None:
        """buffer = its elementwise `kind` (sum, max, min, prod) over the ranks, in place."""
        from mpi4py import MPI

        self._count("Allreduce", buffer)
        self._complete(self.comm.Iallreduce(MPI.IN_PLACE, buffer, op=_MPI_OPS[kind](MPI)))

    def bucket_buffer(self, size: int, dtype: np.dtype) -> np.ndarray:
        """An uninitialised 1-D buffer for a bucket, reused from step to step: one is handed out
        again only once nothing refers to it any more (the averaged gradients a wait returns
        are views of it, so a gradient still held, say fetched by the user, keeps its buffer
        out of use; an all-reduce in flight holds its buffer through `inflight`). A fresh
        buffer of megabytes costs a page fault per 4 KiB on every step (W1's 2.7 MB bucket:
        3.4 ms of system time per 5 ms step on 2 ranks). At most BUCKET_POOL_BYTES are kept."""
        pool = self.buffers.setdefault((size, dtype), [])
        for buffer in pool:
            if getrefcount(buffer) == _UNHELD:
                return buffer
        buffer = np.empty(size, dtype)
        if self.pooled_bytes + buffer.nbytes <= BUCKET_POOL_BYTES:
            pool.append(buffer)
            self.pooled_bytes += buffer.nbytes
        return buffer

    def start_allreduce(self, buffer: np.ndarray) -> Any:
        """Start summing `buffer` over the ranks in place; returns the MPI request. Earlier
        requests still in flight are tested first, which lets MPI progress them (and lets go
        of the buffers of those done, waited for or not)."""
        from mpi4py import MPI

        self.forget_finished()
        self._count("Iallreduce", buffer)
        request = self.comm.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        self.inflight.append((request, buffer))
        return request

    def forget_finished(self) -> None:
        """Test the all-reduces in flight (MPI progresses them) and drop those done, with the
        hold on their buffers."""
        if self.inflight:
            self.inflight = [(r, b) for r, b in self.inflight if not r.Test()]

    def wait(self, request: Any) -> None:
        # By identity: finished requests all compare equal to MPI.REQUEST_NULL.
        self.inflight = [(r, b) for r, b in self.inflight if r is not request]
        start = perf_counter_ns()
        self._complete(request)
        self.wait_ns += perf_counter_ns() - start
        self.calls["Wait"] += 1

    def start_shared(self, window: BucketWindow, own: ScaledGradients) -> SharedSum:
        """This rank's gradients are packed into `window` (all but its own share, which it
        sums from `own`): let the other ranks know (one Ibarrier; the wait completes it and
        sums)."""
        window.tell_held()
        window.sync()
        self.calls["shared_allreduce"] += 1
        self.calls["Ibarrier"] += 1
        self.nbytes += window.send.nbytes
        return SharedSum(window, self.comm.Ibarrier(), own)

    def finish_shared(self, pending: SharedSum, weighted: bool) -> np.ndarray:
        """Once every rank packed: sum this rank's share of the window; once every share is
        summed, the sum (averaged when `weighted`) is the window's sum array, the same memory
        on every rank."""
        window = pending.window
        start = perf_counter_ns()
        self._complete(pending.packed)
        window.sync()
        summed, lent = window.sum_share(pending.own, weighted)
        pending.own = None  # the rank's own gradients: not needed past the sum
        window.sync()
        self.calls["Ibarrier"] += 1
        self._complete(self.comm.Ibarrier())
        window.sync()
        if not lent:  # the scratch array: every rank takes a copy of its own
            self.calls["shared_scratch"] += 1
            private = self.bucket_buffer(summed.size, summed.dtype)
            private[...] = summed
            summed = private
        self.shared.release(window)
        self.wait_ns += perf_counter_ns() - start
        self.calls["Wait"] += 1
        return summed

    def bcast(self, buffer: np.ndarray, root: int) -> None:
        self._count("Bcast", buffer)
        self._complete(self.comm.Ibcast(_as_bytes(buffer), root=root))

    def allgather(self, send: np.ndarray, receive: np.ndarray) -> None:
        """receive (size x send's bytes) = every rank's send, in rank order."""
        self._count("Allgather", receive)
        self._complete(self.comm.Iallgather(_as_bytes(send), _as_bytes(receive)))

    def allgather_text(self, text: str) -> list[str]:
        """Every rank's `text`, in rank order (lengths, then the UTF-8 bytes)."""
        data = np.frombuffer(text.encode("utf-8"), np.uint8)
        lengths = np.empty(self.size, np.int64)
        self.allgather(np.array([data.size], np.int64), lengths)
        every = np.empty(int(lengths.sum()), np.uint8)
        self._count("Allgatherv", every)
        self._complete(self.comm.Iallgatherv(data, [every, lengths.tolist()]))
        ends = np.cumsum(lengths)
        return [every[e - n : e].tobytes().decode("utf-8") for e, n in zip(ends, lengths)]

    def barrier(self) -> None:
        if self.size > 1:
            self.calls["Barrier"] += 1
            self._complete(self.comm.Ibarrier())

    def stats(self, reset: bool = False) -> CommStats:
        found = CommStats(dict(self.calls), self.nbytes, self.wait_ns / 1e9)
        if reset:
            self.calls.clear()
            self.nbytes = self.wait_ns = 0
        return found


class NodeWindows:
    """Gradient averaging through MPI-3 shared memory when every rank runs on one node.

    Each bucket gets MPI shared-memory windows (MPI_Win_allocate_shared on the node's
    communicator). Every rank packs its gradients into its own part of the first, all but
    its own slice; after an MPI barrier rank r sums slice r (NumPy: its own gradients, where
    they are, then the other ranks' parts in rank order) into slice r of one shared sum
    array, and after a second barrier every rank's averaged gradients are read-only
    views of that array: the same memory, so every rank has the same values to the bit
    (float16 gradients are rounded from it into arrays of their own). The memory is
    MPI's and MPI's barriers order the accesses (with MPI_Win_sync around them); the gradients
    move once, by loads and stores, instead of through the copies and system calls of the
    message path (docs/distributed.md has the measurements).

    A sum array still referenced on some rank (say, a fetched gradient) is not written again:
    each rank tells which arrays it still holds next to its packed gradients, and all pick
    the first one nobody holds, or make a new one together (past MAX_SUM_ARRAYS, a scratch
    array every rank copies out of).

    `for_world` returns None (MPI_Iallreduce averages) when the ranks span several nodes or
    any rank has NESTFLOW_ALLREDUCE=mpi. Windows are kept per (size, dtype) and handed out in
    the order the buckets start, the same on every rank, so a new window (a collective
    allocation, after a barrier that notices a rank whose program ended) is made on every rank
    at once. Windows live until the process ends, in the node's shared memory."""

    def __init__(self, world: Communicator, node: Any):
        self.world, self.node = world, node
        self.free: dict[tuple[int, str], list[BucketWindow]] = {}

    @classmethod
    def for_world(cls, world: Communicator, choice: str) -> NodeWindows | None:
        """The node's windows, or None where MPI_Iallreduce averages (`choice` "mpi" on any
        rank, or ranks on several nodes): every rank decides alike."""
        from mpi4py import MPI

        comm = world.comm
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        shared = np.array([node.Get_size() == comm.Get_size() and choice == "shared"], np.int32)
        comm.Allreduce(MPI.IN_PLACE, shared, op=MPI.MIN)
        if not shared[0]:
            node.Free()
            return None
        return cls(world, node)

    def acquire(self, numel: int, dtype: np.dtype) -> BucketWindow:
        pool = self.free.get((numel, dtype.str))
        return pool.pop() if pool else BucketWindow(self, numel, dtype)

    def release(self, window: BucketWindow) -> None:
        self.free.setdefault((window.numel, window.dtype.str), []).append(window)


# The most sum arrays one bucket keeps (held ones are told apart by the bits of one number).
MAX_SUM_ARRAYS = 16


class BucketWindow:
    """One bucket's shared memory: on every rank `send` (its packed gradients, `numel`
    numbers, all but its own share [low, high) which only it reads, from its gradients;
    followed by the bits of the sum arrays it still holds) and the sum arrays (each in one
    window whose memory rank 0 allocates and every rank maps whole)."""

    def __init__(self, windows: NodeWindows, numel: int, dtype: np.dtype):
        from mpi4py import MPI

        self.MPI, self.world, self.node = MPI, windows.world, windows.node
        self.numel, self.dtype = numel, dtype
        self.rank, size = self.node.Get_rank(), self.node.Get_size()
        self.slice = -(-numel // size)
        # the numbers this rank sums (its share), which it therefore never packs
        self.low, self.high = share_range(numel, self.rank, size)
        self.windows = [self._window((numel + 1) * dtype.itemsize)]
        self.sends = [
            np.frombuffer(self.windows[0].Shared_query(r)[0], dtype, numel + 1) for r in range(size)
        ]
        self.send = self.sends[self.rank][:numel]
        self.sums: list[np.ndarray] = []
        self.scratch: np.ndarray | None = None

    def _window(self, nbytes: int) -> Any:
        # Allocate_shared blocks until every rank calls it: meet in a barrier first, which
        # notices a rank whose program ended (Communicator._complete) instead of waiting for it
        # for ever.
        self.world.barrier()
        win = self.MPI.Win.Allocate_shared(nbytes, self.dtype.itemsize, comm=self.node)
        win.Lock_all(self.MPI.MODE_NOCHECK)  # a passive epoch for Win_sync, held for good
        return win

    def sync(self) -> None:
        """Make this rank's stores visible to the others and theirs to it (MPI_Win_sync),
        around a barrier."""
        for win in self.windows:
            win.Sync()

    def tell_held(self) -> None:
        """Write, after the packed gradients, which sum arrays this rank still refers to."""
        held = 0
        index = 0
        # not enumerate(): its tuple would hold one more reference than _UNHELD counts
        for array in self.sums:
            if getrefcount(array) != _UNHELD:
                held |= 1 << index
            index += 1
        self.sends[self.rank][self.numel] = held

    def _free_sum(self) -> tuple[np.ndarray, bool]:
        """The sum array no rank holds (the same on every rank: all read every rank's bits),
        made now on every rank if there is none, and whether the ranks may keep views of it:
        once MAX_SUM_ARRAYS are held, the sum goes to a scratch array every rank copies out
        of."""
        held = 0
        for send in self.sends:
            held |= int(send[self.numel])
        for index in range(len(self.sums)):
            if not held >> index & 1:
                return self.sums[index], True
        if len(self.sums) < MAX_SUM_ARRAYS:
            self.sums.append(self._sum_array())
            return self.sums[-1], True
        if self.scratch is None:
            self.scratch = self._sum_array()
        return self.scratch, False

    def _sum_array(self) -> np.ndarray:
        """A new sum array: its memory allocated by rank 0, mapped by every rank (a
        collective call)."""
        size = len(self.sends)
        win = self._window(size * self.slice * self.dtype.itemsize if self.rank == 0 else 0)
        self.windows.append(win)
        return np.frombuffer(win.Shared_query(0)[0], self.dtype, size * self.slice)

    def sum_share(self, own: ScaledGradients, weighted: bool) -> tuple[np.ndarray, bool]:
        """Sum this rank's slice of every rank's gradients into the free sum array (divided by
        the summed weights, the last number, when weighted); returns that array's first
        `numel` numbers and whether views of it may be handed out (see _free_sum). The
        rank's own term comes from its gradients (`own`), which it did not pack there; the
        other ranks' terms are added in rank order (so with 2 ranks, or for the slices of
        ranks 0 and 1, the sum is the one a rank-order reduction makes)."""
        total, lent = self._free_sum()
        low, high = self.low, self.high
        share = total[low:high]
        own.write(share, low, min(high, own.numel))
        if low <= own.numel < high:  # the weight, the last number: packed by every rank
            share[own.numel - low] = self.send[own.numel]
        for rank, send in enumerate(self.sends):
            if rank != self.rank:
                np.add(share, send[low:high], out=share)
        if weighted:
            # every rank reads the summed weights from the packed parts, not from a share
            weight = self.sends[0][self.numel - 1]
            for send in self.sends[1:]:
                weight = weight + send[self.numel - 1]
            _divide_by_weights(share[: max(0, min(high, self.numel - 1) - low)], weight)
        return total[: self.numel], lent


def share_range(numel: int, rank: int, size: int) -> tuple[int, int]:
    """The numbers [low, high) of a bucket of `numel` that `rank` of `size` sums: slices of
    ceil(numel / size), the last ones short or empty."""
    share = -(-numel // size)
    low = min(numel, rank * share)
    return low, min(numel, low + share)


def _divide_by_weights(values: np.ndarray, total: Any) -> None:
    """Weighted sums into the weighted mean, in place: over the summed weights, or zero when
    no rank had a sample (no step)."""
    if total != 0:
        values /= total
    else:
        values[...] = 0


@dataclass
class SharedSum:
    """A shared-window sum under way: the window, the barrier saying every rank packed, and
    this rank's scaled gradients (its share of the sum reads them rather than the window)."""

    window: BucketWindow
    packed: Any
    own: ScaledGradients | None  # None once its share is summed


class ScaledGradients:
    """One bucket of a rank's gradients, concatenated and scaled in thought only: number i is
    `scale` times number i of the flattened X, one after another (zero for a gradient not
    computed, None). `write` makes a range of them real, so a sum reads each number where it
    already is instead of from a packed copy."""

    __slots__ = ("flat", "sizes", "scale", "numel")

    def __init__(self, X: list[np.ndarray | None], sizes: list[int], scale: float):
        # flattened once (a copy only for a gradient that is not contiguous)
        self.flat = [None if x is None else x.reshape(-1) for x in X]
        self.sizes, self.scale = sizes, scale
        self.numel = sum(sizes)

    def write(self, out: np.ndarray, low: int, high: int) -> None:
        """out[: high - low] = numbers low..high, computed in out's dtype (float16 gradients
        are scaled in float32, the wire's dtype, not rounded to float16 first)."""
        offset = 0
        for flat, size in zip(self.flat, self.sizes):
            start, stop = max(low, offset), min(high, offset + size)
            if start < stop:
                part = out[start - low : stop - low]
                if flat is None or self.scale == 0:  # no gradient, or no sample: nothing
                    part[...] = 0
                else:
                    piece = flat[start - offset : stop - offset]
                    np.multiply(piece, self.scale, out=part, dtype=part.dtype, casting="unsafe")
            offset += size


def _on_host(array: Any, device: DeviceContext) -> np.ndarray:
    """`array` where MPI can read it: a device array copied to the host (the staging the
    c_* ops document), a host one as it is."""
    return array if device.xp is np else device.to_host(array)


def _on_place(array: np.ndarray, device: DeviceContext) -> Any:
    """A host result on the op's place (copied back to a device; as it is on the CPU)."""
    return array if device.xp is np else device.to_device(array)


def _as_bytes(array: np.ndarray) -> np.ndarray:
    """A contiguous array's memory as uint8 (broadcasts and gathers move bytes, so every dtype
    works, float16 and bool included)."""
    return array.reshape(-1).view(np.uint8)


_MPI_OPS = {
    "sum": lambda MPI: MPI.SUM,
    "max": lambda MPI: MPI.MAX,
    "min": lambda MPI: MPI.MIN,
    "prod": lambda MPI: MPI.PROD,
}

WORLD = Communicator()


# ---- Fluid's collective ops ----

_STREAM_ATTRS = {"ring_id": 0, "use_calc_stream": False}


def check_ring(ring_id: int) -> None:
    if ring_id != 0:
        raise AttrError(
            f"ring_id {ring_id}: nestflow has one communication ring, 0 (MPI.COMM_WORLD)"
        )


def _infer_reduced(X: VarInfo, ring_id: int, use_calc_stream: bool) -> VarInfo:
    check_ring(ring_id)
    if X.dtype == "bool":
        raise DTypeError("X is bool; all-reduce needs numbers (cast it first)")
    return X


def _wire_dtype(dtype: np.dtype) -> np.dtype:
    # MPI has no standard half type: float16 is reduced as float32 and rounded back.
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _all_reduced(X: Any, kind: str, device: DeviceContext) -> Any:
    world = WORLD.checked()
    if world.size == 1:
        return X
    buffer = np.array(_on_host(X, device), dtype=_wire_dtype(X.dtype), order="C")
    world.allreduce(buffer, kind)
    return _on_place(buffer.astype(X.dtype, copy=False), device)


@register_op
class c_allreduce_sum:
    """Out = the sum of X over every rank (the same on every rank). Its gradient is the
    all-reduce sum of Out's gradient (every rank's Out depends on every rank's X). A device
    X is staged through the host (MPI reads host memory), as in every c_* op."""

    inputs, outputs = ("X",), ("Out",)
    attrs = dict(_STREAM_ATTRS)
    infer = _infer_reduced

    def forward(X, ring_id, use_calc_stream, device):
        return _all_reduced(X, "sum", device)

    def grad_maker(op: OpDesc, ctx: GradContext) -> list[GradOpSpec]:
        out_grad = ctx.grad_of(op.output("Out")[0])
        x_grad = ctx.grad_of(op.input("X")[0])
        if out_grad is None or x_grad is None:
            return []
        return [GradOpSpec("c_allreduce_sum", {"X": [out_grad]}, {"Out": [x_grad]}, op.attrs)]


@register_op
class c_allreduce_max:
    """Out = the elementwise maximum of X over every rank (no gradient, as in Fluid)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = dict(_STREAM_ATTRS)
    infer = _infer_reduced

    def forward(X, ring_id, use_calc_stream, device):
        return _all_reduced(X, "max", device)


@register_op
class c_allreduce_min:
    """Out = the elementwise minimum of X over every rank (no gradient, as in Fluid)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = dict(_STREAM_ATTRS)
    infer = _infer_reduced

    def forward(X, ring_id, use_calc_stream, device):
        return _all_reduced(X, "min", device)


@register_op
class c_allreduce_prod:
    """Out = the elementwise product of X over every rank (no gradient, as in Fluid)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = dict(_STREAM_ATTRS)
    infer = _infer_reduced

    def forward(X, ring_id, use_calc_stream, device):
        return _all_reduced(X, "prod", device)


@register_op
class c_broadcast:
    """Out = X of rank `root` on every rank (X must have the same shape and dtype on every
    rank; other ranks' values are ignored). The startup program of a data-parallel program
    broadcasts every parameter from rank 0 with it. Staged through the host on a device."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"ring_id": 0, "root": 0, "use_calc_stream": False}

    def infer(X, ring_id, root, use_calc_stream):
        check_ring(ring_id)
        if root < 0:
            raise AttrError(f"root must be a rank >= 0, got {root}")
        return X

    def forward(X, ring_id, root, use_calc_stream, device):
        world = WORLD.checked()
        if world.size == 1:
            return X
        if root >= world.size:
            raise AttrError(f"root {root} is not a rank of this world of {world.size}")
        if world.rank == root:
            buffer = np.array(_on_host(X, device), order="C")
        else:
            buffer = np.empty(X.shape, X.dtype)
        world.bcast(buffer, root)
        return _on_place(buffer, device)


@register_op
class c_allgather:
    """Out = the ranks' X concatenated on dim 0 in rank order ([nranks * N, ...]); X must have
    the same shape on every rank and `nranks` must be the world's size. Staged through the
    host on a device."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"nranks": Required(int), "ring_id": 0, "use_calc_stream": False}

    def infer(X, nranks, ring_id, use_calc_stream):
        check_ring(ring_id)
        if nranks < 1:
            raise AttrError(f"nranks must be >= 1, got {nranks}")
        if X.ndim == 0:
            raise ShapeError("X is 0-d; all-gather stacks the ranks' X on dim 0")
        first = X.shape[0] * nranks if X.shape[0] >= 0 else -1
        return VarInfo((first, *X.shape[1:]), X.dtype)

    def forward(X, nranks, ring_id, use_calc_stream, device):
        world = WORLD.checked()
        if nranks != world.size:
            raise AttrError(f"nranks is {nranks} but the world has {world.size} rank(s)")
        if world.size == 1:
            return X
        send = np.ascontiguousarray(_on_host(X, device))
        receive = np.empty((world.size, *X.shape), X.dtype)
        world.allgather(send, receive)
        return _on_place(receive.reshape((world.size * X.shape[0], *X.shape[1:])), device)


@register_op
class c_sync_calc_stream:
    """Out = X (Fluid waits for the CUDA calculation stream here; nestflow has no streams)."""

    inputs, outputs = ("X",), ("Out",)

    def infer(X):
        return X

    def forward(X):
        return X


@register_op
class c_sync_comm_stream:
    """Out = X (Fluid waits for the communication stream; nestflow's collective ops are done
    when they return, and non-blocking all-reduces are waited for by c_allreduce_wait)."""

    inputs, outputs = ("X*",), ("Out*",)
    attrs = {"ring_id": 0}

    def infer_op(op: OpDesc) -> None:
        check_ring(op.attrs["ring_id"])
        _same_as_inputs(op, "X", "Out")

    def forward(X, ring_id):
        return list(X)


def _same_as_inputs(op: OpDesc, in_slot: str, out_slot: str) -> None:
    """Declare each output of `out_slot` like the input at its index in `in_slot`."""
    block = op.block
    ins, outs = op.input(in_slot), op.output(out_slot)
    if len(ins) != len(outs):
        raise AttrError(f"{out_slot} has {len(outs)} variable(s) but {in_slot} has {len(ins)}")
    for source, target in zip(ins, outs):
        if not target:
            continue
        desc = block.find_var(source)
        var = block.find_var(target) or block.create_var(target)
        if desc is not None and var is not desc:
            var.shape, var.dtype = desc.shape, desc.dtype


# ---- bucketed, non-blocking gradient averaging ----


class PendingAverage:
    """A bucket of gradients being summed over the ranks: what c_allreduce_start hands to
    c_allreduce_wait (the value of a RAW variable). `buffer` holds the flattened gradients in
    the wire dtype, divided by the number of ranks (so that the sum is the mean), or when
    weighted times the rank's weight and followed by the weight itself (in a shared-memory
    window, all but the rank's own share: see BucketWindow); `request` is the MPI request of
    their sum, or a SharedSum when the ranks sum in a shared-memory window. `device`: the
    DeviceContext of the program's place, where the averages go (from the host buffer)."""

    __slots__ = ("world", "buffer", "request", "shapes", "dtype", "weighted", "device")

    def __init__(self, world, buffer, request, shapes, dtype, weighted, device):
        self.world = world
        self.buffer = buffer
        self.request = request
        self.shapes = shapes
        self.dtype = dtype
        self.weighted = weighted
        self.device = device

    def __repr__(self) -> str:
        state = "local" if self.request is None else "in flight"
        return f"PendingAverage({len(self.shapes)} tensors, {state})"

    def wait(self, X: list[Any]) -> list[Any]:
        if self.request is None:  # alone: the average over one rank is X itself
            zeros = self.device.xp.zeros
            return [x if x is not None else zeros(s, self.dtype) for x, s in zip(X, self.shapes)]
        if isinstance(self.request, SharedSum):  # averaged in shared memory already
            values = self.world.finish_shared(self.request, self.weighted)
            values = (values[:-1] if self.weighted else values).view()
            # Shared with the other ranks: no op may take it for its output (plan._owned),
            # and a user's write into a fetched gradient fails instead of changing theirs.
            values.flags.writeable = False
            return self._views(values)
        self.world.wait(self.request)
        buffer = self.buffer
        if self.weighted:
            values = buffer[:-1]
            _divide_by_weights(values, buffer[-1])
        else:  # each rank sent X / size: the sum is the mean
            values = buffer
        return self._views(values)

    def _views(self, values: np.ndarray) -> list[Any]:
        out, offset = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(values[offset : offset + size].reshape(shape).astype(self.dtype, copy=False))
            offset += size
        if self.device.xp is not np:  # the host buffer's averages, copied to the device
            out = [self.device.to_device(o) for o in out]
        return out


def _numbers(name: str, infos: list[VarInfo | None]) -> str:
    dtypes = {i.dtype for i in infos if i is not None}
    if len(dtypes) > 1:
        raise DTypeError(f"{name} mixes dtypes {sorted(dtypes)}; a bucket holds one dtype")
    dtype = dtypes.pop() if dtypes else "float32"
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise DTypeError(f"{name} is {dtype}; gradients to average must be floating point")
    return dtype


def _var_infos(op: OpDesc, slot: str) -> list[VarInfo | None]:
    found = []
    for name in op.input(slot):
        var = op.block.find_var(name) if name else None
        found.append(None if var is None else VarInfo(var.shape, var.dtype))
    return found


@register_op
class c_allreduce_start:
    """Start averaging one bucket of gradients over the ranks: X (tensors of one floating
    dtype) flattened and concatenated into one buffer, and one sum over the ranks started on
    it (in shared memory when every rank runs on one node, else one non-blocking
    MPI_Iallreduce; see NodeWindows); Out is the handle c_allreduce_wait waits on.

    Param (optional, one per X): the parameters X are the gradients of; a gradient that was not
    computed in this run (None) contributes zeros of its parameter's shape, so every rank sends
    the same buffer. Weight (optional, one number, e.g. the rank's batch size): each rank's X is
    multiplied by its Weight and the weights are summed with them, so the wait gives
    sum(w_r * X_r) / sum(w_r); without it the plain mean over the ranks.

    On a device place the gradients (and Weight) are copied to the host bucket (MPI reads host
    memory) and c_allreduce_wait copies the averages back; alone, nothing moves."""

    inputs, outputs = ("X*", "Param*", "Weight?"), ("Out",)
    attrs = {"ring_id": 0}

    def infer_op(op: OpDesc) -> None:
        check_ring(op.attrs["ring_id"])
        grads, params = _var_infos(op, "X"), _var_infos(op, "Param")
        if not grads:
            raise AttrError("X needs at least one gradient")
        _numbers("X", grads)
        if params and len(params) != len(grads):
            raise AttrError(f"Param has {len(params)} variable(s) but X has {len(grads)}")
        for name, grad, param in zip(op.input("X"), grads, params):
            if grad is not None and param is not None and _differ(grad.shape, param.shape):
                raise ShapeError(
                    f"gradient '{name}' is {list(grad.shape)} but its parameter is "
                    f"{list(param.shape)}"
                )
        weight = _var_infos(op, "Weight")
        if weight and weight[0] is not None:
            shape = weight[0].shape
            if all(d >= 0 for d in shape) and int(np.prod(shape, dtype=np.int64)) != 1:
                raise ShapeError(f"Weight must hold one number, got shape {list(shape)}")
            if weight[0].dtype == "bool":
                raise DTypeError("Weight is bool; it must be a number (e.g. a batch size)")
        for name in op.output("Out"):
            var = op.block.find_var(name) or op.block.create_var(name, type="raw")
            var.type = "raw"

    def forward(X, Param, Weight, ring_id, device):
        return _start_average(X, Param, Weight, device)


def _differ(a, b) -> bool:
    return len(a) != len(b) or any(x != y and x >= 0 and y >= 0 for x, y in zip(a, b))


def _start_average(X, Param, Weight, device: DeviceContext) -> PendingAverage:
    world = WORLD.checked()
    # A sparse gradient is densified: its rows differ from rank to rank, and an all-gather of
    # rows would need sizes exchanged first (the distributed guide says so).
    X = [x.to_dense() if isinstance(x, SelectedRows) else x for x in X]
    shapes = []
    for i, x in enumerate(X):
        if x is not None:
            shapes.append(x.shape)
        elif i < len(Param) and Param[i] is not None:
            shapes.append(Param[i].shape)
        else:
            raise ExecutionError(
                f"gradient #{i} of the bucket was not computed and no Param gives its shape"
            )
    dtype = next((x.dtype for x in X if x is not None), None) or Param[0].dtype
    if world.size == 1:
        return PendingAverage(world, None, None, shapes, dtype, Weight is not None, device)
    if device.xp is not np:  # staged: the bucket MPI sums is host memory
        X = [None if x is None else device.to_host(x) for x in X]
    weight = None
    if Weight is not None:
        values = np.asarray(_on_host(Weight, device)).reshape(-1)
        if values.size != 1:
            raise ShapeError(f"Weight must hold one number, got {values.size}")
        weight = float(values[0])
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    wire = _wire_dtype(np.dtype(dtype))
    numel = sum(sizes) + (weight is not None)
    window = world.shared.acquire(numel, wire) if world.shared is not None else None
    buffer = window.send if window is not None else world.bucket_buffer(numel, wire)
    # Scaled as they are packed or summed (one pass over each number): by the weight, else by
    # 1 / size so that the sum is the mean (exact for power-of-two sizes).
    scaled = ScaledGradients(X, sizes, weight if weight is not None else 1.0 / world.size)
    if weight is not None:
        buffer[-1] = weight
    if window is None:
        scaled.write(buffer, 0, scaled.numel)
        request = world.start_allreduce(buffer)
    else:  # all but the share this rank sums, which reads its gradients where they are
        scaled.write(buffer, 0, window.low)
        scaled.write(buffer[window.high :], window.high, scaled.numel)
        request = world.start_shared(window, scaled)
    return PendingAverage(world, buffer, request, shapes, dtype, weight is not None, device)


@register_op
class c_allreduce_wait:
    """Out[i] = X[i] averaged over the ranks, once the sum c_allreduce_start started (Request,
    its handle) is done. Out usually names the same variables as X (the gradients are replaced
    by their averages before the optimizer reads them). On a device place the averages are
    copied from the host bucket to the device."""

    inputs, outputs = ("Request", "X*"), ("Out*",)
    attrs = {"ring_id": 0}

    def infer_op(op: OpDesc) -> None:
        check_ring(op.attrs["ring_id"])
        request = op.block.find_var(op.input("Request")[0])
        if request is not None and request.type != "raw":
            raise DTypeError(
                f"Request '{request.name}' is a {request.type}; it must be the RAW handle a "
                "c_allreduce_start op outputs"
            )
        _same_as_inputs(op, "X", "Out")

    def forward(Request, X, ring_id):
        if not isinstance(Request, PendingAverage):
            raise ExecutionError(
                f"Request holds {type(Request).__name__}, not the handle of a c_allreduce_start op"
            )
        if len(X) != len(Request.shapes):
            raise ExecutionError(
                f"X has {len(X)} tensors but the bucket started with {len(Request.shapes)}"
            )
        return Request.wait(X)


# ---- the startup check that every rank runs the same program ----


@register_op
class c_check_layout:
    """Out = the SHA-256 digest (uint8 [32]) of `layout`, after checking that every rank's
    `layout` equals rank 0's: a text naming what the program synchronises (the broadcast
    variables with their dtypes and shapes, the gradient buckets). Ranks with different
    programs would otherwise mismatch their broadcasts and all-reduces (wrong sizes or a
    hang); instead every rank raises ProgramMismatchError naming the first differences. The
    digest is made and compared on the host, then put on the op's place."""

    outputs = ("Out",)
    attrs = {"layout": Required(str), "ring_id": 0}

    def infer(layout, ring_id):
        check_ring(ring_id)
        return VarInfo((32,), "uint8")

    def forward(layout, ring_id, device):
        digest = np.frombuffer(hashlib.sha256(layout.encode("utf-8")).digest(), np.uint8).copy()
        world = WORLD.checked()
        if world.size == 1:
            return _on_place(digest, device)
        every = np.empty((world.size, digest.size), np.uint8)
        world.allgather(digest, every)
        differ = [r for r in range(world.size) if not np.array_equal(every[r], every[0])]
        if differ:
            layouts = world.allgather_text(layout)
            raise ProgramMismatchError(_mismatch_message(layouts, differ, world.rank))
        return _on_place(digest, device)


def _mismatch_message(layouts: list[str], differ: list[int], rank: int) -> str:
    reference = layouts[0].splitlines()
    lines = [
        f"the ranks run different programs: rank(s) {differ} synchronise other variables "
        f"than rank 0 (this is rank {rank}); build the same program on every rank"
    ]
    for r in differ[:3]:
        other = layouts[r].splitlines()
        only_0 = [line for line in reference if line not in set(other)][:3]
        only_r = [line for line in other if line not in set(reference)][:3]
        if not only_0 and not only_r:
            lines.append(f"  rank {r}: the same variables in another order")
        for line in only_0:
            lines.append(f"  rank 0 has: {line}")
        for line in only_r:
            lines.append(f"  rank {r} has: {line}")
    return "\n".join(lines)


__all__ = [
    "WORLD",
    "CommStats",
    "Communicator",
    "PendingAverage",
    "ProgramMismatchError",
    "launched_rank",
    "launched_world_size",
]
