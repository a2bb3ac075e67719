"""DeviceContext: what runs on a place (Paddle's DeviceContextPool, thinc's Ops/CupyOps).

One context per place, from a pool (`device_context(place)`). A kernel that declares an `xp`
parameter gets the context's array module (NumPy, CuPy or the stand-in) and is written once
against it; a kernel that declares `device` gets the context itself, for what differs between
places: scatter-add, random draws, host transfers the op's meaning needs. The CPU context also
owns the intra-op thread budget; the CUDA one the device, its stream and memory pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import numpy as np

from nestflow.core.place import CPUPlace, CUDAPlace, Place, StandInPlace
from nestflow.errors import ExecutionError, PlaceError


class DeviceContext:
    """What runs on `place`: its array module `xp`, transfers to and from the host, and the
    few operations whose kernels differ between places.

    >>> ctx = nf.device_context(nf.CPUPlace())
    >>> isinstance(ctx, nf.DeviceContext), ctx.to_device([1, 2]).tolist()
    (True, [1, 2])
    >>> target = np.zeros(3)
    >>> ctx.scatter_add(target, np.array([0, 2, 0]), np.ones(3))
    >>> target.tolist()
    [2.0, 0.0, 1.0]
    """

    def __init__(self, place: Place, xp: ModuleType):
        self.place = place
        self.xp = xp
        # (device flag, message) of the checks `check` left for the end of the run, per thread
        # (runs on one place from several threads each read their own)
        self._checks = threading.local()

    def owns(self, array: Any) -> bool:
        """Whether `array` is an array of this place."""
        return isinstance(array, self.xp.ndarray)

    def to_device(self, array: Any) -> Any:
        """`array` on this place: an array of the place as it is, a host array (or array-like)
        copied over; PlaceError for an array of another device."""
        raise NotImplementedError

    def to_host(self, array: Any) -> np.ndarray:
        """An array of this place as a host NumPy array (a copy for device arrays)."""
        return self.place.to_host(array)

    def activate(self) -> contextlib.AbstractContextManager:
        """A context in which this place's device is the current one (for the length of a
        run)."""
        return contextlib.nullcontext()

    @property
    def _pending_checks(self) -> list[tuple[Any, Callable[[], str]]]:
        pending = getattr(self._checks, "pending", None)
        if pending is None:
            pending = self._checks.pending = []
        return pending

    @_pending_checks.setter
    def _pending_checks(self, value: list) -> None:
        self._checks.pending = value

    # whether ops' fused CUDA kernels (`forward_cuda`, `backward_cuda`) run on this place
    runs_cuda_kernels = False
    # whether `check` reads its flag at once (the host) or after the run (a device)
    defers_checks = False
    # whether an Executor with cuda_graph=True captures blocks here (CUDA; the stand-in
    # emulates a capture, so the executor's side of it is tested without a GPU)
    captures_graphs = False

    def check(self, failed: Any, message: Callable[[], str]) -> None:
        """Raise ExecutionError(message()) if the 0-d bool array `failed` holds True (a bad
        input only the values show, such as a class id out of range). On the host at once; on
        a device the flag stays there and the executor reads every check's flag in one
        transfer when the run's ops are queued (`raise_failed_checks`), so checking costs a
        kernel no wait for the device, and a block stays capturable as a CUDA graph; the run's
        persistables are written after that read, so a failed run still changes none."""
        if not self.defers_checks:
            if bool(failed):
                raise ExecutionError(message())
            return
        self._pending_checks.append((failed, message))

    def raise_failed_checks(self) -> None:
        """Read the flags of the checks left by `check` (one transfer) and raise the first
        failed one's ExecutionError; forget them either way."""
        pending, self._pending_checks = self._pending_checks, []
        if not pending:
            return
        flags = self.to_host(self.xp.stack([flag.reshape(()) for flag, _ in pending]))
        for flag, (_, message) in zip(flags.tolist(), pending):
            if flag:
                try:
                    text = message()
                except Exception as exc:  # noqa: BLE001 (the check failed: say so anyway)
                    text = f"an input failed its check ({type(exc).__name__} naming it: {exc})"
                raise ExecutionError(
                    text + f" (found on {self.place!r} after the run's ops were queued: "
                    "a device checks its inputs without stopping; nothing was stored)"
                )

    def discard_checks(self) -> None:
        """Forget the checks left by `check` (a run that failed another way)."""
        self._pending_checks = []

    def synchronize(self) -> None:
        """Wait for the work queued on this place to finish."""

    def scatter_add(self, target: Any, indices: Any, values: Any) -> None:
        """target[indices] += values, repeated indices adding up (NumPy's `add.at`)."""
        self.xp.add.at(target, indices, values)

    def scatter_at(self, target: Any, indices: Any, values: Any, ufunc: str) -> None:
        """target[indices] = ufunc(target[indices], values) for `ufunc` one of add, multiply,
        maximum, minimum, repeated indices combining in their order (NumPy's `<ufunc>.at`).

        >>> target, ctx = np.ones(3), nf.device_context(nf.CPUPlace())
        >>> ctx.scatter_at(target, [0, 0, 2], [2.0, 3.0, 4.0], "multiply")
        >>> target.tolist()
        [6.0, 1.0, 4.0]
        """
        if ufunc == "add":
            self.scatter_add(target, indices, values)
        else:
            getattr(self.xp, ufunc).at(target, indices, values)

    def random(self, host_generator: np.random.Generator) -> Any:
        """A generator drawing arrays on this place (`uniform`, `normal`, `random`,
        `integers`, `standard_normal`), made from the run's host generator."""
        return host_generator

    def map_rows(self, fn: Callable[..., Any], out: Any, *arrays: Any) -> Any:
        """out = fn(*arrays) for an elementwise fn (NumPy broadcasting), which writes its
        result into the `out=` it is given: out's leading axis in chunks of at least
        ROW_CHUNK_ELEMENTS elements on parallel_for. An array whose leading axis is out's
        (same rank, same length) is sliced with it; any other (broadcast along it) goes
        whole. An elementwise result has the same bits however it is split.

        >>> out = np.empty(3)
        >>> nf.device_context().map_rows(np.add, out, np.arange(3.0), 1.0).tolist()
        [1.0, 2.0, 3.0]
        """
        n = out.shape[0] if out.ndim else 0
        grain = thread_grain(n, out.size // n, ROW_CHUNK_ELEMENTS) if n else 0
        if grain >= n:
            fn(*arrays, out=out)
            return out

        def rows(start: int, stop: int) -> None:
            parts = [
                a[start:stop] if getattr(a, "ndim", 0) == out.ndim and a.shape[0] == n else a
                for a in arrays
            ]
            fn(*parts, out=out[start:stop])

        self.parallel_for(n, rows, grain)
        return out

    def parallel_for(self, n: int, body: Callable[[int, int], Any], grain: int = 1) -> list:
        """body(start, stop) over range(n) in chunks of `grain` items: the list of its results
        in chunk order. Here (a device place) one call over everything: the device runs the
        body's array operations in parallel itself. CPUDeviceContext runs the chunks on its
        intra-op thread pool.

        >>> nf.device_context(nf.core.StandInPlace(0)).parallel_for(10, lambda a, b: (a, b), 4)
        [(0, 10)]
        """
        return [body(0, n)] if n > 0 else []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.place!r})"


