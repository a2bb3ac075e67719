"""make gpu-check: one prepared run on a GPU machine (a GPU is lent to this work only some of the
time, for minutes), writing every figure to one report file.

1. every op's forward and gradient on CUDAPlace against CPUPlace: the op harness and the
   device-program tests (tests/ops, tests/executor/test_places.py) with CUDA as the device
   place (float64 to 1e-10, float32 to 1e-5), with the count of op types checked;
2. the digits MLP, conv, RNN, sentiment and translation demos trained on the GPU, against their CPU accuracies;
3. a model trained and saved on the GPU, loaded on the CPU: parameters bit for bit, predictions;
4. W1/W3/W8/W9/W10 train steps against PyTorch CUDA eager in the same process (median of
   interleaved rounds), and W1's peak GPU memory next to PyTorch's;
5. issue 29's CPU workloads (W9, W13, W14, W1/W8/W10) at 1, 2, 4, ... threads up to the
   host's cores, against PyTorch on the CPU (the GPU machines have 16 cores; bench/*.py with
   NF_BENCH_THREADS, 3 interleaved rounds each), within --cpu-scaling-s seconds (0: skip).

Sections 1 and 2 run in child processes while this one waits; sections 3 and 4 run after them,
so the timings have the GPU to themselves. It needs CuPy and PyTorch CUDA, which the GPU machines hold, and
installs nothing. `--place standin --torch-device cpu` rehearses the whole script on a machine
without a GPU (the stand-in device; PyTorch on the CPU).

    PYTHONPATH=.:bench python3 bench/gpu_check.py --report gpu_check.md
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEMOS = {"mlp": 0.97, "conv": 0.985, "rnn": 0.95, "sentiment": 0.95, "translate": 0.90}
OPS_TIMEOUT_S = 270
DEMO_TIMEOUT_S = 270


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", default="gpu_check.md")
    parser.add_argument("--place", default="cuda", help="cuda (default) or standin (a rehearsal)")
    parser.add_argument("--torch-device", default="cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-ops", action="store_true")
    parser.add_argument("--cpu-scaling-s", type=int, default=300)
    args = parser.parse_args()
    started = time.perf_counter()
    global REPORT_DIR
    report = Report(Path(args.report))
    REPORT_DIR = report.path.parent
    report.section("Environment")
    try:
        import nestflow as nf
        from nestflow.core.place import parse_place

        place = parse_place(args.place)
    except Exception as exc:  # nestflow or CuPy missing here: say so and stop
        report.line(f"cannot start: {type(exc).__name__}: {exc}")
        report.write()
        return 1
    report.line(environment(nf, place))
    children = {} if args.skip_ops else {"ops": start_op_checks(args.place)}
    for name in DEMOS:
        children[f"demo {name}"] = start_demo(name, args.place)
    report.section("Every op on the device against CPUPlace")
    if "ops" in children:
        report.line(finish_op_checks(children.pop("ops")))
    else:
        report.line("skipped (--skip-ops)")
    report.section("Demos trained on the device (held-out accuracy; CPU target)")
    for name, (process, log) in children.items():
        report.line(finish_demo(name.removeprefix("demo "), process, log))
    # the timings run last, on a GPU no child process is using
    report.section("A model saved on the GPU, loaded on the CPU")
    report.guarded(round_trip, nf, place)
    report.section(f"Train steps against PyTorch ({args.torch_device}), median ms per step")
    benchmarks = report.guarded(bench_rows, nf, place, args.torch_device, args.rounds)
    report.section("Where the device time goes: nf.profiler('GPU'), 10 steps each, top op types")
    report.guarded(op_profiles, nf, place)
    if args.cpu_scaling_s > 0:
        report.section(
            "The CPU's cores: issue 29's workloads by thread count (nestflow / PyTorch CPU)"
        )
        report.guarded(cpu_scaling, args.cpu_scaling_s)
    report.section("Summary")
    if benchmarks:
        report.line(benchmarks)
    report.line(f"gpu-check took {time.perf_counter() - started:.0f} s")
    report.write()
    print(report.text[-6000:])
    return 0


class Report:
    def __init__(self, path: Path):
        self.path = path
        self.text = "# make gpu-check\n"

    def section(self, title: str) -> None:
        self.text += f"\n## {title}\n\n"
        self.write()

    def line(self, text: str) -> None:
        self.text += text.rstrip() + "\n"
        self.write()

    def guarded(self, function, *args):
        try:
            result = function(*args)
        except Exception as exc:  # one section failing must not lose the others' figures
            import traceback

            self.line("FAILED: " + "".join(traceback.format_exception(exc))[-3000:])
            return None
        self.line(result)
        return result

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.text)


def environment(nf, place) -> str:
    lines = [
        f"- host: {platform.node()}, Python {platform.python_version()}, NumPy {np.__version__}",
        f"- place: {place!r}; nestflow {nf.__version__}",
    ]
    if place.is_device and type(place).__name__ == "CUDAPlace":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(place.device_id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        lines.append(f"- GPU: {name}, CuPy {cupy.__version__}")
    try:
        import torch

        lines.append(f"- PyTorch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    except ImportError:
        lines.append("- PyTorch: not installed")
    return "\n".join(lines)


# ---- 1. every op ----


def start_op_checks(place_name: str):
    log = Path(tempfile.mkdtemp(prefix="nestflow-gpu-check-")) / "checked.txt"
    env = dict(
        os.environ,
        NESTFLOW_TEST_DEVICES="standin" if place_name.startswith("standin") else "cuda",
        NESTFLOW_DEVICE_CHECKED_LOG=str(log),
        PYTHONPATH=_python_path(),
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    command += ["-rf", "--tb=line"]  # a failure's message in the report, not in a log alone
    try:
        import xdist  # noqa: F401  (the GPU machines hold pytest-xdist)

        command += ["-n", "8"]
    except ImportError:
        pass
    command += ["tests/ops", "tests/optimizer/test_update_ops.py", "tests/executor/test_places.py"]
    out = open(log.with_suffix(".out"), "w")  # noqa: SIM115  (closed in finish_op_checks)
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return process, log


def finish_op_checks(child) -> str:
    process, log = child
    try:
        process.wait(timeout=max(1, OPS_TIMEOUT_S - _elapsed()))
    except subprocess.TimeoutExpired:
        process.kill()
    output = log.with_suffix(".out").read_text()
    (REPORT_DIR / "gpu_ops_pytest.txt").write_text(output)
    checked = set(log.read_text().split()) if log.exists() else set()
    from nestflow.ops.registry import registered_ops

    ops = set(registered_ops())
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    failed = [line for line in output.splitlines() if line.startswith("FAILED")]
    # --tb=line: one "path:line: message" line per failure
    where = [line for line in output.splitlines() if re.match(r"^\S+\.py:\d+: ", line)]
    lines = [
        f"- pytest: {summary[-1] if summary else 'no summary (killed at the time limit?)'}",
        f"- op types run on the device equal to CPUPlace: {len(checked & ops)} of {len(ops)} "
        "registered (gradient ops included)",
        f"- not run by a one-op case: {', '.join(sorted(ops - checked))}",
    ]
    if failed:
        lines.append(f"- failures ({len(failed)}):")
        lines += [f"  - {line[:300]}" for line in failed[:60]]
        lines.append("- where they failed:")
        lines += [f"  - {line[:500]}" for line in where[:60]]
    return "\n".join(lines)


# ---- 2. demos ----


def start_demo(name: str, place_name: str):
    log = Path(tempfile.mkdtemp(prefix=f"nestflow-demo-{name}-")) / "out.txt"
    command = [sys.executable, "-m", "nestflow", "demo", "--model", name, "--place", place_name]
    command += ["--no-progress"]
    out = open(log, "w")  # noqa: SIM115  (read back in finish_demo)
    env = dict(os.environ, PYTHONPATH=_python_path())
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return process, log


def finish_demo(name: str, process, log: Path) -> str:
    try:
        code = process.wait(timeout=max(1, DEMO_TIMEOUT_S - _elapsed()))
    except subprocess.TimeoutExpired:
        process.kill()
        code = "killed at the time limit"
    output = log.read_text()
    (REPORT_DIR / f"gpu_demo_{name}.txt").write_text(output)
    found = re.findall(r"(?:test accuracy|exact match, beam search[^:]*): ([\d.]+)%", output)
    accuracy = f"{found[0]}%" if found else "no accuracy printed"
    tail = "" if code == 0 else "\n  " + "\n  ".join(output.splitlines()[-8:])
    return f"- {name}: {accuracy} (CPU target {DEMOS[name]:.1%}; exit {code}){tail}"


def _python_path() -> str:
    """The repository first, then what the caller had (packages carried to the GPU machine)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


