"""Shared benchmark machinery: interleaved medians, result rows and their printing.

Every workload times its contenders (nestflow, PyTorch, the NumPy-by-hand floor) in the same
process, alternating rounds A, B, C, A, B, C ... so that slow drifts of the machine (thermal,
other processes on 2 cores) hit every contender alike; only ratios from one run mean much.

A workload's `run()` returns a result dict::

    {"workload": "W2 ...", "rows": [row, ...]}

and a row is a dict: `metric`, `unit`, the three values `numpy`, `torch`, `nestflow` (a float in
`unit`, or a string such as "n/a (reason)" or "–"), and `targets`, a list of `(ref, limit)`
where ref is "torch" or "numpy" (nestflow/ref <= limit) or "abs" (nestflow <= limit in `unit`).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROUNDS = 7
TORCH_THREADS = 2

Row = dict[str, Any]


def setup_torch():
    """Import torch with the thread count the issue fixes for every comparison; None if absent."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(TORCH_THREADS)
    return torch


def calls_per_round(fn: Callable[[], Any], budget_s: float) -> int:
    """How many calls of `fn` fill about `budget_s` seconds (at least 1)."""
    fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    return max(1, int(budget_s / max(once, 1e-9)))


# OpenBLAS worker threads (NumPy, nestflow) busy-wait for about 2**28 cycles after a BLAS call
# and torch's OpenMP workers spin too; on 2 cores a contender timed right after another one
# shares the CPU with those spinning threads (measured on W4: PyTorch 0.15 ms after a pause,
# 0.22-2.5 ms right after NumPy). Each timed batch therefore starts after a pause that lets the
# previous contender's threads go to sleep.
SETTLE_S = 0.2


def interleaved(
    cases: dict[str, Callable[[], Any]],
    rounds: int = ROUNDS,
    budget_s: float = 0.05,
    warmup: int = 2,
    settle_s: float = SETTLE_S,
) -> dict[str, float]:
    """Median seconds per call of each case, rounds alternating between the cases.

    Each round calls a case `n` times back to back (n chosen so one round takes ~budget_s) and
    records the mean; the result is the median of those means over `rounds` rounds. Every
    batch starts `settle_s` after the previous one ended (see SETTLE_S); a case with a
    `prepare` attribute (ThreadCounts.case: its thread count) has it called before that pause,
    outside the timed batch.
    """
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    numbers = {name: calls_per_round(fn, budget_s) for name, fn in cases.items()}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    clock = time.perf_counter
    for _ in range(rounds):
        for name, fn in cases.items():
            n = numbers[name]
            prepare = getattr(fn, "prepare", None)
            if prepare is not None:
                prepare()
            gc.collect()
            time.sleep(settle_s)
            start = clock()
            for _ in range(n):
                fn()
            samples[name].append((clock() - start) / n)
    return {name: statistics.median(values) for name, values in samples.items()}


def _busy_seconds() -> float | None:
    """CPU seconds all processes of the machine have used since boot (None off Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class OtherLoad:
    """Measures how many cores other processes kept busy while a block ran.

    The machine has 2 cores shared with other work; BLAS threads in particular slow down
    badly when a core is taken. A workload timed while others used a sizeable share of the
    CPU gets a note in the results rather than silently wrong figures.
    """

    def __enter__(self) -> OtherLoad:
        self.cores: float | None = None
        self._start = (time.perf_counter(), _busy_seconds(), _own_seconds())
        return self

    def __exit__(self, *exc) -> None:
        wall0, busy0, own0 = self._start
        busy1 = _busy_seconds()
        if busy0 is None or busy1 is None:
            return
        wall = time.perf_counter() - wall0
        others = (busy1 - busy0) - (_own_seconds() - own0)
        self.cores = max(others, 0.0) / wall if wall > 0 else 0.0


BUSY_CORES = 0.25  # other processes' CPU use (in cores) that makes figures suspect


def measured(run: Callable[[], dict]) -> dict:
    """`run()`'s result, with a note when other processes kept cores busy meanwhile."""
    with OtherLoad() as load:
        result = run()
    if load.cores is not None and load.cores > BUSY_CORES:
        result.setdefault("notes", []).append(
            f"other processes kept {load.cores:.2f} cores busy while this ran: "
            "figures unreliable, run again on a quiet machine"
        )
    return result


