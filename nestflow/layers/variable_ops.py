"""`+ - * / @` and unary minus on build-time variables append the matching ops.

Installed onto VarDesc here because the framework layer, which defines VarDesc, sits below
the ops and layers that these operators append.
"""

from __future__ import annotations

from nestflow.framework.program import VarDesc
from nestflow.layers import nn

_NUMBER = (int, float)


def _add(x, y):
    return nn.scale(x, 1.0, float(y)) if isinstance(y, _NUMBER) else nn.elementwise_add(x, y)


def _sub(x, y):
    return nn.scale(x, 1.0, -float(y)) if isinstance(y, _NUMBER) else nn.elementwise_sub(x, y)


def _rsub(x, y):
    return nn.scale(x, -1.0, float(y)) if isinstance(y, _NUMBER) else nn.elementwise_sub(y, x)


def _mul(x, y):
    return nn.scale(x, float(y)) if isinstance(y, _NUMBER) else nn.elementwise_mul(x, y)


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
