"""while: run a sub-block until a bool [1] condition is false (seed 002's WhileOp), its gradient,
and tensor arrays (lists of per-iteration values).

The body is in SSA form (the layer rewrites it when `with w.block():` exits): each write of an
outer variable goes to a fresh inner name, listed in attr `carried_inner` beside the outer name
in `carried`. Each iteration runs in a fresh kid scope with the current values of the carried
variables bound under their outer names; afterwards the inner values become the current ones.
Each step scope therefore keeps the step's input and output values, which is what `while_grad`
needs to run the body's gradient block backwards over the steps.

A loop whose step scopes no op reads (no `while_grad`: an inference program) keeps only the
newest one (values made in the body can still be fetched), so a loop that runs long holds no
more memory than one step. With a gradient to come every step is kept, up to
MAX_KEPT_STEPS when `max_steps` is -1: past that the loop stops with MaxStepsExceededError
rather than growing until memory runs out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nestflow.core.device_context import array_module
from nestflow.errors import AttrError, ControlFlowError, MaxStepsExceededError
from nestflow.framework.program import GRAD_SUFFIX, OpDesc, Program
from nestflow.ops.ifelse import (
    GradSum,
    check_block_attrs,
    grad_value,
    is_float,
    scope_array,
    store_step,
)
from nestflow.ops.registry import GradContext, GradOpSpec, VarInfo, register_op
from nestflow.ops.step_products import (
    DEFERRED_ATTRS,
    defer_parameter_products,
    deferred_products,
)

# The most step scopes a `while` with max_steps -1 keeps for its gradient (each holds one
# step's values): a loop past it is taken for one that never ends.
MAX_KEPT_STEPS = 100_000


def _check_while(op: OpDesc) -> None:
    """The layer's checks, for a while op however it was made (nf.While, by hand, or loaded):
    a body, one inner name per carried variable, and a condition the body writes unless
    max_steps bounds the loop."""
    op.block_attr("sub_block")
    attrs = op.attrs
    carried, inner = attrs["carried"], attrs["carried_inner"]
    if len(carried) != len(inner):
        raise AttrError(
            f"while: 'carried' names {len(carried)} variables ({carried}) but "
            f"'carried_inner' {len(inner)} ({inner}); each carried variable needs one"
        )
    if len(op.output("Out")) != len(carried):
        raise AttrError(
            f"while: Out names {len(op.output('Out'))} variables ({op.output('Out')}) but "
            f"'carried' {len(carried)} ({carried}); each carried variable is one output"
        )
    cond = op.input("Condition")[0]
    if cond not in carried and attrs["max_steps"] < 0:
        raise ControlFlowError(
            f"while: the body never writes the condition '{cond}' (it is not among the "
            f"carried variables {carried}) and max_steps is {attrs['max_steps']}, so the "
            f"loop could never stop"
        )


def _step_scopes_read(op: OpDesc) -> bool:
    """Whether any op of the program reads the while op's StepScopes (its gradient op)."""
    names = [n for n in op.output("StepScopes") if n]
    if not names:
        return False
    program = op.block.program
    return any(name in _read_names(program) for name in names)


def _read_names(program: Program) -> frozenset[str]:
    """Every name an op of `program` reads, computed once per program version."""
    cached = program.__dict__.get("_read_names")
    if cached is None or cached[0] != program.version:
        names = frozenset(n for b in program.blocks for op in b.ops for n in op.input_names())
        cached = program.__dict__["_read_names"] = (program.version, names)
    return cached[1]


def _truth(value: Any, name: str) -> bool:
    """The While condition's value, read on the host (on a device, the one read the loop's
    meaning needs: whether to run another step)."""
    is_array = isinstance(value, array_module(value).ndarray)
    if not is_array or value.dtype != np.bool_ or value.size != 1:
        shape = list(getattr(value, "shape", []))
        kind = getattr(value, "dtype", type(value).__name__)
        raise ControlFlowError(
            f"while: the condition '{name}' must be one bool value, got {kind}{shape}"
        )
    return bool(value.reshape(-1)[0])


