"""DistributedOptimizer: data-parallel training as a program transformation.

`minimize(loss)` turns the main program into a data-parallel one (Horovod's
DistributedOptimizer with tensor fusion, Paddle fleet's collective transpiler):

1. the backward ops (append_backward, through the wrapped optimizer);
2. the gradients in buckets of at most `bucket_size_mb` (one dtype each), filled in the order
   backward finishes them (the last layer's first), and for each bucket a c_allreduce_start op
   inserted right after the op that writes the bucket's last gradient: one sum per bucket,
   started while backward goes on with the earlier layers (in MPI-3 shared memory when every
   rank runs on one node: the start packs and announces the rank's gradients, the wait sums
   this rank's share of them;
   else a non-blocking MPI_Iallreduce, whose data Open MPI moves inside MPI calls: the later
   buckets' starts test the earlier ones, the waits finish them; what overlaps backward is
   mostly the time a rank would otherwise spend waiting for a slower one);
3. a c_allreduce_wait per bucket after the backward ops, replacing each gradient by its
   average over the ranks;
4. the wrapped optimizer's clip, regularization and update ops, on the averaged gradients.

A sparse gradient (a SelectedRows, `embedding(is_sparse=True)`) is densified by the
all-reduce, not all-gathered by rows: every rank sends the whole [height, dim] table, and
the update after it is the dense one (a regularizer decays every row, Adam's lazy_mode has
nothing to skip). Sparse updates stay a single-process saving.

The startup program gets a c_check_layout op (every rank must synchronise the same variables
with the same shapes and dtypes, else ProgramMismatchError on every rank) and then a
c_broadcast from rank 0 of every persistable variable it initialises for the main program
(parameters, trainable or not, optimizer state, learning rates, running statistics), so every
rank starts from rank 0's values and stays equal.

The averaging rule. Rank r's gradient g_r is of its own loss on its own batch of n_r samples;
the wait gives
- without `batch_var`: the plain mean (g_1 + ... + g_R) / R; this equals one process on the
  concatenated batches when the loss is a mean over the batch and every rank's batch has the
  same size (what DistributedBatchSampler gives);
- with `batch_var` (a variable, or its name, whose first dimension is the rank's batch size,
  e.g. the label): (n_1 g_1 + ... + n_R g_R) / (n_1 + ... + n_R), which equals one process on
  the concatenated batches for a mean loss also when the batch sizes differ (an uneven last
  batch); a rank with an empty batch contributes nothing.
A loss summed over the batch (not averaged) gives R times smaller steps than one process on the
concatenated batches under the plain mean: scale the learning rate by R, or average the loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nestflow.errors import AttrError, NestflowError, TypeMismatchError
from nestflow.framework import unique_name
from nestflow.framework.program import (
    Block,
    OpDesc,
    OpRole,
    Program,
    VarDesc,
    default_startup_program,
)
from nestflow.ops.collective import WORLD
from nestflow.optimizer.optimizer import Optimizer

ParamsGrads = list[tuple[VarDesc, VarDesc]]


@dataclass
class Bucket:
    """Gradients averaged by one MPI call: their parameters, dtype and size; the ops made."""

    dtype: str
    params: list[VarDesc] = field(default_factory=list)
    grads: list[VarDesc] = field(default_factory=list)
    nbytes: int = 0
    start: OpDesc | None = None
    wait: OpDesc | None = None

    def add(self, param: VarDesc, grad: VarDesc) -> None:
        self.params.append(param)
        self.grads.append(grad)
        self.nbytes += _numel(param) * np.dtype(self.dtype).itemsize


class DistributedOptimizer:
    """`optimizer` (an nf.optimizer optimizer) made data-parallel over the ranks of an MPI job:
    see the module docstring. `bucket_size_mb`: a bucket is closed once it holds this many
    megabytes (MiB) of gradients (a bigger gradient gets a bucket of its own); `batch_var`:
    weight each rank's gradient by its batch size (the module docstring's rule).

    The learning rate, state and name are the wrapped optimizer's (`name`, `learning_rate`,
    `state_vars`, `set_learning_rate` pass through); `buckets` lists the buckets minimize
    made. Bad arguments: TypeMismatchError (not an optimizer) or AttrError.

    >>> import nestflow as nf
    >>> opt = nf.distributed.DistributedOptimizer(nf.optimizer.SGD(0.1), bucket_size_mb=1)
    >>> opt.inner_optimizer.type, opt.bucket_size_mb
    ('sgd', 1.0)
    """

    def __init__(
        self,
        optimizer: Optimizer,
        bucket_size_mb: float = 25,
        batch_var: VarDesc | str | None = None,
    ):
        if not isinstance(optimizer, Optimizer):
            raise TypeMismatchError(
                "DistributedOptimizer wraps an nf.optimizer optimizer, got "
                f"{type(optimizer).__name__}"
            )
        if (
            isinstance(bucket_size_mb, bool)
            or not isinstance(bucket_size_mb, (int, float, np.integer, np.floating))
            or not np.isfinite(bucket_size_mb)
            or bucket_size_mb <= 0
        ):
            raise AttrError(
                f"DistributedOptimizer: bucket_size_mb must be a number > 0, got {bucket_size_mb!r}"
            )
        if batch_var is not None and not isinstance(batch_var, (VarDesc, str)):
            raise TypeMismatchError(
                "DistributedOptimizer: batch_var must be a variable or its name, got "
                f"{type(batch_var).__name__}"
            )
        self.inner_optimizer = optimizer
        self.bucket_size_mb = float(bucket_size_mb)
        self.batch_var = batch_var
        self.buckets: list[Bucket] = []

    # The wrapped optimizer's identity and state (nf.Model renames it and reads its state).
    @property
    def name(self) -> str:
        return self.inner_optimizer.name

    @name.setter
    def name(self, value: str) -> None:
        self.inner_optimizer.name = value

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @property
    def learning_rate_var(self) -> VarDesc | None:
        return self.inner_optimizer.learning_rate_var

    @property
    def state_vars(self) -> list[VarDesc]:
        return self.inner_optimizer.state_vars

    def set_learning_rate(self, value: float, scope: Any) -> None:
        self.inner_optimizer.set_learning_rate(value, scope)

    def minimize(
        self,
        loss: VarDesc,
        startup_program: Program | None = None,
        parameter_list: Sequence[VarDesc | str] | None = None,
        no_grad_set: Iterable[VarDesc | str] | None = None,
    ) -> tuple[list[OpDesc], ParamsGrads]:
        """Append backward, the bucketed all-reduces and the updates to `loss`'s program and
        the check and broadcasts to the startup program (default: nf.default_startup_program());
        returns (update ops, [(param, averaged gradient)]) as Optimizer.minimize does."""
        WORLD.checked()  # under mpiexec, init() must have run (or every rank trains alone)
        if not isinstance(loss, VarDesc):
            raise TypeMismatchError(
                f"DistributedOptimizer.minimize: loss must be a variable, got {type(loss).__name__}"
            )
        block = loss.block
        if block is not block.program.global_block():
            raise NestflowError(
                f"DistributedOptimizer.minimize: loss '{loss.name}' is in block {block.idx}; "
                "the loss must be a variable of the program's global block"
            )
        startup = startup_program if startup_program is not None else default_startup_program()
        inner = self.inner_optimizer
        params_grads = inner.backward(loss, startup, parameter_list, no_grad_set)
        with block.program.op_role_guard(OpRole.OPTIMIZE):
            weight = self._weight(block) if self.batch_var is not None else None
            self.buckets = plan_buckets(block, params_grads, self.bucket_size_mb * 2**20)
            insert_allreduce_ops(block, self.buckets, weight)
            for _, grad in params_grads:
                if grad is not None and grad.type == "selected_rows":
                    grad.type = "lod_tensor"  # the all-reduce densifies it
        ops = inner.apply_gradients(params_grads)
        append_startup_sync(startup, block.program, self.buckets, weight is not None)
        return ops, params_grads

    def _weight(self, block: Block) -> VarDesc:
        """Ops computing the rank's batch size (batch_var's first dimension) as a [1] int32,
        placed right after the op writing batch_var (first, for a fed variable)."""
        name = self.batch_var.name if isinstance(self.batch_var, VarDesc) else self.batch_var
        var = block.find_var(name)
        if var is None or var.ndim == 0:
            what = "is not a variable of the loss's program" if var is None else "is 0-d"
            raise AttrError(
                f"DistributedOptimizer: batch_var '{name}' {what}; it must have a batch "
                "dimension first (e.g. the label)"
            )
        index = 1 + max(
            (i for i, op in enumerate(block.ops) if name in op.output_names()), default=-1
        )
        dims = block.create_var(unique_name.generate(f"{name}.shape"), [var.ndim], "int32")
        rows = block.create_var(unique_name.generate(f"{name}.rows"), [1], "int32")
        block.insert_op(index, "shape", {"Input": [var]}, {"Out": [dims]})
        attrs = {"axes": [0], "starts": [0], "ends": [1]}
        block.insert_op(index + 1, "slice", {"Input": [dims]}, {"Out": [rows]}, attrs)
        return rows


def _numel(var: VarDesc) -> int:
    return int(np.prod([max(d, 1) for d in var.shape], dtype=np.int64))


def _last_writers(block: Block) -> dict[str, int]:
    last: dict[str, int] = {}
    for index, op in enumerate(block.ops):
        for name in op.output_names():
            last[name] = index
    return last


def plan_buckets(block: Block, params_grads: ParamsGrads, limit_bytes: float) -> list[Bucket]:
    """The gradients in buckets: taken in the order the ops of `block` finish them (ties in
    params_grads' order), each added to the open bucket of its dtype, which is closed once it
    holds `limit_bytes`."""
    last = _last_writers(block)
    pairs = [(p, g) for p, g in params_grads if g is not None]
    order = sorted(range(len(pairs)), key=lambda k: (last.get(pairs[k][1].name, -1), k))
    buckets: list[Bucket] = []
    open_buckets: dict[str, Bucket] = {}
    for k in order:
        param, grad = pairs[k]
        bucket = open_buckets.get(grad.dtype)
        if bucket is None:
            bucket = open_buckets[grad.dtype] = Bucket(grad.dtype)
            buckets.append(bucket)
        bucket.add(param, grad)
        if bucket.nbytes >= limit_bytes:
            del open_buckets[grad.dtype]
    return buckets


def insert_allreduce_ops(block: Block, buckets: list[Bucket], weight: VarDesc | None) -> None:
    """For each bucket, a c_allreduce_start right after the op writing its last gradient and a
    c_allreduce_wait appended after every op so far (the backward), in bucket order."""
    last = _last_writers(block)
    handles = [
        block.create_var(unique_name.generate("allreduce.bucket"), type="raw", stop_gradient=True)
        for _ in buckets
    ]
    if weight is not None:
        first = min(last.get(g.name, -1) for b in buckets for g in b.grads) if buckets else 0
        if last.get(weight.name, -1) > first:
            raise NestflowError(
                f"DistributedOptimizer: the batch size '{weight.name}' is computed after the "
                "first gradient; batch_var must be a forward variable"
            )
    # From the last insertion point back, so earlier positions stay where they are.
    ready = [max(last.get(g.name, -1) for g in b.grads) + 1 for b in buckets]
    for index in sorted(range(len(buckets)), key=lambda i: ready[i], reverse=True):
        bucket = buckets[index]
        inputs = {"X": bucket.grads, "Param": bucket.params}
        if weight is not None:
            inputs["Weight"] = [weight]
        bucket.start = block.insert_op(
            ready[index], "c_allreduce_start", inputs, {"Out": [handles[index]]}
        )
    for bucket, handle in zip(buckets, handles):
        bucket.wait = block.append_op(
            "c_allreduce_wait", {"Request": [handle], "X": bucket.grads}, {"Out": bucket.grads}
        )


def _synchronised(startup: Program, program: Program) -> list[VarDesc]:
    """The main program's persistable variables the startup program writes, in its order."""
    block = program.global_block()
    found: dict[str, VarDesc] = {}
    for op in startup.global_block().ops:
        for name in op.output_names():
            var = block.find_var(name) if name else None
            if var is not None and var.persistable and name not in found:
                found[name] = var
    return list(found.values())


def layout_text(variables: list[VarDesc], buckets: list[Bucket], weighted: bool) -> str:
    """What a rank synchronises, one line per broadcast variable and per bucket; the ranks'
    texts must be equal (c_check_layout)."""
    lines = []
    for var in variables:
        kind = "param" if var.is_parameter else "state"
        flags = " trainable" if var.is_parameter and var.trainable else ""
        lines.append(f"{kind} {var.name} {var.dtype}{list(var.shape)}{flags}")
    for i, bucket in enumerate(buckets):
        grads = ", ".join(f"{g.name}{list(p.shape)}" for p, g in zip(bucket.params, bucket.grads))
        weight = " weighted" if weighted else ""
        lines.append(f"bucket {i} {bucket.dtype}{weight}: {grads}")
    return "\n".join(lines)


def append_startup_sync(
    startup: Program, program: Program, buckets: list[Bucket], weighted: bool
) -> None:
    """The startup program's check that every rank synchronises the same variables, then a
    broadcast from rank 0 of each of them."""
    block = startup.global_block()
    variables = _synchronised(startup, program)
    digest = block.create_var(unique_name.generate("distributed.layout"), [32], "uint8")
    block.append_op(
        "c_check_layout",
        {},
        {"Out": [digest]},
        {"layout": layout_text(variables, buckets, weighted)},
    )
    for var in variables:
        target = block.find_var(var.name) or block.create_var(
            var.name, var.shape, var.dtype, persistable=True
        )
        block.append_op("c_broadcast", {"X": [target]}, {"Out": [target]}, {"root": 0})


__all__ = ["Bucket", "DistributedOptimizer", "plan_buckets"]
