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
import inspect
from collections.abc import Callable
from sys import getrefcount
from time import perf_counter_ns
from typing import Any, NoReturn

import numpy as np

from nestflow.core.device_context import DeviceContext, device_context
from nestflow.core.dtype import LOW_PRECISION, is_inexact
from nestflow.errors import ExecutionError, NanInfError, NestflowError
from nestflow.framework.program import Block, OpDesc
from nestflow.ops.registry import OpDef, VarInfo, get_op_def, place_args, shape_stand_in

Env = list
Step = Callable[[Env], None]

# The running nestflow.profiler (None: not profiling). While set, blocks run their timed variant
# and tell it when each op starts and ends: `profiler.recorder(frame)` gives the frame's
# `record(op_index, start_ns)`, called as each op finishes.
profiler: Any = None


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

    @property
    def device(self) -> DeviceContext:
        """The DeviceContext of the place the op runs on (its `xp`, transfers, ...)."""
        return self.frame.plan.device

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

    def __init__(
        self,
        plan: BlockPlan,
        scope,
        executor,
        parent: Frame | None = None,
        env: list | None = None,
        check_nan_inf: bool | None = None,
    ):
        self.plan = plan
        self.env = [None] * len(plan.names) if env is None else env
        self.scope = scope
        self.executor = executor
        self.parent = parent
        if check_nan_inf is not None:  # the run's own choice (Executor.run)
            self.check_nan_inf = check_nan_inf
        elif parent is not None:
            self.check_nan_inf = parent.check_nan_inf
        else:
            self.check_nan_inf = executor.check_nan_inf if executor is not None else False

    def lookup(self, name: str) -> Any:
        slot = self.plan.slot_of.get(name)
        if slot is not None and self.env[slot] is not None:
            return self.env[slot]
        if self.parent is not None:
            return self.parent.lookup(name)
        # Scope._value: as find_var, without making Variables of a step scope's held values.
        return None if self.scope is None else self.scope._value(name)

    def value(self, name: str) -> Any:
        slot = self.plan.slot_of.get(name)
        return None if slot is None else self.env[slot]

    def store_in_scope(self, scope=None, names=None) -> None:
        """Keep this frame's values as variables of `scope` (default: the frame's scope), so a
        gradient op can run in that scope later. By default every variable the block declares
        itself is kept (outer variables stay where they are); `names` may also be a ready
        name -> slot map. The frame must have finished: the scope keeps its env as it is and
        makes Variables of it only when asked for one by name (Scope._hold)."""
        scope = scope if scope is not None else self.scope
        plan = self.plan
        if isinstance(names, dict):
            slots = names
        elif names is None:
            slots = plan.__dict__.get("_kept_slots")
            if slots is None:
                declared = plan.block.vars
                slots = {n: plan.slot_of[n] for n in plan.names if n in declared}
                plan.__dict__["_kept_slots"] = slots
        else:
            slots = {n: plan.slot_of[n] for n in names if n in plan.slot_of}
        scope._hold(slots, self.env)

    def run(self, keep: frozenset[str] | None = None) -> None:
        """Run every op. With `keep` (the names the caller still wants afterwards), big
        temporaries are released right after their last use."""
        if self.check_nan_inf:
            return self._run_checked()
        plan = self.plan
        try:
            if profiler is None:
                plan.compiled(keep)(self.env, self)
            else:
                plan.compiled(keep, timed=True)(self.env, self, profiler.recorder(self))
        except Exception as exc:
            self.raise_located(exc, self.env)

    def raise_located(self, exc: Exception, env: Env) -> NoReturn:
        """Raise `exc`, which an op of this frame's plan raised running over `env`, as the
        error naming that op and the user's line that made it."""
        plan = self.plan
        if isinstance(exc, NestflowError):
            if exc.location is not None:
                raise exc
            index = plan.failing_op(exc)
            raise type(exc)(exc.message, location=plan.ops[index].location()) from exc
        raise plan.runtime_error(plan.failing_op(exc), env, exc) from exc

    def _run_checked(self) -> None:
        env = self.env
        record = profiler.recorder(self) if profiler is not None else None
        for index, step in enumerate(self.plan.steps):
            start = perf_counter_ns()
            try:
                step(env, self)
            except NestflowError as exc:
                if exc.location is not None:
                    raise
                raise type(exc)(exc.message, location=self.plan.ops[index].location()) from exc
            except Exception as exc:
                raise self.plan.runtime_error(index, env, exc) from exc
            if record is not None:
                record(index, start)
            op = self.plan.ops[index]
            xp = self.plan.device.xp
            for name in op.output_names():
                value = env[self.plan.slot_of[name]] if name else None
                if isinstance(value, xp.ndarray) and value.dtype.kind in "fc":
                    if not bool(xp.isfinite(value).all()):  # the check's meaning: a host read
                        bad = "NaN" if bool(xp.isnan(value).any()) else "Inf"
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
    """Ops of one block resolved to kernels over env slots, compiled into one function.

    The compiled function has one source line per op (`e[7] = k3(e[2], e[5])`), so running a
    block costs one Python call per op and nothing else; the traceback line of a failure names
    the op. `steps` holds the same ops as separate closures for the checked (NaN/Inf) path and
    for running a range of ops (PlainNet.run).
    """

    def __init__(self, block: Block, device: DeviceContext | None = None):
        self.block = block
        # Kernels declaring `xp` or `device` get this place's array module or context.
        self.device = device if device is not None else device_context()
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
        self.calls: list[_Call] = [self._make_call(op) for op in self.ops]
        # Every op a kernel over env slots (none runs sub-blocks or reads the frame): the
        # compiled function may then run with any frame of this plan.
        self.frame_free = all(get_op_def(op.type).run is None for op in self.ops)
        self.steps: list[Callable] = [call.closure() for call in self.calls]
        self._compiled: dict[frozenset[str] | None, Callable] = {}
        self._codes: set = set()

    def slot(self, name: str) -> int:
        index = self.slot_of.get(name)
        if index is None:
            index = self.slot_of[name] = len(self.names)
            self.names.append(name)
        return index

    def _make_call(self, op: OpDesc) -> _Call:
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

            return _Call(scope_step, None, None, False)
        return _kernel_call(op, op_def, attrs, in_slots, out_slots, self.device)

    def compiled(self, keep: frozenset[str] | None = None, timed: bool = False) -> Callable:
        """The block as one function of (env, frame). With `keep`, every big temporary not in
        `keep` is dropped from the env right after the op that uses it last. `timed`: the
        profiler's variant, a function of (env, frame, record) calling `record(op_index,
        start_ns)` as each op finishes."""
        key = (keep, True) if timed else keep
        function = self._compiled.get(key)
        if function is None:
            if keep is None:
                releases = stand_ins = [()] * len(self.ops)
            else:
                releases, stand_ins = self._releases(keep), self._stand_ins(keep)
            function = _compile(self.calls, releases, self.block.idx, timed, stand_ins)
            self._compiled[key] = function
            self._codes.add(function.__code__)
        return function

    def source(self, keep: frozenset[str] | None = None) -> str:
        """The Python source the block runs as (for reading and debugging): one line per op,
        `kN` its kernel, `e[i]` the value of variable `names[i]`."""
        return self.compiled(keep).source

    def failing_op(self, exc: BaseException) -> int:
        """The index of the op that raised `exc` inside a compiled function of this plan."""
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in self._codes:
                return tb.tb_lineno - _FIRST_OP_LINE
            tb = tb.tb_next
        return 0

    def _releases(self, keep: frozenset[str]) -> list[tuple[int, ...]]:
        """For each op, the slots of temporaries it is the last to use.

        Never released: persistable variables (written back after the run), names in `keep`
        (fetches), names any sub-block mentions (read by name while it runs), and arrays known
        to be small, where the saved memory is not worth a line.
        """
        last_use, _ = self._last_uses()
        seen_by_sub_blocks = _names_in_sub_blocks(self.ops)
        drops: list[list[int]] = [[] for _ in self.ops]
        for name, index in last_use.items():
            slot = self._big_temporary(name, keep, seen_by_sub_blocks)
            if slot is not None:
                drops[index].append(slot)
        return [tuple(d) for d in drops]

    def _stand_ins(self, keep: frozenset[str]) -> list[tuple[int, ...]]:
        """For each op, the slots of temporaries it is the last to need the value of, where
        later ops read them through no_need_buffer slots only (a gradient op needing a forward
        value's shape): the value then gives way to a zero-stride stand-in of its shape and
        dtype, and its memory is free long before its last reader has run. The same names are
        exempt as from `_releases`."""
        last_use, last_need = self._last_uses()
        seen_by_sub_blocks = _names_in_sub_blocks(self.ops)
        points: list[list[int]] = [[] for _ in self.ops]
        for name, index in last_need.items():
            if last_use[name] == index:
                continue  # released after that op anyway
            slot = self._big_temporary(name, keep, seen_by_sub_blocks)
            if slot is not None:
                points[index].append(slot)
        return [tuple(p) for p in points]

    def _last_uses(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per name, the index of the last op that uses it, and of the last that needs its
        value (writes it, or reads it through a slot not in its op's no_need_buffer)."""
        last_use: dict[str, int] = {}
        last_need: dict[str, int] = {}
        for index, op in enumerate(self.ops):
            shape_only = get_op_def(op.type).no_need_buffer
            for slot, names in op.inputs.items():
                for name in names:
                    if name:
                        last_use[name] = index
                        if slot not in shape_only:
                            last_need[name] = index
            for name in op.output_names():
                if name:
                    last_use[name] = last_need[name] = index
        return last_use, last_need

    def _big_temporary(
        self, name: str, keep: frozenset[str], seen_by_sub_blocks: set[str]
    ) -> int | None:
        """The slot of `name` if the plan may drop its value before the run ends: not
        persistable (written back after the run), not in `keep` (fetched), not read by name in
        a sub-block, and not known to be small."""
        desc = self.block.find_var(name)
        if desc is None or desc.persistable or name in keep or name in seen_by_sub_blocks:
            return None
        return self.slot_of[name] if _static_size(desc.shape) >= RELEASE_MIN_ELEMENTS else None

    def runtime_error(self, index: int, env: Env, exc: Exception) -> ExecutionError:
        op = self.ops[index]
        shapes = []
        for name in op.input_names():
            value = env[self.slot_of[name]] if name else None
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                shapes.append(f"{name}: {value.dtype}{list(value.shape)}")
            else:
                shapes.append(f"{name}: {type(value).__name__}")
        message = f"{type(exc).__name__}: {exc}\n  inputs: " + ", ".join(shapes)
        return ExecutionError(message, location=op.location())


# Temporaries known to hold fewer elements are kept to the end of the run: dropping them early
# saves no memory worth a statement.
RELEASE_MIN_ELEMENTS = 4096
_FIRST_OP_LINE = 2  # line 1 of a compiled block is its `def`


class _Call:
    """How one op runs: `function(env, frame)` when `args` is None, else
    `function(*args)` with its results stored into `targets` (env slots, None: dropped).

    `donor` is the env slot of an input whose buffer `into(*args, out=buffer)` may take for the
    output (the op's `inplace` declaration), when the run owns that buffer outright.
    """

    __slots__ = ("function", "args", "targets", "returns_tuple", "donor", "into")

    def __init__(self, function: Callable, args, targets, returns_tuple: bool):
        self.function = function
        self.args = args
        self.targets = targets
        self.returns_tuple = returns_tuple
        self.donor: int | None = None
        self.into: Callable | None = None

    def closure(self) -> Callable[[Env, Frame], None]:
        if self.args is None:
            return self.function
        return _compile([self], [()], "step")

    def source(self, name: str, donate: bool = False) -> str:
        """This op's statement, calling the function bound to `name` (its in-place variant to
        `name`_into, when `donate` and the donor's buffer turns out to be owned)."""
        if self.args is None:
            return f"{name}(e, frame)"
        args = ", ".join(_arg_source(a) for a in self.args)
        call = f"{name}({args})"
        if donate:
            buffer = f"e[{self.donor}]"
            call = f"{name}_into({args}, out={buffer}) if _owned({buffer}) else {call}"
        if not self.returns_tuple:
            (target,) = self.targets
            return call if target is None else f"e[{target}] = {call}"
        stores = [f"e[{t}] = r[{i}]" for i, t in enumerate(self.targets) if t is not None]
        return "; ".join([f"r = {call}"] + stores)


def _owned(value: Any) -> bool:
    """Whether nothing but the env slot holds `value` (an array) or the array it views, so an op
    may overwrite it. The counts to expect come from `_held_once_counts`, which reads them the
    same way (in CPython 3.11: the env slot, this call's argument and getrefcount's own; for a
    view's base: the view's, the local `base` and getrefcount's)."""
    if (
        getrefcount(value) != _HELD_ONCE
        or type(value) is not np.ndarray
        or not value.flags.writeable
    ):
        return False
    base = value.base
    return base is None or (type(base) is np.ndarray and getrefcount(base) == _BASE_HELD_ONCE)


def _held_once_counts(value: Any) -> tuple[int, int]:
    """What _owned reads for a view held by one env slot whose base only it holds: the same
    statements, so the counts follow the interpreter (CPython 3.14 borrows references to
    locals where 3.11 takes them)."""
    base = value.base
    return getrefcount(value), getrefcount(base)


_probe_env = [np.empty(2)[1:]]  # an env slot holding a view, as e[s] does
_HELD_ONCE, _BASE_HELD_ONCE = _held_once_counts(_probe_env[0])
del _probe_env


def _into(kernel: Callable) -> Callable | None:
    """`kernel` as a function taking `out=`, or None if it cannot write into a given buffer."""
    if isinstance(kernel, np.ufunc) and kernel.nin == 2:
        return _ufunc_into(kernel)
    if isinstance(kernel, np.ufunc) or (
        isinstance(kernel, functools.partial) and isinstance(kernel.func, np.ufunc)
    ):
        return kernel
    try:
        parameters = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return None
    return kernel if "out" in parameters else None


def _ufunc_into(ufunc: np.ufunc) -> Callable:
    def into(x, y, out):
        # Broadcasting may make the result bigger than the buffer: NumPy checks that (and the
        # dtype cast) before writing anything, so falling back to a new array is safe.
        try:
            return ufunc(x, y, out=out)
        except (ValueError, TypeError):
            return ufunc(x, y)

    return into


def _arg_source(arg) -> str:
    if arg is None:
        return "None"
    if isinstance(arg, list):
        return "[" + ", ".join("None" if i < 0 else f"e[{i}]" for i in arg) + "]"
    return f"e[{arg}]"


def _compile(
    calls: list[_Call],
    releases: list[tuple[int, ...]],
    tag,
    timed: bool = False,
    stand_ins: list[tuple[int, ...]] | None = None,
) -> Callable:
    lines = [f"def block_{tag}(e, frame, record):" if timed else f"def block_{tag}(e, frame):"]
    namespace: dict[str, Any] = {
        "_owned": _owned,
        "_clock": perf_counter_ns,
        "_stand_in": shape_stand_in,
    }
    stand_ins = stand_ins or [()] * len(calls)
    for index, (call, drops, shapes) in enumerate(zip(calls, releases, stand_ins)):
        name = f"k{index}"
        namespace[name] = call.function
        donate = call.into is not None and call.donor in drops
        if donate:
            namespace[name + "_into"] = call.into
        statement = call.source(name, donate)
        if drops:
            statement += "; " + "; ".join(f"e[{slot}] = None" for slot in drops)
        if shapes:
            statement += "; " + "; ".join(f"e[{s}] = _stand_in(e[{s}])" for s in shapes)
        if timed:  # still one line per op: failing_op reads the op from the line number
            statement = f"t = _clock(); {statement}; record({index}, t)"
        lines.append("    " + statement)
    if not calls:
        lines.append("    pass")
    source = "\n".join(lines)
    exec(compile(source, f"<nestflow block {tag}>", "exec"), namespace)  # noqa: S102
    function = namespace[f"block_{tag}"]
    function.source = source  # what BlockPlan.source shows
    return function


def _static_size(shape) -> float:
    size = 1.0
    for d in shape:
        if d < 0:
            return float("inf")
        size *= d
    return size


def _names_in_sub_blocks(ops) -> set[str]:
    """Every variable name an op inside a sub-block (at any depth) reads or writes."""
    names: set[str] = set()
    pending = [b for op in ops for b in op.sub_blocks()]
    seen: set[int] = set()  # each block once (a block may be reached from several ops)
    while pending:
        block = pending.pop()
        if block.idx in seen:
            continue
        seen.add(block.idx)
        for op in block.ops:
            names.update(n for n in op.input_names() + op.output_names() if n)
            pending.extend(op.sub_blocks())
    return names


def _kernel_call(
    op: OpDesc, op_def: OpDef, attrs: dict, in_slots: dict, out_slots: dict, device: DeviceContext
) -> _Call:
    """The op's kernel with its attrs (and its place's `xp` or `device`, where it declares
    them) bound, as a call over env slots."""
    kernel = _specialized(op, op_def, attrs, device)
    if kernel is None:
        kernel = op_def.forward
        if op_def.backward_wants_needs:
            # A gradient nobody takes (no slot, or an empty name: -1) is not computed.
            needs = tuple(any(i >= 0 for i in out_slots.get(s.name, ())) for s in op_def.outputs)
            attrs = dict(attrs, needs=needs)
        cuda = op_def.forward_cuda if device.runs_cuda_kernels else None
        if cuda is not None:
            kernel = _with_cuda_kernel(cuda, kernel, attrs, device)
        else:
            attrs = {**attrs, **place_args(kernel, device)}
            if attrs:
                kernel = functools.partial(kernel, **attrs)
    returns_tuple = len(op_def.outputs) > 1 or op_def.forward_type is not None
    kernel = _keeping_low_precision(op, op_def, kernel, returns_tuple)
    # Argument sources: one slot, a list of slots (duplicable), or absent (None).
    args = []
    for slot in op_def.inputs:
        indices = in_slots.get(slot.name)
        if slot.duplicable:
            args.append(list(indices or []))
        else:
            args.append(indices[0] if indices and indices[0] >= 0 else None)
    targets = []
    for slot in op_def.outputs:
        indices = out_slots.get(slot.name)
        if slot.duplicable:
            targets.append(list(indices or []))
        else:
            targets.append(indices[0] if indices and indices[0] >= 0 else None)
    if any(isinstance(t, list) for t in targets):
        return _Call(_list_output_step(kernel, args, targets, returns_tuple), None, None, False)
    call = _Call(kernel, args, targets, returns_tuple)
    for out_slot, in_slot in op_def.inplace.items():
        donor = (in_slots.get(in_slot) or [-1])[0]
        target = (out_slots.get(out_slot) or [-1])[0]
        if donor >= 0 and target >= 0 and _same_array_type(op, in_slot, out_slot):
            call.donor, call.into = donor, _into(kernel)
        break
    return call


def _with_cuda_kernel(cuda: Callable, body: Callable, attrs: dict, device) -> Callable:
    """The op's fused CUDA kernel, falling back to its xp body where it returns
    NotImplemented (an input it does not cover); both with attrs and place args bound."""
    fused = functools.partial(cuda, **attrs, **place_args(cuda, device))
    body = functools.partial(body, **attrs, **place_args(body, device))

    def fused_or_body(*args, **kwargs):
        out = fused(*args, **kwargs)
        return body(*args, **kwargs) if out is NotImplemented else out

    return fused_or_body


def _keeping_low_precision(
    op: OpDesc, op_def: OpDef, kernel: Callable, returns_tuple: bool
) -> Callable:
    """`kernel`, its float results cast to the float16/bfloat16 its outputs are declared as
    (the kernel itself where none is). NumPy promotes bfloat16 (ml_dtypes' dtype) times a
    Python float to float32, so a kernel written for float32 computes a bfloat16 op partly in
    float32; the result still has the declared dtype. Float32 programs pay nothing."""
    wanted = []
    for slot in op_def.outputs:
        dtypes = []
        for name in op.output(slot.name) if slot.name in op.outputs else []:
            var = op.block.find_var(name) if name else None
            low = var is not None and var.type == "lod_tensor" and var.dtype in LOW_PRECISION
            dtypes.append(np.dtype(var.dtype) if low else None)
        wanted.append(dtypes if slot.duplicable else (dtypes[0] if dtypes else None))
    if all(d is None for w in wanted for d in _listed(w)):
        return kernel

    def cast(value: Any, want: Any) -> Any:
        if isinstance(want, list):
            return value if value is None else [cast(v, w) for v, w in zip(value, want)]
        dtype = getattr(value, "dtype", None)
        if want is None or dtype is None or dtype == want or not is_inexact(dtype):
            return value
        return value.astype(want)

    def keeping(*args: Any, **kwargs: Any) -> Any:
        result = kernel(*args, **kwargs)
        if not returns_tuple:
            return cast(result, wanted[0])
        return tuple(cast(r, w) for r, w in zip(result, wanted))

    return keeping


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _same_array_type(op: OpDesc, in_slot: str, out_slot: str) -> bool:
    """Whether the declared donor and output are arrays of one dtype and rank (not 0-d)."""
    donor = op.block.find_var(op.input(in_slot)[0])
    out = op.block.find_var(op.output(out_slot)[0])
    if donor is None or out is None or donor.type != "lod_tensor" or out.type != "lod_tensor":
        return False
    return donor.dtype == out.dtype and len(donor.shape) == len(out.shape) > 0


def _specialized(op: OpDesc, op_def: OpDef, attrs: dict, device: DeviceContext) -> Callable | None:
    """The op's `specialize(<input VarInfos>, **attrs)` kernel for this op, if it offers one
    (`specialize` may declare `xp` or `device` as a kernel does)."""
    if op_def.specialize is None:
        return None
    infos = {}
    for slot in op_def.inputs:
        names = op.inputs.get(slot.name) or []
        descs = [op.block.find_var(n) if n else None for n in names]
        infos[slot.name] = (
            [_info(d) for d in descs] if slot.duplicable else (_info(descs[0]) if descs else None)
        )
    return op_def.specialize(**infos, **attrs, **place_args(op_def.specialize, device))


def _info(desc) -> VarInfo | None:
    return None if desc is None else VarInfo(tuple(desc.shape), desc.dtype)


def _list_output_step(kernel: Callable, args: list, targets: list, returns_tuple: bool):
    """A step for kernels with a duplicable (list) output: results are stored pairwise."""

    def gather(env):
        values = []
        for source in args:
            if source is None:
                values.append(None)
            elif isinstance(source, list):
                values.append([env[i] if i >= 0 else None for i in source])
            else:
                values.append(env[source])
        return values

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
