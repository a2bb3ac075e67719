"""Data-parallel training over MPI (mpi4py): one process per rank, each with its own shard of
the data, gradients averaged over the ranks by collective ops in the program itself.

    import nestflow as nf
    nf.distributed.init()                     # every rank, before running programs
    with nf.program_guard(main, startup):
        ...                                   # the model and its loss, as for one process
        opt = nf.distributed.DistributedOptimizer(nf.optimizer.Adam(1e-3))
        opt.minimize(loss)                    # backward, bucketed all-reduces, updates
    exe.run(startup, scope=scope)             # checks the ranks agree, broadcasts rank 0's
    sampler = nf.io.DistributedBatchSampler(dataset, batch_size=32, shuffle=True)
    for batch in nf.io.DataLoader(dataset, batch_sampler=sampler): ...

Run it with `nestflow launch -n 4 train.py [args]` (or `mpiexec -n 4 python train.py`). With
nf.Model, prepare it with `nf.distributed.DistributedOptimizer(...)` as its optimizer and fit
as usual: the model shards the training data with DistributedBatchSampler, only rank 0 writes
checkpoints and logs, and a checkpoint is read by rank 0 and sent to every rank.

API: `init()`, `is_initialized()`, `rank()`, `world_size()`, `barrier()`, `broadcast(array)`, `allgather(array)`,
`broadcast_bytes(data)`, `stats()` (MPI calls made), `abort(message)`,
`DistributedOptimizer(optimizer, bucket_size_mb=25, batch_var=None)` (its module docstring
states the averaging rule), `ProgramMismatchError`. The collective ops themselves
(c_allreduce_sum, c_broadcast, c_allgather, ..., c_allreduce_start/wait) are in
nestflow/ops/collective.py. After `init()`, an exception on any rank prints its traceback and
ends every rank (MPI_Abort): a failed rank never leaves the others waiting; nor does a rank
whose program ends early (the others' next collective op fails after 5 s, naming it);
`python -m nestflow.distributed script.py` (what `nestflow launch` runs) does the same for
exceptions before init() and for sys.exit with a non-zero status.

Several machines. MPI starts the ranks over ssh, so:
1. every host has the same virtual environment at the same path (the launch runs that
   path's python on each host) and the training script at the same path;
2. the launching host can ssh to every host without a password (ssh-copy-id), and every host
   can reach the others over TCP (nestflow launch selects MPI's tcp transport between hosts
   and shared memory within one);
3. a hostfile lists the hosts and how many ranks each runs, one line each:

       node1 slots=8
       node2 slots=8

   then `nestflow launch -n 16 --hostfile hosts train.py` (Open MPI's `mpiexec --hostfile`).
Data: each rank reads its shard itself (DistributedBatchSampler by rank), so every host needs
the dataset at the same path; checkpoints are written by rank 0 on its host (nf.Model loads
them on rank 0 and broadcasts them, so the other hosts need no copy).
"""

from __future__ import annotations

from nestflow.distributed.optimizer import Bucket, DistributedOptimizer
from nestflow.distributed.runtime import (
    abort,
    allgather,
    barrier,
    broadcast,
    broadcast_bytes,
    init,
    is_initialized,
    rank,
    stats,
    world_size,
)
from nestflow.ops.collective import CommStats, ProgramMismatchError

__all__ = [
    "Bucket",
    "CommStats",
    "DistributedOptimizer",
    "ProgramMismatchError",
    "abort",
    "allgather",
    "barrier",
    "broadcast",
    "broadcast_bytes",
    "init",
    "is_initialized",
    "rank",
    "stats",
    "world_size",
]
