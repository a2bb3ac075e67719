"""The random generator behind random ops (seed=0): the run's own generator while a Program
with a non-zero random_seed runs, else the global one, reseeded by nf.seed(n).

A program's generator is made from its random_seed on the program's first run (and again if
random_seed changes), then advances run after run: the startup program draws the same initial
parameters in any process, and dropout draws a new mask each step, the same sequence each time
the program is built and run again. An op with its own non-zero `seed` attr ignores both.

The run's generator is a context variable set by Executor.run for the length of the run, never
a swap of the module's global: runs on other threads (each thread has its own context) keep
drawing from their own generator, so concurrent runs reproduce their single-threaded draws. A
program without a random_seed shares the global generator with every other such program (two of
them run at once interleave their draws); a seeded program run on two threads at once shares
its one generator the same way.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

# Made on first use: numpy.random costs ~15 ms to import, and many programs draw nothing.
_global: np.random.Generator | None = None

# The generator of the run in progress on this thread (context), None outside seeded runs.
_run: contextvars.ContextVar[np.random.Generator | None] = contextvars.ContextVar(
    "nestflow_run_generator", default=None
)
# Two threads running one seeded program for the first time make its generator once.
_making = threading.Lock()


def seed(value: int) -> None:
    """Make every later random op (seed=0) of programs without a random_seed draw
    deterministically from `value`.

    >>> x = nf.layers.dropout(nf.layers.fill_constant([8], "float32", 1.0), dropout_prob=0.5)
    >>> exe = nf.Executor()
    >>> nf.seed(7); first = exe.run(fetch_list=[x])[0]
    >>> nf.seed(7); again = exe.run(fetch_list=[x])[0]
    >>> bool((first == again).all())
    True
    """
    global _global
    _global = np.random.default_rng(value)


def generator(op_seed: int = 0) -> np.random.Generator:
    """An op's generator: its own fixed seed if it has one, else the run's generator (a seeded
    program's), else the global generator."""
    global _global
    if op_seed:
        return np.random.default_rng(op_seed)
    run = _run.get()
    if run is not None:
        return run
    if _global is None:
        _global = np.random.default_rng(0)
    return _global


def current_generator() -> np.random.Generator | None:
    """The generator the run in progress in this context draws from, None outside a seeded
    run."""
    return _run.get()


@contextlib.contextmanager
def run_generator(rng: np.random.Generator) -> Iterator[None]:
    """Random ops (seed=0) run in this context draw from `rng` until the block ends; the
    previous choice (an enclosing run's) is back afterwards."""
    token = _run.set(rng)
    try:
        yield
    finally:
        _run.reset(token)


def program_rng(program: Any) -> np.random.Generator | None:
    """`program`'s own generator (made from its random_seed on first use and when random_seed
    changes), None when its random_seed is 0."""
    seed_value = getattr(program, "random_seed", 0)
    if not seed_value:
        return None
    made = program.__dict__.get("_random_generator")
    if made is None or made[0] != seed_value:
        with _making:
            made = program.__dict__.get("_random_generator")
            if made is None or made[0] != seed_value:
                made = (seed_value, np.random.default_rng(seed_value))
                program.__dict__["_random_generator"] = made
    return made[1]


@contextlib.contextmanager
def program_generator(program: Any) -> Iterator[None]:
    """While the block runs, random ops (seed=0) in this context draw from `program`'s own
    generator if its random_seed is non-zero; otherwise nothing changes."""
    rng = program_rng(program)
    if rng is None:
        yield
        return
    with run_generator(rng):
        yield
