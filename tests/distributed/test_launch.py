"""`nestflow launch` (the mpiexec command it builds, its errors, a real 2-rank job) and
`nestflow demo --distributed`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from nestflow.cli import launch
from nestflow.cli.main import main
from nestflow.errors import NestflowError
from tests.distributed.jobs import mpi_job, needs_mpi


@needs_mpi
def test_the_command_wraps_mpiexec_with_the_settings_that_work_here(capsys, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    argv = ["launch", "-n", "3", "--hostfile", str(hosts), "--dry-run", "train.py", "--lr", "1"]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip()
    mpiexec = launch.find_mpiexec()
    assert line.startswith(f"{mpiexec} -n 3 ")
    assert line.endswith(f"{sys.executable} -m nestflow.distributed train.py --lr 1")
    if launch.is_open_mpi(mpiexec):
        for option in (
            "--oversubscribe",
            "--bind-to none",
            "--mca pml ob1",
            "--mca btl self,sm,tcp",
            "--mca mpi_yield_when_idle 1",
            "--mca coll_libnbc_iallreduce_algorithm 1",
            f"--hostfile {hosts}",
            "-x OMP_NUM_THREADS",
            "-x NESTFLOW_TTY",
        ):
            assert f" {option} " in line, option
        assert ("--allow-run-as-root" in line) == (os.geteuid() == 0)


@needs_mpi
def test_threads_per_rank_default_to_cores_over_ranks(monkeypatch):
    for name in launch.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    _, env = launch.command(2, ["train.py"])
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    _, env = launch.command(2, ["train.py"], threads=3)
    assert env["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    _, env = launch.command(64, ["train.py"])
    assert "OMP_NUM_THREADS" not in env  # the user's setting stands
    cmd, _ = launch.command(2, ["nestflow", "demo"], module=True)
    assert cmd[cmd.index("nestflow.distributed") + 1 :] == ["-m", "nestflow", "demo"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["launch", "-n", "0", "x.py"], "number of ranks must be >= 1, got 0"),
        (["launch", "-n", "2"], "name the script to run"),
        (["launch", "-n", "2", "--hostfile", "/no/such/hosts", "x.py"], "does not exist"),
        (["launch", "-n", "2", "--threads", "0", "--mpiexec", "mpiexec", "x.py"], ">= 1"),
    ],
)
def test_launch_errors_say_what_is_wrong(argv, message, capsys):
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_without_mpiexec_the_error_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NestflowError, match=r"pip install 'nestflow\[distributed\]'"):
        launch.find_mpiexec()


@needs_mpi
def test_a_two_rank_job_through_launch():
    job = mpi_job(2, ["unused", "hello"])
    assert job.returncode == 0, job.output
    assert "hello from rank 0 of 2" in job.output and "hello from rank 1 of 2" in job.output


@needs_mpi
def test_the_distributed_demo_trains_on_two_ranks(tmp_path):
    """A reduced `nestflow demo --distributed` (400 digits, 3 epochs): both ranks end with the
    same parameters, rank 0 saves and reloads the model bit for bit, one line per epoch."""
    out = tmp_path / "model"
    done = subprocess.run(
        [sys.executable, "-m", "nestflow", "demo", "--distributed", "--epochs", "3"]
        + ["--limit", "400", "--min-accuracy", "0", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "3 epochs on 2 MPI ranks" in text
    assert len(re.findall(r"^epoch \d/3: loss [\d.]+", text, re.M)) == 3  # rank 0 only
    assert "parameters identical on all 2 ranks: True" in text
    assert "reloaded predictions identical bit for bit: True" in text
    assert (out / "model.json").exists()


def test_the_distributed_demo_is_the_mlp(capsys):
    assert main(["demo", "--distributed", "--model", "rnn"]) == 2
    assert "--distributed runs the mlp demo" in capsys.readouterr().err


_LEAVES_EARLY = """
import os, sys
import nestflow as nf
if os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK")) == "1":
    sys.exit(0)  # ends before joining: rank 0 waits for it in init()
nf.distributed.init()
print("joined", flush=True)
"""

_NEVER_JOINS = "print('a rank of a job that never uses MPI')\n"


def _launched(tmp_path, script: str) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(script)
    return subprocess.run(
        [sys.executable, "-m", "nestflow", "launch", "-n", "2", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        start_new_session=True,
    )


@needs_mpi
def test_a_rank_exiting_before_init_ends_the_job_naming_it(tmp_path):
    """Issue 32 item 11: rank 1 exits with status 0 before nf.distributed.init() while rank 0
    waits in init(): the launcher ends the job within 30 s, naming rank 1, with status 1."""
    start = time.perf_counter()
    done = _launched(tmp_path, _LEAVES_EARLY)
    assert time.perf_counter() - start < 30
    assert done.returncode == 1, done.stdout + done.stderr
    assert "rank 1 exited with status 0 without calling nf.distributed.init()" in done.stderr
    assert "joined" not in done.stdout


@needs_mpi
def test_a_job_in_which_no_rank_joins_still_ends_normally(tmp_path):
    done = _launched(tmp_path, _NEVER_JOINS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("never uses MPI") == 2
