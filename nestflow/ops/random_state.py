"""The global random generator behind random ops, reseeded by nf.seed(n)."""

from __future__ import annotations

import numpy as np

_global = np.random.default_rng(0)


def seed(value: int) -> None:
    """Make every later random op (seed=0) draw deterministically from `value`."""
    global _global
    _global = np.random.default_rng(value)


def generator(op_seed: int = 0) -> np.random.Generator:
    """An op's generator: its own fixed seed if it has one, else the global generator."""
    return np.random.default_rng(op_seed) if op_seed else _global
