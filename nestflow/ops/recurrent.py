"""recurrent: run a step block once per time step over a batch of sequences (seeds 000/002's
RNNOp), its gradient `recurrent_grad` (backward through time), and `rnn_memory_boot`.

Layout: a sequence is `[batch, time, ...]`. At step t the op binds, in a fresh kid scope of the
scope it runs in (one step scope per time step, seed 000):
- each step input (slot "Inputs") under its own name, as its time slice `X[:, t]`;
- each memory (attr `memories`) under its name, as the memory's value before the step (its boot
  value, slot "Boots", at step 0).
After the step, each memory takes the value of its update variable (attr `updates`), and each step
output (attr `step_outputs`) is collected; outputs are stacked into `[batch, time, ...]`, and
"FinalMemories" are the memories' values after the last step.
Outer variables the step reads (slot "Params": parameters, non-sequence variables) are read
through the frame chain, never copied.

Per-row lengths (slot "Lengths", int64 [batch]): at steps t >= lengths[row] the row's memory
keeps its value and the row's outputs are zero.

The step scopes are kept (output "StepScopes") with every value of the step, so
`recurrent_grad` runs the step's gradient block in each of them, last step first. They are kids
of the executor's per-run local scope and are destroyed when the run ends. When nothing but
`recurrent_grad` reads them, a step value its gradient block needs only the shape of (its ops'
no-need-buffer slots) is kept as a zero-stride stand-in, except in the newest step scope.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nestflow.core.device_context import array_module
from nestflow.errors import ControlFlowError
from nestflow.framework.program import GRAD_SUFFIX, OpDesc
from nestflow.ops.ifelse import (
    GradSum,
    check_block_attrs,
    scope_array,
    set_grads,
    step_slots,
)
from nestflow.ops.registry import (
    GradContext,
    GradOpSpec,
    VarInfo,
    get_op_def,
    register_op,
    shape_stand_in,
)
from nestflow.ops.step_products import (
    DEFERRED_ATTRS,
    defer_parameter_products,
    deferred_products,
)


def _sequences(names: list[str], values: list[Any]) -> tuple[int, int]:
    """(batch, steps) shared by all step inputs; ControlFlowError if they disagree."""
    batch = steps = None
    first = ""
    for name, value in zip(names, values):
        if not isinstance(value, array_module(value).ndarray) or value.ndim < 2:
            shape = list(getattr(value, "shape", []))
            raise ControlFlowError(
                f"recurrent: step input '{name}' has shape {shape}; a sequence must be "
                f"[batch, time, ...] (at least 2-D)"
            )
        if batch is None:
            batch, steps, first = value.shape[0], value.shape[1], name
        elif value.shape[:2] != (batch, steps):
            raise ControlFlowError(
                f"recurrent: step inputs '{first}' [batch={batch}, time={steps}] and '{name}' "
                f"{list(value.shape)} differ in batch or time dims"
            )
    if batch is None:
        raise ControlFlowError("recurrent: the step reads no sequence (no step input)")
    return batch, steps


def _lengths(value: Any, batch: int, steps: int, name: str) -> np.ndarray | None:
    if value is None:
        return None
    lengths = value if hasattr(value, "dtype") else np.asarray(value)
    if lengths.dtype.kind not in "iu" or lengths.reshape(-1).shape[0] != batch:
        raise ControlFlowError(
            f"recurrent: lengths '{name}' must be an integer [batch={batch}] array, got "
            f"{lengths.dtype}{list(lengths.shape)}"
        )
    lengths = lengths.reshape(-1)
    # a host read on a device: the check's meaning
    if lengths.size and (int(lengths.min()) < 0 or int(lengths.max()) > steps):
        raise ControlFlowError(
            f"recurrent: lengths '{name}' must lie in [0, {steps}] (the time dim), got "
            f"{lengths.tolist()}"
        )
    return lengths


def _running(lengths: np.ndarray | None, steps: int) -> list[np.ndarray | None]:
    """For each step t, the bool mask of the rows still running at t, or None when every row
    is (from one comparison)."""
    if lengths is None:
        return [None] * steps
    # a host read on a device: the steps before the shortest sequence ends need no mask
    shortest = int(lengths.min()) if lengths.size else steps
    masks = lengths[None, :] > array_module(lengths).arange(steps)[:, None]
    return [None if t < shortest else masks[t] for t in range(steps)]


def _step_parts(grad, scopes: list, name: str, running: list) -> list[np.ndarray]:
    """A seeded step output's gradient, grad [batch, steps, ...] (None: zeros), as each step's
    slice shaped like the step's value, with the rows of finished sequences zeroed."""
    if not scopes:
        return []
    step = scope_array(scopes[-1], name)
    step = step if hasattr(step, "dtype") else np.asarray(step)
    if grad is None:
        return [array_module(step).zeros(step.shape, dtype=step.dtype)] * len(scopes)
    parts = []
    for part, active in zip(grad.swapaxes(0, 1), running):
        part = part if active is None else _masked(part, active)
        parts.append(part if part.shape == step.shape else part.reshape(step.shape))
    return parts