@register_op
class while_:
    """Runs `sub_block` while Condition holds; Out are the carried variables' final values.

    Attrs: `carried` (outer names the body writes), `carried_inner` (the inner names holding
    each one's new value), `max_steps` (-1: no limit; else MaxStepsExceededError past it).
    """

    type = "while"
    inputs = ("X*", "Condition")
    outputs = ("Out*", "StepScopes")
    attrs = {"sub_block": None, "carried": [], "carried_inner": [], "max_steps": -1}
    no_grad_inputs = ("Condition",)
    infer_op = _check_while

    def run(ctx):
        attrs = ctx.attrs
        body, carried, inner = attrs["sub_block"], attrs["carried"], attrs["carried_inner"]
        max_steps = attrs["max_steps"]
        keep_all = _step_scopes_read(ctx.op)
        kept_limit = max_steps if max_steps >= 0 or not keep_all else MAX_KEPT_STEPS
        cond_name = ctx.op.input("Condition")[0]
        given = dict(zip(ctx.op.input("X"), ctx.inputs("X")))
        current = {name: given[name] if name in given else ctx.lookup(name) for name in carried}
        cond = ctx.input("Condition")
        if cond_name not in carried and _truth(cond, cond_name):
            # The body never writes the condition: the loop can only end at max_steps, with
            # the error below. Say so now rather than after max_steps idle iterations.
            raise MaxStepsExceededError(
                f"while: the condition '{cond_name}' holds and the body never writes it, so "
                f"the loop would only stop at max_steps={max_steps} iterations (with this error)"
            )
        scopes = []
        steps = 0
        run_block, remembered = ctx.executor.run_sub_block, {}
        while _truth(cond, cond_name):
            if 0 <= kept_limit <= steps:
                raise MaxStepsExceededError(_past_limit_message(cond_name, max_steps, steps))
            scope = ctx.scope.new_scope()
            bound = dict(current)
            frame = run_block(body, scope, bound, ctx.frame, remembered)
            store_step(frame, scope, bound)
            for outer, name in zip(carried, inner):
                current[outer] = frame.value(name)
            if not keep_all and scopes:
                ctx.scope.delete_scope(scopes.pop())  # nothing reads an older step
            scopes.append(scope)
            steps += 1
            if cond_name in current:
                cond = current[cond_name]
        ctx.set_outputs("Out", [current[name] for name in carried])
        ctx.set_output("StepScopes", scopes)

    def grad_maker(op: OpDesc, ctx: GradContext) -> list[GradOpSpec]:
        attrs = op.attrs
        carried, inner = attrs["carried"], attrs["carried_inner"]
        body = attrs["sub_block"]
        out_grads = [ctx.grad_of(n) for n in op.output("Out")]
        if all(g is None for g in out_grads):
            return []
        x_names = op.input("X")
        x_grads = [ctx.grad_of(n) for n in x_names]
        # Every float carried variable takes part in the chain through the steps, even one whose
        # initial value needs no gradient: a parameter's gradient may flow through it.
        chain = [
            (outer, name)
            for outer, name in zip(carried, inner)
            if (desc := body.find_var(name)) is not None
            and desc.type in ("lod_tensor", "tensor_array")
            and np.dtype(desc.dtype).kind in "fc"
        ]
        chained = {outer for outer, _ in chain}
        wanted = [n for n in x_names if n in chained] + [
            n for n, g in zip(x_names, x_grads) if g and n not in chained
        ]
        if not wanted:
            return []
        seeds = {name: name + GRAD_SUFFIX for _, name in chain}
        grad_block, got = ctx.backward_block(body, seeds, wanted)
        seed_of = dict(chain)
        x_grad_names = [got.get(n, "") for n in x_names]
        # Gradients summed over the steps (not carried through them): products by them are
        # multiplied once after the loop. The step's own values and the carried ones (bound
        # per step) are the X a product may take.
        summed = [g for n, g in zip(x_names, x_grad_names) if g and n not in chained]
        deferred = defer_parameter_products(grad_block, set(body.vars) | set(carried), summed)
        grad_attrs = {
            "grad_block": grad_block,
            "carried": carried,
            "carried_inner": inner,
            "seeds": [seeds[seed_of[o]] if o in seed_of else "" for o in carried],
            "x_grads": x_grad_names,
            **deferred,
        }
        inputs = {
            "X": x_names,
            "Out": op.output("Out"),
            "Out" + GRAD_SUFFIX: [g or "" for g in out_grads],
            "StepScopes": op.output("StepScopes"),
        }
        outputs = {"X" + GRAD_SUFFIX: [g or "" for g in x_grads]}
        return [GradOpSpec("while_grad", inputs, outputs, grad_attrs)]


