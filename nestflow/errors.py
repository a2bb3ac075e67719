"""Errors nestflow raises: each says what went wrong, where (op, block, source line) and why.

Every class derives from :class:`NestflowError`; where a builtin exception means the same thing
(TypeError, ValueError, KeyError) the class derives from it too, so generic handlers still work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class OpLocation:
    """Where an op lives and who built it; attached to every op-related error."""

    op_type: str
    op_index: int = -1
    block_idx: int = 0
    source: str = ""
    inputs: Mapping[str, list[str]] = field(default_factory=dict)
    outputs: Mapping[str, list[str]] = field(default_factory=dict)

    def describe(self) -> str:
        where = f"op '{self.op_type}'"
        if self.op_index >= 0:
            where += f" (#{self.op_index} in block {self.block_idx})"
        slots = []
        for kind, mapping in (("inputs", self.inputs), ("outputs", self.outputs)):
            if mapping:
                slots.append(f"{kind} {dict(mapping)}")
        lines = [where + (", " + "; ".join(slots) if slots else "")]
        if self.source:
            lines.append(f"  built at {self.source}")
        return "\n".join(lines)


class NestflowError(Exception):
    """Base of every error nestflow raises on purpose."""

    def __init__(self, message: str, *, location: OpLocation | None = None):
        self.message = message
        self.location = location
        full = message if location is None else f"{location.describe()}: {message}"
        super().__init__(full)


class ScopeDestroyedError(NestflowError, RuntimeError):
    """A Scope or Variable was used after its scope was destroyed (seed 001's weak pointers)."""


class TypeMismatchError(NestflowError, TypeError):
    """A Variable was asked for a type other than the one it holds."""


class UninitializedError(NestflowError, RuntimeError):
    """A Variable holds nothing yet, or a Tensor has no memory yet."""


class PlaceError(NestflowError, RuntimeError):
    """A place that cannot be used here (no CuPy, no CUDA driver, no such device), or a value
    that lives on another place than the one asked for."""


class ShapeError(NestflowError, ValueError):
    """Shapes of an op's inputs do not fit together (found at build time or run time)."""


class DTypeError(NestflowError, TypeError):
    """An op got a dtype it does not accept."""


class AttrError(NestflowError, ValueError):
    """An op attribute is unknown, missing or of the wrong type."""


class UnknownOpError(NestflowError, KeyError):
    """No operator of this type is registered."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.args[0] if self.args else ""


class UnknownNameError(NestflowError, AttributeError):
    """A name asked of a nestflow module (e.g. `nf.layers.conv3d`) that it does not have; the
    message suggests the closest names. Also an AttributeError, so hasattr() keeps working."""


class ProgramDecodeError(NestflowError, ValueError):
    """Bytes that should hold a ProgramDesc do not parse, or describe an invalid program."""


class FeedError(NestflowError, ValueError):
    """A feed is missing, unknown, or of the wrong shape or dtype."""


class FetchError(NestflowError, KeyError):
    """A fetch target does not exist after the run."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


class ExecutionError(NestflowError, RuntimeError):
    """An op failed while running; the message names the op and its inputs' shapes."""


class NanInfError(ExecutionError):
    """A NaN or Inf where none may be: an op's output or a feed while check_nan_inf is on, or
    the loss of a `Model.fit` step (its NaN guard)."""


class ControlFlowError(NestflowError, ValueError):
    """A control-flow construct (IfElse, RNN, While) is used wrongly."""


class MaxStepsExceededError(ExecutionError):
    """A While loop ran past its max_steps guard."""


class ParameterFileError(NestflowError, ValueError):
    """A parameter file is unreadable or does not match the program (missing, extra, misshaped)."""


class FileWriteError(NestflowError, OSError):
    """A file could not be written (a parameter file, a saved model); what was there before is
    left as it was."""


def suggest_names(name: str, known) -> str:
    """' (did you mean a, b?)' for the names of `known` closest to `name`, or ''."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