def main(run: Callable[[], dict]) -> None:
    """What a workload script does when run alone: measure, then print."""
    print_result(measured(run))


def unavailable(exc: BaseException) -> str:
    """The table entry for a contender that cannot run: never a made-up number."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if len(text) > 90:
        text = text[:87] + "..."
    return f"n/a ({text})"


def error_line(stderr: str) -> str:
    """The line of a child's stderr that names its exception (the last line otherwise)."""
    lines = [line.strip() for line in stderr.strip().splitlines()] or ["child failed"]
    named = [line for line in lines if "Error" in line.split(":")[0]]
    return named[-1] if named else lines[-1]


def row(
    metric: str,
    unit: str,
    nestflow: float | str,
    torch: float | str = "–",
    numpy: float | str = "–",
    targets: list[tuple[str, float]] | None = None,
) -> Row:
    return {
        "metric": metric,
        "unit": unit,
        "nestflow": nestflow,
        "torch": torch,
        "numpy": numpy,
        "targets": list(targets or []),
    }


def ratio(row_: Row, ref: str) -> float | None:
    a, b = row_["nestflow"], row_[ref]
    if isinstance(a, float | int) and isinstance(b, float | int) and b > 0:
        return a / b
    return None


def target_status(row_: Row) -> str:
    """'met', 'MISSED' or '?' (a side unavailable), for every target of the row."""
    parts = []
    for ref, limit in row_["targets"]:
        if ref == "abs":
            value = row_["nestflow"]
            got = value if isinstance(value, float | int) else None
            label = f"<= {limit:g} {row_['unit']}"
        else:
            got = ratio(row_, ref)
            label = f"<= {limit:g}x {'PyTorch' if ref == 'torch' else 'NumPy'}"
        if got is None:
            parts.append(f"{label}: ?")
        else:
            parts.append(f"{label}: {'met' if got <= limit else 'MISSED'}")
    return "; ".join(parts) if parts else "–"


def fmt_value(value: Any, unit: str) -> str:
    if isinstance(value, float | int):
        if value >= 100:
            return f"{value:.0f} {unit}"
        if value >= 10:
            return f"{value:.1f} {unit}"
        return f"{value:.3g} {unit}"
    return str(value)


def fmt_ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def print_result(result: dict, flush: bool = False) -> None:
    print(f"== {result['workload']}")
    for r in result["rows"]:
        unit = r["unit"]
        print(f"  {r['metric']}")
        print(f"    NumPy by hand : {fmt_value(r['numpy'], unit)}")
        print(f"    PyTorch eager : {fmt_value(r['torch'], unit)}")
        print(f"    nestflow      : {fmt_value(r['nestflow'], unit)}")
        print(f"    nestflow/PyTorch {fmt_ratio(ratio(r, 'torch'))}", end="")
        print(f"   nestflow/NumPy {fmt_ratio(ratio(r, 'numpy'))}")
        print(f"    target: {target_status(r)}")
    for note in result.get("notes", []):
        print(f"  note: {note}")
    if flush:
        sys.stdout.flush()


