"""The random generator behind random ops (seed=0): the global one, reseeded by nf.seed(n), or
while a Program with a non-zero random_seed runs, that program's own generator.

A program's generator is made from its random_seed on the program's first run (and again if
random_seed changes), then advances run after run: the startup program draws the same initial
parameters in any process, and dropout draws a new mask each step, the same sequence each time
the program is built and run again. An op with its own non-zero `seed` attr ignores both."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

# Made on first use: numpy.random costs ~15 ms to import, and many programs draw nothing.
_global: np.random.Generator | None = None


def seed(value: int) -> None:
    """Make every later random op (seed=0) draw deterministically from `value`."""
    global _global
    _global = np.random.default_rng(value)


def generator(op_seed: int = 0) -> np.random.Generator:
    """An op's generator: its own fixed seed if it has one, else the global generator."""
    global _global
    if op_seed:
        return np.random.default_rng(op_seed)
    if _global is None:
        _global = np.random.default_rng(0)
    return _global


@contextlib.contextmanager
def program_generator(program: Any) -> Iterator[None]:
    """While the block runs, random ops (seed=0) draw from `program`'s own generator if its
    random_seed is non-zero; otherwise nothing changes."""
    global _global
    seed_value = getattr(program, "random_seed", 0)
    if not seed_value:
        yield
        return
    made = program.__dict__.get("_random_generator")
    if made is None or made[0] != seed_value:
        made = program._random_generator = (seed_value, np.random.default_rng(seed_value))
    saved, _global = _global, made[1]
    try:
        yield
    finally:
        _global = saved
