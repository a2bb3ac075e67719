"""Issue 15's acceptance, on real MPI jobs (2 and 3 ranks oversubscribed on a small machine):
data-parallel training equals one process on the concatenated batches, gradients travel in
buckets started during backward, a failing rank ends the job, mismatched programs are caught,
and nf.Model.fit shards, checkpoints on rank 0 and loads everywhere."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nestflow as nf
from tests.distributed import models
from tests.distributed.jobs import mpi_job, needs_mpi

pytestmark = needs_mpi

# Communication calls (everything but Wait and the barriers) the collective ops make; a
# shared-memory sum (all ranks on one node) counts as "shared_allreduce".
COMMUNICATION = ("Allreduce", "Iallreduce", "shared_allreduce", "Bcast", "Allgather", "Allgatherv")
MPI_PATH = {"NESTFLOW_ALLREDUCE": "mpi"}


def _arrays(path) -> dict[str, np.ndarray]:
    with np.load(path) as found:
        return dict(found)


def _check_equal_to_one_process(out, ranks: int, rows: int) -> None:
    for model in models.MODELS:
        initial = _arrays(out / f"{model}_init.npz")
        expected = models.train_reference(model, initial, rows)
        for rank in range(ranks):
            got = _arrays(out / f"{model}_rank{rank}.npz")
            assert sorted(got) == sorted(expected)
            for name, value in expected.items():
                assert value.dtype == np.float64
                np.testing.assert_allclose(
                    got[name], value, rtol=1e-12, atol=1e-12, err_msg=f"{model} rank {rank}"
                )
                # trained: the comparison is not between two copies of the start
                assert not np.allclose(got[name], initial[name], atol=1e-6), (model, name)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The four models, 20 steps, 2 ranks of 4 rows each (plain mean), via nestflow launch."""
    out = tmp_path_factory.mktemp("two_ranks")
    job = mpi_job(2, [str(out), "train", "--sizes", "4,4"])
    assert job.returncode == 0, job.output
    return out


@pytest.fixture(scope="module")
def two_ranks_mpi(tmp_path_factory):
    """The same through MPI_Iallreduce (NESTFLOW_ALLREDUCE=mpi) instead of shared memory."""
    out = tmp_path_factory.mktemp("two_ranks_mpi")
    job = mpi_job(2, [str(out), "train", "--sizes", "4,4"], env=MPI_PATH)
    assert job.returncode == 0, job.output
    return out


@pytest.fixture(scope="module")
def three_uneven_ranks(tmp_path_factory):
    """The same with 3 ranks of 5, 3 and 2 rows, weighted by batch size, via plain mpiexec."""
    out = tmp_path_factory.mktemp("three_ranks")
    job = mpi_job(3, [str(out), "train", "--sizes", "5,3,2", "--weighted"], launcher=False)
    assert job.returncode == 0, job.output
    return out


def test_two_ranks_equal_one_process_on_the_concatenated_batches(two_ranks):
    """MLP, IfElse, RNN with lengths and While: every rank's parameters after 20 steps equal (float64,
    1e-12) one process's on the 8-row concatenation, from rank 0's initial parameters (each
    rank initialised others: the startup broadcast made them agree)."""
    _check_equal_to_one_process(two_ranks, 2, 8)


def test_three_uneven_ranks_equal_one_process_when_weighted_by_batch_size(three_uneven_ranks):
    _check_equal_to_one_process(three_uneven_ranks, 3, 10)
    for model in models.MODELS:  # summed in shared memory (one node)
        info = json.loads((three_uneven_ranks / f"{model}_calls_rank2.json").read_text())
        assert all(c["shared_allreduce"] == info["buckets"] for c in info["calls"])