def _stacked_steps(grads: list[Any], sequence: np.ndarray) -> np.ndarray | None:
    """The steps' gradients of one input's time slices as one array like `sequence` (a step
    no gradient reached: zeros); None when none reached any."""
    first = next((g for g in grads if g is not None), None)
    if first is None:
        return None
    xp = array_module(first)
    zeros = None
    for t, grad in enumerate(grads):
        if grad is None:
            zeros = zeros if zeros is not None else xp.zeros(sequence[:, t].shape, first.dtype)
            grads[t] = zeros
    return xp.stack(grads, axis=1).reshape(sequence.shape)


def _same_shape(new: Any, old: np.ndarray, name: str, update: str, t: int) -> np.ndarray:
    """A memory's update as an array of the memory's shape; ControlFlowError otherwise."""
    new = np.asarray(new) if isinstance(new, np.generic) else new
    if not isinstance(new, array_module(old).ndarray) or new.shape != old.shape:
        raise ControlFlowError(
            f"recurrent: memory '{name}' has shape {list(old.shape)} but its update "
            f"'{update}' has shape {list(getattr(new, 'shape', []))} at step {t}; "
            f"a memory keeps one shape over the steps"
        )
    return new


def _rows(mask: np.ndarray, ndim: int) -> np.ndarray:
    return mask.reshape(mask.shape + (1,) * (ndim - 1))


def _masked(value: np.ndarray, active: np.ndarray | None) -> np.ndarray:
    """`value` with the rows of finished sequences zeroed (a new array; `value` is kept)."""
    if active is None:
        return value
    xp = array_module(value)
    return xp.where(_rows(active, value.ndim), value, xp.zeros((), value.dtype))


def _as_rows(value: Any, batch: int, name: str, what: str) -> np.ndarray:
    """A step value with a leading batch dim. A 0-d value (e.g. the seed's matmul of two 1-D
    vectors) is taken as one row, which needs a batch of one sequence."""
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, array_module(value).ndarray):
        raise ControlFlowError(f"recurrent: {what} '{name}' is not a tensor ({type(value)})")
    if value.ndim == 0 and batch == 1:
        return value.reshape(1)
    if value.ndim == 0 or value.shape[0] != batch:
        raise ControlFlowError(
            f"recurrent: {what} '{name}' has shape {list(value.shape)}, but the batch has "
            f"{batch} sequence(s): it needs one row per sequence"
        )
    return value


def _step_value(frame, bound: dict[str, Any], name: str) -> Any:
    value = frame.value(name)
    if value is None:
        value = bound.get(name)
    return frame.lookup(name) if value is None else value


def _no_steps(block, name: str, batch: int, xp) -> Any:
    """A step output stacked over zero steps: [batch, 0, ...] with the step variable's declared
    row shape, which must be known since no step ran to show it."""
    var = block.find_var(name)
    shape = tuple(var.shape) if var is not None else ()
    tail = shape[1:]
    if not shape or any(d < 0 for d in tail):
        raise ControlFlowError(
            f"recurrent: the sequences have no time steps, and step output '{name}' is declared "
            f"{list(shape)}: its shape after the batch dim must be known to give an empty output"
        )
    return xp.zeros((batch, 0, *tail), dtype=var.dtype)


