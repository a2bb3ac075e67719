"""Running program descriptions: Executor, plans, Net/PlainNet, backward, prune (nf.NetBuilder,
which builds nets with nf.layers, is frontend: nestflow.layers.net_builder)."""

from nestflow.executor.backward import append_backward, gradients
from nestflow.executor.cuda_graph import ExecutionStrategy
from nestflow.executor.executor import Executor, global_scope
from nestflow.executor.net import Net, PlainNet
from nestflow.executor.prune import prune

__all__ = [
    "ExecutionStrategy",
    "Executor",
    "append_backward",
    "gradients",
    "Net",
    "PlainNet",
    "global_scope",
    "prune",
]