_START = time.perf_counter()
REPORT_DIR = Path(".")  # where the report and the child processes' logs go (set by main)


# ---- 5. the CPU's cores ----

# each workload's share of --cpu-scaling-s (W13's train step is the longest)
CPU_WORKLOADS = {
    "w9_conv": 0.23,
    "w13_resnet18": 0.37,
    "w14_bn_pool": 0.13,
    "threads_scaling": 0.27,
}


def cpu_scaling(budget_s: int) -> str:
    """Each workload's scaling rows at 1, 2, 4, ... threads up to the host's cores, run in a
    child process each (its own thread pools): each measurement's one-line summary, then the
    tables."""
    cores = os.cpu_count() or 1
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= cores]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT), str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")]
        ),
        NF_BENCH_THREADS=",".join(map(str, counts)),
        NF_BENCH_ROUNDS="3",
    )
    lines = [f"- {cores} cores; thread counts {counts}; 3 interleaved rounds each"]
    tables = []
    for name, share in CPU_WORKLOADS.items():
        command = [sys.executable, str(ROOT / "bench" / f"{name}.py")]
        try:
            done = subprocess.run(
                command,
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=max(10, int(budget_s * share)),
            )
            summary = [line for line in done.stderr.splitlines() if line.startswith("[")]
            lines.append(f"- {name}: exit {done.returncode}")
            tables.append(done.stdout)
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            summary = [line for line in stderr.splitlines() if line.startswith("[")]
            lines.append(f"- {name}: cut at {int(budget_s * share)} s (what it measured is below)")
        lines += [f"  - {line}" for line in summary]
    return "\n".join(lines + ["```", *tables, "```"])


