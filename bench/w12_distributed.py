"""W12: data-parallel training on MPI ranks, 1 BLAS thread each: the throughput (samples/s) of
the W1 MLP and the W3 RNN at 1 rank (one process, the plain optimizer) and 2 ranks
(nf.distributed.DistributedOptimizer under `nestflow launch -n 2`), the scaling efficiency
(2-rank throughput / (2 x 1-rank throughput)) and the share of the 2-rank step time each rank
spends waiting in all-reduce (c_allreduce_wait: the sum itself plus waiting for the slower
rank).

Weak scaling: every rank takes W1's (W3's) batch per step, so a 2-rank step trains on twice the
samples. Each configuration runs in fresh processes, 1 rank and 2 ranks (in turn first, so a
slow or fast spell of the shared host does not always fall on the same one), `ROUNDS` times; a
process times `CHUNKS` chunks of steps after a warm-up (the ranks start each chunk together and
a chunk lasts as long as its slowest rank) and reports the median chunk. The table shows the
medians over the rounds and the load average of the machine while it ran: with other work on
the 2 cores the 2-rank figures are unreliable (the bench notes it).

The PyTorch column is the reference for W1: the same MLP, batch and SGD in torch eager, one
process, and 2 processes under DistributedDataParallel over gloo (torch's CPU backend; its
wheel has no MPI backend) with DDP's defaults, 1 thread each, timed the same way in the same
rounds.

    python bench/w12_distributed.py            # what make bench runs
    python bench/w12_distributed.py --worker w1 --steps 40   # one process (or rank) alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from timing import row, setup_torch, unavailable

ROUNDS = 5
CHUNKS = 5
TARGET_SPEEDUP = 1.7  # W1 at 2 ranks over 1 rank
# The workloads also timed in PyTorch (its DistributedDataParallel on 2 processes).
TORCH_WORKLOADS = ("w1",)
WORKLOADS = {
    "w1": ("W1 MLP 784-512-512-10, batch 128 per rank, SGD", 40),
    "w3": ("W3 tanh RNN T=32, batch 32 per rank, 64->128, SGD", 40),
}


def _build(kind: str, distributed: bool, rank: int):
    """The W1 (or W3) train step's program, its feed for this rank and the samples per step."""
    import nestflow as nf

    sys.path.insert(0, str(Path(__file__).parent))
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        if kind == "w1":
            import w1_mlp as w

            x = nf.data("x", [-1, w.SIZES[0]])
            y = nf.data("y", [-1, 1], "int64")
            h = nf.layers.fc(x, w.SIZES[1], act="relu", name="fc1")
            h = nf.layers.fc(h, w.SIZES[2], act="relu", name="fc2")
            logits = nf.layers.fc(h, w.SIZES[3], name="fc3")
            loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, y))
            xs, ys = w.batch(seed=rank)
            feed, samples, lr = {"x": xs, "y": ys}, w.BATCH, w.LR
        else:
            import w3_rnn as w

            xs, wx, wh = w.data(seed=rank)
            x = nf.data("x", [-1, w.T, w.N_IN])
            w_x = nf.layers.create_parameter([w.N_IN, w.N_HID], "float32", name="rnn.wx")
            w_h = nf.layers.create_parameter([w.N_HID, w.N_HID], "float32", name="rnn.wh")
            h0 = nf.layers.fill_constant([w.BATCH, w.N_HID], "float32", 0.0)
            rnn = nf.rnn()
            with rnn.step():
                x_t = rnn.step_input(x)
                h = rnn.memory(init=h0)
                z = nf.layers.matmul(x_t, w_x) + nf.layers.matmul(rnn.previous_memory(h), w_h)
                act = nf.layers.tanh(z)
                rnn.update_memory(h, act)
                rnn.output(act)
            out = rnn()
            loss = nf.layers.mean(out[0] if isinstance(out, list | tuple) else out)
            feed, samples, lr = {"x": xs}, w.BATCH, w.LR
        optimizer = nf.optimizer.SGD(learning_rate=lr)
        if distributed:
            optimizer = nf.distributed.DistributedOptimizer(optimizer)
        optimizer.minimize(loss)
    return main, startup, loss, feed, samples


def worker(kind: str, steps: int, distributed: bool) -> dict:
    """Time `CHUNKS` chunks of `steps` train steps in this process (one rank of the job when
    `distributed`); returns rank 0's figures (None on the other ranks)."""
    import nestflow as nf

    if distributed:
        nf.distributed.init()
    rank, size = nf.distributed.rank(), nf.distributed.world_size()
    main, startup, loss, feed, samples = _build(kind, distributed, rank)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    for _ in range(3):
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    throughputs, waits, cpu = [], [], []
    for _ in range(CHUNKS):
        nf.distributed.barrier()
        nf.distributed.stats(reset=True)
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(steps):
            exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        seconds = time.perf_counter() - start
        busy = (time.process_time() - cpu_start) / steps
        waited = nf.distributed.stats().wait_seconds
        every = nf.distributed.allgather(np.array([seconds, waited / seconds, busy]))
        throughputs.append(size * samples * steps / every[:, 0].max())
        waits.append(float(every[:, 1].mean()))
        cpu.append(float(every[:, 2].mean()))
    figures = {
        "ranks": size,
        "samples_per_s": statistics.median(throughputs),
        "wait_share": statistics.median(waits),
        "cpu_ms_per_step": 1e3 * statistics.median(cpu),
        "threads": nf.get_num_threads(),
    }
    return figures if rank == 0 else {}