def _shape_only_slots(
    op: OpDesc, plan, kept: dict[str, int], memories: list[str], updates: list[str], outs: list[str]
) -> tuple[int, ...]:
    """The env slots of step values that only their shape and dtype are needed of once the
    step has run: values of the step (a step input's slice, or one the step computes; no
    memory, update or output) that the
    gradient block reads through no_need_buffer slots at most, where nothing but recurrent_grad
    reads the step scopes. Such a value is replaced in its step scope by a zero-stride
    stand-in, so its memory is free for the next step's values to reuse while it is still in
    cache (W3's train step holds 1 MB less at its peak). Worked out once per step plan."""
    cache = plan.__dict__.setdefault("_shape_only_slots", {})
    found = cache.get(id(op))
    if found is not None and found[0] is op:
        return found[1]
    slots: tuple[int, ...] = ()
    reads = _values_read_from_step_scopes(op)
    if reads is not None:
        fixed = set(memories) | set(updates) | set(outs) | reads
        slots = tuple(slot for name, slot in kept.items() if name not in fixed)
    cache[id(op)] = (op, slots)
    return slots


def _values_read_from_step_scopes(op: OpDesc) -> set[str] | None:
    """The names whose values the readers of `op`'s step scopes read from them; None when
    that cannot be told (a reader other than recurrent_grad, or nested sub-blocks in its
    gradient block), which keeps every value."""
    scopes_name = op.output("StepScopes")[0]
    reads: set[str] = set()
    for block in op.block.program.blocks:
        for reader in block.ops:
            if scopes_name not in reader.input_names():
                continue
            if reader.type != "recurrent_grad":
                return None
            grad_block = reader.attrs.get("grad_block")
            if grad_block is None:
                return None
            for grad_op in grad_block.ops:
                if grad_op.sub_blocks():
                    return None
                shape_only = get_op_def(grad_op.type).no_need_buffer
                for slot, names in grad_op.inputs.items():
                    if slot not in shape_only:
                        reads.update(names)
            reads.update(reader.attrs.get("deferred_xs", ()))
    return reads


def _stand_in_for(env: list, slots: tuple[int, ...]) -> None:
    for slot in slots:
        env[slot] = shape_stand_in(env[slot])