@register_op
class while_grad:
    """Runs the body's gradient block in the kept step scopes, last step first: the gradient of
    each carried variable's new value is the seed, the gradient of its old value (under the
    outer name) flows to the step before; other outer inputs' gradients are summed."""

    infer_op = check_block_attrs("grad_block")

    inputs = ("X*", "Out*", "Out@GRAD*", "StepScopes")
    outputs = ("X@GRAD*",)
    attrs = {
        "grad_block": None,
        "carried": [],
        "carried_inner": [],
        "seeds": [],
        "x_grads": [],
        **DEFERRED_ATTRS,
    }

    def run(ctx):
        attrs = ctx.attrs
        carried, inner, seeds = attrs["carried"], attrs["carried_inner"], attrs["seeds"]
        x_names = ctx.op.input("X")
        x_values = ctx.inputs("X")
        upstream = dict(zip(carried, ctx.inputs("Out" + GRAD_SUFFIX)))
        flowing = {o: upstream.get(o) for o, s in zip(carried, seeds) if s}
        summed: dict[str, GradSum] = {}
        deferred = deferred_products(attrs)
        grad_block = attrs["grad_block"]
        run_block, remembered = ctx.executor.run_sub_block, {}
        for scope in reversed(ctx.input("StepScopes") or []):
            values = {}
            for outer, name, seed in zip(carried, inner, seeds):
                if not seed:
                    continue
                grad = flowing[outer]
                if grad is None:
                    grad = zero_grad_like(scope_array(scope, name))
                values[seed] = grad
            frame = run_block(grad_block, scope, values, ctx.frame, remembered)
            for name, grad_name in zip(x_names, attrs["x_grads"]):
                grad = grad_value(frame, values, grad_name)
                if name in flowing:
                    flowing[name] = grad  # None: the old value did not reach the new one
                elif grad is not None:
                    summed.setdefault(name, GradSum()).add(grad)
            for product in deferred.values():
                product.collect(scope, frame.plan, frame.env, values)
        for name, grad_name, value in zip(x_names, attrs["x_grads"], x_values):
            if grad_name in deferred and (grad := deferred[grad_name].finish(value)) is not None:
                summed.setdefault(name, GradSum()).add(grad)
        env = ctx.frame.env
        for index, name, value in zip(ctx.out_slots.get("X" + GRAD_SUFFIX, []), x_names, x_values):
            if index < 0:
                continue
            if name in flowing:
                grad = flowing[name]
            else:
                grad = summed[name].value if name in summed else None
            if grad is None and (is_float(value) or isinstance(value, list)):
                grad = zero_grad_like(value)
            env[index] = grad


def _past_limit_message(cond_name: str, max_steps: int, steps: int) -> str:
    if max_steps >= 0:
        return (
            f"while: the condition '{cond_name}' still holds after max_steps={max_steps} iterations"
        )
    return (
        f"while: the condition '{cond_name}' still holds after {steps} iterations, each kept "
        f"for the gradient (the most a loop with max_steps -1 keeps, "
        f"nestflow.ops.while_loop.MAX_KEPT_STEPS); if the loop is meant to run longer, give "
        f"nf.While its max_steps"
    )


# ---- tensor arrays: a tensor_array variable holds a Python list of arrays ----


class ArrayGrad(list):
    """The gradient of a tensor array: one gradient per element (None: zero). `+` adds
    elementwise, so the `sum` op that accumulates gradient contributions works on it."""

    def __add__(self, other: list) -> ArrayGrad:
        out = ArrayGrad([None] * max(len(self), len(other)))
        for k in range(len(out)):
            a = self[k] if k < len(self) else None
            b = other[k] if k < len(other) else None
            out[k] = a if b is None else b if a is None else a + b
        return out

    __radd__ = __add__

    def copy(self) -> ArrayGrad:
        return ArrayGrad(self)


def zero_grad_like(value: Any) -> Any:
    """A zero gradient for `value`: zeros for a float array, an all-zero ArrayGrad for a list."""
    if isinstance(value, list):
        return ArrayGrad()
    return array_module(value).zeros_like(value)