_IN_POOL = threading.local()  # .active: this thread runs a chunk of a parallel_for


def _mark_pool_thread(cpus: list[int] | None = None, helpers=None) -> None:
    """A pool thread's start: marked as one, and pinned to the next of `cpus` (helper i to
    cpus[i + 1]; the caller takes cpus[0] while it runs chunks) where the pool pins."""
    _IN_POOL.active = True
    if cpus is not None:
        with contextlib.suppress(OSError):  # a CPU taken away since: the thread floats
            os.sched_setaffinity(0, (cpus[next(helpers) % len(cpus)],))


def _cpus_to_pin(threads: int) -> list[int] | None:
    """The CPUs a pool of `threads` threads (the caller included) pins its threads to, one
    each: the process's allowed CPUs where it may use at least that many (Linux); else None.

    Why: a thread woken on a VM whose other vCPUs were idle for a while is put on the waker's
    CPU (the idle vCPUs count as preempted, so the scheduler passes them over) and stays there
    until the load balancer moves it: two chunks then share one vCPU. On the 2-vCPU EPYC, W9's
    3x3 conv at 2 threads took 20-28 ms for its first two steps after a 0.2 s pause and 15 ms
    after that, with both threads on one CPU (/proc/self/task); pinned, 15-16 ms from the first.
    """
    if not hasattr(os, "sched_getaffinity") or os.environ.get("NF_PIN_THREADS") == "0":
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus if len(cpus) >= threads else None