@register_op
class recurrent:
    """Outputs[i][:, t] = step output i of time step t (zero past a row's length).

    Attrs: `sub_block` (the step), `memories` (their names in the step; slot "Boots" gives one
    initial value each, [batch, ...]), `updates` (the step variable holding each memory's next
    value), `step_outputs` (the step variables stacked into "Outputs").
    """

    inputs = ("Inputs*", "Boots*", "Params*", "Lengths?")
    outputs = ("Outputs*", "FinalMemories*", "StepScopes")
    attrs = {"sub_block": None, "memories": [], "updates": [], "step_outputs": []}
    output_attrs = {"Outputs": ("step_outputs",)}
    no_grad_inputs = ("Lengths",)
    infer_op = check_block_attrs("sub_block")

    def run(ctx):
        op, attrs = ctx.op, ctx.attrs
        block = attrs["sub_block"]
        memories, updates, outs = attrs["memories"], attrs["updates"], attrs["step_outputs"]
        in_names = op.input("Inputs")
        sequences = ctx.inputs("Inputs")
        xp = ctx.device.xp
        batch, steps = _sequences(in_names, sequences)
        lengths_name = (op.input("Lengths") or [""])[0]
        lengths = _lengths(ctx.input("Lengths"), batch, steps, lengths_name)
        current = {}
        for name, boot_name, value in zip(memories, op.input("Boots"), ctx.inputs("Boots")):
            current[name] = _as_rows(value, batch, boot_name, f"initial value of memory '{name}'")
        if steps == 0:
            # No step runs: memories keep their initial values, outputs have no time steps.
            ctx.set_outputs("Outputs", [_no_steps(block, name, batch, xp) for name in outs])
            ctx.set_outputs("FinalMemories", [current[name] for name in memories])
            ctx.set_output("StepScopes", [])
            return
        # Each output is written step by step into its [batch, steps, ...] array (a copy: the
        # outputs never alias a value kept in a step scope); rows past their length stay zero.
        stacked: list[np.ndarray | None] = [None] * len(outs)
        # Bound at every step: each input's time slice, then each memory (a memory wins over an
        # input of the same name, as the later binding).
        bound_names = [*in_names, *memories]
        runner = ctx.executor.step_runner(block, ctx.frame, bound_names)
        slot_of = runner.plan.slot_of
        kept = step_slots(runner.plan, dict.fromkeys(bound_names))
        update_slots = [slot_of.get(u) for u in updates]
        out_slots = [slot_of.get(o) for o in outs]
        current = [current[name] for name in memories]
        updated = list(enumerate(zip(memories, updates, update_slots)))
        written = list(enumerate(zip(outs, out_slots)))
        running = _running(lengths, steps)
        # Each input's time slices, made at once ([batch, ...] views, as value[:, t]).
        slices = [list(value.swapaxes(0, 1)) for value in sequences]
        # Where every update and output is a variable of the step and the step is kernels
        # alone, a step is its compiled function over an env: no Frame, and the step scopes
        # are made at once after the loop, each holding its step's env.
        direct = None
        if None not in update_slots and None not in out_slots:
            direct = runner.direct(ctx.scope)
        if direct is not None:
            template, call = direct, runner.call
            n_in = len(in_names)
            in_binds = [(slot, slices[i]) for i, slot in runner.bound if i < n_in]
            memory_binds = [(slot, i - n_in) for i, slot in runner.bound if i >= n_in]
            envs = []
            shape_only = _shape_only_slots(op, runner.plan, kept, memories, updates, outs)
        else:
            new_scope = ctx.scope.new_scope
            scopes = []
        for t in range(steps):
            active = running[t]
            frame = None
            if direct is not None:
                env = template.copy()
                for slot, parts in in_binds:
                    env[slot] = parts[t]
                for slot, i in memory_binds:
                    env[slot] = current[i]
                call(env)
                if shape_only and t < steps - 1:  # the newest step keeps all (fetches read it)
                    _stand_in_for(env, shape_only)
                envs.append(env)
            else:
                scope = new_scope()
                scopes.append(scope)
                values = [value[t] for value in slices] + current
                frame = runner.run(scope, values)
                env = frame.env
                scope._hold(kept, env)
            for i, (name, update, slot) in updated:
                new = env[slot] if slot is not None else None
                if new is None and frame is not None:
                    new = _step_value(frame, dict(zip(bound_names, values)), update)
                old = current[i]
                if type(new) is not type(old) or new.shape != old.shape:
                    new = _same_shape(new, old, name, update, t)
                if active is not None:
                    new = xp.where(_rows(active, new.ndim), new, old)
                current[i] = new
            for i, (name, slot) in written:
                value = env[slot] if slot is not None else None
                if value is None and frame is not None:
                    value = _step_value(frame, dict(zip(bound_names, values)), name)
                if type(value) is not xp.ndarray or not value.ndim or value.shape[0] != batch:
                    value = _as_rows(value, batch, name, "step output")
                out = stacked[i]
                if out is None:
                    # every step writes all its rows unless lengths end some early
                    make = xp.empty if lengths is None else xp.zeros
                    out = stacked[i] = make((batch, steps, *value.shape[1:]), value.dtype)
                elif out.shape[2:] != value.shape[1:]:
                    raise ControlFlowError(
                        f"recurrent: step output '{name}' has shape {list(value.shape)} at "
                        f"step {t} but {[batch, *out.shape[2:]]} at step 0"
                    )
                if active is None:
                    out[:, t] = value
                else:
                    out[active, t] = value[active]
        if direct is not None:
            scopes = ctx.scope._new_held_scopes(kept, envs)
        ctx.set_outputs("Outputs", stacked)
        ctx.set_outputs("FinalMemories", current)
        ctx.set_output("StepScopes", scopes)

    def grad_maker(op: OpDesc, ctx: GradContext) -> list[GradOpSpec]:
        attrs = op.attrs
        block = attrs["sub_block"]
        memories, updates, outs = attrs["memories"], attrs["updates"], attrs["step_outputs"]
        out_names, final_names = op.output("Outputs"), op.output("FinalMemories")
        out_grads = [ctx.grad_of(n) for n in out_names]
        final_grads = [ctx.grad_of(n) for n in final_names]
        if all(g is None for g in out_grads + final_grads):
            return []
        in_names, boot_names = op.input("Inputs"), op.input("Boots")
        param_names = op.input("Params")
        in_grads = [ctx.grad_of(n) for n in in_names]
        boot_grads = [ctx.grad_of(n) for n in boot_names]
        param_grads = [ctx.grad_of(n) for n in param_names]
        # Every float memory carries gradient through time, even when its boot value needs
        # none: a parameter's gradient flows through it.
        chained = [
            (name, update)
            for name, update in zip(memories, updates)
            if (desc := block.find_var(name)) is not None
            and desc.type == "lod_tensor"
            and np.dtype(desc.dtype).kind in "fc"
        ]
        seeds: dict[str, str] = {}
        for name, g in zip(outs, out_grads):
            if g is not None:
                seeds.setdefault(name, name + GRAD_SUFFIX)
        for _, update in chained:
            seeds.setdefault(update, update + GRAD_SUFFIX)
        wanted = [name for name, _ in chained]
        wanted += [n for n, g in zip(in_names, in_grads) if g and n not in wanted]
        wanted += [n for n, g in zip(param_names, param_grads) if g and n not in wanted]
        if not wanted:
            return []
        grad_block, got = ctx.backward_block(block, seeds, wanted)
        step_values = set(block.vars) | set(in_names) | set(memories)
        wanted_params = [got.get(n, "") if g else "" for n, g in zip(param_names, param_grads)]
        deferred = defer_parameter_products(grad_block, step_values, wanted_params)
        chained_names = {name for name, _ in chained}
        grad_attrs = {
            "grad_block": grad_block,
            "memories": memories,
            "updates": updates,
            "step_outputs": outs,
            "output_seeds": [seeds[n] if g is not None else "" for n, g in zip(outs, out_grads)],
            "memory_seeds": [
                seeds[u] if m in chained_names else "" for m, u in zip(memories, updates)
            ],
            "memory_grads": [got.get(m, "") for m in memories],
            "input_grads": [got.get(n, "") if g else "" for n, g in zip(in_names, in_grads)],
            "param_grads": wanted_params,
            **deferred,
        }
        inputs = {
            "Inputs": in_names,
            "Boots": boot_names,
            "Params": param_names,
            "Lengths": op.input("Lengths"),
            "Outputs": out_names,
            "Outputs" + GRAD_SUFFIX: [g or "" for g in out_grads],
            "FinalMemories": final_names,
            "FinalMemories" + GRAD_SUFFIX: [g or "" for g in final_grads],
            "StepScopes": op.output("StepScopes"),
        }
        outputs = {
            "Inputs" + GRAD_SUFFIX: [g or "" for g in in_grads],
            "Boots" + GRAD_SUFFIX: [g or "" for g in boot_grads],
            "Params" + GRAD_SUFFIX: [g or "" for g in param_grads],
        }
        return [GradOpSpec("recurrent_grad", inputs, outputs, grad_attrs)]