def test_through_mpi_iallreduce_two_ranks_equal_one_process_and_the_shared_sum(
    two_ranks, two_ranks_mpi
):
    """The message path trains as one process does, and (2 ranks: one addition per number,
    the same either way) to the bit as the shared-memory sum."""
    _check_equal_to_one_process(two_ranks_mpi, 2, 8)
    for model in models.MODELS:
        for rank in range(2):
            shared = _arrays(two_ranks / f"{model}_rank{rank}.npz")
            message = _arrays(two_ranks_mpi / f"{model}_rank{rank}.npz")
            for name, value in shared.items():
                np.testing.assert_array_equal(message[name], value, err_msg=f"{model} {name}")


@pytest.mark.parametrize("path", ["shared_allreduce", "Iallreduce"])
@pytest.mark.parametrize("model", models.MODELS)
def test_one_mpi_call_per_bucket_and_step(two_ranks, two_ranks_mpi, model, path):
    out = two_ranks if path == "shared_allreduce" else two_ranks_mpi
    for rank in range(2):
        info = json.loads((out / f"{model}_calls_rank{rank}.json").read_text())
        buckets = info["buckets"]
        assert buckets >= 2  # the tiny bucket size splits every model's gradients
        assert len(info["calls"]) == models.STEPS
        for calls in info["calls"]:
            sent = sum(calls.get(kind, 0) for kind in COMMUNICATION)
            assert sent == calls[path] == buckets, calls
            assert calls["Wait"] == buckets
            if path == "shared_allreduce":  # one barrier when packed, one when summed
                assert calls["Ibarrier"] == 2 * buckets, calls


def test_gradients_kept_across_steps_are_not_overwritten(tmp_path):
    """Every bucket's averaged gradient fetched without a copy and kept by rank 0 alone for
    all 20 steps (more than the shared sum arrays a bucket keeps, so the last steps copy out
    of a scratch array): each stays as fetched, rank 1 (which keeps nothing) does not write
    over them, and training is the same as through MPI_Iallreduce."""
    shared, message = tmp_path / "shared", tmp_path / "mpi"
    for out, env in ((shared, None), (message, MPI_PATH)):
        out.mkdir()
        job = mpi_job(2, [str(out), "held", "--keep-on", "0"], env=env)
        assert job.returncode == 0, job.output
    kept = [json.loads((shared / f"held_rank{rank}.json").read_text()) for rank in range(2)]
    assert kept[0]["unchanged"] and kept[0]["kept"] >= 2 * models.STEPS
    assert kept[1]["kept"] == 0
    for info in kept:
        assert info["calls"]["shared_allreduce"] >= 2 * models.STEPS
        assert info["calls"]["shared_scratch"] > 0 and "Iallreduce" not in info["calls"]
    assert json.loads((message / "held_rank0.json").read_text())["unchanged"]
    for rank in range(2):
        got = _arrays(shared / f"held_rank{rank}.npz")
        for name, value in _arrays(message / f"held_rank{rank}.npz").items():
            np.testing.assert_array_equal(got[name], value)


def test_an_all_reduce_is_under_way_before_backward_finishes_at_run_time(two_ranks):
    """The profiler's trace of a training step: the first bucket's all-reduce started (its
    start op ended) before the last backward op began."""
    for rank in range(2):
        trace = json.loads((two_ranks / f"mlp_trace_rank{rank}.json").read_text())
        events = [e for e in trace["traceEvents"] if e["args"]["depth"] == 0]
        first_start = min(
            (e for e in events if e["name"] == "c_allreduce_start"), key=lambda e: e["ts"]
        )
        last_grad = max((e for e in events if e["name"].endswith("_grad")), key=lambda e: e["ts"])
        assert first_start["ts"] + first_start["dur"] <= last_grad["ts"]
        names = {e["name"] for e in events}
        assert {"c_allreduce_start", "c_allreduce_wait"} <= names


def test_a_rank_failing_mid_step_ends_the_whole_job_with_its_error():
    """Rank 1 raises inside step 3 while rank 0 waits in the all-reduce: MPI_Abort ends both
    within 30 s, non-zero, with rank 1's traceback in the output (plain mpiexec: init()'s
    excepthook)."""
    job = mpi_job(2, ["unused", "fail", "--rank", "1"], launcher=False, timeout=60)
    assert job.returncode != 0
    assert job.seconds < 30, job.output
    assert "[nestflow rank 1 of 2] failed" in job.output
    assert "Label holds 102" in job.output  # the error itself
    assert "rank 0 finished step 3" not in job.output


