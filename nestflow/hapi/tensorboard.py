"""`nf.callbacks.TensorBoard`: the training's scalars and the program's graph as TensorBoard
event files, written through tensorboardX (the `tensorboard` extra: pip install
'nestflow[tensorboard]'); `tensorboard --logdir DIR` shows them.

tensorboardX is imported when training starts, not with nestflow, so the callback can be made
(and a script read) without it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from nestflow.hapi.callbacks import Callback, check_count, is_writing_rank


class TensorBoard(Callback):
    """Logs to `log_dir` for TensorBoard: per training step (every `log_freq` steps) the
    running means of the epoch's loss and metrics ("train/loss", "train/acc"; the values the
    progress bar shows) and the learning rate ("train/lr"); per epoch the epoch's means and
    the evaluation's values ("epoch/loss", "epoch/eval_acc", "epoch/lr"); and once, the train
    program's graph (the Graphs tab: forward ops at the top level, gradient ops under
    "backward/", updates under "optimizer/"). Steps count on over fits (a resumed fit goes on
    from the loaded epoch's step). Only the writing rank writes. Without tensorboardX, fit
    stops at its start with a ModuleNotFoundError saying what to install.

    >>> board = nf.callbacks.TensorBoard("runs/digits")  # model.fit(..., callbacks=[board])
    >>> board.log_dir
    'runs/digits'
    """

    def __init__(self, log_dir: str | os.PathLike = "runs", log_freq: int = 1, graph: bool = True):
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self.log_freq = check_count(log_freq, "TensorBoard: log_freq")
        self.graph = bool(graph)
        self.writer: Any = None
        self._step = 0
        self._steps_per_epoch: int | None = None
        self._rate: Any = None  # (program, variable name) computing the learning rate

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not is_writing_rank():
            return
        try:
            from tensorboardX import SummaryWriter
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                "nf.callbacks.TensorBoard writes through tensorboardX: pip install "
                "'nestflow[tensorboard]' (or tensorboardX)"
            ) from None
        self.writer = SummaryWriter(self.log_dir)
        self._steps_per_epoch = self.params.get("steps")
        self._rate = _learning_rate_program(self.model)
        if self.graph:
            _add_graph(self.writer, self.model.train_program)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._steps_per_epoch is not None:  # so a resumed fit goes on where it stopped
            self._step = max(self._step, epoch * self._steps_per_epoch)

    def on_train_batch_end(self, step: int, logs: dict | None = None) -> None:
        if self.writer is not None and step % self.log_freq == 0:
            for key, value in _scalars(logs):
                self.writer.add_scalar(f"train/{key}", value, self._step)
            rate = self._learning_rate()
            if rate is not None:
                self.writer.add_scalar("train/lr", rate, self._step)
        self._step += 1

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.writer is None:
            return
        for key, value in _scalars(logs):
            self.writer.add_scalar(f"epoch/{key}", value, epoch)
        rate = self._learning_rate()
        if rate is not None:
            self.writer.add_scalar("epoch/lr", rate, epoch)
        self.writer.flush()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _learning_rate(self) -> float | None:
        if self._rate is None:
            return None
        program, name = self._rate
        if program is None:  # a fixed rate: a persistable variable of the scope
            found = self.model.scope.find_var(name)
            if found is None:
                return None
            from nestflow.core.tensor import Tensor

            return float(np.asarray(found.get(Tensor).numpy()).reshape(-1)[0])
        (value,) = self.model._executor.run(
            program, fetch_list=[name], scope=self.model.scope, return_numpy=True
        )
        return float(np.asarray(value).reshape(-1)[0])


def _scalars(logs: dict | None):
    for key, value in (logs or {}).items():
        if key not in ("step", "batch_size") and isinstance(value, (int, float, np.number)):
            yield key, float(value)


def _learning_rate_program(model: Any) -> Any:
    """(None, name) for a fixed learning rate the scope holds; (program, name) for a schedule:
    the schedule's ops without the counter's increment, so running it after a step reads the
    rate that step used and advances nothing; None when the model has no optimizer rate."""
    optimizer = getattr(model._prepared, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    rate = getattr(optimizer, "learning_rate_var", None)
    if rate is None:
        return None
    if rate.persistable:
        return None, rate.name
    from nestflow.executor import prune

    program = prune(model.train_program, [rate.name])
    for block in program.blocks:
        block.ops = [op for op in block.ops if op.type != "increment"]
    program._bump()
    return program, rate.name


def _add_graph(writer: Any, program: Any) -> None:
    """The program's global block as a TensorFlow GraphDef (what TensorBoard's graph view
    reads): a node per op, named by its role so that backward and optimizer ops fold into
    groups, and a node per variable no op writes (the feeds and the parameters)."""
    from tensorboardX.proto import event_pb2, graph_pb2, node_def_pb2
    from tensorboardX.proto.attr_value_pb2 import AttrValue

    from nestflow.framework.program import OpRole, op_role

    block = program.global_block()
    graph = graph_pb2.GraphDef()
    made_by: dict[str, str] = {}
    nodes = []
    for i, op in enumerate(block.ops):
        role = op_role(op)
        group = (
            "backward/"
            if role & OpRole.BACKWARD
            else "optimizer/"
            if role & (OpRole.OPTIMIZE | OpRole.LR_SCHED)
            else ""
        )
        name = f"{group}{op.type}_{i}"
        inputs = []
        for var in op.input_names():
            if var not in made_by:
                made_by[var] = f"inputs/{var}"
                desc = block.find_var(var)
                what = "Parameter" if desc is not None and desc.persistable else "Input"
                shape = f"{desc.dtype}{list(desc.shape)}" if desc is not None else "?"
                nodes.append(
                    node_def_pb2.NodeDef(
                        name=made_by[var],
                        op=what,
                        attr={"shape": AttrValue(s=shape.encode())},
                    )
                )
            inputs.append(made_by[var])
        attrs = {"type": AttrValue(s=op.type.encode())}
        if op.source:
            attrs["built_at"] = AttrValue(s=op.source.encode())
        nodes.append(
            node_def_pb2.NodeDef(name=name, op=op.type, input=sorted(set(inputs)), attr=attrs)
        )
        for var in op.output_names():
            made_by[var] = name
    graph.node.extend(nodes)
    # SummaryWriter.add_graph takes PyTorch models; the file writer takes a GraphDef event.
    writer._get_file_writer().add_event(event_pb2.Event(graph_def=graph.SerializeToString()))
