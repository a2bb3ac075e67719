"""A data-parallel program is still a Program (prints, saves, prunes, profiles, runs alone as
the plain one does), DistributedOptimizer's buckets and errors, and nf.distributed in a process
that is not an MPI rank. No MPI job is started here."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import nestflow as nf
from nestflow.distributed.optimizer import plan_buckets
from nestflow.errors import AttrError, NestflowError, TypeMismatchError, UninitializedError
from tests.distributed import models
from tests.distributed.jobs import needs_mpi


@pytest.mark.parametrize("model", models.MODELS)
def test_alone_it_trains_exactly_as_the_plain_optimizer(model):
    """In one process the collective ops are the identity: 20 steps give bit-identical
    parameters to the same model with the plain optimizer."""
    results = []
    for distributed in (True, False):
        built = models.build(model, distributed)
        exe, scope = nf.Executor(), nf.Scope()
        nf.seed(3)
        exe.run(built.startup, scope=scope)
        for step in range(models.STEPS):
            exe.run(built.main, feed=built.batch(step, 6), fetch_list=[built.loss], scope=scope)
        results.append(models.parameters(built, scope))
    for name, value in results[1].items():
        np.testing.assert_array_equal(results[0][name], value)


def test_the_program_prints_round_trips_prunes_and_profiles(capsys):
    built = models.build("mlp", distributed=True, batch_var="y")
    text = str(built.main)
    assert "c_allreduce_start(X=" in text and "c_allreduce_wait(Request=" in text
    assert "c_check_layout()" in str(built.startup) and "c_broadcast(X=" in str(built.startup)
    loaded = nf.Program.from_bytes(built.main.to_bytes())
    assert [op.type for op in loaded.global_block().ops] == [
        op.type for op in built.main.global_block().ops
    ]
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(nf.Program.from_bytes(built.startup.to_bytes()), scope=scope)
    feed = built.batch(0, 5)
    with nf.profiler.profiler(sorted_key="calls") as profile:
        (loss,) = exe.run(loaded, feed=feed, fetch_list=[built.loss.name], scope=scope)
    assert np.isfinite(loss)
    timed = {row.op_type: row.calls for row in profile.stats()}
    assert timed["c_allreduce_start"] == timed["c_allreduce_wait"] == len(built.optimizer.buckets)
    assert "c_allreduce_wait" in capsys.readouterr().out
    small = nf.prune(built.main, targets=[built.loss])
    assert not any(op.type.startswith("c_") for op in small.global_block().ops)


def test_buckets_start_before_backward_finishes_in_the_program():
    """The first bucket's c_allreduce_start comes right after the op writing its last
    gradient, before the backward ops of the earlier layers; the waits come after all of
    backward and before every update op."""
    built = models.build("mlp", distributed=True)
    ops = built.main.global_block().ops
    types = [op.type for op in ops]
    starts = [i for i, t in enumerate(types) if t == "c_allreduce_start"]
    waits = [i for i, t in enumerate(types) if t == "c_allreduce_wait"]
    grads = [i for i, t in enumerate(types) if t.endswith("_grad")]
    updates = [i for i, t in enumerate(types) if t == "sgd"]
    assert len(starts) == len(waits) == len(built.optimizer.buckets) >= 2
    assert starts[0] < grads[-1]  # overlaps the rest of backward
    assert max(grads) < min(waits) and max(waits) < min(updates)
    for bucket in built.optimizer.buckets:
        start = ops.index(bucket.start)
        written = [
            i for i, op in enumerate(ops) if set(op.output_names()) & {g.name for g in bucket.grads}
        ]
        assert start == 1 + max(i for i in written if i < start)


def test_buckets_follow_backward_order_respect_the_size_and_hold_one_dtype():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = nf.data("x", [-1, 16], "float32")
        h = nf.layers.fc(x, 32, act="relu", name="a")  # w: 2 KiB, b: 128 B
        h = nf.layers.fc(h, 32, act="relu", name="b")  # w: 4 KiB
        loss = nf.layers.mean(nf.layers.fc(h, 4, name="c"))
        opt = nf.distributed.DistributedOptimizer(nf.optimizer.SGD(0.1), bucket_size_mb=3 / 1024)
        _, params_grads = opt.minimize(loss)
    names = [[p.name for p in b.params] for b in opt.buckets]
    assert names == [["c.b", "c.w", "b.b", "b.w"], ["a.b", "a.w"]]  # last layer first
    assert [b.nbytes for b in opt.buckets] == [4 * (4 + 128 + 32 + 1024), 4 * (32 + 512)]
    assert sorted(p.name for b in opt.buckets for p in b.params) == sorted(
        p.name for p, _ in params_grads
    )
    # each bucket closes as soon as it holds 3 KiB: a gradient bigger than that gets its own
    block = main.global_block()
    one = plan_buckets(block, params_grads, 1.0)
    assert [len(b.params) for b in one] == [1] * 6
    everything = plan_buckets(block, params_grads, 1e9)
    assert len(everything) == 1 and len(everything[0].params) == 6


def test_buckets_never_mix_dtypes():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x32 = nf.data("x32", [-1, 3], "float32")
        x64 = nf.data("x64", [-1, 3], "float64")
        a = nf.layers.mean(nf.layers.fc(x32, 2, name="a"))
        b = nf.layers.mean(nf.layers.fc(x64, 2, name="b"))
        loss = a + nf.layers.cast(b, "float32")
        opt = nf.distributed.DistributedOptimizer(nf.optimizer.SGD(0.1))
        opt.minimize(loss)
    assert sorted((b.dtype, len(b.params)) for b in opt.buckets) == [
        ("float32", 2),
        ("float64", 2),
    ]


def test_frozen_and_unused_parameters_are_broadcast_but_not_averaged():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = nf.data("x", [-1, 3], "float32")
        frozen = nf.ParamAttr(name="frozen.w", trainable=False)
        h = nf.layers.fc(x, 4, param_attr=frozen, bias_attr=False)
        nf.layers.create_parameter([5], "float32", name="unused")
        loss = nf.layers.mean(nf.layers.fc(h, 1, name="p"))
        opt = nf.distributed.DistributedOptimizer(nf.optimizer.Adam(0.1))
        opt.minimize(loss)
    averaged = {p.name for b in opt.buckets for p in b.params}
    assert averaged == {"p.w", "p.b"}
    broadcast = [op.input("X")[0] for op in startup.global_block().ops if op.type == "c_broadcast"]
    assert {"frozen.w", "unused", "p.w", "p.b"} <= set(broadcast)
    assert any(".moment1" in name for name in broadcast)  # the optimizer's state too
    layout = next(op for op in startup.global_block().ops if op.type == "c_check_layout")
    assert "param frozen.w float32[3, 4]\n" in layout.attr("layout") + "\n"
    assert "param p.w float32[4, 1] trainable" in layout.attr("layout")


def test_the_wrapper_passes_the_optimizers_name_and_state_through():
    inner = nf.optimizer.SGD(0.5)
    opt = nf.distributed.DistributedOptimizer(inner)
    opt.name = "renamed"
    assert inner.name == "renamed" and opt.learning_rate == 0.5
    x = nf.data("x", [-1, 2], "float32")
    opt.minimize(nf.layers.mean(nf.layers.fc(x, 1)))
    assert opt.state_vars == inner.state_vars and opt.learning_rate_var is not None
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    opt.set_learning_rate(0.25, scope)
    assert scope.find_var(opt.learning_rate_var.name).get(nf.Tensor).numpy()[0] == 0.25


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"optimizer": "sgd"}, TypeMismatchError, "wraps an nf.optimizer optimizer"),
        ({"bucket_size_mb": 0}, AttrError, "bucket_size_mb must be a number > 0"),
        ({"bucket_size_mb": True}, AttrError, "bucket_size_mb must be a number > 0"),
        ({"batch_var": 3}, TypeMismatchError, "batch_var must be a variable or its name"),
    ],
)
def test_bad_arguments_are_errors(kwargs, error, match):
    arguments = {"optimizer": nf.optimizer.SGD(0.1), **kwargs}
    with pytest.raises(error, match=match):
        nf.distributed.DistributedOptimizer(**arguments)


def test_minimize_errors_name_the_problem():
    x = nf.data("x", [-1, 2], "float32")
    loss = nf.layers.mean(nf.layers.fc(x, 1))
    with pytest.raises(AttrError, match="batch_var 'nope' is not a variable"):
        nf.distributed.DistributedOptimizer(nf.optimizer.SGD(0.1), batch_var="nope").minimize(loss)
    with pytest.raises(TypeMismatchError, match="loss must be a variable"):
        nf.distributed.DistributedOptimizer(nf.optimizer.SGD(0.1)).minimize("loss")


def test_a_rank_started_by_mpiexec_must_call_init_first(monkeypatch):
    """Under mpiexec (its environment says 2 ranks) without init(), building or running a
    data-parallel program is an error, not silent single-process training."""
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    x = nf.data("x", [-1, 2], "float32")
    loss = nf.layers.mean(nf.layers.fc(x, 1))
    with pytest.raises(UninitializedError, match=r"rank 1 of 2 started by mpiexec.*init\(\)"):
        nf.distributed.DistributedOptimizer(nf.optimizer.SGD(0.1)).minimize(loss)
    alone = nf.Program()
    block = alone.global_block()
    x = block.create_var("x", [2], "float32")
    block.append_op("c_allreduce_sum", {"X": [x]}, {"Out": [block.create_var("summed")]})
    with pytest.raises(UninitializedError, match="nf.distributed.init"):
        nf.Executor().run(alone, feed={"x": np.ones(2, "float32")}, fetch_list=["summed"])


@needs_mpi
def test_outside_mpiexec_init_makes_a_world_of_one_and_the_module_imports_no_mpi():
    code = (
        "import sys, nestflow as nf\n"
        "d = nf.distributed\n"
        "print('mpi4py' in sys.modules, d.is_initialized(), d.rank(), d.world_size())\n"
        "d.init(); d.barrier()\n"
        "print(d.is_initialized(), d.rank(), d.world_size(), d.broadcast_bytes(b'x'))\n"
        "print(d.allgather(d.broadcast([1, 2])).tolist(), d.stats().calls)\n"
        "import os; print(os.environ.get('OMPI_MCA_coll_libnbc_iallreduce_algorithm'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI"))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "False False 0 1",
        "True 0 1 b'x'",
        "[[1, 2]] {}",
        "1",  # init asked Open MPI for the ring all-reduce before MPI started
    ]


def test_the_runner_turns_a_failure_into_a_non_zero_exit_alone(tmp_path):
    """python -m nestflow.distributed outside MPI: the script's own exit status and error."""
    script = tmp_path / "boom.py"
    script.write_text("import sys\nprint(sys.argv[1:])\nraise ValueError('boom')\n")
    done = subprocess.run(
        [sys.executable, "-m", "nestflow.distributed", str(script), "a", "--b"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stdout.strip() == "['a', '--b']"
    assert "[nestflow rank 0 of 1] failed" in done.stderr and "ValueError: boom" in done.stderr
    fine = subprocess.run(
        [sys.executable, "-m", "nestflow.distributed", "-m", "json.tool", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fine.returncode == 0 and "json.tool" in fine.stdout


def test_model_prepared_with_a_distributed_optimizer_alone_fits_as_with_the_plain_one():
    from tests.distributed import worker

    results = []
    for distributed in (True, False):
        nf.seed(0)
        model = worker.fit_model(distributed)
        model.fit(worker.fit_data(), batch_size=8, epochs=2, verbose=0)
        results.append(worker._model_parameters(model))
    for name, value in results[1].items():
        np.testing.assert_array_equal(results[0][name], value)


def test_loss_in_a_sub_block_is_refused():
    x = nf.data("x", [-1, 2], "float32")
    block = nf.default_main_program().create_block()
    inner = block.create_var("inner_loss", [], "float32")
    with pytest.raises(NestflowError, match="global block"):
        nf.distributed.DistributedOptimizer(nf.optimizer.SGD(0.1)).minimize(inner)
    assert x is not None