def default_num_threads() -> int:
    """The intra-op budget a process starts with: the cores it may use
    (os.sched_getaffinity), or fewer where OMP_NUM_THREADS says so."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        asked = int(os.environ.get("OMP_NUM_THREADS", "0").split(",")[0])
    except ValueError:
        asked = 0
    return max(1, min(cores, asked) if asked > 0 else cores)


# The most chunks a kernel splits into, whatever the thread count (_chunk_threads says why).
MAX_CHUNKS = 8
# An elementwise kernel (map_rows) splits its output in chunks of at least this many elements.
# On the 2-vCPU EPYC at 2 threads relu over 2M float32 took 0.39 ms split against 0.64 whole,
# over 1M 0.22 against 0.32; over 256K split in two it ran slower (0.097 against 0.080).
ROW_CHUNK_ELEMENTS = 1 << 19


def chunk_grain(
    n: int, item_cost: int, min_cost: int, max_chunks: int = MAX_CHUNKS, limit: int | None = None
) -> int:
    """Items per chunk for parallel_for over n items of item_cost each: chunks of at least
    min_cost, at most max_chunks of them, or up to MAX_CHUNKS where the budget has more
    threads than max_chunks (_chunk_threads); n (one chunk: the calling thread) for small
    work. A kernel that sums over its chunks passes max_chunks=MAX_CHUNKS, so its chunks (and
    its bits) depend on the shapes only, at any thread count. `limit`: at most that many chunks
    whatever the threads (a kernel's own bound, from its shapes).

    >>> chunk_grain(32, 200_000, 1 << 17, limit=4), chunk_grain(32, 10, 1 << 17)
    (8, 32)
    """
    chunks = min(n, n * item_cost // max(1, min_cost))
    if chunks > max_chunks:  # (the thread count is looked up only where it can matter)
        chunks = min(chunks, max(max_chunks, _chunk_threads()))
    if limit is not None:
        chunks = min(chunks, limit)
    return n if chunks < 2 else -(-n // chunks)


# A kernel whose bits do not depend on its split (thread_grain) works on chunks of about this
# many elements (2 MiB of float32), so that its passes over a chunk find it in cache. W14
# (batch_norm and max-pool on [32, 64, 56, 56]) at 2 threads in one process: 13.7 ms with
# chunks of about 512K elements, 14.4-15.1 with 1M.
CACHE_CHUNK_ELEMENTS = 1 << 19


def thread_grain(n: int, item_cost: int, min_cost: int) -> int:
    """Items per chunk for parallel_for over n items of item_cost elements each, for a kernel
    whose bits do not depend on how its items are split (elementwise, per row, per channel,
    per image): chunks of about CACHE_CHUNK_ELEMENTS, as many as the budget's threads or a
    multiple of them, each of at least min_cost; n (one chunk: the calling thread) for
    small work.

    Why not the most chunks the work allows: every NumPy call in a chunk lets go of the GIL and
    takes it back, and two threads that both do so often wait on each other; on a VM each such
    wait costs a wake-up (tens of us). Why not one chunk a thread on large arrays: a kernel of
    several passes then streams each from memory. Measured on the 2-vCPU EPYC at 1 / 2
    threads: batch_norm's forward on [32, 64, 32, 32] (2M elements) 1.05 / 1.15 ms in 8
    chunks, 0.89 / 0.56 in 2; on [32, 64, 56, 56] (6.4M) 4.25 / 4.47 whole, 3.76 / 2.59 in
    8; 2x2 max-pool's gradient there 10.3 / 10.3 whole, 10.8 / 5.7 in 2, 7.2 / 4.0 in 8.

    >>> nf.set_num_threads(2); thread_grain(32, 1 << 15, 1 << 17), thread_grain(32, 10, 1 << 17)
    (16, 32)
    """
    threads = _chunk_threads()
    total = n * item_cost
    chunks = max(threads, round(total / CACHE_CHUNK_ELEMENTS))
    chunks = min(n, -(-chunks // threads) * threads, total // max(1, min_cost))
    return n if chunks < 2 else -(-n // chunks)


def may_be_large(info: Any) -> bool:
    """Whether a variable of `info`'s shape (-1: known when it runs) may be large enough for
    map_rows to split."""
    shape = info.shape
    return -1 in shape or math.prod(shape) >= 2 * ROW_CHUNK_ELEMENTS


def pooled_ufunc(ufunc: np.ufunc) -> Callable[..., np.ndarray]:
    """`ufunc` over NumPy arrays with its output split across the CPU's intra-op pool
    (map_rows) where its first operand has at least two chunks' elements; smaller calls go
    straight to the ufunc.

    >>> pooled_ufunc(np.add)(np.ones((2, 3)), np.arange(3.0)).tolist()
    [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    """

    def pooled(*arrays: Any, out: np.ndarray | None = None) -> np.ndarray:
        # out: a buffer the executor offers (memory reuse); one the result does not fit (a
        # broadcast grew it) is left alone, as the plan does for a plain ufunc
        if getattr(arrays[0], "size", 0) < 2 * ROW_CHUNK_ELEMENTS:
            if out is None:
                return ufunc(*arrays)
            try:  # NumPy checks the shape and the cast before it writes anything
                return ufunc(*arrays, out=out)
            except (ValueError, TypeError):
                return ufunc(*arrays)
        shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
        dtype = np.result_type(*arrays)
        if out is None or out.shape != shape or out.dtype != dtype:
            out = np.empty(shape, dtype)
        return device_context().map_rows(ufunc, out, *arrays)

    pooled.__name__ = f"pooled_{ufunc.__name__}"
    return pooled


def _chunk_threads() -> int:
    """The threads the pool's chunk counts follow: the budget's, up to MAX_CHUNKS.

    Why not every core: a chunk's NumPy calls each let go of the GIL and take it back, so
    more chunks mean more threads waiting on each other. On a 16-core host (the H200
    machine's Xeon, one thread per core; bench/many_cores.py) W9's 3x3 conv took 18.3 ms at 8
    threads, 27.1 at 12 and 37.6 at 16 with a chunk per thread, and 17.1 at 12 and 18.4 at 16
    with at most 8 chunks; W9 1x1 4.1 / 4.2 ms at 12 / 16 against 3.3 / 3.3; W1, W8, W13 and
    W14 no slower with at most 8 (their spread between two runs of the same variant was
    larger than the gap). BLAS outside the pool still takes the whole budget."""
    return min(device_context().num_threads, MAX_CHUNKS)


_BLAS: list = []  # threadpoolctl's controllers of the BLAS libraries, found on first use


def _blas_controllers() -> list:
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS.append(ThreadpoolController().select(user_api="blas").lib_controllers)
        except Exception:  # no threadpoolctl, or it cannot read a library: leave BLAS be
            _BLAS.append([])
    return _BLAS[0]


def forget_blas_controllers() -> None:
    """Look the BLAS libraries up again on the next parallel_for (after loading another)."""
    _BLAS.clear()


@contextlib.contextmanager
def _single_threaded_blas():
    """BLAS at one thread inside the block (each pool thread runs its own products), then the
    counts as they were."""
    controllers = _blas_controllers()
    before = [c.get_num_threads() for c in controllers]
    for c, n in zip(controllers, before):
        if n != 1:
            c.set_num_threads(1)
    try:
        yield
    finally:
        for c, n in zip(controllers, before):
            if n != 1:
                c.set_num_threads(n)


@contextlib.contextmanager
def _pinned_caller(cpus: list[int] | None):
    """The calling thread on cpus[0] (the CPU no helper is pinned to) inside the block, then
    on the CPUs it had; nothing where cpus is None."""
    if cpus is None:
        yield
        return
    had = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus[:1])
    except OSError:  # a CPU taken away since: the caller floats
        had = None
    try:
        yield
    finally:
        if had is not None:
            os.sched_setaffinity(0, had)


def _foreign_array(place: Place, array: Any) -> PlaceError:
    return PlaceError(
        f"an array of type {type(array).__module__}.{type(array).__name__} (shape "
        f"{list(getattr(array, 'shape', ()))}) is on another device than {place!r}: copy it "
        "to the host first (CuPy: .get()) or run the program on its place"
    )


class CPUDeviceContext(DeviceContext):
    """The host: NumPy kernels, and the intra-op thread pool of `num_threads` threads
    (nf.set_num_threads; by default the cores the process may use, or OMP_NUM_THREADS)."""

    def __init__(self, place: CPUPlace):
        super().__init__(place, np)
        self.num_threads = default_num_threads()
        self._workers: ThreadPoolExecutor | None = None
        self._worker_count = 0
        self._cpus: list[int] | None = None  # _cpus_to_pin's, for the pool's threads
        self._busy = threading.Lock()
        if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._workers, self._worker_count = None, 0
        self._busy = threading.Lock()

    def parallel_for(self, n: int, body: Callable[[int, int], Any], grain: int = 1) -> list:
        """body(start, stop) over range(n) in chunks of `grain` items (the last one shorter):
        the list of its results in chunk order. The chunks depend on n and grain only (and a
        grain from chunk_grain with max_chunks=MAX_CHUNKS on the shapes only), so a kernel that
        combines per-chunk results in order gets the same bits whatever nf.set_num_threads
        says. Chunks on the pool's threads run in a copy of the caller's context
        (np.errstate holds there). With one chunk, one thread, inside another
        parallel_for, or while another thread runs one, the chunks run on the calling thread;
        otherwise on the pool (the calling thread included). Either way NumPy's BLAS runs at
        one thread inside the body (no oversubscription, and the same rounding: OpenBLAS's
        threaded products differ from its single-threaded ones in the last bits). The body's first exception is raised here, after
        every chunk has finished.

        >>> ctx = nf.device_context(nf.CPUPlace())
        >>> ctx.parallel_for(10, lambda a, b: (a, b), 4)
        [(0, 4), (4, 8), (8, 10)]
        """
        grain = max(1, int(grain))
        chunks = [(start, min(start + grain, n)) for start in range(0, n, grain)]
        if self.num_threads < 2 or getattr(_IN_POOL, "active", False):
            return [body(a, b) for a, b in chunks]
        if len(chunks) < 2 or not self._busy.acquire(blocking=False):
            # OpenBLAS's threaded products round differently from its single-threaded ones:
            # chunks run with BLAS at one thread wherever they run, so their bits never
            # depend on the budget
            with _single_threaded_blas():
                return [body(a, b) for a, b in chunks]
        try:
            return self._run(chunks, body)
        finally:
            self._busy.release()

    def _run(self, chunks: list[tuple[int, int]], body) -> list:
        threads = min(self.num_threads, len(chunks))
        if self._workers is None or self._worker_count < threads - 1:
            if self._workers is not None:
                self._workers.shutdown(wait=False)
            self._worker_count = max(threads - 1, self.num_threads - 1)
            self._cpus = _cpus_to_pin(self._worker_count + 1)
            self._workers = ThreadPoolExecutor(
                self._worker_count,
                "nestflow-intra-op",
                initializer=_mark_pool_thread,
                initargs=(self._cpus, itertools.count(1)),
            )
        results: list = [None] * len(chunks)
        errors: list[BaseException] = []
        order = itertools.count()  # next() is atomic under the GIL: each chunk runs once

        def work() -> None:
            for index in iter(order.__next__, None):
                if index >= len(chunks) or errors:
                    return
                try:
                    results[index] = body(*chunks[index])
                except BaseException as exc:  # raised by the caller once all have stopped
                    errors.append(exc)
                    return

        with _single_threaded_blas(), _pinned_caller(self._cpus):
            # each helper runs in a copy of the caller's context: NumPy keeps its error state
            # (np.errstate) there, and a chunk must raise or warn as the caller asked
            helpers = [
                self._workers.submit(contextvars.copy_context().run, work)
                for _ in range(threads - 1)
            ]
            _IN_POOL.active = True
            try:
                work()
            finally:
                _IN_POOL.active = False
                for helper in helpers:
                    helper.result()
        if errors:
            raise errors[0]
        return results

    def to_device(self, array: Any) -> np.ndarray:
        if type(array) is np.ndarray:
            return array
        if hasattr(array, "__cuda_array_interface__") or type(array).__name__ == "StandInArray":
            raise _foreign_array(self.place, array)
        return np.asarray(array)


class StandInDeviceContext(DeviceContext):
    """The stand-in device: NumPy memory behind a CuPy-like module (nestflow.core.standin).
    Random draws come from the host generator, so results equal CPUPlace's bit for bit."""

    def __init__(self, place: StandInPlace):
        from nestflow.core import standin

        super().__init__(place, standin.xp)
        self._standin = standin

    defers_checks = True
    captures_graphs = True

    def to_device(self, array: Any) -> Any:
        if type(array) is self._standin.StandInArray:
            return array
        if hasattr(array, "__cuda_array_interface__"):
            raise _foreign_array(self.place, array)
        return self._standin.StandInArray(np.array(array, copy=True))

    def random(self, host_generator: np.random.Generator) -> Any:
        return _StandInGenerator(host_generator, self._standin.StandInArray)


class _StandInGenerator:
    """The host generator's draws as stand-in arrays."""

    def __init__(self, host: np.random.Generator, wrap):
        self._host = host
        self._wrap = wrap

    def __getattr__(self, name: str):
        draw = getattr(self._host, name)
        wrap = self._wrap

        def on_device(*args, **kwargs):
            return wrap(np.asarray(draw(*args, **kwargs)))

        return on_device


# the fused CUDA kernels built so far, by name (ElementwiseKernel; registry.cuda_elementwise
# keeps names unique) or (source, function, dtype) (RawKernel)
_KERNELS: dict[Any, Any] = {}


class CUDADeviceContext(DeviceContext):
    """GPU `place.device_id` through CuPy: the device, its current stream and CuPy's memory
    pool. Random draws use CuPy's generator, seeded once from the run's host generator:
    reproducible on the device, not bit-equal to the CPU."""

    def __init__(self, place: CUDAPlace):
        import cupy

        super().__init__(place, cupy)
        self.device = cupy.cuda.Device(place.device_id)
        self.memory_pool = cupy.get_default_memory_pool()
        # host generator's id -> (the host generator, kept so its id stays its own; CuPy's)
        self._generators: dict[int, tuple[np.random.Generator, Any]] = {}

    @property
    def stream(self):
        return self.xp.cuda.get_current_stream()

    def to_device(self, array: Any) -> Any:
        if isinstance(array, self.xp.ndarray):
            if array.device.id == self.place.device_id:
                return array
            with self.device:
                return self.xp.asarray(array)  # peer copy from another GPU
        if type(array).__name__ == "StandInArray":
            raise _foreign_array(self.place, array)
        with self.device:
            return self.xp.asarray(np.asarray(array))

    def activate(self) -> contextlib.AbstractContextManager:
        return self.device

    def synchronize(self) -> None:
        self.device.synchronize()

    runs_cuda_kernels = True
    defers_checks = True
    captures_graphs = True

    def elementwise(self, name: str, in_params: str, out_params: str, operation: str, **kw):
        """The `cupy.ElementwiseKernel` `name` (built on first use, then reused: CuPy compiles
        it once per dtype signature and caches the binary)."""
        kernel = _KERNELS.get(name)
        if kernel is None:
            kernel = self.xp.ElementwiseKernel(in_params, out_params, operation, name, **kw)
            _KERNELS[name] = kernel
        return kernel

    def raw_kernel(self, source: str, function: str, dtype) -> Any:
        """The `extern "C"` CUDA function `function` of `source`, compiled with `T` as the C
        type of `dtype` (float, double) once per source, function and dtype, then reused (the
        source is part of the key: two sources may name a function alike)."""
        key = (source, function, np.dtype(dtype).name)
        kernel = _KERNELS.get(key)
        if kernel is None:
            c_type = {"float32": "float", "float64": "double"}[np.dtype(dtype).name]
            kernel = self.xp.RawKernel(f"typedef {c_type} T;\n{source}", function)
            _KERNELS[key] = kernel
        return kernel

    def scatter_add(self, target: Any, indices: Any, values: Any) -> None:
        self.scatter_at(target, indices, values, "add")

    def scatter_at(self, target: Any, indices: Any, values: Any, ufunc: str) -> None:
        # CuPy's atomics (cupyx.scatter_add/max/min, the ufuncs' `at`) cover a few dtypes and
        # no multiply: the rest combines the repeats round by round
        if target.dtype in _CUPY_ATOMIC_DTYPES.get(ufunc, ()):
            import cupyx

            getattr(cupyx, _CUPY_SCATTER[ufunc])(target, indices, values)
        else:
            scatter_in_rounds(self.xp, target, indices, values, ufunc)

    def random(self, host_generator: np.random.Generator) -> Any:
        # NumPy's Generator takes no weak reference: remembered by id, holding it. An op with
        # its own seed makes a fresh host generator per run (the same draws each time, as on
        # the CPU), so the memory is bounded.
        known = self._generators.get(id(host_generator))
        if known is None or known[0] is not host_generator:
            if len(self._generators) >= _GENERATORS_KEPT:
                self._generators.clear()
            seed = int(host_generator.integers(2**63))
            known = (host_generator, _CuPyGenerator(self.xp.random.default_rng(seed)))
            self._generators[id(host_generator)] = known
        return known[1]


_GENERATORS_KEPT = 64

# the target dtypes CuPy's scatter kernels take (those of CuPy 14.0, a subset of later ones')
_CUPY_SCATTER = {"add": "scatter_add", "maximum": "scatter_max", "minimum": "scatter_min"}
_CUPY_ATOMIC_DTYPES = {
    "add": frozenset(map(np.dtype, ("int32", "uint32", "uint64", "float16", "float32", "float64"))),
    "maximum": frozenset(map(np.dtype, ("int32", "uint32", "uint64", "float32", "float64"))),
    "minimum": frozenset(map(np.dtype, ("int32", "uint32", "uint64", "float32", "float64"))),
}


class _CuPyGenerator:
    """CuPy's Generator with NumPy's `normal`, which it lacks (it has `standard_normal`)."""

    def __init__(self, generator: Any):
        self._generator = generator

    def __getattr__(self, name: str) -> Any:
        return getattr(self._generator, name)

    def normal(self, loc: Any = 0.0, scale: Any = 1.0, size: Any = None) -> Any:
        return loc + scale * self._generator.standard_normal(size)


def scatter_in_rounds(xp: ModuleType, target: Any, indices: Any, values: Any, ufunc: str) -> None:
    """NumPy's `<ufunc>.at(target, indices, values)` with plain array operations of `xp`: each
    round combines the earliest remaining update of every element it touches, so repeated
    indices combine in their order, as NumPy's do (the same bits). One round per repeat of the
    most repeated element; each reads its sizes on the host. For CuPy, whose `at` lacks
    multiply and most dtypes.

    >>> target = np.ones(3)
    >>> scatter_in_rounds(np, target, np.array([0, 0, 2]), np.array([2.0, 3.0, 4.0]), "multiply")
    >>> target.tolist()
    [6.0, 1.0, 4.0]
    """
    combine = getattr(xp, ufunc)
    flat = xp.ascontiguousarray(target).reshape(-1)  # target itself when it is contiguous
    picked = xp.arange(target.size).reshape(target.shape)[indices]  # the elements updated
    values = xp.broadcast_to(xp.asarray(values, dtype=target.dtype), picked.shape).reshape(-1)
    where = picked.reshape(-1)
    while where.size:
        touched, first = xp.unique(where, return_index=True)
        flat[touched] = combine(flat[touched], values[first])
        rest = xp.ones(where.shape, dtype=bool)
        rest[first] = False
        where, values = where[rest], values[rest]
    if not target.flags.c_contiguous:  # flat is a copy
        target[...] = flat.reshape(target.shape)


def array_module(*arrays: Any) -> ModuleType:
    """The array module of `arrays` (CuPy's `get_array_module`): for a helper shared by kernels
    that gets arrays, not the kernel's `xp`. NumPy unless one of them is a device array.

    >>> array_module(np.ones(2)) is np
    True
    """
    for array in arrays:
        kind = type(array)
        if kind is np.ndarray:
            continue
        if kind.__name__ == "StandInArray":
            from nestflow.core.standin import xp

            return xp
        if hasattr(array, "__cuda_array_interface__"):
            import cupy

            return cupy
    return np


_POOL: dict[Place, DeviceContext] = {}
_POOL_LOCK = threading.Lock()
_KINDS = {
    CPUPlace: CPUDeviceContext,
    StandInPlace: StandInDeviceContext,
    CUDAPlace: CUDADeviceContext,
}


def device_context(place: Place | None = None) -> DeviceContext:
    """The DeviceContext of `place` (default CPUPlace()), one per place for the process.

    >>> ctx = nf.device_context(nf.CPUPlace())
    >>> ctx.xp is np, ctx is nf.device_context(nf.CPUPlace())
    (True, True)
    """
    place = place if place is not None else CPUPlace()
    ctx = _POOL.get(place)
    if ctx is None:
        kind = _KINDS.get(type(place))
        if kind is None:
            raise PlaceError(f"no device context for {place!r}: nestflow knows {list(_KINDS)}")
        with _POOL_LOCK:
            ctx = _POOL.get(place) or _POOL.setdefault(place, kind(place))
    return ctx
