"""RNN: a step block run once per time step over a batch of sequences (seeds 000 and 002).

    x = nf.sequence([10, 20, 30])     # [batch=1, time=3, 1]
    m = nf.var(0)
    W = nf.var(0.314, param=True)
    U = nf.var(0.375, param=True)
    rnn = nf.rnn()
    with rnn.step():
        h = rnn.memory(init=m)          # h: the memory's value before this step
        h_prev = rnn.previous_memory(h)
        a = nf.layers.matmul(x, W)      # x is read as its time slice x[:, t]
        b = nf.layers.matmul(h_prev, U)
        act = nf.sigmoid(nf.add(a, b))
        rnn.update_memory(h, act)       # h's value at the next step
        rnn.output(a, b)
    o1, o2 = rnn()                      # each [batch, time, ...]

Shapes: a sequence is `[batch, time, ...]` and its slice in the step `[batch, ...]`. Every step
value stacked by `output` (and every memory) has one row per sequence. A step output of rank 0
(in the seed, `matmul` of the [1] memory by the [1] weight is a 0-d dot product) counts as one
row, which works for a batch of one sequence; the seed's outputs are therefore o1 [1, 3] (a_t)
and o2 [1, 3] (b_t).

Sequence variables (VarDesc.is_sequence, e.g. nf.sequence) read in the step are sliced
automatically; `step_input(x, lengths=None)` marks any other `[batch, time, ...]` variable (an
nf.data feed, say). Per-row lengths (an int64 [batch] variable, from `step_input(...,
lengths=)` or the sequence's `lengths_var`): at steps past a row's length that row's memories
keep their values and its outputs are zero. Other outer variables (parameters, constants) are
read whole in every step; parameters get the sum of their per-step gradients.

Hoisting (`hoist=True`, the default): when the step is built, ops of the step that depend on
the time step only through their step inputs (`matmul(x_t, W)`, an fc of x_t, tanh of that...)
move out of the step, before the recurrent op, and run once over the whole `[batch, time, ...]`
sequence instead of once per step; the step reads their result's slice under the same name
(a step input only they read is no longer sliced). Autograd then sees them as ordinary ops:
`W`'s gradient is one product over all steps. A matmul by a matrix moves as the equivalent
`mul` (one 2-D product over all rows). Values and gradients are the same as with hoist=False.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from nestflow.errors import ControlFlowError, NestflowError
from nestflow.framework import unique_name
from nestflow.framework.program import Block, OpDesc, VarDesc, default_main_program
from nestflow.layers.helper import current_block, require_current_block

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reads(block: Block) -> list[str]:
    """Every name `block`'s ops read, including reads from blocks nested in it of names those
    blocks do not declare, in first-read order."""
    names: list[str] = []
    for op in block.ops:
        nested = [n for sub in op.sub_blocks() for n in _reads(sub) if n not in sub.vars]
        for name in op.input_names() + nested:
            if name and name not in names:
                names.append(name)
    return names


def _visible_sequences(block: Block) -> list[VarDesc]:
    """Sequence variables visible from `block` (nearest declaration of each name wins)."""
    seen: dict[str, VarDesc] = {}
    current: Block | None = block
    while current is not None:
        for name, var in current.vars.items():
            if name not in seen:
                seen[name] = var
        current = current.parent
    return [v for v in seen.values() if v.is_sequence and v.type == "lod_tensor"]


def _caller_line() -> str:
    """The user's line that opened the step block (skipping nestflow and contextlib frames)."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_PACKAGE_DIR)
        or frame.f_code.co_filename == contextlib.__file__
    ):
        frame = frame.f_back
    if frame is None:
        return ""
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


def _writes(block: Block) -> Counter[str]:
    """How many ops of `block`, and of the blocks nested in it, write each name."""
    counts: Counter[str] = Counter()
    for op in block.ops:
        counts.update(n for n in op.output_names() if n)
        for sub in op.sub_blocks():
            counts.update(_writes(sub))
    return counts