def _elapsed() -> float:
    return time.perf_counter() - _START


# ---- 3. GPU -> CPU round trip ----


def round_trip(nf, place) -> str:
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 16])
        label = nf.data("label", [-1, 1], "int64")
        h = nf.layers.fc(x, 32, act="relu")
        logits = nf.layers.fc(h, 4)
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
        nf.optimizer.Adam(learning_rate=0.01).minimize(loss)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((64, 16)).astype("float32")
    feed = {"x": xs, "label": rng.integers(0, 4, (64, 1))}
    exe, scope = nf.Executor(place), nf.Scope()
    exe.run(startup, scope=scope)
    for _ in range(5):
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    (on_device,) = exe.eval(main, [logits], feed={"x": xs}, scope=scope)
    with tempfile.TemporaryDirectory() as folder:
        nf.io.save_inference_model(folder, ["x"], [logits], main, scope)
        cpu = nf.Executor(nf.CPUPlace())
        program, feeds, fetches, cpu_scope = nf.io.load_inference_model(folder)
        (on_cpu,) = cpu.run(program, feed={feeds[0]: xs}, fetch_list=fetches, scope=cpu_scope)
        same = all(
            np.array_equal(
                scope.find_var(name).get(nf.Tensor).numpy(),
                cpu_scope.find_var(name).get(nf.Tensor).numpy(),
            )
            for name in cpu_scope.local_var_names()
            if cpu_scope.find_var(name).is_type(nf.Tensor)
        )
    gap = float(np.abs(on_cpu - on_device).max())
    return (
        f"- parameters saved from {place!r} and loaded on CPUPlace identical bit for bit: {same}\n"
        f"- predictions, CPU against the device: max |difference| {gap:.3g}"
    )


# ---- 4. benchmarks ----


def op_profiles(nf, place) -> str:
    """Each W-step's op types by total time, each op waiting for its device work (the profiler's
    "GPU" state), to show which kernels the fused and cuBLAS versions must replace."""
    import contextlib
    import io

    import w1_mlp
    import w8_lenet
    import w9_conv
    import w10_lstm

    steps = {
        "W1": w1_mlp.make_nestflow_step(*w1_mlp.batch(), place)[0],
        "W8": w8_lenet.make_nestflow_step(*w8_lenet.batch(), place)[0],
        "W9": w9_conv.make_nestflow(*w9_conv.data(3), 1, place=place, return_numpy=False),
        "W10": w10_lstm.make_nestflow_step(w10_lstm.batch(), place)[0],
    }
    blocks = []
    for name, step in steps.items():
        for _ in range(3):
            step()
        with contextlib.redirect_stdout(io.StringIO()):
            with nf.profiler.profiler("GPU") as profile:
                for _ in range(10):
                    step()
        lines = profile.table("total").splitlines()
        blocks.append(f"{name}:\n```\n" + "\n".join(lines[:16]) + "\n```")
    return "\n".join(blocks)


