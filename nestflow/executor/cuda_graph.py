"""A block replayed as a CUDA graph (`nf.Executor(place, cuda_graph=True)`, or
`nf.ExecutionStrategy(cuda_graph=True)`): on CUDAPlace, a program's global block is run once as
usual, captured on its second run with the same feed shapes, and replayed from then on: one
graph launch instead of one Python call and several kernel launches per op.

What a capture keeps (a graph replays kernels on the addresses it was captured with):
- the feeds: one buffer per fed variable; each run copies its feed values into them;
- every array the capture made: they come from a memory pool of the capture's own, so no later
  allocation can take the memory the graph writes while it lives;
- the persistables it reads: the scope's arrays when it was captured. Each replay's new values
  (written by the graph into arrays of its own) are copied into them after the run's device
  checks pass, so the scope keeps the same arrays and a failed run still stores nothing.

A program falls back to uncaptured runs (and stays there) when its block holds a random op (a
graph would replay the same draws), a control-flow op (sub-blocks run in scopes of their own, and
While and IfElse read device values on the host) or anything else CuPy cannot capture (a host
read or a synchronous copy raises during the capture: `why_not_captured` says what). A
replay is dropped, and the next run captures again, when the scope's persistables are not the
arrays it captured (a parameter set from outside). `check_nan_inf` and the profiler run
uncaptured. Results are bit-identical to the uncaptured runs: the same kernels on the same
inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nestflow.core import standin
from nestflow.core.device_context import DeviceContext
from nestflow.core.scope import Scope
from nestflow.errors import NestflowError
from nestflow.ops.registry import get_op_def


@dataclass(frozen=True)
class ExecutionStrategy:
    """How an Executor runs programs (Fluid's ExecutionStrategy, its CUDA part).

    cuda_graph: on CUDAPlace, capture a program's block as a CUDA graph on its second run
    with the same feed shapes and fetches, and replay it after that (see
    nestflow.executor.cuda_graph); off by default. Other places ignore it.

    >>> strategy = nf.ExecutionStrategy(cuda_graph=True)
    >>> exe = nf.Executor(nf.CPUPlace(), execution_strategy=strategy)
    >>> exe.why_not_captured()  # the CPU runs every program uncaptured
    'cuda_graph is off (or the place captures no graphs: not CUDAPlace)'
    """

    cuda_graph: bool = False


class CaptureError(NestflowError):
    """A block could not be captured as a CUDA graph (the program then runs uncaptured)."""


# The graphs an executor keeps (by program plan, feed shapes, fetches and scope): each holds
# its arrays and its scope alive, so a loop over changing programs or scopes drops the oldest.
MAX_GRAPHS = 8


class GraphRunner:
    """An executor's captured graphs, by program plan, feed shapes, fetches and scope."""

    def __init__(self, device: DeviceContext):
        self.device = device
        self.graphs: dict[tuple, CapturedBlock] = {}
        self.warmed: set[tuple] = set()
        # why a program plan runs uncaptured, by the plan's id (the plan holds the reason too)
        self.refused: dict[tuple, str] = {}

    def why_not_captured(self, program) -> str | None:
        """Why `program` runs uncaptured here (None: it is captured, or not run twice yet)."""
        plan = program.__dict__.get("_prepared_plan")
        if plan is None:
            return None
        reason = _refusal(plan)
        if reason:
            return reason
        return next((r for key, r in self.refused.items() if key[0] == id(plan)), None)

    def run(
        self,
        executor,
        prepared,
        block,
        feed: Mapping[str, Any],
        fetch_names: Sequence[str],
        scope: Scope,
        return_numpy: bool,
    ) -> list | None:
        """The run's fetches from a replay (capturing first where this is the second run of
        its kind), or None when it must run uncaptured."""
        refusal = _refusal(prepared)
        if refusal:
            return None
        key = (
            id(prepared),
            tuple(fetch_names),
            tuple((str(k), _shape(v), str(getattr(v, "dtype", ""))) for k, v in feed.items()),
            id(scope),
        )
        if key in self.refused:
            return None
        captured = self.graphs.get(key)
        if captured is not None and not captured.still_current(scope):
            del self.graphs[key]
            captured = None
        if captured is None:
            if key not in self.warmed:  # the first run compiles kernels and makes the plan
                if len(self.warmed) > 4 * MAX_GRAPHS:
                    self.warmed.clear()
                self.warmed.add(key)
                return None
            try:
                captured = CapturedBlock(executor, prepared, block, feed, fetch_names, scope)
            except CaptureError as exc:
                self.refused[key] = str(exc)
                return None
            self.graphs[key] = captured
            if len(self.graphs) > MAX_GRAPHS:  # the oldest goes, with its memory pool
                del self.graphs[next(iter(self.graphs))]
        return captured.replay(executor, prepared, block, feed)


def _shape(value) -> tuple[int, ...]:
    """A feed's shape, without handing a device array to NumPy."""
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else np.shape(value)


def _refusal(prepared) -> str | None:
    """Why the program's block cannot be captured whatever its feeds (cached on the plan)."""
    if not hasattr(prepared, "cuda_graph_refusal"):
        prepared.cuda_graph_refusal = _block_refusal(prepared)
    return prepared.cuda_graph_refusal


def _block_refusal(prepared) -> str | None:
    if prepared.needs_local_scope:
        return "its block runs control flow (sub-blocks in scopes of their own)"
    for op in prepared.block_plan.ops:
        values = {**{k: spec.default for k, spec in get_op_def(op.type).attrs.items()}, **op.attrs}
        rate = values.get("dropout_prob", values.get("dropout_rate", 1.0))
        if "seed" in values and not values.get("is_test", False) and rate:
            return f"op '{op.type}' draws random numbers (a replay would draw the same ones)"
    return None


class CapturedBlock:
    """One program's block captured as a CUDA graph for one set of feed shapes and fetches."""

    def __init__(
        self, executor, prepared, block, feed: Mapping[str, Any], fetch_names, scope: Scope
    ):
        from nestflow.executor.executor import _scope_value, _store
        from nestflow.executor.plan import Frame

        device = executor.device
        xp = device.xp
        plan = prepared.block_plan
        # kept with the block: the pool behind the graph's arrays must live as long as it
        self.capture = capture = (
            _CudaCapture(xp) if device.runs_cuda_kernels else _EmulatedCapture()
        )
        frame = Frame(plan, scope, executor, None, None, False)
        env = frame.env
        with capture.allocating():
            fed_only = executor._bind_feeds(prepared, block, env, feed) or {}
            if fed_only:
                raise CaptureError("a fed variable no op reads is fetched")
            self.feeds: dict[int, Any] = {}
            self.fed = {name if type(name) is str else name.name for name in feed}
            for name in self.fed:
                slot = plan.slot_of[name]
                buffer = xp.empty(_shape(env[slot]), env[slot].dtype)
                buffer[...] = device.to_device(env[slot])
                env[slot] = self.feeds[slot] = buffer
            if any(name in self.fed for _, name in prepared.persistable_reads):
                raise CaptureError("a persistable variable is fed")
            executor._bind_persistables(prepared, scope, env, feed)
            for name in prepared.required_feeds:
                if env[plan.slot_of[name]] is not None:
                    continue  # fed
                value = _scope_value(scope, name)
                if value is None or not device.owns(value):
                    raise CaptureError(f"'{name}' is neither fed nor a device array in the scope")
                env[plan.slot_of[name]] = value
            # what the graph reads from the scope: checked before each replay
            self.reads = {name: env[slot] for slot, name in prepared.persistable_reads}
            self.reads.update(
                {n: env[plan.slot_of[n]] for n in prepared.required_feeds if n not in self.fed}
            )
            self.graph = capture.record(frame, frozenset(fetch_names), device)
        self.checks = device._pending_checks
        device._pending_checks = []
        self.fetches = [frame.value(name) for name in fetch_names]
        if any(value is None for value in self.fetches):
            raise CaptureError("a fetch target is not computed by the block")
        # new values of persistables go into the scope's arrays after each replay's checks
        # pass (a failed run stores nothing); one the graph only writes gets an array of the
        # default pool, stored once
        self.copy_backs = []
        for slot, name in prepared.persistable_writes:
            value = env[slot]
            if value is None:
                continue
            if name not in self.reads:
                self.reads[name] = xp.empty_like(value)
                _store(scope, name, self.reads[name])
            if self.reads[name] is not value:
                self.copy_backs.append((self.reads[name], value))
        self.frame = frame  # the arrays the graph writes stay alive with it

    def still_current(self, scope: Scope) -> bool:
        """Whether the scope still holds the arrays the graph reads."""
        return all(scope._value(name) is array for name, array in self.reads.items())

    def replay(self, executor, prepared, block, feed: Mapping[str, Any]):
        """Run the graph on `feed`; the fetches, the graph's own arrays (the caller copies
        them)."""
        device = executor.device
        env = [None] * len(prepared.block_plan.names)
        executor._bind_feeds(prepared, block, env, feed)
        for slot, buffer in self.feeds.items():
            value = env[slot]
            if type(value) is np.ndarray:
                buffer.set(value)
            else:
                buffer[...] = value
        self.capture.launch(self.graph, self.checks)
        device._pending_checks.extend(self.checks)
        device.raise_failed_checks()
        for target, value in self.copy_backs:
            target[...] = value
        return list(self.fetches)  # (Executor._returned copies them: the next replay rewrites)


class _CudaCapture:
    """A CUDA stream capture: its own stream, and its own memory pool for the arrays the
    capture makes (they must stay the graph's for as long as it lives)."""

    def __init__(self, xp):
        self.xp = xp
        self.pool = xp.cuda.MemoryPool()
        self.stream = xp.cuda.Stream(non_blocking=True)

    def allocating(self):
        return self.xp.cuda.using_allocator(self.pool.malloc)

    def record(self, frame, keep: frozenset[str], device):
        device.synchronize()
        with self.stream:
            self.stream.begin_capture()
            try:
                frame.run(keep=keep)
            except Exception as exc:
                _end_failed_capture(self.stream)
                device.discard_checks()
                raise CaptureError(_capture_failure(exc)) from exc
            return self.stream.end_capture()

    def launch(self, graph, checks: list) -> None:
        """Replay `graph` (on the current stream); its kernels write the checks' flags."""
        graph.launch()


class _EmulatedCapture:
    """The stand-in device's capture, so the bookkeeping around a graph (feed buffers, the
    scope's arrays, copies back, fetches, checks) runs in make test: its graph runs the block
    again and writes the results into the arrays the capture made, as a CUDA graph's kernels
    write into the addresses they were captured with."""

    def allocating(self):
        return contextlib.nullcontext()

    def record(self, frame, keep: frozenset[str], device):
        bound = list(frame.env)
        try:
            with standin.capturing():
                frame.run(keep=keep)
        except Exception as exc:
            device.discard_checks()
            raise CaptureError(_capture_failure(exc)) from exc
        return _EmulatedGraph(frame, keep, bound, device)

    def launch(self, graph, checks: list) -> None:
        graph.launch(checks)


class _EmulatedGraph:
    # (no other attributes: CuPy's Graph takes none either)
    __slots__ = ("frame", "keep", "bound", "device", "made")

    def __init__(self, frame, keep: frozenset[str], bound: list, device):
        self.frame, self.keep, self.bound, self.device = frame, keep, bound, device
        self.made = list(frame.env)  # the arrays the capture made (the "graph's addresses")

    def launch(self, checks: list) -> None:
        frame, device = self.frame, self.device
        queued = len(device._pending_checks)
        frame.env[:] = self.bound
        frame.run(keep=self.keep)
        for made, new in zip(self.made, frame.env):
            if made is not None and new is not None and made is not new and device.owns(made):
                made[...] = new
        frame.env[:] = self.made
        # the checks' flags, written where the capture's were
        for (flag, _), (new_flag, _) in zip(checks, device._pending_checks[queued:]):
            flag[...] = new_flag
        del device._pending_checks[queued:]


def _capture_failure(exc: BaseException) -> str:
    """Why a capture failed, for why_not_captured: CuPy's refusal of cuBLAS named as such."""
    text = f"{type(exc).__name__}: {exc}"
    if "cuBLAS API during stream capture" in text:
        return (
            "CuPy cannot record a cuBLAS call (a matrix product: mul, matmul, fc, conv, an "
            "RNN cell) in a CUDA graph; the first was " + text.splitlines()[0]
        )
    return text


def _end_failed_capture(stream) -> None:
    """End a capture an op broke (the graph, if any, is dropped)."""
    try:
        stream.end_capture()
    except Exception:  # noqa: BLE001 (an invalidated capture raises here too; nothing to keep)
        pass