def _op_reads(op: OpDesc) -> set[str]:
    """The names `op` reads, with those its nested blocks read from outside themselves."""
    names = {n for n in op.input_names() if n}
    for sub in op.sub_blocks():
        names.update(n for n in _reads(sub) if n not in sub.vars)
    return names


# Time-batchable ops: run once on whole `[batch, time, ...]` sequences, their result sliced at
# [:, t] is exactly what they compute in the step from step t's values. Only these are hoisted.
_UNARY = frozenset({"assign", "cast", "relu", "scale", "sigmoid", "square", "tanh"})
_ELEMENTWISE = frozenset(
    {"elementwise_add", "elementwise_div", "elementwise_mul", "elementwise_sub"}
)
_MATMUL_ATTRS = frozenset({"transpose_X", "transpose_Y", "alpha"})
# Deterministic ops without side effects: one whose inputs are all time-invariant computes the
# same value at every step, so it runs once before the recurrent op (e.g. a cell's transposed
# and reordered weights).
_INVARIANT = (
    _UNARY
    | _ELEMENTWISE
    | frozenset(
        {"concat", "matmul", "mul", "reshape", "slice", "split", "stack", "sum", "transpose"}
    )
)


def _batched(op: OpDesc, kind) -> tuple[str, dict[str, Any]] | None:
    """The op type and attrs computing on whole sequences what `op` computes in one step, or
    None if there are none. `kind(name)` is ("t", rank) for a time-varying value (rank in the
    step, batch dim first; the time dim goes in at dim 1), ("c", rank) for a time-invariant
    one, or None. Needs a time-varying input; time-invariant ones must not reach the batch dim.
    """
    slots = {slot: names for slot, names in op.inputs.items() if names}
    if any(len(names) != 1 for names in slots.values()):
        return None
    ins = {slot: kind(names[0]) for slot, names in slots.items()}
    if any(k is None for k in ins.values()) or all(k[0] != "t" for k in ins.values()):
        return None
    attrs = dict(op.attrs)
    if op.type in _UNARY:
        return (op.type, attrs) if set(ins) == {"X"} else None
    if op.type == "lookup_table":  # rows of W by ids; Ids of rank 1 would lose a [..., 1] dim
        batched = set(ins) == {"W", "Ids"} and ins["W"][0] == "c" and ins["Ids"][1] >= 2
        return (op.type, attrs) if batched else None
    if set(ins) != {"X", "Y"}:
        return None
    (x_kind, x_rank), (y_kind, y_rank) = ins["X"], ins["Y"]
    if op.type == "matmul":  # [B, ..., K] @ [K, N]: one product per row
        if x_kind != "t" or x_rank < 2 or y_kind != "c" or y_rank != 2 or attrs["transpose_X"]:
            return None
        if not attrs["transpose_Y"] and attrs["alpha"] == 1.0:
            # The same product as one 2-D GEMM over all rows: np.matmul would loop over the
            # leading dims, and its Y gradient would sum a [B, K, N] stack of products.
            extra = {k: v for k, v in attrs.items() if k not in _MATMUL_ATTRS}
            return "mul", {**extra, "x_num_col_dims": x_rank, "y_num_col_dims": 1}
        return op.type, attrs
    if op.type == "mul":  # X's row dims gain the time dim
        cols = attrs["x_num_col_dims"]
        if x_kind == "t" and y_kind == "c" and 1 <= cols <= x_rank:
            return op.type, {**attrs, "x_num_col_dims": cols + 1}
        return None
    if op.type in _ELEMENTWISE:
        axis = attrs["axis"]
        if x_kind == y_kind == "t":
            return (op.type, attrs) if x_rank == y_rank else None
        # Y lines up with X's dims from `axis` (< 0: the trailing dims), past the batch dim.
        if x_kind == "t" and y_rank < x_rank and axis != 0:
            return op.type, attrs if axis < 0 else {**attrs, "axis": axis + 1}
        if y_kind == "t" and x_rank < y_rank and axis < 0:
            return op.type, attrs
    return None


