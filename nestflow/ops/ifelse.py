"""ifelse: per-row two-way branching over a minibatch (seed 002's IfElseOp), and its gradient.

Rows where the [N, 1] (or [N]) bool condition holds run the true block, the others the false
block; each block runs in its own kid scope of the scope the op runs in, with the batch inputs
("X") split by the condition and bound under their outer names, while whole inputs ("Params":
parameters, non-batch variables) are read through the frame chain. Branch outputs are merged
back in the original row order. The kid scopes are kept (output "Scopes") so `ifelse_grad` can
run each branch's gradient block where the branch ran.

A branch that receives no rows is skipped (forward and backward) unless the whole batch is
empty, in which case both branches run on zero rows so the outputs get their real shapes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nestflow.core.device_context import array_module
from nestflow.errors import ControlFlowError
from nestflow.framework.program import GRAD_SUFFIX, Block, OpDesc
from nestflow.ops.registry import GradContext, GradOpSpec, register_op


def row_mask(cond: Any, op_name: str = "ifelse") -> np.ndarray:
    """The condition as a 1-D bool row mask; ControlFlowError unless it is bool [N, 1] or [N]."""
    if not isinstance(cond, array_module(cond).ndarray) or cond.dtype != np.bool_:
        kind = getattr(cond, "dtype", type(cond).__name__)
        raise ControlFlowError(f"{op_name}: the condition must be a bool array, got {kind}")
    if cond.ndim == 1 or (cond.ndim == 2 and cond.shape[1] == 1):
        return cond.reshape(-1)
    raise ControlFlowError(
        f"{op_name}: the condition must have shape [N, 1] or [N], got {list(cond.shape)}"
    )


def branch_rows(mask: Any) -> tuple[Any, Any]:
    """The row indices where `mask` holds and where it does not (taking rows by index is
    several times faster than by a bool mask, and the indices serve every input). On a device
    the counts are read on the host: the per-row split's shapes depend on the condition."""
    xp = array_module(mask)
    return xp.flatnonzero(mask), xp.flatnonzero(~mask)


def scope_array(scope, name: str) -> Any:
    """The value a kept step scope holds for `name` (a Tensor's array, or the raw value)."""
    return scope._local_value(name)


def store_step(frame, scope, bound: dict[str, Any]) -> None:
    """Keep the block's own variables and the values bound for this step in `scope`."""
    scope._hold(step_slots(frame.plan, bound), frame.env)  # frame.store_in_scope(scope, slots)


def step_slots(plan, bound) -> dict[str, int]:
    """The name -> env slot map of what a step scope keeps: the block's own variables and the
    names bound for the step. One map per block and bound names, shared by every step scope
    (a StepRunner reading kept values relies on that)."""
    cache = plan.__dict__.setdefault("_step_slots", {})
    key = tuple(bound)
    slots = cache.get(key)
    if slots is None:
        declared = [n for n in plan.names if n in plan.block.vars]
        names = declared + [n for n in bound if n not in declared and n in plan.slot_of]
        slots = cache[key] = {n: plan.slot_of[n] for n in names}
    return slots


class GradSum:
    """A gradient summed over the steps of a control-flow op. The first step's gradient is
    kept as it is (it may be a value another op still holds); the second makes a new array,
    which the later ones are added into in place (same shape and dtype: the result is what
    out-of-place sums give)."""

    __slots__ = ("value", "_owned")

    def __init__(self):
        self.value: Any = None
        self._owned = False

    def add(self, grad: Any) -> None:
        total = self.value
        if total is None:
            self.value = grad
        elif (
            self._owned
            and type(grad) is np.ndarray
            and grad.shape == total.shape
            and grad.dtype == total.dtype
        ):
            np.add(total, grad, out=total)
        else:
            total = self.value = total + grad
            self._owned = type(total) is np.ndarray


def check_block_attrs(*names: str, optional: tuple[str, ...] = ()):
    """An infer_op for a control-flow op: AttrError unless each attribute of `names` holds a
    sub-block (and each of `optional` one or nothing), when the op is appended or loaded."""

    def infer_op(op: OpDesc) -> None:
        for name in names:
            op.block_attr(name)
        for name in optional:
            op.block_attr(name, optional=True)

    return infer_op


def _branch_value(frame, bound: dict[str, Any], name: str) -> Any:
    if name in bound:
        return bound[name]
    return frame.lookup(name)


