"""Whole-batch conditional: `nf.layers.cond(pred, true_fn, false_fn)` (Fluid 1.7), and the
nested-structure helpers (`flatten`, `pack_sequence_as`, `map_structure`) it and the decoders
use for values that are variables or lists, tuples, namedtuples and dicts of them.

    x = nf.layers.data("x", [-1, 4])
    pred = nf.layers.less_than(nf.layers.reduce_sum(x), zero)     # one bool
    y = nf.layers.cond(pred, lambda: nf.layers.fc(x, 2), lambda: x[:, :2] * 2.0)

How it is built (Fluid 1.7's design): each branch is a sub-block holding what its fn built,
run by a `conditional_block` op, the true one on `pred` and the false one on
`logical_not(pred)`, so exactly one runs, in a kid scope kept for its gradient op; each
returned value is merged by a `select_input` op picking the false (0) or true (1) branch's
value by `cast(pred, "int32")`. Gradients flow to every variable the branch that ran used; a
parameter used by both branches gets its gradient from the one that ran (zeros from the other).

Departure from Fluid: a branch may not write a variable of the enclosing block (Fluid's
`assign(x, output=outer)` inside a branch); return the value and assign the result of cond
instead (ControlFlowError naming the variable otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nestflow.errors import ControlFlowError, DTypeError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import Block, VarDesc, default_main_program
from nestflow.layers.control_flow import _outer_reads, _outer_writes
from nestflow.layers.helper import append_op, current_block, layer_error

# ---- nested structures ----


def _is_nest(value: Any) -> bool:
    return isinstance(value, (list, tuple, dict))


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value[k] for k in sorted(value)]
    return list(value)


def flatten(nest: Any) -> list[Any]:
    """The leaves of `nest` (lists, tuples, namedtuples and dicts, the latter by sorted key),
    depth first; anything else is one leaf."""
    if not _is_nest(nest):
        return [nest]
    return [leaf for child in _children(nest) for leaf in flatten(child)]


def _rebuild(like: Any, children: list[Any]) -> Any:
    if isinstance(like, dict):
        return type(like)(zip(sorted(like), children))
    if isinstance(like, tuple) and hasattr(like, "_fields"):  # a namedtuple
        return type(like)(*children)
    return type(like)(children)


def pack_sequence_as(structure: Any, leaves: list[Any]) -> Any:
    """`leaves` (as many as `structure` has) arranged as `structure`."""
    leaves = list(leaves)

    def pack(like: Any) -> Any:
        if not _is_nest(like):
            return leaves.pop(0)
        return _rebuild(like, [pack(child) for child in _children(like)])

    return pack(structure)


def same_structure(a: Any, b: Any) -> str | None:
    """None if `a` and `b` nest the same way (types of lists/tuples aside), else what differs."""
    if _is_nest(a) != _is_nest(b):
        return f"{_kind(a)} vs {_kind(b)}"
    if not _is_nest(a):
        return None
    if isinstance(a, dict) != isinstance(b, dict):
        return f"{_kind(a)} vs {_kind(b)}"
    if isinstance(a, dict) and sorted(a) != sorted(b):
        return f"dict keys {sorted(a)} vs {sorted(b)}"
    if len(a) != len(b):
        return f"{_kind(a)} of {len(a)} vs {_kind(b)} of {len(b)}"
    for x, y in zip(_children(a), _children(b)):
        problem = same_structure(x, y)
        if problem is not None:
            return problem
    return None


def _kind(value: Any) -> str:
    return type(value).__name__ if _is_nest(value) else "a single value"


def map_structure(fn: Callable, *nests: Any) -> Any:
    """`fn` applied leaf by leaf to nests of one structure (ControlFlowError if they differ),
    arranged as the first."""
    for other in nests[1:]:
        problem = same_structure(nests[0], other)
        if problem is not None:
            raise ControlFlowError(f"map_structure: the structures differ ({problem})")
    flats = [flatten(n) for n in nests]
    return pack_sequence_as(nests[0], [fn(*leaves) for leaves in zip(*flats)])


# ---- cond ----


def _check_pred(pred: Any) -> VarDesc:
    if not isinstance(pred, VarDesc):
        raise layer_error(
            ControlFlowError, "cond", f"pred must be a bool variable, got {type(pred).__name__}"
        )
    if pred.dtype != "bool":
        raise layer_error(
            DTypeError,
            "cond",
            f"pred '{pred.name}' must be bool, but it is {pred.dtype}{list(pred.shape)} (use a "
            f"comparison such as nf.layers.less_than, or nf.layers.cast)",
        )
    if any(d != 1 for d in pred.shape):
        raise layer_error(
            ShapeError,
            "cond",
            f"pred '{pred.name}' has shape {list(pred.shape)}; cond takes one bool for the "
            f"whole batch (shape [] or [1], e.g. from nf.layers.reduce_all); for one branch "
            f"per row use nf.layers.IfElse",
        )
    return pred


class _Branch:
    """One branch: the sub-block its fn built, what the fn returned, and the block's own
    variables holding the returned values."""

    def __init__(self, label: str, fn: Callable, parent: Block, name: str):
        self.label = label
        with default_main_program().block_guard(parent.idx) as block:
            self.block = block
            self.result = fn()
            leaves = [] if self.result is None else flatten(self.result)
            for i, leaf in enumerate(leaves):
                if not isinstance(leaf, VarDesc):
                    raise layer_error(
                        ControlFlowError,
                        "cond",
                        f"cond '{name}': {label} returned {type(leaf).__name__} ({leaf!r}) as "
                        f"value {i}; a branch returns variables (or lists, tuples, dicts of "
                        f"them), or None",
                    )
            # A value made outside the branch is copied in it: every output is the block's own.
            self.inner = [v if v.name in block.vars else _copy(v) for v in leaves]
        writes = _outer_writes(block)
        if writes:
            raise layer_error(
                ControlFlowError,
                "cond",
                f"cond '{name}': {label} writes variable(s) {writes} of the enclosing block; "
                f"return the new value from {label} and assign cond's result instead",
            )

    def append(self, parent: Block, cond: VarDesc, name: str) -> list[VarDesc]:
        """Append the conditional_block op running this branch when `cond` holds."""
        outs = [
            parent.create_var(unique_name.generate(f"{name}.{self.label}.out"), v.shape, v.dtype)
            for v in self.inner
        ]
        scope = parent.create_var(
            unique_name.generate(f"{name}.{self.label}.scope"),
            type="step_scopes",
            stop_gradient=True,
        )
        parent.append_op(
            "conditional_block",
            inputs={"Cond": [cond], "Input": _outer_reads(self.block)},
            outputs={"Out": outs, "Scope": [scope]},
            attrs={
                "sub_block": self.block,
                "is_scalar_condition": True,
                "outs": [v.name for v in self.inner],
            },
        )
        return outs


def _copy(var: VarDesc) -> VarDesc:
    return append_op("assign", {"X": var}, name=var.name)


def _check_outputs(name: str, true: _Branch | None, false: _Branch | None) -> None:
    """ControlFlowError unless both branches return values of one structure, dtypes and
    (where known) shapes, or both return None."""
    results = [b.result if b is not None else None for b in (true, false)]
    if (results[0] is None) != (results[1] is None):
        given, missing = ("true_fn", "false_fn") if results[1] is None else ("false_fn", "true_fn")
        why = "returns None" if (false if results[1] is None else true) else "is not given"
        raise layer_error(
            ControlFlowError,
            "cond",
            f"cond '{name}': {given} returns values but {missing} {why}; both branches must "
            f"return values of one structure",
        )
    if results[0] is None:
        return
    problem = same_structure(results[0], results[1])
    if problem is not None:
        raise layer_error(
            ControlFlowError,
            "cond",
            f"cond '{name}': true_fn and false_fn return different structures ({problem})",
        )
    for i, (t, f) in enumerate(zip(true.inner, false.inner)):
        if t.dtype != f.dtype:
            raise layer_error(
                DTypeError,
                "cond",
                f"cond '{name}': value {i} is {t.dtype} in true_fn but {f.dtype} in false_fn",
            )
        clash = len(t.shape) != len(f.shape) or any(
            a != b and -1 not in (a, b) for a, b in zip(t.shape, f.shape)
        )
        if clash:
            raise layer_error(
                ShapeError,
                "cond",
                f"cond '{name}': value {i} has shape {list(t.shape)} in true_fn but "
                f"{list(f.shape)} in false_fn",
            )


def cond(
    pred: VarDesc,
    true_fn: Callable[[], Any] | None = None,
    false_fn: Callable[[], Any] | None = None,
    name: str | None = None,
) -> Any:
    """`true_fn()` if the scalar bool `pred` holds, else `false_fn()`, for the whole batch.

    Each fn takes no arguments and builds its branch (it may read any outer variable and make
    parameters); both return variables in the same structure (a variable, or lists, tuples,
    namedtuples, dicts of them) with the same dtypes and shapes, or both None (a missing fn
    counts as returning None). Returns the merged values in that structure, or None. Only the
    branch taken runs; gradients flow through it. `pred` is a bool variable of shape [] or
    [1] (e.g. `reduce_all(...)`, `less_than` of [1] values).

    Errors (at the user's line): DTypeError for a non-bool pred, ShapeError for a pred of
    another shape, ControlFlowError/DTypeError/ShapeError for branches whose results differ,
    ControlFlowError for a branch writing an outer variable; at run time a pred fed with more
    than one value is a FeedError (declared [1]) or ControlFlowError.

    >>> import nestflow as nf
    >>> x = nf.layers.data("x", [-1, 3], "float32")
    >>> pred = nf.layers.reduce_all(nf.layers.greater_than(x, x * 0.0))
    >>> nf.layers.cond(pred, lambda: x * 2.0, lambda: x - 1.0).shape
    (-1, 3)
    """
    pred = _check_pred(pred)
    parent = current_block()
    name = name or unique_name.generate("cond")
    for label, fn in (("true_fn", true_fn), ("false_fn", false_fn)):
        if fn is not None and not callable(fn):
            raise layer_error(
                ControlFlowError,
                "cond",
                f"cond '{name}': {label} must be callable (or None), got {type(fn).__name__}",
            )
    true = _Branch("true_fn", true_fn, parent, name) if true_fn is not None else None
    false = _Branch("false_fn", false_fn, parent, name) if false_fn is not None else None
    _check_outputs(name, true, false)
    true_outs = true.append(parent, pred, name) if true is not None else None
    false_outs = None
    if false is not None:
        not_pred = append_op("logical_not", {"X": pred}, name=f"{name}.not", stop_gradient=True)
        false_outs = false.append(parent, not_pred, name)
    if true is None or true.result is None:
        return None
    mask = append_op("cast", {"X": pred}, {"out_dtype": "int32"}, name=f"{name}.mask")
    merged = [
        append_op("select_input", {"X": [f, t], "Mask": mask}, name=f"{name}.out")
        for f, t in zip(false_outs, true_outs)
    ]
    return pack_sequence_as(true.result, merged)


__all__ = ["cond"]