def bench_rows(nf, place, torch_device: str, rounds: int) -> str:
    import torch
    import w1_mlp
    import w3_rnn
    import w8_lenet
    import w10_lstm

    torch.manual_seed(0)
    rows = []
    xs, ys = w1_mlp.batch()
    w1_steps, memory = _w1_with_peak_memory(place, torch, torch_device, w1_mlp, xs, ys)
    rows.append(_timed("W1 MLP 784-512-512-10 train step", w1_steps, rounds))
    rows.append(memory)
    graph_step = w1_mlp.make_nestflow_step(xs, ys, place, cuda_graph=True)[0]
    w1_graph = {"nestflow": graph_step, "torch": w1_steps["torch"]}
    rows.append(_timed("W1 train step, nestflow replayed as a CUDA graph", w1_graph, rounds))
    refusal = graph_step.why_not_captured()
    rows.append(f"- W1's block captured as a CUDA graph: {'yes' if refusal is None else refusal}")
    xs3, wx, wh = w3_rnn.data()
    rows.append(
        _timed(
            "W3 tanh RNN train step",
            {
                "nestflow": w3_rnn.make_nestflow_step(xs3, wx, wh, place=place),
                "torch": w3_rnn.make_torch_step(xs3, wx, wh, torch, device=torch_device),
            },
            rounds,
        )
    )
    xs8, ys8 = w8_lenet.batch()
    nf_w8, params8 = w8_lenet.make_nestflow_step(xs8, ys8, place)
    rows.append(
        _timed(
            "W8 LeNet-5 train step",
            {
                "nestflow": nf_w8,
                "torch": w8_lenet.make_torch_step(xs8, ys8, params8, torch, device=torch_device),
            },
            rounds,
        )
    )
    rows.append(
        _timed("W9 3x3 conv 64->64 fwd+bwd", _w9_steps(nf, place, torch, torch_device), rounds)
    )
    if torch_device == "cuda":  # cuDNN takes TF32 by default; nestflow's GEMMs are float32
        allowed = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            steps = _w9_steps(nf, place, torch, torch_device)
            rows.append(_timed("W9 3x3, PyTorch without TF32 (float32 both)", steps, rounds))
        finally:
            torch.backends.cudnn.allow_tf32 = allowed
    xs10 = w10_lstm.batch()
    nf_w10, params10 = w10_lstm.make_nestflow_step(xs10, place)
    rows.append(
        _timed(
            "W10 LSTM train step",
            {
                "nestflow": nf_w10,
                "torch LSTMCell loop": w10_lstm.make_torch_cell_step(
                    xs10, params10, torch, device=torch_device
                ),
                "torch nn.LSTM": w10_lstm.make_torch_lstm_step(
                    xs10, params10, torch, device=torch_device
                ),
            },
            rounds,
        )
    )
    return "\n".join(rows)


def _w9_steps(nf, place, torch, torch_device) -> dict:
    """W9's conv fwd+bwd (batch 32, 64 channels, 28x28, 3x3, pad 1); each step waits for its
    device work, and neither side copies its results to the host."""
    import w9_conv

    x, w, upstream = w9_conv.data(3)
    ours = w9_conv.make_nestflow(x, w, upstream, 1, place=place, return_numpy=False)
    theirs = w9_conv.make_torch(x, w, upstream, 1, torch, device=torch_device)
    on_gpu = torch_device == "cuda"

    def nestflow_step():
        ours()
        nf.cuda.synchronize() if place.is_device and on_gpu else None
        return 0.0

    def torch_step():
        theirs()
        torch.cuda.synchronize() if on_gpu else None
        return 0.0

    return {"nestflow": nestflow_step, "torch": torch_step}


def _timed(title: str, steps: dict, rounds: int) -> str:
    """Median ms per step over `rounds` interleaved rounds of 20 steps each (each step returns
    a host float: the device work is finished when it returns), after 5 warm-up steps."""
    losses = {name: [step() for _ in range(5)] for name, step in steps.items()}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(20):
                step()
            times[name].append((time.perf_counter() - start) / 20 * 1e3)
    ms = {name: median(values) for name, values in times.items()}
    base = ms["nestflow"]
    parts = [f"nestflow {base:.3f} ms"] + [
        f"{name} {value:.3f} ms (ratio {base / value:.2f}x)"
        for name, value in ms.items()
        if name != "nestflow"
    ]
    first = {name: round(values[0], 4) for name, values in losses.items()}
    return f"- {title}: " + "; ".join(parts) + f" (first losses {first})"


def _w1_with_peak_memory(place, torch, torch_device, w1_mlp, xs, ys) -> tuple[dict, str]:
    """W1's two steps, made first on an empty GPU, and the peak memory of 10 steps of each:
    CuPy's pool (what it holds: its high-water mark, as blocks are kept) against PyTorch's
    max_memory_allocated."""
    on_gpu = type(place).__name__ == "CUDAPlace" and torch_device == "cuda"
    if on_gpu:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    nf_step, params = w1_mlp.make_nestflow_step(xs, ys, place)
    for _ in range(10):
        nf_step()
    ours = cupy.get_default_memory_pool().total_bytes() / 2**20 if on_gpu else None
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    torch_step = w1_mlp.make_torch_step(xs, ys, params, torch, device=torch_device)
    for _ in range(10):
        torch_step()
    steps = {"nestflow": nf_step, "torch": torch_step}
    if not on_gpu:
        return steps, "- W1 peak GPU memory: n/a off the GPU"
    theirs = torch.cuda.max_memory_allocated() / 2**20
    return steps, (
        f"- W1 peak GPU memory after 10 steps: nestflow {ours:.1f} MiB (CuPy pool) vs "
        f"PyTorch {theirs:.1f} MiB (max_memory_allocated)"
    )


if __name__ == "__main__":
    sys.exit(main())
