"""The profiler: how long each op ran, as a per-op-type table and a Chrome trace.

    with nf.profiler.profiler(sorted_key="total", profile_path="trace.json"):
        for batch in loader:
            exe.run(main, feed=..., fetch_list=[loss])

While a profiler runs, every block the executor runs (sub-blocks of IfElse, RNN, While and
BlockOp included, and their gradient blocks) runs its timed variant, which reads the clock
around each op; otherwise nothing is timed and nothing costs. At exit the table is printed: per
op type its calls, total, average, min and max time, and share of the profiled time; with a path
a Chrome trace JSON is written (one complete event per op run, nested under the control-flow op
that ran it), for chrome://tracing or https://ui.perfetto.dev.

Departures from Fluid 1.8 (`profiler(state, sorted_key=None, profile_path='/tmp/profile')`):
`state` defaults to "CPU", which times each op's host side (on a device place: its kernel
launches); "GPU" and "All" also wait for each op's device work before reading the clock, so on a
device place an op's time includes its kernels (on the CPU the three are the same); `sorted_key` defaults to "total"; `profile_path` defaults to None (no file) and names a
Chrome trace JSON, not Fluid's protobuf profile.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from nestflow.errors import AttrError, NestflowError

__all__ = [
    "OpStats",
    "Profile",
    "profiler",
    "reset_profiler",
    "start_profiler",
    "stop_profiler",
]

STATES = ("CPU", "GPU", "All")
SORTED_KEYS = ("calls", "total", "max", "min", "ave")


@dataclass
class OpStats:
    """One row of the table: an op type's runs (times in nanoseconds)."""

    op_type: str
    calls: int = 0
    total: int = 0
    min: int = 0
    max: int = 0

    @property
    def ave(self) -> float:
        return self.total / self.calls if self.calls else 0.0


class Profile:
    """The op runs recorded while profiling: one event (op type, start and end in ns, block,
    op index, depth below the top-level block, thread) per op run, in the order they ended."""

    def __init__(self, state: str = "CPU"):
        self.state = state
        self.events: list[tuple[str, int, int, int, int, int, int]] = []
        self.origin = perf_counter_ns()

    def recorder(self, frame: Any) -> Callable[[int, int], None]:
        """`record(op_index, start_ns)` for the ops of `frame` (a nestflow Frame), called as
        each op finishes; what the executor's timed block calls."""
        ops, block = frame.plan.ops, frame.plan.block.idx
        depth, parent = 0, frame.parent
        while parent is not None:
            depth, parent = depth + 1, parent.parent
        append, tid, clock = self.events.append, threading.get_ident(), perf_counter_ns
        device = frame.plan.device
        if self.state != "CPU" and device.place.is_device:
            # a device runs its kernels after their launch returns: "GPU" and "All" wait for
            # each op's device work, so an op's time is its launches plus its kernels
            wait = device.synchronize

            def record_on_device(index: int, start: int) -> None:
                wait()
                append((ops[index].type, start, clock(), block, index, depth, tid))

            return record_on_device

        def record(index: int, start: int) -> None:
            append((ops[index].type, start, clock(), block, index, depth, tid))

        return record

    def stats(self, sorted_key: str | None = "total") -> list[OpStats]:
        """Per op type, sorted by `sorted_key` (descending; None: in the order each type first
        finished a run)."""
        _check_sorted_key(sorted_key)
        rows: dict[str, OpStats] = {}
        for op_type, start, end, *_ in self.events:
            duration = end - start
            row = rows.get(op_type)
            if row is None:
                rows[op_type] = OpStats(op_type, 1, duration, duration, duration)
                continue
            row.calls += 1
            row.total += duration
            row.min = min(row.min, duration)
            row.max = max(row.max, duration)
        ordered = list(rows.values())
        if sorted_key is not None:
            ordered.sort(key=lambda r: getattr(r, sorted_key), reverse=True)
        return ordered

    def profiled_ns(self) -> int:
        """Time spent in top-level ops (a control-flow op's includes its sub-blocks' ops)."""
        return sum(end - start for _, start, end, _, _, depth, _ in self.events if depth == 0)

    def table(self, sorted_key: str | None = "total") -> str:
        """The printed report: one line per op type, times in milliseconds; share is of the
        time in top-level ops, so sub-block ops' shares also count in their control-flow op's."""
        rows = self.stats(sorted_key)
        whole = self.profiled_ns() or 1
        order = "first run" if sorted_key is None else f"{sorted_key}, descending"
        width = max([len("Op type")] + [len(r.op_type) for r in rows]) + 2
        lines = [
            f"nestflow profile ({self.state}): {len(self.events)} op runs, "
            f"{self.profiled_ns() / 1e6:.3f} ms in top-level ops; sorted by {order}; times in ms",
            f"{'Op type':<{width}}{'Calls':>8}{'Total':>12}{'Average':>12}{'Min':>12}"
            f"{'Max':>12}{'Share %':>9}",
        ]
        for r in rows:
            lines.append(
                f"{r.op_type:<{width}}{r.calls:>8}{r.total / 1e6:>12.4f}{r.ave / 1e6:>12.4f}"
                f"{r.min / 1e6:>12.4f}{r.max / 1e6:>12.4f}{100 * r.total / whole:>9.2f}"
            )
        return "\n".join(lines)

    def chrome_trace(self) -> dict[str, Any]:
        """The events as Chrome's trace event format: complete ("X") events, `ts` and `dur` in
        microseconds from the profiler's start; sub-block ops lie inside their control-flow
        op's interval on the same thread, which is how the viewers nest them."""
        pid = os.getpid()
        events = [
            {
                "name": op_type,
                "cat": "op",
                "ph": "X",
                "ts": (start - self.origin) / 1e3,
                "dur": (end - start) / 1e3,
                "pid": pid,
                "tid": tid,
                "args": {"op_index": index, "block": block, "depth": depth},
            }
            for op_type, start, end, block, index, depth, tid in self.events
        ]
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str | os.PathLike) -> None:
        """Write chrome_trace() as JSON to `path` (atomically; FileWriteError if it cannot)."""
        from nestflow.io.atomic import write_atomic

        write_atomic(path, json.dumps(self.chrome_trace()).encode())


