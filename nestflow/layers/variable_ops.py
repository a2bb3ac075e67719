"""`+ - * / @ **`, comparisons (`> >= < <=`, bool results), `abs()`, unary minus and Python
indexing (`x[1:3, :, 0]`, `x[::-1]`, `x[..., None]`) on build-time variables append the
matching ops.

Installed onto VarDesc here because the framework layer, which defines VarDesc, sits below
the ops and layers that these operators append.
"""

from __future__ import annotations

import builtins
import numbers
from typing import Any

from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.framework.program import VarDesc
from nestflow.layers import nn
from nestflow.layers.helper import append_op

_NUMBER = (int, float)


def _add(x, y):
    return nn.scale(x, 1.0, float(y)) if isinstance(y, _NUMBER) else nn.elementwise_add(x, y)


def _sub(x, y):
    return nn.scale(x, 1.0, -float(y)) if isinstance(y, _NUMBER) else nn.elementwise_sub(x, y)


def _rsub(x, y):
    return nn.scale(x, -1.0, float(y)) if isinstance(y, _NUMBER) else nn.elementwise_sub(y, x)


def _mul(x, y):
    return nn.scale(x, float(y)) if isinstance(y, _NUMBER) else nn.elementwise_mul(x, y)


def _pow(x, y):
    if isinstance(y, _NUMBER):
        return append_op("pow", {"X": x}, {"factor": float(y)})
    return nn._binary("elementwise_pow", x, y)


def _rpow(x, y):
    return nn._binary("elementwise_pow", nn.fill_constant([1], x.dtype, y), x)


def _div(x, y):
    if isinstance(y, _NUMBER) and y != 0:
        return nn.scale(x, 1.0 / float(y))
    if isinstance(y, _NUMBER):  # x / 0: NumPy's inf/nan at run time, not a ZeroDivisionError
        y = nn.fill_constant([1], x.dtype, y)
    return nn.elementwise_div(x, y)


def _rdiv(x, y):
    if isinstance(y, _NUMBER):
        y = nn.fill_constant([1], x.dtype, y)
    return nn.elementwise_div(y, x)


# An omitted stop (start, for a negative step): past the end of any dim. Fluid's slice attrs are
# int32, so the largest int32; Python's slicing clamps it to the dim.
_PAST_END = 2**31 - 1
# An omitted stop with a negative step: strided_slice reads an end of -1 as "through index 0".
_THROUGH_FIRST = -1


def _show(item: Any) -> str:
    parts = item if isinstance(item, tuple) else (item,)
    shown = []
    for part in parts:
        if isinstance(part, builtins.slice):
            text = ":".join("" if v is None else str(v) for v in (part.start, part.stop))
            shown.append(text if part.step is None else f"{text}:{part.step}")
        else:
            shown.append("..." if part is Ellipsis else repr(part))
    return ", ".join(shown)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_items(x: VarDesc, item: Any, items: tuple) -> tuple:
    """`items` with the ellipsis expanded; errors for what build-time indexing cannot do."""
    where = f"'{x.name}' {list(x.shape)}[{_show(item)}]"
    for part in items:
        if part is None or part is Ellipsis or _is_int(part):
            continue
        if isinstance(part, builtins.slice):
            for bound in (part.start, part.stop, part.step):
                if bound is not None and not _is_int(bound):
                    raise DTypeError(f"{where}: slice bound {bound!r} is not an int")
            if part.step == 0:
                raise AttrError(f"{where}: a slice step cannot be 0")
            continue
        kind = "a variable" if isinstance(part, VarDesc) else f"a {type(part).__name__}"
        raise DTypeError(
            f"{where}: index {part!r} is {kind}; indexes are ints, slices, None and ... "
            "(select by a tensor of indexes with nf.layers.gather / gather_nd / where)"
        )
    if sum(1 for part in items if part is Ellipsis) > 1:
        raise ShapeError(f"{where}: an index can hold only one ellipsis (...)")
    used = sum(1 for part in items if part is not None and part is not Ellipsis)
    if used > x.ndim:
        raise ShapeError(f"{where}: too many indices ({used}) for a variable of rank {x.ndim}")
    at = next((i for i, part in enumerate(items) if part is Ellipsis), len(items))
    fill = (builtins.slice(None),) * (x.ndim - used)
    return items[:at] + fill + items[at + 1 :]


