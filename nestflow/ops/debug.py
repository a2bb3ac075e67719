"""print: show a variable's value while the program runs, and its gradient in the backward pass.

The op passes its input through (In -> Out), so later ops that read Out run after it. It is
scope-aware (`run(ctx)`) because it prints the variable's name, which a pure kernel never sees.
Its gradient op `print_grad` passes Out@GRAD through to In@GRAD the same way, printing it when
`print_phase` asks for the backward pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nestflow.core.device_context import array_module
from nestflow.errors import AttrError
from nestflow.framework.program import OpDesc
from nestflow.ops.registry import GradContext, GradOpSpec, VarInfo, register_op

_PHASES = ("forward", "backward", "both")
_ATTRS = {"message": "", "summarize": 20, "print_phase": "both"}


def format_value(name: str, value: Any, message: str = "", summarize: int = 20) -> str:
    """The text `print` shows: message, variable name, shape, dtype and the first `summarize`
    values in row-major order (-1: all of them): only those are read from a device."""
    lines = [f"{message} Variable: {name}" if message else f"Variable: {name}"]
    if isinstance(value, np.ndarray) or array_module(value) is not np:
        flat = value.reshape(-1)
        shown = flat if summarize < 0 else flat[:summarize]
        more = " ..." if shown.size < flat.size else ""
        lines += [
            f"  - shape: {list(value.shape)}",
            f"  - dtype: {value.dtype}",
            f"  - data: {shown.tolist()}{more}",
        ]
    else:
        lines.append(f"  - value: {value!r}")
    return "\n".join(lines)


def _infer(In: VarInfo, message: str, summarize: int, print_phase: str) -> VarInfo:
    if print_phase not in _PHASES:
        raise AttrError(f"print_phase must be one of {list(_PHASES)}, got '{print_phase}'")
    return In


def _print_and_pass(ctx, phases: tuple[str, ...]) -> None:
    value = ctx.input("In")
    attrs = ctx.attrs
    if attrs["print_phase"] in phases:
        name = ctx.op.input("In")[0]
        print(format_value(name, value, attrs["message"], attrs["summarize"]))
    ctx.set_output("Out", value)


@register_op
class print_:
    """Out = In, printing In (see `format_value`) when print_phase is "forward" or "both"."""

    type = "print"
    inputs, outputs = ("In",), ("Out",)
    attrs = dict(_ATTRS)
    infer = _infer

    def run(ctx) -> None:
        _print_and_pass(ctx, ("forward", "both"))

    def grad_maker(op: OpDesc, ctx: GradContext) -> list[GradOpSpec]:
        out_grad = ctx.grad_of(op.output("Out")[0])
        in_grad = ctx.grad_of(op.input("In")[0])
        if out_grad is None or in_grad is None:
            return []
        return [GradOpSpec("print_grad", {"In": [out_grad]}, {"Out": [in_grad]}, dict(op.attrs))]


@register_op
class print_grad:
    """The gradient of print: Out (In@GRAD of print) = In (Out@GRAD of print), printed when
    print_phase is "backward" or "both"."""

    inputs, outputs = ("In",), ("Out",)
    attrs = dict(_ATTRS)
    infer = _infer

    def run(ctx) -> None:
        _print_and_pass(ctx, ("backward", "both"))
