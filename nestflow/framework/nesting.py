"""How deep a program's sub-blocks nest, and room on the Python stack to run that deep.

Running or differentiating a program recurses once per level of sub-block nesting (a
control-flow op runs its sub-block, whose ops run theirs...), a handful of Python frames per
level: Python's default recursion limit (1000 frames) stops at about 160 levels. `stack_room`
raises the limit for as long as a deeper program needs it and puts it back afterwards. Since
CPython 3.11 a call from Python code to Python code takes no C stack, so the frames it allows
cost heap memory only; MAX_NESTING bounds them anyway (a deeper program is a
ControlFlowError, not a crash).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from nestflow.errors import ControlFlowError
from nestflow.framework.program import Block, Program

# The deepest nesting of sub-blocks a program may have to be run or differentiated.
MAX_NESTING = 5000
# Python frames one level of nesting may take while running (measured: 6-8) or differentiating
# (4-6), with room to spare.
FRAMES_PER_LEVEL = 16
# Frames for what runs above the outermost block and inside the innermost one (kernels,
# NumPy's Python code, error handling).
_HEADROOM = 300

_lock = threading.Lock()
_holders = 0  # stack_room blocks active now (in any thread)
_limit_before = 0  # the recursion limit before the first of them raised it


def nesting_depth(program: Program, block: Block | None = None) -> int:
    """The number of blocks on the longest chain of sub-block references starting at `block`
    (default: the global block): 1 for a block running no sub-block. Computed once per
    program version, in one pass (references go from lower to higher block indices)."""
    cached = program.__dict__.get("_nesting_depths")
    if cached is None or cached[0] != program.version:
        blocks = program.blocks
        depths = [1] * len(blocks)
        for outer in reversed(blocks):
            deepest = 1
            for op in outer.ops:
                for sub in op.sub_blocks():
                    if outer.idx < sub.idx < len(blocks):
                        deepest = max(deepest, 1 + depths[sub.idx])
            depths[outer.idx] = deepest
        cached = program.__dict__["_nesting_depths"] = (program.version, depths)
    return cached[1][0 if block is None else block.idx]


def _frames_in_use() -> int:
    frame, count = sys._getframe(1), 0
    while frame is not None:
        frame, count = frame.f_back, count + 1
    return count


def hold_stack_room(levels: int, what: str) -> bool:
    """Raise Python's recursion limit to leave room for `levels` levels of nested sub-blocks
    below the caller; True if the caller must call release_stack_room() when done (the
    common shallow case needs nothing and returns False). ControlFlowError (naming `what`)
    past MAX_NESTING.

    The limit is process-wide: while any thread holds room it stays at the highest any of
    them asked for, and the last one to release it puts back the limit found by the first."""
    global _holders, _limit_before
    frames = levels * FRAMES_PER_LEVEL + _HEADROOM
    if frames < 600:  # fits under the default limit
        return False
    if levels > MAX_NESTING:
        raise ControlFlowError(
            f"{what} nests sub-blocks {levels} deep; nestflow runs at most {MAX_NESTING} "
            f"(nestflow.framework.nesting.MAX_NESTING)"
        )
    need = _frames_in_use() + frames
    with _lock:
        if _holders == 0:
            _limit_before = sys.getrecursionlimit()
        _holders += 1
        if need > sys.getrecursionlimit():
            sys.setrecursionlimit(need)
    return True


def release_stack_room() -> None:
    """Give back room taken by hold_stack_room (called once per True it returned)."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0:
            sys.setrecursionlimit(_limit_before)


@contextlib.contextmanager
def stack_room(levels: int, what: str) -> Iterator[None]:
    """hold_stack_room for the duration of a `with` block."""
    held = hold_stack_room(levels, what)
    try:
        yield
    finally:
        if held:
            release_stack_room()


__all__ = ["MAX_NESTING", "hold_stack_room", "nesting_depth", "release_stack_room", "stack_room"]
