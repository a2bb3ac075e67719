"""BlockPlan: a block prepared once for running many times.

Preparing resolves every op to its kernel and every variable name to an index ("slot") in a
flat list of values, the env. Running a plan is then a loop over pre-bound step closures that
read and write env slots: no registry, name or shape lookups in the hot loop (STYLE habit 3).

Kernels are pure: they never write into their inputs. So persistable variables are loaded from
the scope before the loop and written back only after every op succeeded, and a failed run
leaves the scope's persistable state exactly as it was.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from nestflow.errors import ExecutionError, NanInfError, NestflowError
from nestflow.framework.program import Block, OpDesc
from nestflow.ops.registry import OpDef, get_op_def

Env = list
Step = Callable[[Env], None]


class RunContext:
    """What a scope-aware op (`run(ctx)`: control flow, print, feed/fetch) sees while it runs."""

    __slots__ = ("op", "op_def", "attrs", "frame", "in_slots", "out_slots")

    def __init__(self, op: OpDesc, op_def: OpDef, attrs: dict, frame: Frame, in_slots, out_slots):
        self.op = op
        self.op_def = op_def
        self.attrs = attrs
        self.frame = frame
        self.in_slots = in_slots
        self.out_slots = out_slots

    @property
    def scope(self):
        return self.frame.scope

    @property
    def executor(self):
        return self.frame.executor

    def has_input(self, slot: str) -> bool:
        return bool(self.in_slots.get(slot))

    def input(self, slot: str) -> Any:
        """The value of a one-variable input slot (None if the slot is empty)."""
        slots = self.in_slots.get(slot)
        return self.frame.env[slots[0]] if slots and slots[0] >= 0 else None

    def inputs(self, slot: str) -> list[Any]:
        """Values of a list slot; an empty name ("", slot -1: no variable) reads as None."""
        env = self.frame.env
        return [env[i] if i >= 0 else None for i in self.in_slots.get(slot, [])]

    def set_output(self, slot: str, value: Any) -> None:
        slots = self.out_slots.get(slot)
        if slots and slots[0] >= 0:
            self.frame.env[slots[0]] = value

    def set_outputs(self, slot: str, values: list[Any]) -> None:
        for i, value in zip(self.out_slots.get(slot, []), values):
            if i >= 0:
                self.frame.env[i] = value

    def lookup(self, name: str) -> Any:
        """A variable's value by name: this frame's env, enclosing frames, then the scope chain."""
        return self.frame.lookup(name)

    def run_block(self, block: Block, scope, values: dict[str, Any]) -> Frame:
        """Run sub-block `block` in `scope`, with `values` bound first; returns its frame."""
        return self.frame.executor.run_sub_block(block, scope, values, parent=self.frame)


class Frame:
    """One execution of a BlockPlan: its env, the scope it runs in, and the enclosing frame."""

    __slots__ = ("plan", "env", "scope", "executor", "parent", "check_nan_inf")

    def __init__(self, plan: BlockPlan, scope, executor, parent: Frame | None = None):
        self.plan = plan
        self.env = [None] * len(plan.names)
        self.scope = scope
        self.executor = executor
        self.parent = parent
        self.check_nan_inf = executor.check_nan_inf if executor is not None else False

    def lookup(self, name: str) -> Any:
        slot = self.plan.slot_of.get(name)
        if slot is not None and self.env[slot] is not None:
            return self.env[slot]
        if self.parent is not None:
            return self.parent.lookup(name)
        return _value_in_scope(self.scope, name)

    def value(self, name: str) -> Any:
        slot = self.plan.slot_of.get(name)
        return None if slot is None else self.env[slot]

    def store_in_scope(self, scope=None, names=None) -> None:
        """Keep this frame's values as variables of `scope` (default: the frame's scope), so a
        gradient op can run in that scope later. By default every variable the block declares
        itself is kept (outer variables stay where they are)."""
        from nestflow.core.tensor import Tensor

        scope = scope if scope is not None else self.scope
        block = self.plan.block
        if names is None:
            names = [n for n in self.plan.names if n in block.vars]
        for name in names:
            slot = self.plan.slot_of.get(name)
            value = None if slot is None else self.env[slot]
            if value is None:
                continue
            var = scope.var(name)
            if isinstance(value, np.ndarray):
                tensor = Tensor()
                tensor._array = value
                var.set_value(tensor)
            else:
                var.set_value(value)

    def run(self) -> None:
        steps = self.plan.steps
        env = self.env
        if self.check_nan_inf:
            return self._run_checked()
        index = 0
        try:
            for index, step in enumerate(steps):  # noqa: B007  (index names the failing op)
                step(env, self)
        except NestflowError as exc:
            if exc.location is not None:
                raise
            raise type(exc)(exc.message, location=self.plan.ops[index].location()) from exc
        except Exception as exc:
            raise self.plan.runtime_error(index, env, exc) from exc

    def _run_checked(self) -> None:
        env = self.env
        for index, step in enumerate(self.plan.steps):
            try:
                step(env, self)
            except NestflowError as exc:
                if exc.location is not None:
                    raise
                raise type(exc)(exc.message, location=self.plan.ops[index].location()) from exc
            except Exception as exc:
                raise self.plan.runtime_error(index, env, exc) from exc
            op = self.plan.ops[index]
            for name in op.output_names():
                value = env[self.plan.slot_of[name]] if name else None
                if isinstance(value, np.ndarray) and value.dtype.kind in "fc":
                    if not np.isfinite(value).all():
                        bad = "NaN" if np.isnan(value).any() else "Inf"
                        raise NanInfError(
                            f"output '{name}' contains {bad} (shape {list(value.shape)})",
                            location=op.location(),
                        )


def _value_in_scope(scope, name: str) -> Any:
    if scope is None:
        return None
    var = scope.find_var(name)
    if var is None or var._value is None:
        return None
    held = var._value
    return getattr(held, "_array", held) if type(held).__name__ == "Tensor" else held


class BlockPlan:
    """Ops of one block resolved to step closures over env slots."""

    def __init__(self, block: Block):
        self.block = block
        self.ops: list[OpDesc] = list(block.ops)
        self.names: list[str] = []
        self.slot_of: dict[str, int] = {}
        for op in self.ops:
            for name in op.input_names() + op.output_names():
                self.slot(name)
        # Names read before any op of this block writes them: they come from feeds, the
        # enclosing frame or the scope.
        written: set[str] = set()
        self.external_inputs: list[str] = []
        for op in self.ops:
            for name in op.input_names():
                if name and name not in written and name not in self.external_inputs:
                    self.external_inputs.append(name)
            written.update(n for n in op.output_names() if n)
        self.written = written
        self.steps: list[Callable] = [self._make_step(op) for op in self.ops]

    def slot(self, name: str) -> int:
        index = self.slot_of.get(name)
        if index is None:
            index = self.slot_of[name] = len(self.names)
            self.names.append(name)
        return index

    def _make_step(self, op: OpDesc) -> Callable:
        op_def = get_op_def(op.type)
        attrs = {k: v for k, v in op.attrs.items() if k in op_def.attrs}
        in_slots = {s: [self.slot(n) if n else -1 for n in names] for s, names in op.inputs.items()}
        out_slots = {
            s: [self.slot(n) if n else -1 for n in names] for s, names in op.outputs.items()
        }
        if op_def.run is not None:
            run = op_def.run

            def scope_step(env, frame):
                run(RunContext(op, op_def, attrs, frame, in_slots, out_slots))

            return scope_step
        return _kernel_step(op_def, attrs, in_slots, out_slots)

    def runtime_error(self, index: int, env: Env, exc: Exception) -> ExecutionError:
        op = self.ops[index]
        shapes = []
        for name in op.input_names():
            value = env[self.slot_of[name]] if name else None
            if isinstance(value, np.ndarray):
                shapes.append(f"{name}: {value.dtype}{list(value.shape)}")
            else:
                shapes.append(f"{name}: {type(value).__name__}")
        message = f"{type(exc).__name__}: {exc}\n  inputs: " + ", ".join(shapes)
        return ExecutionError(message, location=op.location())


def _kernel_step(op_def: OpDef, attrs: dict, in_slots: dict, out_slots: dict) -> Callable:
    """A closure running `op_def.forward` on env slots; the common shapes get fast versions."""
    kernel = op_def.specialize(**attrs) if op_def.specialize is not None else None
    if kernel is None:
        kernel = op_def.forward
        if op_def.backward_wants_needs:
            needs = tuple(bool(out_slots.get(s.name)) for s in op_def.outputs)
            attrs = dict(attrs, needs=needs)
        if attrs:
            kernel = functools.partial(kernel, **attrs)
    # Argument sources: one slot, a list of slots (duplicable), or absent (None).
    sources = []
    for slot in op_def.inputs:
        indices = in_slots.get(slot.name)
        if slot.duplicable:
            sources.append(list(indices or []))
        else:
            sources.append(indices[0] if indices and indices[0] >= 0 else None)
    returns_tuple = len(op_def.outputs) > 1 or op_def.forward_type is not None
    targets = []
    for slot in op_def.outputs:
        indices = out_slots.get(slot.name)
        if slot.duplicable:
            targets.append(list(indices or []))
        else:
            targets.append(indices[0] if indices and indices[0] >= 0 else None)

    simple_inputs = all(isinstance(s, int) for s in sources)
    if simple_inputs and not returns_tuple and isinstance(targets[0], int):
        out = targets[0]
        if len(sources) == 1:
            (a,) = sources

            def step1(env, frame):
                env[out] = kernel(env[a])

            return step1
        if len(sources) == 2:
            a, b = sources

            def step2(env, frame):
                env[out] = kernel(env[a], env[b])

            return step2

    def gather(env):
        args = []
        for source in sources:
            if source is None:
                args.append(None)
            elif isinstance(source, list):
                args.append([env[i] if i >= 0 else None for i in source])
            else:
                args.append(env[source])
        return args

    def step(env, frame):
        result = kernel(*gather(env))
        results = result if returns_tuple else (result,)
        for target, value in zip(targets, results):
            if target is None:
                continue
            if isinstance(target, list):
                for i, v in zip(target, value):
                    if i >= 0:
                        env[i] = v
            else:
                env[target] = value

    return step
