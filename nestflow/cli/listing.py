"""The program listing of `nestflow show`: print(program)'s text, with each op's attributes cut
to those that differ from the op's registered defaults (a conv2d carries some 25 Fluid
hardware and fusion settings, all at their defaults in a program a user built).

>>> from nestflow.cli.listing import program_listing
>>> x = nf.data("x", [-1, 1, 8, 8])
>>> y = nf.layers.conv2d(x, num_filters=4, filter_size=3, stride=2)
>>> print(program_listing(nf.default_main_program()).splitlines()[-3])
  op 0: {Output=['conv2d_0.tmp_0']} = conv2d(Input=['x'], Filter=['conv2d_0.w']) {strides=[2, 2], use_cudnn=True} (+24 attrs at their defaults)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nestflow.framework.program import Block, OpDesc, Program
from nestflow.ops.registry import registered_ops


def _text(value: Any) -> str:
    if isinstance(value, Block):
        return f"block[{value.idx}]"
    if isinstance(value, list) and value and all(isinstance(b, Block) for b in value):
        return "[" + ", ".join(f"block[{b.idx}]" for b in value) + "]"
    return repr(value)


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, Block) or isinstance(default, Block):
        return False
    try:
        return bool(np.array_equal(value, default)) and type(value) is type(default)
    except (TypeError, ValueError):
        return False


def op_line(op: OpDesc, all_attrs: bool = False) -> str:
    """One op as print(program) shows it; unless `all_attrs`, only the attributes that differ
    from its op type's defaults (required ones, sub-blocks and attributes the registry does
    not list, such as op_role, always shown), with the count of those left out."""
    outs = ", ".join(f"{k}={v}" for k, v in op.outputs.items())
    ins = ", ".join(f"{k}={v}" for k, v in op.inputs.items())
    spec = registered_ops().get(op.type)
    shown, hidden = [], 0
    for name, value in sorted(op.attrs.items()):
        attr = spec.attrs.get(name) if spec is not None else None
        if not all_attrs and attr is not None and not attr.required and _same(value, attr.default):
            hidden += 1
            continue
        shown.append(f"{name}={_text(value)}")
    text = f"{{{outs}}} = {op.type}({ins})"
    if shown:
        text += f" {{{', '.join(shown)}}}"
    if hidden:
        text += f" (+{hidden} attr{'s' if hidden != 1 else ''} at their defaults)"
    return text


def program_listing(program: Program, all_attrs: bool = False) -> str:
    """Every block of `program` with its variables and ops (see op_line for `all_attrs`)."""
    lines = []
    for block in program.blocks:
        head = f"block {block.idx}"
        if block.parent_idx >= 0:
            head += f" (parent {block.parent_idx})"
        lines.append(head + " {")
        lines += [f"  var {var!r}" for var in block.vars.values()]
        lines += [f"  op {i}: {op_line(op, all_attrs)}" for i, op in enumerate(block.ops)]
        lines.append("}")
    return "\n".join(lines)