def _slice_bounds(part: builtins.slice, size: int) -> tuple[int, int, int] | None:
    """(start, end, stride) attrs for a slice of a dim of `size` (-1: unknown); None for `:`."""
    step = 1 if part.step is None else part.step
    if part.start is None and part.stop is None and step == 1:
        return None
    if step > 0:
        start = 0 if part.start is None else part.start
        return start, _PAST_END if part.stop is None else part.stop, step
    start = _PAST_END if part.start is None else part.start
    stop = part.stop
    if stop is None:
        return start, _THROUGH_FIRST, step
    if stop < 0 and size >= 0:  # resolve now: -1 must not read as "through index 0"
        stop = max(stop + size, _THROUGH_FIRST)
    elif stop == -1:  # Python's "down to the last element": nothing, whatever the size
        return 0, 0, step
    return start, stop, step


def _getitem(x: VarDesc, item: Any) -> VarDesc:
    """x[item] as slice / strided_slice ops (ints drop their dim) and an unsqueeze2 for each
    None; gradients flow through them. ShapeError for an int outside a known dim or too many
    indices, DTypeError for an index that is not an int, slice, None or ...."""
    items = _check_items(x, item, item if isinstance(item, tuple) else (item,))
    axes, starts, ends, strides, decrease, inserted = [], [], [], [], [], []
    dim = out_dim = 0
    for part in items:
        if part is None:
            inserted.append(out_dim)
            out_dim += 1
            continue
        size = x.shape[dim]
        if isinstance(part, builtins.slice):
            bounds = _slice_bounds(part, size)
            out_dim += 1
        else:
            index = int(part)
            if size >= 0 and not -size <= index < size:
                raise ShapeError(
                    f"'{x.name}' {list(x.shape)}[{_show(item)}]: index {index} is out of range "
                    f"for dim {dim} of size {size}"
                )
            if size >= 0:
                index %= size
            bounds = (index, _PAST_END if index == -1 else index + 1, 1)
            decrease.append(dim)
        if bounds is not None:
            axes.append(dim)
            starts.append(bounds[0])
            ends.append(bounds[1])
            strides.append(bounds[2])
        dim += 1
    out = x
    if axes:
        attrs = {"axes": axes, "starts": starts, "ends": ends, "decrease_axis": decrease}
        if all(s == 1 for s in strides):
            out = append_op("slice", {"Input": x}, attrs)
        else:
            out = append_op("strided_slice", {"Input": x}, dict(attrs, strides=strides))
    if inserted:
        out, _ = append_op("unsqueeze2", {"X": out}, {"axes": inserted}, outputs=("Out", "XShape"))
    return out


def _iter(x: VarDesc):
    raise DTypeError(
        f"variable '{x.name}' {list(x.shape)} cannot be iterated while the program is built "
        "(its values exist only when it runs): index it (x[0]) or use nf.layers.unstack"
    )


def install() -> None:
    VarDesc.__add__ = _add
    VarDesc.__radd__ = _add
    VarDesc.__sub__ = _sub
    VarDesc.__rsub__ = _rsub
    VarDesc.__mul__ = _mul
    VarDesc.__rmul__ = _mul
    VarDesc.__truediv__ = _div
    VarDesc.__rtruediv__ = _rdiv
    VarDesc.__matmul__ = nn.matmul
    VarDesc.__neg__ = lambda x: nn.scale(x, -1.0)
    VarDesc.__pow__ = _pow
    VarDesc.__rpow__ = _rpow
    VarDesc.__abs__ = lambda x: append_op("abs", {"X": x})
    # == and != stay Python's identity tests: variables are dict keys and set members.
    VarDesc.__gt__ = lambda x, y: nn._compare("greater_than", x, y, None, None)
    VarDesc.__ge__ = lambda x, y: nn._compare("greater_equal", x, y, None, None)
    VarDesc.__lt__ = lambda x, y: nn._compare("less_than", x, y, None, None)
    VarDesc.__le__ = lambda x, y: nn._compare("less_equal", x, y, None, None)
    VarDesc.__getitem__ = _getitem
    # Without __iter__, Python would iterate by calling __getitem__ with 0, 1, 2, ... and, on
    # a dim of unknown size, append slice ops forever.
    VarDesc.__iter__ = _iter
