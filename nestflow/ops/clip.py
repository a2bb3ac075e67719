"""Ops that shape gradients between backward and the update: clip_by_norm,
clip_by_global_norm, `sign` (L1Decay's decay term) and selected_rows_decay (a sparse
gradient's decay term); clipping by value is the `clip` op. The clips take a SelectedRows
gradient as Fluid does: its rows merged, the norm that of the dense tensor it stands for.

They act on gradients, so none has a gradient of its own. clip_by_norm is Fluid's op; the
global-norm clip is one op over all gradients (Fluid builds it from square, reduce_sum, sums,
sqrt and elementwise ops) with Fluid's formula.
"""

from __future__ import annotations

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.core.selected_rows import SelectedRows
from nestflow.errors import AttrError, DTypeError
from nestflow.ops.registry import Required, VarInfo, register_op


def _floating(name: str, info: VarInfo) -> VarInfo:
    if not is_floating(info.dtype):
        raise DTypeError(f"{name} must be floating point, got {info.dtype}")
    return info


def _squared_norm(x, xp):
    """The sum of the squares of all of x's elements, in float64 (0-d, on x's place)."""
    flat = xp.asarray(x, np.float64).ravel()
    return xp.dot(flat, flat)


def _merged(x):
    """A SelectedRows with each row once (so its values' norm is the dense tensor's)."""
    return x.merged() if isinstance(x, SelectedRows) else x


def _scaled(x, scale, xp):
    """x * scale, a SelectedRows keeping its rows."""
    if isinstance(x, SelectedRows):
        values = xp.asarray(x.values * scale.astype(x.dtype))
        return SelectedRows(x.rows, values, x.height, check=False)
    return xp.asarray(x * scale.astype(x.dtype))


@register_op
class clip_by_norm:
    """Out = X * max_norm / ||X|| when the L2 norm ||X|| of all of X exceeds max_norm, else X
    (Fluid's clip_by_norm)."""

    inputs, outputs = ("X",), ("Out",)
    attrs = {"max_norm": Required(float)}

    def infer(X, max_norm):
        if not max_norm > 0:
            raise AttrError(f"max_norm must be > 0, got {max_norm}")
        return _floating("X", X)

    def forward(X, max_norm, xp):
        # max_norm / max(norm, max_norm): 1 (X unchanged) unless the norm exceeds max_norm, NaN
        # for a NaN norm; computed on X's place, never read on the host
        X = _merged(X)
        norm = xp.sqrt(_squared_norm(X.values if isinstance(X, SelectedRows) else X, xp))
        scale = max_norm / xp.maximum(norm, max_norm)
        return _scaled(X, scale, xp)


@register_op
class clip_by_global_norm:
    """Out[i] = X[i] * max_global_norm / max(global_norm, max_global_norm), global_norm being
    the L2 norm of all the X[i] together (Fluid's GradientClipByGlobalNorm)."""

    inputs, outputs = ("X*",), ("Out*",)
    attrs = {"max_global_norm": Required(float)}

    def infer(X, max_global_norm):
        if not max_global_norm > 0:
            raise AttrError(f"max_global_norm must be > 0, got {max_global_norm}")
        return [_floating(f"X[{i}]", x) for i, x in enumerate(X)]

    def forward(X, max_global_norm, xp):
        X = [_merged(x) for x in X]
        dense = [x.values if isinstance(x, SelectedRows) else x for x in X]
        total = xp.sqrt(sum(_squared_norm(x, xp) for x in dense))
        scale = max_global_norm / xp.maximum(total, max_global_norm)
        return [_scaled(x, scale, xp) for x in X]


@register_op
class selected_rows_decay:
    """Out = the SelectedRows of Grad's rows (repeats kept) holding coeff * Param[rows], or
    coeff * sign(Param[rows]) with `l1`: L2Decay/L1Decay's term for a sparse gradient, which
    Fluid builds from extract_rows, lookup_table and scale."""

    inputs, outputs = ("Param", "Grad"), ("Out",)
    attrs = {"coeff": 0.0, "l1": False}

    def infer(Param, Grad, coeff, l1):
        return _floating("Param", Param)

    def forward(Param, Grad, coeff, l1, xp):
        picked = Param[Grad.rows]
        if l1:
            picked = xp.sign(picked)
        values = xp.asarray(picked * xp.asarray(coeff, Param.dtype), Param.dtype)
        return SelectedRows(Grad.rows, values, Param.shape[0], check=False)


@register_op
class sign:
    """Out = sign(X): -1, 0 or 1 (Fluid's sign; L1Decay's term is coeff * sign(param))."""

    inputs, outputs = ("X",), ("Out",)

    def infer(X):
        return _floating("X", X)

    def forward(X, xp):
        return xp.asarray(xp.sign(X))
