"""`nestflow demo --distributed`: the digits MLP of `nestflow demo` trained data-parallel on 2
MPI ranks (through `nestflow launch`; needs nestflow[distributed]).

The command starts itself again under mpiexec; each rank then runs `run`, the training script a
user writes for MPI (demo_mlp's, with two changes):

    nf.distributed.init()
    model = nf.Model(mlp, inputs=..., labels=...)
    model.prepare(nf.distributed.DistributedOptimizer(nf.optimizer.Adam(1e-3)),
                  loss=nf.layers.cross_entropy, metrics=nf.metric.Accuracy())
    model.fit((data.train_x, data.train_y), eval_data=(data.test_x, data.test_y),
              batch_size=32, epochs=20)     # each rank trains on its half of the data
    model.save("digits", training=False)      # rank 0 writes

Each rank takes batches of 32 from its own half of every epoch's shuffle, so a step learns from
64 digits and an epoch has half the steps of the one-process demo (98.3% held-out at seed 0;
27 s on the shared 2-core machine at load average ~12, MPI start included). At the end every
rank checks
that its parameters equal rank 0's bit for bit, and rank 0 saves, reloads and re-checks the
inference model as the one-process demo does; any failed check (or an error on either rank)
ends the job with status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import numpy as np

import nestflow as nf
from nestflow.cli.demo_mlp import (
    BATCH_SIZE,
    EPOCHS,
    LEARNING_RATE,
    accuracy_of,
    load_digits,
    mlp,
    output_directory,
    saved_message,
    verdict,
)
from nestflow.core.threads import threads_summary
from nestflow.ops.collective import launched_world_size

RANKS = 2
MIN_ACCURACY = 0.97


def main(args: argparse.Namespace, argv: list[str]) -> int:
    """`nestflow demo --distributed`: start the ranks (when not one of them yet), or be one."""
    if args.model != "mlp":
        print(f"nestflow: --distributed runs the mlp demo, not '{args.model}'", file=sys.stderr)
        return 2
    if args.min_accuracy is None:
        args.min_accuracy = MIN_ACCURACY
    if launched_world_size() == 1:
        from nestflow.cli.launch import run_module

        return run_module("nestflow", argv, RANKS)
    return run(args)


def _parameters_digest(model: nf.Model) -> np.ndarray:
    scope = model.scope
    digest = hashlib.sha256()
    for var in sorted(model.train_program.all_parameters(), key=lambda v: v.name):
        digest.update(np.ascontiguousarray(scope.find_var(var.name).get(nf.Tensor).numpy()))
    return np.frombuffer(digest.digest(), np.uint8)


def run(args: argparse.Namespace) -> int:
    """One rank's work: train, check the ranks agree; rank 0 evaluates, saves and reloads."""
    started = time.perf_counter()
    nf.distributed.init()
    rank, size = nf.distributed.rank(), nf.distributed.world_size()
    epochs = args.epochs if args.epochs is not None else EPOCHS
    data = load_digits(seed=args.seed, limit=args.limit)
    if rank == 0:
        print(f"rank 0: {threads_summary()}")
        print(
            f"digits: {len(data.train_x)} training and {len(data.test_x)} held-out 8x8 images; "
            f"MLP 64 -> 128 relu -> 10, Adam lr {LEARNING_RATE}, {epochs} epochs on {size} "
            f"MPI ranks, {BATCH_SIZE} digits per rank and step"
        )
    nf.seed(args.seed)
    model = nf.Model(
        mlp,
        inputs=nf.InputSpec([None, 64], "float32", "x"),
        labels=nf.InputSpec([None, 1], "int64", "label"),
    )
    model.prepare(
        nf.distributed.DistributedOptimizer(nf.optimizer.Adam(LEARNING_RATE)),
        loss=nf.layers.cross_entropy,
        metrics=nf.metric.Accuracy(),
    )
    model.fit(
        (data.train_x, data.train_y),
        eval_data=(data.test_x, data.test_y),
        batch_size=BATCH_SIZE,
        epochs=epochs,
        verbose=0 if args.no_progress else 1,
    )
    digests = nf.distributed.allgather(_parameters_digest(model))
    same = all(np.array_equal(d, digests[0]) for d in digests)
    if rank != 0:
        return 0 if same else 1
    print(f"parameters identical on all {size} ranks: {same}")
    (trained,) = model.predict(data.test_x, batch_size=len(data.test_x), stack_outputs=True)
    test_accuracy = accuracy_of(trained, data.test_y)
    print(f"test accuracy: {test_accuracy:.2%}")
    with output_directory(args.out, "nestflow-digits-") as out:
        model.save(out, training=False)
        program, feeds, fetches, scope = nf.io.load_inference_model(out)
        (reloaded,) = nf.Executor().run(
            program, feed={feeds[0]: data.test_x}, fetch_list=fetches, scope=scope
        )
        print(saved_message(args.out, out))
    identical = reloaded.dtype == trained.dtype and np.array_equal(reloaded, trained)
    status = verdict(identical, test_accuracy, args.min_accuracy, started)
    return status if same else 1