@register_op
class ifelse:
    """Out[i] = rows of the true block's outputs where Cond holds, else the false block's.

    Attrs: the two blocks, and the names each block outputs (same count, same dtypes).
    """

    inputs = ("Cond", "X*", "Params*")
    outputs = ("Out*", "Scopes")
    attrs = {"true_block": None, "false_block": None, "true_outs": [], "false_outs": []}
    output_attrs = {"Out": ("true_outs", "false_outs")}
    no_grad_inputs = ("Cond",)
    infer_op = check_block_attrs("true_block", "false_block")

    def run(ctx):
        op = ctx.op
        xp = ctx.device.xp
        mask = row_mask(ctx.input("Cond"))
        n = mask.shape[0]
        names = op.input("X")
        batch = ctx.inputs("X")
        for name, value in zip(names, batch):
            if not isinstance(value, xp.ndarray) or value.ndim == 0 or value.shape[0] != n:
                shape = list(getattr(value, "shape", []))
                raise ControlFlowError(
                    f"batch input '{name}' has shape {shape} but the condition has {n} rows; "
                    f"a variable whose first dim is -1 is split by row in a branch (use a "
                    f"variable with a known first dim to pass it whole)"
                )
        attrs = ctx.attrs
        true_rows, false_rows = branch_rows(mask)
        branches = (
            (attrs["true_block"], attrs["true_outs"], true_rows),
            (attrs["false_block"], attrs["false_outs"], false_rows),
        )
        scopes: list[Any] = []
        results: list[list[np.ndarray] | None] = []
        for block, outs, rows in branches:
            count = len(rows)
            if count == 0 and n > 0:
                scopes.append(None)
                results.append(None)
                continue
            scope = ctx.scope.new_scope()
            bound = {name: value.take(rows, axis=0) for name, value in zip(names, batch)}
            frame = ctx.run_block(block, scope, bound)
            store_step(frame, scope, bound)
            values = []
            for name in outs:
                value = _branch_value(frame, bound, name)
                if not isinstance(value, xp.ndarray) or value.ndim == 0 or value.shape[0] != count:
                    shape = list(getattr(value, "shape", []))
                    raise ControlFlowError(
                        f"branch output '{name}' has shape {shape}, but the branch got "
                        f"{count} rows: each output needs one row per row of the branch"
                    )
                values.append(value)
            scopes.append(scope)
            results.append(values)
        merged = []
        for i in range(len(attrs["true_outs"])):
            parts = [(r[i], rows) for r, (_, _, rows) in zip(results, branches) if r is not None]
            tail = parts[0][0].shape[1:]
            for part, _ in parts[1:]:
                if part.shape[1:] != tail:
                    raise ControlFlowError(
                        f"output {i}: the branches give rows of shape {list(tail)} and "
                        f"{list(part.shape[1:])}"
                    )
            out = xp.empty((n, *tail), dtype=parts[0][0].dtype)
            for part, rows in parts:
                out[rows] = part
            merged.append(out)
        ctx.set_outputs("Out", merged)
        ctx.set_output("Scopes", scopes)

    def grad_maker(op: OpDesc, ctx: GradContext) -> list[GradOpSpec]:
        outs = op.output("Out")
        out_grads = [ctx.grad_of(n) for n in outs]
        if all(g is None for g in out_grads):
            return []
        x_grads = [ctx.grad_of(n) for n in op.input("X")]
        p_grads = [ctx.grad_of(n) for n in op.input("Params")]
        wanted = [n for n, g in zip(op.input("X") + op.input("Params"), x_grads + p_grads) if g]
        if not wanted:
            return []
        attrs: dict[str, Any] = {}
        for side in ("true", "false"):
            block: Block = op.attrs[f"{side}_block"]
            branch_outs = op.attrs[f"{side}_outs"]
            seeds = {}
            for name, g in zip(branch_outs, out_grads):
                if g is not None:
                    seeds[name] = name + GRAD_SUFFIX
            grad_block, got = ctx.backward_block(block, seeds, wanted)
            attrs[f"{side}_grad_block"] = grad_block
            attrs[f"{side}_seeds"] = [
                seeds.get(name, "") if g is not None else ""
                for name, g in zip(branch_outs, out_grads)
            ]
            attrs[f"{side}_x_grads"] = [
                got.get(n, "") if g else "" for n, g in zip(op.input("X"), x_grads)
            ]
            attrs[f"{side}_param_grads"] = [
                got.get(n, "") if g else "" for n, g in zip(op.input("Params"), p_grads)
            ]
        inputs = {
            "Cond": op.input("Cond"),
            "X": op.input("X"),
            "Params": op.input("Params"),
            "Out": outs,
            "Out" + GRAD_SUFFIX: [g or "" for g in out_grads],
            "Scopes": op.output("Scopes"),
        }
        outputs = {
            "X" + GRAD_SUFFIX: [g or "" for g in x_grads],
            "Params" + GRAD_SUFFIX: [g or "" for g in p_grads],
        }
        return [GradOpSpec("ifelse_grad", inputs, outputs, attrs)]