class _Memory:
    __slots__ = ("var", "boot", "shape", "value", "batch_ref", "update", "final")

    def __init__(self, var, boot, shape, value, batch_ref):
        self.var: VarDesc = var
        self.boot: VarDesc | None = boot
        self.shape = shape
        self.value = value
        self.batch_ref: VarDesc | None = batch_ref
        self.update: VarDesc | None = None
        self.final: VarDesc | None = None


class RNN:
    """A recurrent network over `[batch, time, ...]` sequences (the seed's `pd.rnn()`).

    Build the step with `with rnn.step():`; inside it use `step_input`, `memory`,
    `previous_memory`, `update_memory` and `output`. `rnn()` returns the stacked outputs (one
    variable if there is one output, else a list); `final_memory(h)` gives a memory's value
    after the last step (per row: at its last step). Each time step runs in its own step scope,
    kept for the backward pass (`recurrent_grad`) and destroyed when the run ends.
    `hoist` (default True): when the step is built, move out of it the ops that need no other
    time-varying value than step inputs (e.g. `matmul(x_t, W)`, fc of x_t, an activation of
    that), to run once over whole sequences before the recurrent op; same values and
    gradients, fewer ops per step. hoist=False keeps every op in the step.
    Errors (ControlFlowError): update_memory of a variable that is not a memory of this RNN, a
    memory never updated, an update whose shape or dtype differs from the memory's, a step that
    reads no sequence, and misuse of the step block.

    >>> x = nf.data("x", [-1, 3, 1])
    >>> rnn = nf.rnn()
    >>> with rnn.step():
    ...     x_t = rnn.step_input(x)
    ...     h_prev = rnn.memory(shape=[1], batch_ref=x_t)
    ...     h = nf.layers.elementwise_add(h_prev, x_t)
    ...     rnn.update_memory(h_prev, h)
    ...     rnn.output(h)
    >>> out = rnn()
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[[1], [2], [3]]], "float32")},
    ...     fetch_list=[out])[0].ravel()
    array([1., 3., 6.], dtype=float32)
    """

    def __init__(self, name: str | None = None, *, hoist: bool = True):
        self._program = default_main_program()
        self._hoisting = hoist
        self._parent = current_block()
        self._name = name or unique_name.generate("rnn")
        self._block: Block | None = None
        self._building = False
        self._built = False
        self._inputs: list[str] = []  # explicit step inputs (outer names)
        self._shadows: dict[str, VarDesc] = {}  # outer sequence name -> its slice in the step
        self._lengths: VarDesc | None = None
        self._memories: list[_Memory] = []
        self._outputs: list[VarDesc] = []
        self._results: list[VarDesc] = []
        self._source = ""

    # ---- building the step ----
    @contextlib.contextmanager
    def step(self) -> Iterator[Block]:
        """`with rnn.step():` builds the step block; the recurrent op is appended at its end."""
        if self._built or self._building:
            raise ControlFlowError(f"RNN '{self._name}': step() was already built")
        require_current_block(self._parent, "RNN", f"RNN '{self._name}': step()")
        self._building = True
        self._source = _caller_line()
        with self._program.block_guard(self._parent.idx) as block:
            self._block = block
            # Sequences are read per step under their own names: declare their slices in the
            # step block now, so shape inference of the step's ops sees [batch, ...].
            for var in _visible_sequences(self._parent):
                self._shadow(var)
            try:
                yield block
            finally:
                self._building = False
        self._finish()

    def _require_step(self, what: str) -> Block:
        if not self._building or current_block() is not self._block:
            raise ControlFlowError(
                f"RNN '{self._name}': {what}() must be called directly inside `with rnn.step():`"
            )
        return self._block

    def _shadow(self, var: VarDesc) -> VarDesc:
        shadow = self._shadows.get(var.name)
        if shadow is None:
            shape = (var.shape[0], *var.shape[2:]) if len(var.shape) >= 2 else (-1,)
            shadow = self._block.create_var(var.name, shape, var.dtype, stop_gradient=False)
            self._shadows[var.name] = shadow
        return shadow

    def step_input(self, x: VarDesc, lengths: VarDesc | None = None) -> VarDesc:
        """Read the `[batch, time, ...]` variable `x` one time step at a time; returns its
        `[batch, ...]` slice (same name). `lengths`: the rows' lengths, int64 [batch]."""
        self._require_step("step_input")
        if not isinstance(x, VarDesc):
            raise ControlFlowError(
                f"RNN '{self._name}': step_input() takes a variable, got {type(x).__name__}"
            )
        outer = self._parent.find_var(x.name)
        if outer is None or x.name in self._block.vars and x.name not in self._shadows:
            raise ControlFlowError(
                f"RNN '{self._name}': step_input('{x.name}') needs a variable from outside the step"
            )
        if len(outer.shape) < 2:
            raise ControlFlowError(
                f"RNN '{self._name}': step input '{x.name}' has shape {list(outer.shape)}; a "
                f"sequence must be [batch, time, ...]"
            )
        if x.name not in self._inputs:
            self._inputs.append(x.name)
        if lengths is not None:
            self._set_lengths(lengths)
        return self._shadow(outer)

    def _set_lengths(self, lengths: VarDesc | str) -> None:
        var = lengths if isinstance(lengths, VarDesc) else self._parent.find_var(lengths)
        if var is None:
            raise ControlFlowError(f"RNN '{self._name}': no lengths variable '{lengths}'")
        if np.dtype(var.dtype).kind not in "iu" or len(var.shape) != 1:
            raise ControlFlowError(
                f"RNN '{self._name}': lengths '{var.name}' must be an integer [batch] variable, "
                f"got {var.dtype}{list(var.shape)}"
            )
        if self._lengths is not None and self._lengths.name != var.name:
            raise ControlFlowError(
                f"RNN '{self._name}': step inputs have different lengths variables "
                f"'{self._lengths.name}' and '{var.name}'"
            )
        self._lengths = var

    def memory(
        self,
        init: VarDesc | None = None,
        shape: Sequence[int] | None = None,
        value: float = 0.0,
        batch_ref: VarDesc | None = None,
        dtype: Any = "float32",
        name: str | None = None,
    ) -> VarDesc:
        """A memory: a step variable holding, at each step, the value it was given by
        `update_memory` at the step before. At step 0 it is `init` (an outer variable with
        one row per sequence), or, without `init`, a `[batch, *shape]` tensor filled with
        `value`, batch taken from `batch_ref` (default: the first step input)."""
        block = self._require_step("memory")
        if init is None and shape is None:
            raise ControlFlowError(f"RNN '{self._name}': memory() needs init= or shape=")
        if init is not None and not isinstance(init, VarDesc):
            raise ControlFlowError(
                f"RNN '{self._name}': memory(init=...) takes a variable, got {type(init).__name__}"
            )
        if init is not None and self._parent.find_var(init.name) is None:
            raise ControlFlowError(
                f"RNN '{self._name}': memory init '{init.name}' must be a variable from outside "
                f"the step"
            )
        mem_name = name or unique_name.generate(f"{self._name}.mem")
        if init is not None:
            var = block.create_var(mem_name, init.shape, init.dtype, stop_gradient=False)
            self._memories.append(_Memory(var, init, None, None, None))
        else:
            row = [int(d) for d in shape]
            var = block.create_var(mem_name, [-1, *row], dtype, stop_gradient=False)
            self._memories.append(_Memory(var, None, row, float(value), batch_ref))
        return var

    def _memory_of(self, mem: Any, what: str) -> _Memory:
        for memory in self._memories:
            if memory.var is mem or (isinstance(mem, VarDesc) and memory.var.name == mem.name):
                return memory
        name = mem.name if isinstance(mem, VarDesc) else repr(mem)
        raise ControlFlowError(
            f"RNN '{self._name}': {what}: '{name}' is not a memory of this RNN (make one with "
            f"rnn.memory(...))"
        )

    def previous_memory(self, mem: VarDesc) -> VarDesc:
        """The memory's value before this step (the variable `memory()` returned)."""
        self._require_step("previous_memory")
        return self._memory_of(mem, "previous_memory").var

    def update_memory(self, mem: VarDesc, new: VarDesc) -> None:
        """Make `new` the memory's value at the next step (same shape and dtype)."""
        self._require_step("update_memory")
        memory = self._memory_of(mem, "update_memory")
        if not isinstance(new, VarDesc):
            raise ControlFlowError(
                f"RNN '{self._name}': update_memory('{memory.var.name}', ...) takes a variable, "
                f"got {type(new).__name__}"
            )
        if memory.update is not None:
            raise ControlFlowError(
                f"RNN '{self._name}': memory '{memory.var.name}' is already updated by "
                f"'{memory.update.name}'"
            )
        var = memory.var
        if new.dtype != var.dtype or not _compatible(new.shape, var.shape):
            raise ControlFlowError(
                f"RNN '{self._name}': update_memory: memory '{var.name}' is "
                f"{var.dtype}{list(var.shape)} but the update '{new.name}' is "
                f"{new.dtype}{list(new.shape)}; a memory keeps one shape and dtype"
            )
        memory.update = new

    def output(self, *outs: VarDesc) -> None:
        """Step variables to stack over time into `rnn()`'s outputs ([batch, time, ...])."""
        self._require_step("output")
        for out in outs:
            if not isinstance(out, VarDesc):
                raise ControlFlowError(
                    f"RNN '{self._name}': output() takes variables, got {type(out).__name__}"
                )
            self._outputs.append(out)

    # ---- the op ----
    def _finish(self) -> None:
        block = self._block
        for memory in self._memories:
            if memory.update is None:
                raise ControlFlowError(
                    f"RNN '{self._name}': memory '{memory.var.name}' is never updated; call "
                    f"rnn.update_memory({memory.var.name}, new_value) in the step"
                )
        used = set(_reads(block)) | {v.name for v in self._outputs}
        used |= {m.update.name for m in self._memories}
        inputs = list(self._inputs)
        for name in self._shadows:
            if name in used and name not in inputs:
                inputs.append(name)
        for name in list(self._shadows):
            if name not in inputs:
                block.remove_var(name)
                del self._shadows[name]
        if not inputs:
            raise ControlFlowError(
                f"RNN '{self._name}': the step reads no sequence; use a sequence variable "
                f"(nf.sequence, VarDesc.is_sequence) or rnn.step_input(x)"
            )
        if self._lengths is None:
            for name in inputs:
                lengths_var = self._parent.find_var(name).lengths_var
                if lengths_var:
                    self._set_lengths(lengths_var)
        if self._hoisting:
            inputs = self._hoist(inputs, used)
        boots = []
        for memory in self._memories:
            if memory.boot is None:
                memory.boot = self._boot(memory, inputs[0])
            boots.append(memory.boot.name)
        memory_names = {m.var.name for m in self._memories}
        outer_extra = [
            v.name
            for v in self._outputs + [m.update for m in self._memories]
            if v.name not in block.vars
        ]
        params = [
            n
            for n in _reads(block) + outer_extra
            if n not in block.vars and n not in inputs and n not in memory_names
        ]
        params = list(dict.fromkeys(params))
        # Every step input has the same number of steps: a length known on one is the outputs'.
        known = {self._parent.find_var(n).shape[1] for n in inputs} - {-1}
        steps = known.pop() if len(known) == 1 else -1
        results = []
        for out in self._outputs:
            tail = tuple(out.shape[1:]) if out.shape else ()
            results.append(
                self._parent.create_var(
                    unique_name.generate(f"{self._name}.out"), (-1, steps, *tail), out.dtype
                )
            )
        for memory in self._memories:
            memory.final = self._parent.create_var(
                unique_name.generate(f"{memory.var.name}.final"),
                (-1, *memory.var.shape[1:]) if memory.var.shape else (),
                memory.var.dtype,
            )
        scopes = self._parent.create_var(
            unique_name.generate(f"{self._name}.scopes"), type="step_scopes", stop_gradient=True
        )
        self._parent.append_op(
            "recurrent",
            inputs={
                "Inputs": inputs,
                "Boots": boots,
                "Params": params,
                "Lengths": [self._lengths] if self._lengths is not None else [],
            },
            outputs={
                "Outputs": results,
                "FinalMemories": [m.final for m in self._memories],
                "StepScopes": [scopes],
            },
            attrs={
                "sub_block": block,
                "memories": [m.var.name for m in self._memories],
                "updates": [m.update.name for m in self._memories],
                "step_outputs": [v.name for v in self._outputs],
            },
            source=self._source,
        )
        self._results = results
        self._built = True

    def _hoist(self, inputs: list[str], used: set[str]) -> list[str]:
        """Move the step's time-batchable ops (`_batched`) out of the step, in order, when
        each input is time-varying (a step input, or a hoisted op's output) or time-invariant
        (an outer variable the step never writes): each runs once before the recurrent op and
        its output, now `[batch, time, ...]` in the parent block, becomes a step input of the
        same name. Outputs that are memories or memory updates, written twice or read before
        they are written stay in the step. Returns the step inputs after hoisting."""
        block, parent = self._block, self._parent
        pinned = {m.var.name for m in self._memories} | {m.update.name for m in self._memories}
        self._hoist_invariant(pinned | {v.name for v in self._outputs})
        writes = _writes(block)
        varying = {n: block.vars[n].ndim for n in inputs if not writes[n]}

        def kind(name: str) -> tuple[str, int] | None:
            if name in varying:
                return ("t", varying[name]) if varying[name] else None
            var = None if name in block.vars or writes[name] else parent.find_var(name)
            # A declared rank 0 may stand for a shape not known yet: not provably invariant.
            if var is None or var.type != "lod_tensor" or not var.ndim:
                return None
            return ("c", var.ndim)

        hoisted: list[str] = []
        read: set[str] = set()
        for op in list(block.ops):
            outs = op.output_names()
            batched = _batched(op, kind) if len(outs) == 1 else None
            if (
                batched is not None
                and outs[0] in block.vars
                and writes[outs[0]] == 1
                and outs[0] not in pinned | read
                and parent.find_var(outs[0]) is None
                and self._move(op, *batched)
            ):
                varying[outs[0]] = block.vars[outs[0]].ndim
                hoisted.append(outs[0])
            read |= _op_reads(op)
        # A step input that only hoisted ops read is no longer sliced per step (the hoisted
        # outputs carry its batch and time dims); one the step never read is kept as it was.
        still = set(_reads(block)) | {v.name for v in self._outputs}
        still |= {m.update.name for m in self._memories}
        kept = [n for n in inputs + hoisted if n in still or n in inputs and n not in used]
        kept = kept or inputs[:1]
        for name in inputs:
            if name not in kept:
                block.remove_var(name)
                del self._shadows[name]
        return kept

    def _hoist_invariant(self, pinned: set[str]) -> None:
        """Move out of the step, in order, the `_INVARIANT` ops whose inputs are all outer
        variables the step never writes (or outputs of ops moved before them): they run once,
        before the recurrent op, and the step reads their outputs as outer variables. Outputs
        that are memories, updates or step outputs, written twice, read before they are
        written or declared outside the step keep the op in the step."""
        block, parent = self._block, self._parent
        writes = _writes(block)
        read: set[str] = set()
        for op in list(block.ops):
            ins, outs = [n for n in op.input_names() if n], op.output_names()
            if (
                op.type in _INVARIANT
                and ins
                and all(n not in block.vars and not writes[n] for n in ins)
                and all(parent.find_var(n) is not None for n in ins)
                and all(
                    n in block.vars
                    and writes[n] == 1
                    and n not in pinned | read
                    and parent.find_var(n) is None
                    for n in outs
                )
                and self._move_whole(op)
            ):
                writes.subtract(outs)
                continue
            read |= _op_reads(op)

    def _move_whole(self, op: OpDesc) -> bool:
        """Append `op` unchanged to the parent block, its outputs declared there (and no longer
        in the step); False, and nothing changed, if the parent rejects it."""
        block, parent = self._block, self._parent
        outs = op.output_names()
        for name in outs:
            var = block.vars[name]
            parent.create_var(name, (), var.dtype, stop_gradient=var.stop_gradient)
        try:
            parent.append_op(op.type, op.inputs, op.outputs, dict(op.attrs), source=op.source)
        except NestflowError:
            for name in outs:
                parent.remove_var(name)
            return False
        block.remove_op(op.index)
        for name in outs:
            block.remove_var(name)
        return True

    def _move(self, op: OpDesc, op_type: str, attrs: dict[str, Any]) -> bool:
        """Append `op` (as `op_type` with `attrs`) to the parent block, its output declared
        there under the same name, and drop it from the step. Shape inference runs in the
        parent; if it fails or the output is not [batch, time, *step shape], nothing changes
        and False is returned."""
        block, parent = self._block, self._parent
        name = op.output_names()[0]
        step_var = block.vars[name]
        outer = parent.create_var(name, (), step_var.dtype, stop_gradient=step_var.stop_gradient)
        try:
            moved = parent.append_op(op_type, op.inputs, op.outputs, attrs, source=op.source)
        except NestflowError:
            parent.remove_var(name)
            return False
        shape = outer.shape
        if (
            outer.dtype != step_var.dtype
            or len(shape) != step_var.ndim + 1
            or not _compatible((shape[0], *shape[2:]), step_var.shape)
        ):
            parent.remove_op(moved.index)
            parent.remove_var(name)
            return False
        block.remove_op(op.index)
        return True

    def _boot(self, memory: _Memory, first_input: str) -> VarDesc:
        ref = memory.batch_ref.name if memory.batch_ref is not None else first_input
        boot = self._parent.create_var(
            unique_name.generate(f"{memory.var.name}.boot"),
            [-1, *memory.shape],
            memory.var.dtype,
            stop_gradient=True,
        )
        self._parent.append_op(
            "rnn_memory_boot",
            inputs={"Ref": [ref]},
            outputs={"Out": [boot]},
            attrs={"shape": memory.shape, "value": memory.value, "dtype": memory.var.dtype},
            source=self._source,
        )
        return boot

    def final_memory(self, mem: VarDesc) -> VarDesc:
        """The memory's value after the last step, [batch, ...] (for a row shorter than the
        others: its value at the row's last step). Call after the step is built."""
        if not self._built:
            raise ControlFlowError(
                f"RNN '{self._name}': final_memory() needs the step built (after `with "
                f"rnn.step():`)"
            )
        return self._memory_of(mem, "final_memory").final

    def __call__(self) -> VarDesc | list[VarDesc]:
        """The outputs stacked over time, `[batch, time, ...]`: one variable for one output,
        else a list in output() order."""
        if not self._built:
            raise ControlFlowError(f"RNN '{self._name}': build the step (with rnn.step():) first")
        return self._results[0] if len(self._results) == 1 else list(self._results)


def rnn(name: str | None = None, *, hoist: bool = True) -> RNN:
    """The seed's `pd.rnn()`.

    >>> x = nf.data("x", [-1, 3, 1])
    >>> rnn = nf.rnn()
    >>> with rnn.step():
    ...     x_t = rnn.step_input(x)
    ...     h_prev = rnn.memory(shape=[1], batch_ref=x_t)
    ...     h = nf.layers.elementwise_add(h_prev, x_t)
    ...     rnn.update_memory(h_prev, h)
    ...     rnn.output(h)
    >>> out = rnn()
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[[1], [2], [3]]], "float32")},
    ...     fetch_list=[out])[0].ravel()
    array([1., 3., 6.], dtype=float32)
    """
    return RNN(name, hoist=hoist)


__all__ = ["RNN"]