def _check_sorted_key(sorted_key: str | None) -> None:
    if sorted_key is not None and sorted_key not in SORTED_KEYS:
        raise AttrError(
            f"profiler: sorted_key must be one of {', '.join(SORTED_KEYS)} or None, got "
            f"{sorted_key!r}"
        )


def _plan_module():
    from nestflow.executor import plan

    return plan


def start_profiler(state: str = "CPU") -> Profile:
    """Start timing every op the executor runs (Fluid's start_profiler); returns the Profile
    being filled. A profiler already running -> NestflowError; a bad state -> AttrError."""
    if state not in STATES:
        raise AttrError(f"profiler: state must be one of {', '.join(STATES)}, got {state!r}")
    plan = _plan_module()
    if plan.profiler is not None:
        raise NestflowError("a profiler is already running: stop it before starting another")
    plan.profiler = Profile(state)
    return plan.profiler


def reset_profiler() -> None:
    """Forget the op runs recorded so far by the running profiler (Fluid's reset_profiler)."""
    running = _plan_module().profiler
    if running is not None:
        running.events.clear()
        running.origin = perf_counter_ns()


def stop_profiler(
    sorted_key: str | None = "total", profile_path: str | os.PathLike | None = None
) -> Profile | None:
    """Stop timing, print the table sorted by `sorted_key`, write the Chrome trace to
    `profile_path` if given; returns the Profile (None if no profiler was running)."""
    _check_sorted_key(sorted_key)
    plan = _plan_module()
    profile, plan.profiler = plan.profiler, None
    if profile is None:
        return None
    print(profile.table(sorted_key), file=sys.stdout)
    if profile_path is not None:
        profile.write_chrome_trace(profile_path)
    return profile


@contextlib.contextmanager
def profiler(
    state: str = "CPU",
    sorted_key: str | None = "total",
    profile_path: str | os.PathLike | None = None,
) -> Iterator[Profile]:
    """Profile the ops run inside the `with` block; at exit (also on an error) print the per-op
    table sorted by `sorted_key` ("calls", "total", "max", "min", "ave", descending; None: first
    run order) and, with `profile_path`, write a Chrome trace JSON there. Yields the Profile.

    state: "CPU" (host time: on a device, the launches), "GPU" or "All" (on a device place, each
    op's time waits for its device work; the same as "CPU" on the CPU). A bad state or
    sorted_key -> AttrError (before anything runs); a profiler already running -> NestflowError.

    >>> import nestflow as nf
    >>> with nf.profiler.profiler(sorted_key="calls") as prof:  # doctest: +SKIP
    ...     exe.run(main, feed=feed, fetch_list=[loss])
    """
    _check_sorted_key(sorted_key)
    start_profiler(state)
    try:
        yield _plan_module().profiler
    finally:
        stop_profiler(sorted_key, profile_path)
