"""Unique variable names per prefix ("fc_0", "fc_1"), resettable for reproducible programs."""

from __future__ import annotations

import contextlib
import itertools
from collections import defaultdict

_counters: defaultdict[str, itertools.count] = defaultdict(itertools.count)


def generate(prefix: str) -> str:
    return f"{prefix}_{next(_counters[prefix])}"


@contextlib.contextmanager
def guard():
    """Within this block names start from 0 again; the outer counters come back afterwards."""
    global _counters
    saved, _counters = _counters, defaultdict(itertools.count)
    try:
        yield
    finally:
        _counters = saved


def reset() -> None:
    _counters.clear()