def markdown_table(results: list[dict]) -> str:
    head = (
        "| workload | metric | NumPy by hand | PyTorch eager | nestflow | nestflow/PyTorch "
        "| nestflow/NumPy | target |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for result in results:
        for r in result["rows"]:
            unit = r["unit"]
            cells = [
                result["workload"],
                r["metric"],
                fmt_value(r["numpy"], unit),
                fmt_value(r["torch"], unit),
                fmt_value(r["nestflow"], unit),
                fmt_ratio(ratio(r, "torch")),
                fmt_ratio(ratio(r, "numpy")),
                target_status(r),
            ]
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return head + "\n".join(lines) + "\n"


class ThreadCounts:
    """Runs contenders at several thread counts inside one interleaved run: nestflow's budget
    (nf.set_num_threads: its intra-op pool and NumPy's BLAS) and PyTorch's
    (torch.set_num_threads) switch to a case's count when it starts a batch, so rounds at 1 and
    at 2 threads alternate and the machine's drifts hit both alike. `restore()` puts back the
    counts found at the start (run_all times other workloads in the same process)."""

    def __init__(self, torch) -> None:
        import nestflow as nf

        self._nf, self._torch = nf, torch
        self._before = (nf.get_num_threads(), torch.get_num_threads() if torch else None)
        self._current: int | None = None

    def set(self, n: int) -> None:
        if n != self._current:
            self._nf.set_num_threads(n)
            if self._torch is not None:
                self._torch.set_num_threads(n)
            self._current = n

    def case(self, n: int, fn: Callable[[], Any]) -> Callable[[], Any]:
        """fn, called at n threads. A switch took 0.6-0.7 ms with PyTorch loaded (both
        libraries' set_num_threads), which the first call of a timed batch paid, and only
        nestflow's batches started with one (cases alternate nestflow@1, torch@1, nestflow@2,
        torch@2): `interleaved` switches through the returned function's `prepare` before it
        starts the clock. The call still switches, for callers that time it otherwise."""

        def at_n():
            self.set(n)
            return fn()

        at_n.prepare = lambda: self.set(n)
        return at_n

    def restore(self) -> None:
        self._nf.set_num_threads(self._before[0])
        if self._torch is not None:
            self._torch.set_num_threads(self._before[1])
        self._current = None


def bench_thread_counts() -> tuple[int, ...]:
    """The thread counts the scaling rows measure: NF_BENCH_THREADS ("1,2,4,8,16"), else 1 and 2.
    1 always comes first: the speed-up rows divide by it."""
    given = os.environ.get("NF_BENCH_THREADS", "")
    counts = sorted({int(n) for n in given.split(",") if n.strip()} | {1})
    return tuple(counts) if len(counts) > 1 else (1, 2)


def load_note() -> str:
    """The machine's load averages (1, 5, 15 minutes) against its cores, for the notes."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} cores"


def scaling_rows(
    metric: str,
    makers: dict[str, Callable[[], Callable[[], Any]]],
    torch,
    rounds: int,
    budget_s: float,
    targets: dict[int, float],
    counts: tuple[int, ...] | None = None,
) -> tuple[list[Row], dict[str, float]]:
    """Rows of `metric` at each thread count (nestflow against PyTorch, targets[n] the ratio
    limit at n threads, none where absent) and one row of each side's speed-up at the last count
    over 1 thread. makers: "nestflow"/"torch" -> a function making the step (called once at each
    count, so a step may keep per-count state); a maker that raises makes an "n/a" entry.
    counts: the thread counts, by default NF_BENCH_THREADS (e.g. "1,2,4,8,16" on a many-core
    machine) or 1 and 2; NF_BENCH_ROUNDS overrides `rounds`. Each measurement is also printed
    to stderr as it ends (a run cut short keeps what it measured). Returns the rows and the
    speed-ups."""
    counts = counts or bench_thread_counts()
    rounds = int(os.environ.get("NF_BENCH_ROUNDS", rounds))
    started = time.perf_counter()
    switch = ThreadCounts(torch)
    cases, missing = {}, {}
    try:
        for n in counts:
            switch.set(n)
            for name, make in makers.items():
                try:
                    cases[f"{name}@{n}"] = switch.case(n, make())
                except Exception as exc:  # a missing layer/op: report it, never fake a number
                    missing[name] = unavailable(exc)
        times = interleaved(cases, rounds=rounds, budget_s=budget_s)
    finally:
        switch.restore()
    ms = {key: t * 1e3 for key, t in times.items()}
    print(
        f"[{metric}: {time.perf_counter() - started:.0f} s] "
        + ", ".join(f"{key} {value:.3f} ms" for key, value in ms.items()),
        file=sys.stderr,
        flush=True,
    )
    rows = []
    for n in counts:
        limit = targets.get(n)
        rows.append(
            row(
                f"{metric}, {n} thread{'s' if n > 1 else ''}",
                "ms",
                ms.get(f"nestflow@{n}", missing.get("nestflow", "–")),
                torch=ms.get(f"torch@{n}", missing.get("torch", "n/a (torch not installed)")),
                targets=[("torch", limit)] if limit is not None else [],
            )
        )
    speedups = {}
    for name in makers:
        one, many = ms.get(f"{name}@1"), ms.get(f"{name}@{counts[-1]}")
        if one and many:
            speedups[name] = one / many
    rows.append(
        row(
            f"{metric}: {counts[-1]}-thread speed-up over 1 thread (time at 1 / time at "
            f"{counts[-1]}, higher is better)",
            "x",
            speedups.get("nestflow", "–"),
            torch=speedups.get("torch", "–"),
        )
    )
    return rows, speedups
