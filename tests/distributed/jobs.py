"""Running MPI jobs from the tests: `mpi_job(ranks, args)` runs tests/distributed/worker.py on
`ranks` ranks (through `nestflow launch`, or plain mpiexec with `launcher=False`) with one BLAS
thread per rank. Tests that need MPI skip, saying why, when mpi4py or mpiexec is missing
(`pip install 'nestflow[distributed]'`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nestflow.cli import launch
from nestflow.errors import NestflowError

WORKER = Path(__file__).with_name("worker.py")


def _mpi_missing() -> str | None:
    try:
        import mpi4py  # noqa: F401  (the package only: MPI itself is not initialised)
    except ImportError:
        return "mpi4py is not installed (pip install 'nestflow[distributed]')"
    try:
        launch.find_mpiexec()
    except NestflowError as exc:
        return str(exc)
    return None


MPI_MISSING = _mpi_missing()
needs_mpi = pytest.mark.skipif(MPI_MISSING is not None, reason=f"no MPI: {MPI_MISSING}")


@dataclass
class Job:
    returncode: int
    output: str  # stdout and stderr of every rank and of mpiexec
    seconds: float


def mpi_job(
    ranks: int,
    args: list[str],
    launcher: bool = True,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> Job:
    """Run the worker with `args` on `ranks` ranks (with `env` added to the environment);
    returns its exit status and output."""
    target = [str(WORKER), *args]
    if launcher:
        cmd = [sys.executable, "-m", "nestflow", "launch", "-n", str(ranks), *target]
    else:
        mpiexec = launch.find_mpiexec()
        cmd = [mpiexec, "-n", str(ranks)]
        if launch.is_open_mpi(mpiexec):
            cmd += ["--allow-run-as-root"] if os.geteuid() == 0 else []
            cmd += list(launch.OPEN_MPI_OPTIONS)
        cmd += [sys.executable, *target]
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    start = time.perf_counter()
    # A session of its own, so that a job past its time is killed with every rank (killing
    # mpiexec's parent alone would leave the ranks running).
    job = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=WORKER.parent,
        start_new_session=True,
    )
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        err += f"\n(killed after {timeout} s)"
    return Job(job.returncode, out + err, time.perf_counter() - start)