def torch_worker(steps: int) -> dict:
    """W1 in PyTorch, the reference: one process, or (WORLD_SIZE > 1, set by _run_torch) one
    rank of a DistributedDataParallel job over gloo, torch's CPU backend, with DDP's defaults
    (25 MB buckets); timed as `worker` times nestflow. Returns rank 0's figures."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).parent))
    import w1_mlp as w

    torch.set_num_threads(1)
    size, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    wrap = None
    if size > 1:
        dist.init_process_group("gloo", rank=rank, world_size=size)
        wrap = torch.nn.parallel.DistributedDataParallel
    xs, ys = w.batch(seed=rank)
    step = w.make_torch_step(xs, ys, w.initial_params(), torch, wrap)
    for _ in range(3):
        step()
    throughputs = []
    for _ in range(CHUNKS):
        if size > 1:
            dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        if size > 1:
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        throughputs.append(size * w.BATCH * steps / float(seconds))
    if size > 1:
        dist.barrier()
        dist.destroy_process_group()
    figures = {"ranks": size, "samples_per_s": statistics.median(throughputs)}
    return figures if rank == 0 else {}


def _torch_or_why(steps: int, ranks: int) -> dict | str:
    """PyTorch's figures, or why there are none (no torch, a failed gloo job): the nestflow
    rows never depend on the reference."""
    if setup_torch() is None:
        return unavailable(ImportError("torch is not installed"))
    try:
        return _run_torch(steps, ranks)
    except Exception as exc:
        return unavailable(exc)


def _median_or_why(found: list[dict | str]) -> float | str:
    numbers = [f["samples_per_s"] for f in found if isinstance(f, dict)]
    if len(numbers) == len(found) and numbers:
        return statistics.median(numbers)
    return next((f for f in found if isinstance(f, str)), "–")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_torch(steps: int, ranks: int) -> dict:
    """PyTorch's W1 on `ranks` fresh processes (a DDP job over loopback when 2); rank 0's
    figures."""
    here = str(Path(__file__).resolve())
    cmd = [sys.executable, here, "--torch-worker", "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if ranks > 1:
        env.update(
            WORLD_SIZE=str(ranks),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
            GLOO_SOCKET_IFNAME="lo",
        )
    figures = _run_together(cmd, [dict(env, RANK=str(rank)) for rank in range(ranks)])[0]
    if not figures:
        raise RuntimeError("the PyTorch job printed no figures")
    return figures


def _printed_figures(out: str) -> dict:
    """The figures a worker printed (its last "W12 " line); {} when it printed none."""
    lines = [line for line in out.splitlines() if line.startswith("W12 ")]
    return json.loads(lines[-1][4:]) if lines else {}


def _run_together(cmd: list[str], envs: list[dict]) -> list[dict]:
    """`cmd` in one process per environment of `envs`, all at once: each one's figures;
    RuntimeError with the last line a failed one wrote."""
    jobs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for env in envs
    ]
    found = []
    for job in jobs:
        out, err = job.communicate(timeout=600)
        if job.returncode != 0:
            raise RuntimeError((err or out).strip().splitlines()[-1])
        found.append(_printed_figures(out))
    return found


def _run_process(kind: str, steps: int, ranks: int) -> dict:
    """One configuration in fresh processes; rank 0's figures."""
    here = str(Path(__file__).resolve())
    args = [here, "--worker", kind, "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if ranks == 1:
        cmd = [sys.executable, *args]
    else:
        from nestflow.cli.launch import command

        cmd, launch_env = command(ranks, [*args, "--distributed"], threads=1)
        env.update(launch_env, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    figures = _printed_figures(done.stdout)
    if done.returncode != 0 or not figures:
        raise RuntimeError((done.stderr or done.stdout).strip().splitlines()[-1])
    return figures


def _run_pair(kind: str, steps: int) -> float:
    """Two independent 1-rank processes (no MPI) at once: their combined samples/s. Over one
    process's alone, that is the most 2 ranks can gain on this machine at this moment,
    whatever the MPI (on a shared VM host it moves with the host's load)."""
    here = str(Path(__file__).resolve())
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, here, "--worker", kind, "--steps", str(steps)]
    figures = _run_together(cmd, [env, env])
    if not all(figures):
        raise RuntimeError("a worker printed no figures")
    return sum(f["samples_per_s"] for f in figures)


def run(rounds: int = ROUNDS) -> dict:
    rows, notes, cpu = [], [], []
    loads = [os.getloadavg()[0]]
    torch_found: dict[int, list[dict | str]] = {1: [], 2: []}
    for kind, (title, steps) in WORKLOADS.items():
        try:
            found = {1: [], 2: []}
            pairs = []
            for turn in range(rounds):
                for ranks in (1, 2) if turn % 2 == 0 else (2, 1):
                    found[ranks].append(_run_process(kind, steps, ranks))
                    if kind in TORCH_WORKLOADS:
                        torch_found[ranks].append(_torch_or_why(steps, ranks))
                pairs.append(_run_pair(kind, steps))
                loads.append(os.getloadavg()[0])
        except Exception as exc:  # no MPI, or a failed job: say so, never a made-up number
            rows.append(row(f"{title}: throughput", "samples/s", unavailable(exc)))
            continue
        one = statistics.median(f["samples_per_s"] for f in found[1])
        two = statistics.median(f["samples_per_s"] for f in found[2])
        wait = statistics.median(f["wait_share"] for f in found[2])
        pair = statistics.median(pairs)
        cpu.append(
            f"{kind.upper()} {statistics.median(f['cpu_ms_per_step'] for f in found[1]):.1f} ms "
            f"alone, {statistics.median(f['cpu_ms_per_step'] for f in found[2]):.1f} ms per rank "
            "with 2"
        )
        name = kind.upper()
        # each round's 2 ranks over its 1 rank (run next to each other): how far the host's
        # spells move the speed-up within this run
        speedups = sorted(
            b["samples_per_s"] / a["samples_per_s"] for a, b in zip(found[1], found[2])
        )
        notes.append(
            f"{name} speed-up of 2 ranks over 1 in each round: "
            + ", ".join(f"{x:.2f}x" for x in speedups)
        )
        torch_one, torch_two, torch_ratio = "–", "–", "–"
        if kind in TORCH_WORKLOADS:
            torch_one, torch_two = (_median_or_why(torch_found[r]) for r in (1, 2))
            if isinstance(torch_one, float) and isinstance(torch_two, float):
                torch_ratio = torch_one / torch_two
                notes.append(
                    f"PyTorch {setup_torch().__version__} reference for "
                    f"{name}: DistributedDataParallel over gloo (its CPU backend, loopback), "
                    f"25 MB buckets, 1 thread per process: 2 processes reach "
                    f"{torch_two / torch_one:.2f}x one process"
                )
        rows += [
            row(
                f"{name} throughput, 1 rank (one process, plain SGD)",
                "samples/s",
                one,
                torch=torch_one,
            ),
            row(
                f"{name} throughput, 2 ranks (DistributedOptimizer; PyTorch: DDP over gloo)",
                "samples/s",
                two,
                torch=torch_two,
            ),
            row(
                f"{name} time per sample, 2 ranks / 1 rank (1 / speed-up {two / one:.2f}x; "
                f"scaling efficiency {two / (2 * one):.0%})",
                "x",
                one / two,
                torch=torch_ratio,
                targets=[("abs", round(1 / TARGET_SPEEDUP, 3))] if kind == "w1" else None,
            ),
            row(f"{name} share of the 2-rank step waiting in all-reduce", "%", 100 * wait),
            row(
                f"{name} ceiling: 2 independent 1-rank processes at once, no MPI (combined "
                f"{pair:.0f} samples/s, {pair / one:.2f}x one process alone)",
                "samples/s",
                pair,
            ),
        ]
    if cpu:
        notes.append(
            "CPU time of one step (all-reduce waits included): " + "; ".join(cpu) + " (what "
            "2 ranks can overlap on 2 idle cores)"
        )
    notes.append(
        f"1 BLAS thread per process; load average {min(loads):.1f}-{max(loads):.1f} while it "
        f"ran on {os.cpu_count()} cores (2 ranks need 2 idle cores to scale)"
    )
    return {
        "workload": "W12 data-parallel MPI, 1 BLAS thread per rank",
        "rows": rows,
        "notes": notes,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--distributed", action="store_true")
    parser.add_argument("--torch-worker", action="store_true")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    if args.torch_worker:
        figures = torch_worker(args.steps)
        if figures:
            print("W12 " + json.dumps(figures), flush=True)
        # gloo's threads can abort the interpreter's shutdown ("terminate called without an
        # active exception") after the figures are out: leave without it.
        sys.stderr.flush()
        os._exit(0)
    if args.worker:
        figures = worker(args.worker, args.steps, args.distributed)
        if figures:
            print("W12 " + json.dumps(figures), flush=True)
        return
    from timing import measured, print_result

    print_result(measured(lambda: run(args.rounds)))


if __name__ == "__main__":
    main()
