"""Running program descriptions: Executor, plans, and (later) Net/PlainNet, backward, prune."""

from nestflow.executor.backward import append_backward, gradients
from nestflow.executor.executor import Executor, global_scope
from nestflow.executor.net import Net, NetBuilder, PlainNet
from nestflow.executor.prune import prune

__all__ = [
    "Executor",
    "append_backward",
    "gradients",
    "Net",
    "NetBuilder",
    "PlainNet",
    "global_scope",
    "prune",
]