@register_op
class ifelse_grad:
    """Runs each branch's gradient block in the branch's kept scope, with the output gradients'
    rows of that branch bound as seeds; scatters batch-input gradients back to their rows and
    sums whole-input (parameter) gradients over the branches."""

    inputs = ("Cond", "X*", "Params*", "Out*", "Out@GRAD*", "Scopes")
    outputs = ("X@GRAD*", "Params@GRAD*")
    attrs = {
        "true_grad_block": None,
        "false_grad_block": None,
        "true_seeds": [],
        "false_seeds": [],
        "true_x_grads": [],
        "false_x_grads": [],
        "true_param_grads": [],
        "false_param_grads": [],
    }
    infer_op = check_block_attrs(optional=("true_grad_block", "false_grad_block"))

    def run(ctx):
        attrs = ctx.attrs
        xp = ctx.device.xp
        mask = row_mask(ctx.input("Cond"))
        batch = ctx.inputs("X")
        params = ctx.inputs("Params")
        outs = ctx.inputs("Out")
        out_grads = ctx.inputs("Out" + GRAD_SUFFIX)
        scopes = ctx.input("Scopes")
        x_grads: list[Any] = [None] * len(batch)
        p_grads: list[Any] = [None] * len(params)
        for side, rows, scope in zip(("true", "false"), branch_rows(mask), scopes):
            grad_block = attrs[f"{side}_grad_block"]
            if scope is None or grad_block is None:
                continue
            values: dict[str, Any] = {}
            for seed, out, grad in zip(attrs[f"{side}_seeds"], outs, out_grads):
                if not seed:
                    continue
                if grad is not None:
                    part = xp.take(grad, rows, axis=0)
                else:
                    part = xp.zeros((len(rows),) + out.shape[1:], out.dtype)
                values[seed] = values[seed] + part if seed in values else part
            frame = ctx.run_block(grad_block, scope, values)
            for i, name in enumerate(attrs[f"{side}_x_grads"]):
                grad = grad_value(frame, values, name)
                if grad is None:
                    continue
                if x_grads[i] is None:
                    x_grads[i] = xp.zeros(batch[i].shape, dtype=grad.dtype)
                x_grads[i][rows] += grad
            for i, name in enumerate(attrs[f"{side}_param_grads"]):
                grad = grad_value(frame, values, name)
                if grad is not None:
                    p_grads[i] = grad if p_grads[i] is None else p_grads[i] + grad
        set_grads(ctx, "X" + GRAD_SUFFIX, x_grads, batch)
        set_grads(ctx, "Params" + GRAD_SUFFIX, p_grads, params)


def grad_value(frame, values: dict[str, Any], name: str) -> Any:
    """A gradient a sub-block's gradient ops computed (its frame), else the seed bound to it;
    None for no name. Shared by the control-flow gradient ops."""
    if not name:
        return None
    value = frame.value(name)
    return values.get(name) if value is None else value


def is_float(value: Any) -> bool:
    return isinstance(value, array_module(value).ndarray) and value.dtype.kind in "fc"


def set_grads(ctx, slot: str, grads: list[Any], forward: list[Any]) -> None:
    """Write a control-flow gradient op's gradients to the slot's named outputs, each shaped
    like its forward value; an input no step or branch reached gets zeros."""
    env = ctx.frame.env
    xp = ctx.device.xp
    for index, grad, value in zip(ctx.out_slots.get(slot, []), grads, forward):
        if index < 0:
            continue
        if grad is None:
            value = value if isinstance(value, xp.ndarray) else xp.asarray(value)
            grad = xp.zeros(value.shape, value.dtype if value.dtype.kind in "fc" else "float64")
        elif is_float(value) and grad.shape != value.shape:
            grad = grad.reshape(value.shape)
        env[index] = grad
