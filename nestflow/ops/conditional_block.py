"""conditional_block: a sub-block run as one op only when its condition holds (Fluid's
ConditionalBlockOp), its gradient, and select_input / select_output (one of several values
picked by an integer mask), which `nf.layers.cond` merges its two branches with.

`conditional_block` runs its sub-block in a kid scope of the scope it runs in, as the `block`
op does: outer variables (slot "Input") are read through the frame and scope chain, the values
the block makes for the outside (attr `outs`, names inside the block) become "Out", and the
kid scope is kept in "Scope" for `conditional_block_grad` (the run and the gradient are the
`block` op's, used as they are). When the condition does not hold
nothing runs: "Out" holds nothing (None) and "Scope" an empty list, and the gradient op gives
zero gradients to every input.

The condition, as in Fluid: with `is_scalar_condition` the one "Cond" variable must hold one
bool value (ControlFlowError otherwise), and the block runs when it is True; without it the
block runs when every "Cond" tensor has at least one element.

nestflow's departure from Fluid: Fluid's block writes its results into variables of the outer
block; here (as for every nestflow control-flow op) a sub-block writes only its own variables,
and attr `outs` names those whose values become the op's "Out".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nestflow.core.device_context import array_module
from nestflow.errors import AttrError, ControlFlowError, DTypeError, ShapeError
from nestflow.framework.program import GRAD_SUFFIX, Block, OpDesc
from nestflow.ops.block import block, block_grad
from nestflow.ops.ifelse import set_grads
from nestflow.ops.registry import GradContext, GradOpSpec, VarInfo, register_op


def _block_attr(op: OpDesc, name: str) -> Block:
    value = op.attrs.get(name)
    if not isinstance(value, Block):
        raise AttrError(
            f"attribute '{name}' must be a sub-block (a Block of this program), got "
            f"{type(value).__name__} ({value!r})"
        )
    return value


def _check_scalar_condition(op: OpDesc) -> None:
    names = op.input("Cond")
    if len(names) != 1:
        raise ControlFlowError(
            f"conditional_block with is_scalar_condition takes one Cond variable, got {names}"
        )
    var = op.block.find_var(names[0])
    if var.dtype != "bool":
        raise DTypeError(f"the condition '{var.name}' must be bool, but it is {var.dtype}")
    if any(d not in (1, -1) for d in var.shape):
        raise ShapeError(
            f"the condition '{var.name}' has shape {list(var.shape)}; a scalar condition "
            f"holds one bool value (shape [] or [1])"
        )


def _infer_conditional_block(op: OpDesc) -> None:
    """A sub-block, one inner name per output (each output shaped like its inner variable),
    and with is_scalar_condition one bool condition of one element."""
    sub_block = _block_attr(op, "sub_block")
    outs, inner = op.output("Out"), op.attrs["outs"]
    if len(outs) != len(inner):
        raise AttrError(
            f"'Out' has {len(outs)} variables ({outs}) but attr 'outs' names {len(inner)} "
            f"({inner}); each output needs the name of the block's variable it takes"
        )
    if op.attrs["is_scalar_condition"]:
        _check_scalar_condition(op)
    for out, name in zip(outs, inner):
        source = sub_block.find_var(name)
        if source is None:
            raise AttrError(f"attr 'outs' names '{name}', which block {sub_block.idx} lacks")
        var = op.block.find_var(out) or op.block.create_var(out)
        var.shape, var.dtype = source.shape, source.dtype


def condition_holds(op: OpDesc, conds: list[Any], scalar: bool) -> bool:
    """Whether a conditional_block runs: its scalar bool, or every Cond non-empty."""
    if not scalar:
        return all(getattr(c, "size", 1) != 0 for c in conds)
    (value,) = conds
    # The condition is read on the host (on a device too): it decides whether the block runs.
    is_array = isinstance(value, array_module(value).ndarray)
    if not is_array or value.dtype != np.bool_ or value.size != 1:
        kind = getattr(value, "dtype", type(value).__name__)
        raise ControlFlowError(
            f"the condition '{op.input('Cond')[0]}' must hold one bool value, got "
            f"{kind}{list(getattr(value, 'shape', []))}"
        )
    return bool(value.reshape(-1)[0])


@register_op
class conditional_block:
    """Out[i] = the value the sub-block gives its variable `outs[i]`, when the condition holds
    (otherwise the block does not run and Out holds nothing)."""

    inputs = ("Cond*", "Input*")
    outputs = ("Out*", "Scope?")
    attrs = {"sub_block": None, "is_scalar_condition": False, "outs": []}
    output_attrs = {"Out": ("outs",)}
    no_grad_inputs = ("Cond",)
    infer_op = _infer_conditional_block

    def run(ctx):
        attrs = ctx.attrs
        if not condition_holds(ctx.op, ctx.inputs("Cond"), attrs["is_scalar_condition"]):
            ctx.set_outputs("Out", [None] * len(attrs["outs"]))
            ctx.set_output("Scope", [])
        else:
            block.run(ctx)  # the block op's run: same attrs, same outputs

    def grad_maker(op: OpDesc, ctx: GradContext) -> list[GradOpSpec]:
        # The gradient is the block op's, run only when the block ran.
        specs = block.grad_maker(_AsBlockOp(op), ctx)
        if not specs:
            return []
        (spec,) = specs
        inputs = {"Cond": op.input("Cond"), "Input": spec.inputs.pop("X"), **spec.inputs}
        outputs = {"Input" + GRAD_SUFFIX: spec.outputs["X" + GRAD_SUFFIX]}
        attrs = {**spec.attrs, "is_scalar_condition": op.attrs["is_scalar_condition"]}
        return [GradOpSpec("conditional_block_grad", inputs, outputs, attrs)]


class _AsBlockOp:
    """A conditional_block op as the `block` op whose gradient it shares (slot Input is X)."""

    def __init__(self, op: OpDesc):
        self.op, self.attrs = op, op.attrs

    def input(self, slot: str) -> list[str]:
        return self.op.input("Input" if slot == "X" else slot)

    def output(self, slot: str) -> list[str]:
        return self.op.output(slot)


@register_op
class conditional_block_grad:
    """When the block ran (its kept Scope list is not empty), `block_grad`: the block's
    gradient ops run in the kept kid scope, seeded with the output gradients, give the inputs'
    gradients; when it did not run, zeros."""

    inputs = ("Cond*", "Input*", "Out*", "Out@GRAD*", "Scope")
    outputs = ("Input@GRAD*",)
    attrs = {"grad_block": None, "seeds": [], "x_grads": [], "is_scalar_condition": False}

    def infer_op(op: OpDesc) -> None:
        _block_attr(op, "grad_block")

    def run(ctx):
        inputs = ctx.inputs("Input")
        if not ctx.input("Scope"):
            set_grads(ctx, "Input" + GRAD_SUFFIX, [None] * len(inputs), inputs)
            return
        in_slots = {("X" if k == "Input" else k): v for k, v in ctx.in_slots.items()}
        out_slots = {"X" + GRAD_SUFFIX: ctx.out_slots.get("Input" + GRAD_SUFFIX, [])}
        block_grad.run(type(ctx)(ctx.op, ctx.op_def, ctx.attrs, ctx.frame, in_slots, out_slots))


# ---- select_input / select_output ----


def _mask_index(Mask: Any, count: int, op_type: str) -> int:
    """The branch Mask picks, read on the host (on a device too: it picks a Python value)."""
    mask = Mask if hasattr(Mask, "dtype") else np.asarray(Mask)
    if mask.size != 1 or mask.dtype.kind not in "iu":
        raise ControlFlowError(
            f"{op_type}: Mask must hold one integer, got {mask.dtype}{list(mask.shape)}"
        )
    index = int(mask.reshape(-1)[0])
    if not 0 <= index < count:
        raise ControlFlowError(f"{op_type}: Mask is {index}, but there are {count} branches")
    return index


def _check_mask(Mask: VarInfo) -> None:
    if np.dtype(Mask.dtype).kind not in "iu":
        raise DTypeError(f"Mask must be an integer (int32) variable, got {Mask.dtype}")
    if any(d not in (1, -1) for d in Mask.shape):
        raise ShapeError(f"Mask must hold one integer (shape [1]), got {list(Mask.shape)}")


def merged_shape(shapes: list[tuple[int, ...]], what: str) -> tuple[int, ...]:
    """One shape for values that may have any of `shapes`: -1 where they differ or are
    unknown; ShapeError for different ranks."""
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        raise ShapeError(f"{what} have different ranks: {[list(s) for s in shapes]}")
    return tuple(dims[0] if len(set(dims)) == 1 else -1 for dims in zip(*shapes))


@register_op
class select_input:
    """Out = X[Mask]: the one of the X values the integer Mask ([1]) picks (the others may hold
    nothing). Its gradient goes to the picked X; the others get zeros (nothing if they hold
    nothing)."""

    inputs = ("X*", "Mask")
    outputs = ("Out",)
    no_grad_inputs = ("Mask",)

    def infer(X, Mask):
        _check_mask(Mask)
        known = [x for x in X if x is not None]
        if not known:
            raise ShapeError("select_input needs at least one X")
        dtypes = sorted({x.dtype for x in known})
        if len(dtypes) > 1:
            raise DTypeError(f"the X values have different dtypes {dtypes}")
        return VarInfo(merged_shape([x.shape for x in known], "the X values"), dtypes[0])

    def forward(X, Mask):
        return X[_mask_index(Mask, len(X), "select_input")]

    def backward(X, Mask, Out, Out_grad, xp):
        index = _mask_index(Mask, len(X), "select_input_grad")
        grads = [None if x is None else xp.zeros_like(x) for x in X]
        grads[index] = Out_grad
        return (grads,)


@register_op
class select_output:
    """Out[Mask] = X: X written to the one output the integer Mask ([1]) picks; the other
    outputs get zeros of X's shape. Its gradient is the picked output's."""

    inputs = ("X", "Mask")
    outputs = ("Out*",)
    no_grad_inputs = ("Mask",)

    def infer_op(op: OpDesc) -> None:
        block = op.block
        mask = block.find_var(op.input("Mask")[0])
        _check_mask(VarInfo(mask.shape, mask.dtype))
        x = block.find_var(op.input("X")[0])
        for name in op.output("Out"):
            if name:
                var = block.find_var(name) or block.create_var(name)
                var.shape, var.dtype = x.shape, x.dtype

    def run(ctx):
        x, outs = ctx.input("X"), ctx.out_slots.get("Out", [])
        index = _mask_index(ctx.input("Mask"), len(outs), "select_output")
        zeros = ctx.device.xp.zeros_like
        ctx.set_outputs("Out", [x if i == index else zeros(x) for i in range(len(outs))])

    def backward(X, Mask, Out, Out_grad, xp):
        index = _mask_index(Mask, len(Out), "select_output_grad")
        grad = Out_grad[index]
        return (xp.zeros_like(X) if grad is None else grad,)