@pytest.mark.parametrize("until", [4, 0])
def test_a_rank_ending_early_does_not_leave_the_others_waiting_for_ever(until):
    """Rank 1's program ends normally after 4 steps (or before its first, while rank 0's first
    step makes the shared-memory windows) while rank 0 goes on: rank 0's next collective
    learns that rank 1 is gone (its exit message) and fails, ending the job."""
    job = mpi_job(2, ["unused", "uneven", "--rank", "1", "--until", str(until)], timeout=60)
    assert job.returncode != 0 and job.seconds < 30, job.output
    if until:
        assert f"rank 1 finished step {until - 1}" in job.output
    assert f"rank 1 finished step {until}" not in job.output
    assert "rank 1 ended its program while rank 0 waits for it" in job.output


def test_a_rank_failing_before_init_ends_the_job_through_the_launcher():
    """nestflow launch runs each rank under python -m nestflow.distributed: an exception
    before nf.distributed.init() (here: a bad argument on every rank) still ends the job."""
    job = mpi_job(2, ["unused", "no-such-case"], timeout=60)
    assert job.returncode != 0 and job.seconds < 30
    assert "invalid choice: 'no-such-case'" in job.output
    assert "exited with status 2; aborting every rank" in job.output


def test_ranks_with_different_programs_fail_at_startup_on_every_rank():
    job = mpi_job(2, ["unused", "mismatch"], timeout=60)
    assert job.returncode != 0 and job.seconds < 30
    assert "ProgramMismatchError: the ranks run different programs" in job.output
    assert "rank 0 has: param mlp.h.w float64[6, 8] trainable" in job.output
    assert "rank 1 has: param mlp.h.w float64[6, 9] trainable" in job.output
    assert "startup ran although" not in job.output


def test_model_fit_under_mpi_equals_one_process_and_checkpoints_on_rank_0(tmp_path):
    """nf.Model with a DistributedOptimizer on 2 ranks, batch 4 each, 2 epochs over 32
    shuffled samples, equals one process's fit with batch 8; rank 0 wrote the checkpoints
    (fit's save_dir) and every rank loaded the final one into a fresh Model; a DataLoader with
    a DistributedBatchSampler gives each rank its own shard."""
    from tests.distributed import worker

    job = mpi_job(2, [str(tmp_path), "fit", "--batch-size", "4"])
    assert job.returncode == 0, job.output
    nf.seed(0)
    alone = worker.fit_model(distributed=False)
    alone.fit(worker.fit_data(), batch_size=8, epochs=2, verbose=0)
    expected = worker._model_parameters(alone)
    for rank in range(2):
        for what in ("fit", "loaded"):
            got = _arrays(tmp_path / f"{what}_rank{rank}.npz")
            for name, value in expected.items():
                np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12)
        loaded = json.loads((tmp_path / f"loaded_epoch_rank{rank}.json").read_text())
        assert loaded["epoch"] == 2
        assert loaded["files"] == ["0.safetensors", "1.safetensors", "final.safetensors"]
        # Both ranks see one directory; rank 0 wrote every file in it, rank 1 none.
        assert loaded["wrote"] == (loaded["files"] if rank == 0 else []), loaded
    # DataLoader + DistributedBatchSampler(defaults from nf.distributed): distinct shards
    # (11 samples padded to 12 by repeating the first), batches of 2 and a last one of 2.
    shards = [
        json.loads((tmp_path / f"loaded_epoch_rank{r}.json").read_text())["shard"] for r in (0, 1)
    ]
    assert [len(b) for b in shards[0]] == [len(b) for b in shards[1]] == [2, 2, 2]
    seen = [i for shard in shards for batch in shard for i in batch]
    assert sorted(set(seen)) == list(range(11)) and len(seen) == 12
