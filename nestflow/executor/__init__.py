"""Running program descriptions: Executor, plans, and (later) Net/PlainNet, backward, prune."""

from nestflow.executor.executor import Executor, global_scope

__all__ = ["Executor", "global_scope"]
