"""The MPI side of the distributed tests: `mpiexec -n N python worker.py OUT CASE [options]`
(or through `nestflow launch`). Each rank writes what the test checks into the directory OUT.

Cases:
- train: every model of models.py trained STEPS steps on this rank's shard of each global
  batch (--sizes: rows per rank; --weighted: DistributedOptimizer(batch_var=...)); writes
  the initial parameters (rank 0), each rank's final parameters, the MPI calls of each step
  and the bucket count, and a profiler trace of one step of the MLP.
- held: trains the MLP fetching (return_numpy=False) and keeping a gradient of every bucket at
  every step (only on rank --keep-on, when given); writes the final parameters, whether every
  kept gradient stayed as fetched, and the MPI calls.
- fail: trains the MLP; rank --rank fails in the middle of step 3 (a label out of range makes
  cross_entropy raise while the other ranks wait in the all-reduce).
- uneven: rank --rank ends its program normally after --until steps (4), the others go on.
- mismatch: rank 1 builds the MLP with another hidden size; the startup program must fail.
- fit: nf.Model.fit with a DistributedOptimizer and a ModelCheckpoint, then every rank loads
  the checkpoint rank 0 wrote; writes each rank's parameters, the loaded epoch, and the
  batches a DataLoader with a DistributedBatchSampler (default rank and size) gives it.
- hello: prints this rank and the world size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import nestflow as nf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def _save(path: str, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **arrays)


def train(out: str, sizes: list[int], weighted: bool) -> None:
    rank = nf.distributed.rank()
    batch_var = {"mlp": "y", "ifelse": "y", "rnn": "lengths", "while": "x"}
    for model in models.MODELS:
        built = models.build(model, True, batch_var[model] if weighted else None)
        exe, scope = nf.Executor(), nf.Scope()
        nf.seed(rank)  # different initial values on each rank: the broadcast must fix them
        exe.run(built.startup, scope=scope)
        if rank == 0:
            _save(f"{out}/{model}_init.npz", models.parameters(built, scope))
        calls = []
        for step in range(models.STEPS):
            feed = models.shard(built.batch(step, sum(sizes)), sizes, rank)
            nf.distributed.stats(reset=True)
            if model == "mlp" and step == 10:
                trace = f"{out}/{model}_trace_rank{rank}.json"
                with nf.profiler.profiler(profile_path=trace):
                    exe.run(built.main, feed=feed, fetch_list=[built.loss], scope=scope)
            else:
                exe.run(built.main, feed=feed, fetch_list=[built.loss], scope=scope)
            calls.append(nf.distributed.stats().calls)
        _save(f"{out}/{model}_rank{rank}.npz", models.parameters(built, scope))
        info = {"calls": calls, "buckets": len(built.optimizer.buckets)}
        with open(f"{out}/{model}_calls_rank{rank}.json", "w") as file:
            json.dump(info, file)
        if rank == 0 and model == "mlp":
            with open(f"{out}/{model}_program.txt", "w") as file:
                file.write(str(built.main))


def fail(failing_rank: int, uneven: bool = False, until: int = 4) -> None:
    rank = nf.distributed.rank()
    built = models.build("mlp", True)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(built.startup, scope=scope)
    steps = until if uneven and rank == failing_rank else models.STEPS
    for step in range(steps):
        feed = models.shard(built.batch(step, 8), [4] * nf.distributed.world_size(), rank)
        if step == 3 and rank == failing_rank and not uneven:
            feed["y"] = feed["y"] + 100  # cross_entropy raises: a label outside the classes
        exe.run(built.main, feed=feed, fetch_list=[built.loss], scope=scope)
        print(f"rank {rank} finished step {step}", flush=True)


def held(out: str, keep_on: int | None) -> None:
    """The MLP trained STEPS steps, fetching a gradient of every bucket each step with
    return_numpy=False (the executor's own arrays, not copies) and keeping them (only on rank
    `keep_on`, when given): each kept value must still be what it was when fetched; writes the
    final parameters, how many values were kept and stayed unchanged, and the MPI calls."""
    rank = nf.distributed.rank()
    keep = keep_on is None or keep_on == rank
    nf.distributed.stats(reset=True)
    built = models.build("mlp", True)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(built.startup, scope=scope)
    grads = [bucket.grads[0].name for bucket in built.optimizer.buckets]
    kept = []
    for step in range(models.STEPS):
        feed = models.shard(built.batch(step, 8), [4, 4], rank)
        fetched = exe.run(
            built.main, feed=feed, fetch_list=[built.loss, *grads], scope=scope, return_numpy=False
        )
        if keep:
            kept += [(value, np.array(value, copy=True)) for value in fetched[1:]]
    unchanged = all(np.array_equal(np.asarray(value), copy) for value, copy in kept)
    _save(f"{out}/held_rank{rank}.npz", models.parameters(built, scope))
    found = {"kept": len(kept), "unchanged": unchanged, "calls": nf.distributed.stats().calls}
    with open(f"{out}/held_rank{rank}.json", "w") as file:
        json.dump(found, file)


def mismatch() -> None:
    rank = nf.distributed.rank()
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = nf.data("x", [-1, 6], "float64")
        hidden = nf.layers.fc(x, 8 if rank == 0 else 9, act="tanh", name="mlp.h")
        loss = nf.layers.mean(nf.layers.fc(hidden, 1, name="mlp.p"))
        nf.distributed.DistributedOptimizer(nf.optimizer.SGD(0.1)).minimize(loss)
    nf.Executor().run(startup, scope=nf.Scope())
    print(f"rank {rank}: startup ran although the programs differ", flush=True)


def fit(out: str, batch_size: int) -> None:
    rank = nf.distributed.rank()
    nf.seed(0)
    model = fit_model(distributed=True)
    data = fit_data()
    checkpoints = f"{out}/checkpoints"
    # Every file this rank writes through the atomic writer (what Model.save uses): only rank
    # 0 may write checkpoints, though both ranks see one directory.
    from nestflow.io import atomic

    wrote, write_atomic = [], atomic.write_atomic

    def recording(path, data, **kwargs):
        wrote.append(os.path.basename(os.fspath(path)))
        return write_atomic(path, data, **kwargs)

    atomic.write_atomic = recording
    try:
        model.fit(data, batch_size=batch_size, epochs=2, verbose=0, save_dir=checkpoints)
    finally:
        atomic.write_atomic = write_atomic
    _save(f"{out}/fit_rank{rank}.npz", _model_parameters(model))
    fresh = fit_model(distributed=True)
    fresh.load(f"{checkpoints}/final")
    _save(f"{out}/loaded_rank{rank}.npz", _model_parameters(fresh))
    # A DataLoader with a DistributedBatchSampler left to its defaults: this rank's shard.
    dataset = nf.io.TensorDataset([np.arange(11)])
    sampler = nf.io.DistributedBatchSampler(dataset, 2, shuffle=True)
    shard = [batch[0].tolist() for batch in nf.io.DataLoader(dataset, batch_sampler=sampler)]
    found = {
        "epoch": fresh.epoch,
        "files": sorted(os.listdir(checkpoints)),
        "shard": shard,
        "wrote": sorted(wrote),
    }
    with open(f"{out}/loaded_epoch_rank{rank}.json", "w") as file:
        json.dump(found, file)


def fit_model(distributed: bool) -> nf.Model:
    model = nf.Model(
        lambda x: nf.layers.fc(nf.layers.fc(x, 8, act="tanh"), 3, act="softmax"),
        inputs=nf.InputSpec([None, 6], "float64", "x"),
        labels=nf.InputSpec([None, 1], "int64", "y"),
    )
    optimizer = nf.optimizer.Adam(0.05)
    if distributed:
        optimizer = nf.distributed.DistributedOptimizer(optimizer, bucket_size_mb=0.0005)
    model.prepare(optimizer, loss=nf.layers.cross_entropy)
    return model


def fit_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.normal(size=(32, 6)), rng.integers(0, 3, size=(32, 1))


def _model_parameters(model: nf.Model) -> dict[str, np.ndarray]:
    return {
        p.name: np.array(model.scope.find_var(p.name).get(nf.Tensor).numpy())
        for p in model.train_program.all_parameters()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument(
        "case", choices=("train", "held", "fail", "uneven", "mismatch", "fit", "hello")
    )
    parser.add_argument("--sizes", default="4,4")
    parser.add_argument("--weighted", action="store_true")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--until", type=int, default=4)
    parser.add_argument("--keep-on", type=int, default=None)
    args = parser.parse_args()
    nf.distributed.init()
    if args.case == "train":
        train(args.out, [int(s) for s in args.sizes.split(",")], args.weighted)
    elif args.case == "held":
        held(args.out, args.keep_on)
    elif args.case in ("fail", "uneven"):
        fail(args.rank, uneven=args.case == "uneven", until=args.until)
    elif args.case == "mismatch":
        mismatch()
    elif args.case == "fit":
        fit(args.out, args.batch_size)
    else:
        print(f"hello from rank {nf.distributed.rank()} of {nf.distributed.world_size()}")


if __name__ == "__main__":
    main()