def _index(value: Any, what: str) -> int:
    """A tensor array's index, read on the host (on a device too: it picks a Python list
    element)."""
    array = value if hasattr(value, "dtype") else np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "iu":
        raise ControlFlowError(
            f"{what}: the index must be one integer, got {array.dtype}{list(array.shape)}"
        )
    return int(array.reshape(-1)[0])


@register_op
class create_array:
    """Out = an empty tensor array."""

    inputs, outputs = (), ("Out",)
    attrs = {"dtype": "float32"}

    def run(ctx):
        ctx.set_output("Out", [])


def _infer_array_write(op: OpDesc) -> None:
    block = op.block
    x = block.find_var(op.input("X")[0])
    out = block.find_var(op.output("Out")[0])
    if x is not None and out is not None:
        out.shape, out.dtype = x.shape, x.dtype


@register_op
class array_write:
    """Out = Array with element I set to X (the array grows as needed; Array is not changed)."""

    inputs, outputs = ("X", "I", "Array?"), ("Out",)
    infer_op = _infer_array_write
    no_grad_inputs = ("I",)

    def run(ctx):
        items = list(ctx.input("Array") or [])
        index = _index(ctx.input("I"), "array_write")
        if index < 0:
            raise ControlFlowError(f"array_write: index {index} is negative")
        items.extend([None] * (index + 1 - len(items)))
        items[index] = ctx.input("X")
        ctx.set_output("Out", items)

    def backward(X, I, Array, Out, Out_grad):  # noqa: E741
        index = _index(I, "array_write_grad")
        grads = ArrayGrad(Out_grad or [])
        x_grad = grads[index] if index < len(grads) else None
        if index < len(grads):
            grads[index] = None  # the write replaced whatever the element held before
        x_grad = array_module(X).zeros_like(X) if x_grad is None else x_grad
        return x_grad, (grads if Array is not None else None)


def _array_item(items: list, index: int, what: str) -> np.ndarray:
    if not 0 <= index < len(items) or items[index] is None:
        raise ControlFlowError(
            f"{what}: element {index} of the array was never written (length {len(items)})"
        )
    return items[index]


@register_op
class array_read:
    """Out = element I of Array."""

    inputs, outputs = ("Array", "I"), ("Out",)
    no_grad_inputs = ("I",)

    def infer(Array, I):  # noqa: E741  (Paddle's slot name)
        return VarInfo(Array.shape, Array.dtype)

    def run(ctx):
        items = ctx.input("Array") or []
        ctx.set_output(
            "Out", _array_item(items, _index(ctx.input("I"), "array_read"), "array_read")
        )

    def backward(Array, I, Out, Out_grad):  # noqa: E741
        grads = ArrayGrad([None] * len(Array))
        grads[_index(I, "array_read_grad")] = Out_grad
        return (grads,)


@register_op
class array_length:
    """Out = the number of elements of Array (int64 [1])."""

    inputs, outputs = ("Array",), ("Out",)

    def infer(Array):
        return VarInfo((1,), "int64")

    def run(ctx):
        length = [len(ctx.input("Array") or [])]
        ctx.set_output("Out", ctx.device.xp.asarray(length, dtype=np.int64))


@register_op
class array_to_tensor:
    """Out = the array's elements stacked along a new dim `axis` (all must have one shape)."""

    inputs, outputs = ("Array",), ("Out",)
    attrs = {"axis": 0}

    def infer(Array, axis):
        shape = list(Array.shape)
        shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, -1)
        return VarInfo(tuple(shape), Array.dtype)

    def run(ctx):
        items = ctx.input("Array") or []
        for index in range(len(items)):
            _array_item(items, index, "array_to_tensor")
        shapes = {item.shape for item in items}
        if len(shapes) > 1:
            raise ControlFlowError(
                f"array_to_tensor: elements have different shapes {sorted(map(list, shapes))}"
            )
        if not items:
            raise ControlFlowError("array_to_tensor: the array is empty")
        ctx.set_output("Out", ctx.device.xp.stack(items, axis=ctx.attrs["axis"]))

    def backward(Array, Out, Out_grad, axis, xp):
        return (ArrayGrad(xp.moveaxis(Out_grad, axis, 0)),)
