"""block: a Block run as one operator (seed 002's `class Block : OperatorBase`), and its
gradient `block_grad`.

The op runs its sub-block's ops in order in a kid scope of the scope it runs in, as the seed's
Block::Run runs its operators in a scope: outer variables (slot "X", parameters included) are
read through the frame and scope chain, never copied; the values the block makes for the
outside (attr `outs`, names inside the block) become the op's "Out". The kid scope is kept in
"Scope" (a step-scopes variable) so `block_grad` runs the block's gradient ops in it, reading
the forward values where the forward pass left them.
"""

from __future__ import annotations

from typing import Any

from nestflow.errors import ControlFlowError
from nestflow.framework.program import GRAD_SUFFIX, OpDesc
from nestflow.ops.ifelse import check_block_attrs, grad_value, set_grads, store_step
from nestflow.ops.registry import GradContext, GradOpSpec, register_op


@register_op
class block:
    """Out[i] = the value the sub-block gives its variable `outs[i]` when its ops have run."""

    inputs = ("X*",)
    outputs = ("Out*", "Scope?")
    attrs = {"sub_block": None, "outs": []}
    output_attrs = {"Out": ("outs",)}
    infer_op = check_block_attrs("sub_block")

    def run(ctx):
        scope = ctx.scope.new_scope()
        frame = ctx.run_block(ctx.attrs["sub_block"], scope, {})
        store_step(frame, scope, {})
        # An output is made in the block, or reached from it (frame, then scope chain).
        ctx.set_outputs("Out", [frame.lookup(name) for name in ctx.attrs["outs"]])
        ctx.set_output("Scope", [scope])  # (the kid scope goes with the run's scope)

    def grad_maker(op: OpDesc, ctx: GradContext) -> list[GradOpSpec]:
        outs, inner_outs = op.output("Out"), op.attrs["outs"]
        out_grads = [ctx.grad_of(n) for n in outs]
        if all(g is None for g in out_grads):
            return []
        x_names = op.input("X")
        x_grads = [ctx.grad_of(n) for n in x_names]
        wanted = [n for n, g in zip(x_names, x_grads) if g]
        if not wanted:
            return []
        if not [n for n in op.output("Scope") if n]:
            raise ControlFlowError(
                f"block op writing {outs}: gradients are wanted through it, but it has no "
                f"'Scope' output to keep its kid scope for block_grad (nf.BlockOp gives it one)"
            )
        seeds = {inner: inner + GRAD_SUFFIX for inner, g in zip(inner_outs, out_grads) if g}
        grad_block, got = ctx.backward_block(op.attrs["sub_block"], seeds, wanted)
        attrs = {
            "grad_block": grad_block,
            "seeds": [seeds[n] if g else "" for n, g in zip(inner_outs, out_grads)],
            "x_grads": [got.get(n, "") if g else "" for n, g in zip(x_names, x_grads)],
        }
        inputs = {
            "X": x_names,
            "Out": outs,
            "Out" + GRAD_SUFFIX: [g or "" for g in out_grads],
            "Scope": op.output("Scope"),
        }
        outputs = {"X" + GRAD_SUFFIX: [g or "" for g in x_grads]}
        return [GradOpSpec("block_grad", inputs, outputs, attrs)]


@register_op
class block_grad:
    """Runs the block's gradient ops in the kept kid scope, seeded with the output gradients
    (zeros for an output no gradient reached); gives the outer inputs' gradients."""

    inputs = ("X*", "Out*", "Out@GRAD*", "Scope")
    outputs = ("X@GRAD*",)
    attrs = {"grad_block": None, "seeds": [], "x_grads": []}
    infer_op = check_block_attrs("grad_block")

    def run(ctx):
        attrs = ctx.attrs
        (scope,) = ctx.input("Scope")
        values: dict[str, Any] = {}
        outs, out_grads = ctx.inputs("Out"), ctx.inputs("Out" + GRAD_SUFFIX)
        for seed, out, grad in zip(attrs["seeds"], outs, out_grads):
            if not seed:
                continue
            part = ctx.device.xp.zeros_like(out) if grad is None else grad
            values[seed] = values[seed] + part if seed in values else part
        frame = ctx.run_block(attrs["grad_block"], scope, values)
        grads = [grad_value(frame, values, name) for name in attrs["x_grads"]]
        set_grads(ctx, "X" + GRAD_SUFFIX, grads, ctx.inputs("X"))
