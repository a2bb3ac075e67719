"""Comparison and logical ops: bool outputs with broadcasting, no gradients.

Each op is a few lines made by a factory: a comparison aligns Y to X by `axis` like the
elementwise ops; a logical op broadcasts its operands by NumPy's rules.
"""

from __future__ import annotations

from nestflow.errors import DTypeError
from nestflow.ops.math import align_y
from nestflow.ops.registry import VarInfo, broadcast_shapes, fail, register_op


def _infer_compare(X: VarInfo, Y: VarInfo, axis: int) -> VarInfo:
    if X.dtype != Y.dtype:
        raise DTypeError(f"X is {X.dtype} but Y is {Y.dtype}; cast one of them to compare")
    y_shape = Y.shape
    if axis >= 0 and Y.ndim < X.ndim:
        if axis + Y.ndim > X.ndim:
            fail(f"axis={axis} puts Y {list(Y.shape)} past the end of X {list(X.shape)}")
        y_shape = Y.shape + (1,) * (X.ndim - axis - Y.ndim)
    return VarInfo(broadcast_shapes(X.shape, y_shape), "bool")


def _comparison(name: str, ufunc: str, doc: str) -> type:
    def forward(X, Y, axis, xp):
        return xp.asarray(getattr(xp, ufunc)(X, align_y(X.ndim, Y, axis)))

    body = {
        "__doc__": doc,
        "inputs": ("X", "Y"),
        "outputs": ("Out",),
        "attrs": {"axis": -1},
        "infer": _infer_compare,
        "forward": forward,
    }
    return register_op(type(name, (), body))


greater_than = _comparison("greater_than", "greater", "Out = X > Y (bool), broadcast.")
less_than = _comparison("less_than", "less", "Out = X < Y (bool), broadcast.")
greater_equal = _comparison("greater_equal", "greater_equal", "Out = X >= Y (bool), broadcast.")
less_equal = _comparison("less_equal", "less_equal", "Out = X <= Y (bool), broadcast.")
equal = _comparison("equal", "equal", "Out = X == Y (bool), broadcast.")
not_equal = _comparison("not_equal", "not_equal", "Out = X != Y (bool), broadcast.")


def _infer_logical(X: VarInfo, Y: VarInfo | None = None) -> VarInfo:
    shape = X.shape if Y is None else broadcast_shapes(X.shape, Y.shape)
    return VarInfo(shape, "bool")


def _logical(name: str, ufunc: str, doc: str, unary: bool = False) -> type:
    if unary:

        def forward(X, xp):
            return xp.asarray(getattr(xp, ufunc)(X))
    else:

        def forward(X, Y, xp):
            return xp.asarray(getattr(xp, ufunc)(X, Y))

    body = {
        "__doc__": doc,
        "inputs": ("X",) if unary else ("X", "Y"),
        "outputs": ("Out",),
        "infer": _infer_logical,
        "forward": forward,
    }
    return register_op(type(name, (), body))


logical_and = _logical("logical_and", "logical_and", "Out = X and Y (bool), broadcast.")
logical_or = _logical("logical_or", "logical_or", "Out = X or Y (bool), broadcast.")
logical_xor = _logical("logical_xor", "logical_xor", "Out = X xor Y (bool), broadcast.")
logical_not = _logical("logical_not", "logical_not", "Out = not X (bool).", unary=True)