@register_op
class recurrent_grad:
    """Backward through time: runs the step's gradient block in each kept step scope, last
    step first. Seeds of a step are the output gradients' time slice and the gradient flowing
    into each memory's new value; the block gives the gradient of the memory's old value (passed
    to the step before), of the step inputs' slices and of outer variables (summed over steps).
    Rows past their length pass the memory gradient straight through and get no other."""

    inputs = (
        "Inputs*",
        "Boots*",
        "Params*",
        "Lengths?",
        "Outputs*",
        "Outputs@GRAD*",
        "FinalMemories*",
        "FinalMemories@GRAD*",
        "StepScopes",
    )
    outputs = ("Inputs@GRAD*", "Boots@GRAD*", "Params@GRAD*")
    # the step values come from the step scopes: these only give shapes and dtypes
    no_need_buffer = ("Inputs", "Boots", "Outputs", "FinalMemories")
    attrs = {
        "grad_block": None,
        "memories": [],
        "updates": [],
        "step_outputs": [],
        "output_seeds": [],
        "memory_seeds": [],
        "memory_grads": [],
        "input_grads": [],
        "param_grads": [],
        **DEFERRED_ATTRS,
    }
    infer_op = check_block_attrs("grad_block")

    def run(ctx):
        attrs = ctx.attrs
        grad_block = attrs["grad_block"]
        memories = attrs["memories"]
        outs, out_seeds = attrs["step_outputs"], attrs["output_seeds"]
        mem_seeds, mem_grads = attrs["memory_seeds"], attrs["memory_grads"]
        sequences = ctx.inputs("Inputs")
        params = ctx.inputs("Params")
        boots = ctx.inputs("Boots")
        out_grads = ctx.inputs("Outputs" + GRAD_SUFFIX)
        scopes = ctx.input("StepScopes") or []
        xp = ctx.device.xp
        batch, steps = _sequences(ctx.op.input("Inputs"), sequences)
        lengths = _lengths(ctx.input("Lengths"), batch, steps, "Lengths")
        x_grads: list[Any] = [None] * len(sequences)
        # Gradient w.r.t. each memory's value after the step being processed: after the last
        # step, that of the final value (zero if nothing reads it).
        final_grads = ctx.inputs("FinalMemories" + GRAD_SUFFIX)
        flowing: dict[str, Any] = {m: g for m, g in zip(memories, final_grads) if g is not None}
        seeded_outs = [item for item in zip(outs, out_seeds, out_grads) if item[1]]
        seeded_memories = [item for item in zip(memories, mem_seeds, mem_grads) if item[1]]
        x_wanted = [(i, name) for i, name in enumerate(attrs["input_grads"]) if name]
        p_sums = [GradSum() for _ in attrs["param_grads"]]
        p_wanted = [(total, name) for total, name in zip(p_sums, attrs["param_grads"]) if name]
        deferred = deferred_products(attrs)
        p_wanted = [item for item in p_wanted if item[1] not in deferred]
        # Bound at every step: the seeds (a step output's gradient slice, a memory's gradient).
        seed_names = list(dict.fromkeys([s for _, s, _ in seeded_outs + seeded_memories]))
        runner = ctx.executor.step_runner(grad_block, ctx.frame, seed_names)
        running = _running(lengths, len(scopes))
        plan = runner.plan
        slot_of = plan.slot_of
        # Each step's seeds are a list in the order of `seed_names`.
        seed_at = {name: k for k, name in enumerate(seed_names)}
        # Where each gradient the loop reads after a step is: its slot in the step's gradient
        # frame, else (a seed passed straight through) the seed bound to it.
        memory_reads = [(name, slot_of.get(g), seed_at.get(g)) for name, _, g in seeded_memories]
        p_reads = [(total, slot_of.get(g), seed_at.get(g)) for total, g in p_wanted]
        products = list(deferred.values())
        # Each seeded output's gradient slice of every step, finished rows zeroed, made before
        # the loop (a step output's shape and dtype are one over the steps: from the last).
        out_parts = [
            (seed_at[seed], _step_parts(grad, scopes, name, running))
            for name, seed, grad in seeded_outs
        ]
        memory_seeds = [(name, seed_at[seed]) for name, seed, _ in seeded_memories]
        x_steps: list[list[Any]] = [[None] * len(scopes) for _ in x_wanted]
        x_reads = [
            (steps_of, slot_of.get(g), seed_at.get(g))
            for steps_of, (_, g) in zip(x_steps, x_wanted)
        ]
        # Deferred products whose X and dOut are both in a step's env take them from there.
        appended = [(product, *product.slots_in(plan)) for product in products]
        collected = [p for p, x_slot, g_slot in appended if x_slot is None or g_slot is None]
        appended = [(p, p.xs, p.gs, x, g) for p, x, g in appended if p not in collected]
        # Where the step scopes hold values alone and the step is kernels alone, a step is its
        # compiled function over an env of held values and seeds (else runner.step).
        direct = runner.direct_held(scopes)
        if direct is not None:
            template, reads = direct
            call = runner.call
            held_values = [scope._held_only()[1] for scope in scopes]
        for t in reversed(range(len(scopes))):
            scope = scopes[t]
            active = running[t]
            seeds: list[Any] = [None] * len(seed_names)
            for k, parts in out_parts:
                part = parts[t]
                seeds[k] = part if seeds[k] is None else seeds[k] + part
            # Rows of finished sequences pass their memory gradient on unchanged.
            passed: dict[str, Any] | None = None
            for name, k in memory_seeds:
                grad = flowing.get(name)
                if grad is None:
                    grad = xp.zeros_like(scope_array(scope, name))
                if active is not None:
                    rows = _rows(active, grad.ndim)
                    passed = {} if passed is None else passed
                    passed[name] = xp.where(rows, xp.zeros((), grad.dtype), grad)
                    grad = xp.where(rows, grad, xp.zeros((), grad.dtype))
                seeds[k] = grad if seeds[k] is None else seeds[k] + grad
            env = None
            if direct is not None:
                env = template.copy()
                values = held_values[t]
                for slot, index in reads:
                    value = values[index]
                    if value is None:  # not held here: runner.step looks beyond the step
                        env = None
                        break
                    env[slot] = value
            if env is None:
                env = runner.step(scope, seeds)
            else:
                for k, slot in runner.bound:
                    env[slot] = seeds[k]
                call(env)
            for name, slot, k in memory_reads:
                grad = env[slot] if slot is not None else None
                if grad is None:
                    grad = seeds[k] if k is not None else None
                    if grad is None:
                        grad = xp.zeros_like(scope_array(scope, name))
                if passed is not None and (held := passed.get(name)) is not None:
                    grad = grad + held
                flowing[name] = grad
            for steps_of, slot, k in x_reads:
                grad = env[slot] if slot is not None else None
                if grad is None and k is not None:
                    grad = seeds[k]
                steps_of[t] = grad
            for total, slot, k in p_reads:
                grad = env[slot] if slot is not None else None
                if grad is None and k is not None:
                    grad = seeds[k]
                if grad is not None:
                    total.add(grad)
            for product, xs, gs, x_slot, g_slot in appended:
                grad = env[g_slot]
                if grad is not None:
                    x = env[x_slot]
                    xs.append(scope_array(scope, product.x_name) if x is None else x)
                    gs.append(grad)
            if collected:
                by_name = dict(zip(seed_names, seeds))
                for product in collected:
                    product.collect(scope, plan, env, by_name)
        for (i, _), steps_of in zip(x_wanted, x_steps):
            x_grads[i] = _stacked_steps(steps_of, sequences[i])
        for total, name, value in zip(p_sums, attrs["param_grads"], params):
            if name in deferred and (grad := deferred[name].finish(value)) is not None:
                total.add(grad)
        p_grads = [total.value for total in p_sums]
        boot_grads = []
        for name, boot in zip(memories, boots):
            grad = flowing.get(name)
            if grad is not None and getattr(boot, "ndim", 0) == 0:
                grad = grad.reshape(())
            boot_grads.append(grad)
        set_grads(ctx, "Inputs" + GRAD_SUFFIX, x_grads, sequences)
        set_grads(ctx, "Boots" + GRAD_SUFFIX, boot_grads, boots)
        set_grads(ctx, "Params" + GRAD_SUFFIX, p_grads, params)


@register_op
class rnn_memory_boot:
    """Out = a [Ref.shape[0], *shape] tensor filled with `value`: the initial value of an RNN
    memory declared by shape (one row per sequence of the batch Ref belongs to)."""

    inputs, outputs = ("Ref",), ("Out",)
    attrs = {"shape": [], "value": 0.0, "dtype": "float32"}
    no_grad_inputs = ("Ref",)

    def infer(Ref, shape, value, dtype):
        return VarInfo((Ref.shape[0] if Ref.shape else -1, *shape), dtype)

    def forward(Ref, shape, value, dtype, xp):
        return xp.full((Ref.shape[0], *shape), value, dtype=dtype)
