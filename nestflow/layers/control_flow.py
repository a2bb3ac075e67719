"""Control flow layers: IfElse (per-row branching), While (loops) and tensor arrays (seed 002).

Each builds its body into a child block of the current block (`program.block_guard()`), so the
body's variables shadow outer ones and outer variables are read through the parent chain. The
control-flow op is appended to the enclosing block when the construct is complete.

    ie = nf.layers.IfElse()                 # or nf.ifelse()
    with ie.true_block():
        ie.output(nf.layers.scale(x, 2.0))  # x's rows where cond holds
    with ie.false_block():
        ie.output(x)
    (out,) = ie(cond)                       # rows merged back in their original order

    i = nf.layers.fill_constant([1], "int64", 0)
    cond = nf.layers.less_than(i, n)
    w = nf.While(cond, max_steps=1000)
    with w.block():
        nf.layers.assign(nf.layers.tanh(x * p), output=x)   # loop-carried x
        nf.layers.increment(i)
        nf.layers.less_than(i, n, out=cond)
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from nestflow.core.dtype import dtype_name
from nestflow.errors import ControlFlowError
from nestflow.framework import unique_name
from nestflow.framework.program import Block, VarDesc, default_main_program
from nestflow.layers.helper import append_op, as_int, current_block, require_current_block

# The ops the constructs of this module appended: each lists among its inputs every name its
# sub-blocks read from outside them (and keeps doing so through _rename_reads), so a walk over
# nested blocks need not enter their sub-blocks again.
_inputs_cover_sub_blocks: weakref.WeakSet = weakref.WeakSet()


def _nested_blocks(block: Block) -> list[Block]:
    """`block` and every block nested in it that a walk must enter, innermost first (higher
    indices first: a sub-block is made after the block that runs it)."""
    found: dict[int, Block] = {}
    pending = [block]
    while pending:
        one = pending.pop()
        if one.idx not in found:
            found[one.idx] = one
            for op in one.ops:
                if op not in _inputs_cover_sub_blocks:
                    pending.extend(op.sub_blocks())
    return [found[idx] for idx in sorted(found, reverse=True)]


def _outer_reads(block: Block) -> list[str]:
    """Names `block` (and blocks nested in it) reads but does not declare, in first-read order
    (an op's own inputs, then what its sub-blocks read from outside them). Innermost blocks
    are read first, so any depth of nesting takes no recursion, and the sub-blocks of an op
    whose inputs already name what they read are not entered: building N nested constructs
    costs N walks of one block, not N walks of the nest below."""
    reads: dict[int, list[str]] = {}
    for one in _nested_blocks(block):
        names: dict[str, None] = {}
        local = one.vars
        for op in one.ops:
            nested = []
            if op not in _inputs_cover_sub_blocks:
                nested = [n for sub in op.sub_blocks() for n in reads.get(sub.idx, ())]
            for name in op.input_names() + nested:
                if name and name not in local:
                    names.setdefault(name)
        reads[one.idx] = list(names)
    return reads[block.idx]


def _outer_writes(block: Block) -> list[str]:
    return [n for op in block.ops for n in op.output_names() if n and n not in block.vars]


def _check_cond_var(cond: Any, what: str) -> VarDesc:
    if not isinstance(cond, VarDesc):
        raise ControlFlowError(
            f"{what}: the condition must be a variable, got {type(cond).__name__}"
        )
    if cond.dtype != "bool":
        raise ControlFlowError(
            f"{what}: the condition '{cond.name}' must be bool, but it is {cond.dtype} "
            f"(use a comparison such as nf.layers.greater_than, or nf.layers.cast)"
        )
    return cond


def _merge_tail(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x == y or y == -1:
            out.append(x)
        elif x == -1:
            out.append(y)
        else:
            return None
    return tuple(out)


class IfElse:
    """Per-row two-way branch over a minibatch (seed 002's `pd.ifelse()`).

    Rows of the bool condition (shape [N, 1] or [N]) that hold go through `true_block()`, the
    others through `false_block()`. Outer variables whose first dim is -1 (batch variables) are
    split by the condition when a branch reads them (`input(v)` splits any variable
    explicitly); other variables (parameters, [1] values) pass whole. Both branches call
    `output(...)` with the same number of per-row outputs of matching dtypes and row shapes;
    `ie(cond)` returns the merged outputs, as a list, in the original row order.
    Errors: ControlFlowError for a condition that is not bool [N, 1]/[N], mismatched outputs,
    a branch writing an outer variable, or misuse of the blocks.

    >>> x = nf.data("x", [-1, 1])
    >>> cond = nf.layers.greater_than(x, 15.0)
    >>> ie = nf.ifelse()
    >>> with ie.true_block():
    ...     ie.output(nf.layers.scale(x, 2.0))
    >>> with ie.false_block():
    ...     ie.output(nf.layers.scale(x, -1.0))
    >>> (out,) = ie(cond)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[10], [20]], "float32")},
    ...     fetch_list=[out])[0]
    array([[-10.],
           [ 40.]], dtype=float32)
    """

    def __init__(self, cond: VarDesc | None = None, name: str | None = None):
        self._program = default_main_program()
        self._parent = current_block()
        self._cond = None if cond is None else self._check_cond(cond)
        self._name = name or unique_name.generate("ifelse")
        self._blocks: dict[bool, Block | None] = {True: None, False: None}
        self._outputs: dict[bool, list[VarDesc] | None] = {True: None, False: None}
        self._inputs: dict[bool, list[str]] = {True: [], False: []}
        self._active: bool | None = None
        self._done = False

    def _check_cond(self, cond: Any) -> VarDesc:
        cond = _check_cond_var(cond, f"IfElse '{getattr(self, '_name', 'ifelse')}'")
        shape = cond.shape
        # An unknown second dim is checked at run time (the ifelse op's row_mask), as Fluid.
        if not (len(shape) == 1 or (len(shape) == 2 and shape[1] in (1, -1))):
            raise ControlFlowError(
                f"IfElse: the condition '{cond.name}' has shape {list(shape)}; it must be "
                f"[N, 1] or [N] (one bool per row)"
            )
        return cond

    @contextlib.contextmanager
    def _branch(self, which: bool) -> Iterator[Block]:
        label = "true_block" if which else "false_block"
        if self._done:
            raise ControlFlowError(f"IfElse '{self._name}': {label}() after ie() was called")
        if self._active is not None:
            raise ControlFlowError(f"IfElse '{self._name}': {label}() inside another branch")
        if self._blocks[which] is not None:
            raise ControlFlowError(f"IfElse '{self._name}': {label}() was already built")
        require_current_block(self._parent, "IfElse", f"IfElse '{self._name}': {label}()")
        with self._program.block_guard(self._parent.idx) as block:
            self._blocks[which] = block
            self._active = which
            try:
                yield block
            finally:
                self._active = None

    def true_block(self) -> contextlib.AbstractContextManager[Block]:
        """`with ie.true_block():` builds the branch for the rows where the condition holds."""
        return self._branch(True)

    def false_block(self) -> contextlib.AbstractContextManager[Block]:
        """`with ie.false_block():` builds the branch for the other rows."""
        return self._branch(False)

    def _require_branch(self, what: str) -> bool:
        if self._active is None:
            raise ControlFlowError(
                f"IfElse '{self._name}': {what}() must be called inside true_block() or "
                f"false_block()"
            )
        return self._active

    def input(self, x: VarDesc) -> VarDesc:
        """The branch's rows of outer variable `x` (split by the condition whatever its shape)."""
        which = self._require_branch("input")
        if x.name not in self._inputs[which]:
            self._inputs[which].append(x.name)
        return x

    def output(self, *outs: VarDesc) -> None:
        """This branch's per-row outputs (call once per branch)."""
        which = self._require_branch("output")
        if self._outputs[which] is not None:
            raise ControlFlowError(f"IfElse '{self._name}': output() called twice in a branch")
        for out in outs:
            if not isinstance(out, VarDesc):
                raise ControlFlowError(
                    f"IfElse '{self._name}': output() takes variables, got {type(out).__name__}"
                )
        self._outputs[which] = list(outs)

    def __call__(self, cond: VarDesc | None = None) -> list[VarDesc]:
        """Append the ifelse op; returns the merged outputs (a list, one per output())."""
        if self._done:
            raise ControlFlowError(f"IfElse '{self._name}' was already called")
        if self._active is not None:
            raise ControlFlowError(f"IfElse '{self._name}': call it after both branches")
        if cond is not None:
            self._cond = self._check_cond(cond)
        if self._cond is None:
            raise ControlFlowError(f"IfElse '{self._name}': no condition (pass it to ie(cond))")
        true_outs = self._outputs[True] or []
        false_outs = self._outputs[False] or []
        for which, label in ((True, "true_block"), (False, "false_block")):
            if self._blocks[which] is None:
                if true_outs or false_outs:
                    raise ControlFlowError(
                        f"IfElse '{self._name}': {label}() was never built, but the other "
                        f"branch has outputs; both branches must output the same variables"
                    )
                with self._program.block_guard(self._parent.idx) as block:
                    self._blocks[which] = block
        if len(true_outs) != len(false_outs):
            raise ControlFlowError(
                f"IfElse '{self._name}': the true branch outputs {len(true_outs)} variable(s) "
                f"({[v.name for v in true_outs]}) but the false branch {len(false_outs)} "
                f"({[v.name for v in false_outs]})"
            )
        merged_shapes = []
        for i, (t, f) in enumerate(zip(true_outs, false_outs)):
            if t.dtype != f.dtype:
                raise ControlFlowError(
                    f"IfElse '{self._name}': output {i} is {t.dtype} ('{t.name}') in the true "
                    f"branch but {f.dtype} ('{f.name}') in the false branch"
                )
            tail = _merge_tail(t.shape[1:], f.shape[1:]) if t.shape and f.shape else None
            if tail is None:
                raise ControlFlowError(
                    f"IfElse '{self._name}': output {i} rows differ in shape: '{t.name}' "
                    f"{list(t.shape)} vs '{f.name}' {list(f.shape)} (dims after the first "
                    f"must match)"
                )
            merged_shapes.append((-1, *tail))
        split: list[str] = []
        whole: list[str] = []
        for which in (True, False):
            block = self._blocks[which]
            writes = _outer_writes(block)
            if writes:
                raise ControlFlowError(
                    f"IfElse '{self._name}': a branch writes outer variable(s) {writes}; make "
                    f"a new variable in the branch and pass it to ie.output() instead"
                )
            outs = [v.name for v in (true_outs if which else false_outs)]
            for name in _outer_reads(block) + [n for n in outs if n not in block.vars]:
                if name in split or name in whole:
                    continue
                var = self._parent.find_var(name)
                batch = (
                    var is not None
                    and var.type == "lod_tensor"
                    and not var.persistable
                    and len(var.shape) >= 1
                    and var.shape[0] == -1
                )
                if batch or name in self._inputs[True] or name in self._inputs[False]:
                    split.append(name)
                else:
                    whole.append(name)
        for name in self._inputs[True] + self._inputs[False]:
            if name not in split:
                split.append(name)
        outs = [
            self._parent.create_var(unique_name.generate(f"{self._name}.out"), shape, t.dtype)
            for shape, t in zip(merged_shapes, true_outs)
        ]
        scopes = self._parent.create_var(
            unique_name.generate(f"{self._name}.scopes"), type="step_scopes", stop_gradient=True
        )
        op = self._parent.append_op(
            "ifelse",
            inputs={"Cond": [self._cond], "X": split, "Params": whole},
            outputs={"Out": outs, "Scopes": [scopes]},
            attrs={
                "true_block": self._blocks[True],
                "false_block": self._blocks[False],
                "true_outs": [v.name for v in true_outs],
                "false_outs": [v.name for v in false_outs],
            },
        )
        _inputs_cover_sub_blocks.add(op)
        self._done = True
        return outs


class BlockOp:
    """A Block run as one operator (seed 002: `class Block : OperatorBase`).

        blk = nf.BlockOp()
        with blk.block():                 # ops built here go into a child block
            h = nf.layers.fc(x, size=4)   # outer x and the new parameters: read through scopes
            blk.output(h)
        (out,) = blk()                    # one `block` op; out is a variable of this block

    When the op runs, the child block's ops run in order in a kid scope of the scope the op
    runs in; outer variables are read through the scope chain, nothing is copied. `blk()`
    returns, as a list, one new variable per `output(...)` holding its value after the block
    has run. Gradients flow through it to outer variables and parameters.
    Errors: ControlFlowError for a block that writes an outer variable (output it instead),
    output() outside block(), or building the block twice.

    >>> x = nf.data("x", [-1, 2])
    >>> blk = nf.BlockOp()
    >>> with blk.block():
    ...     blk.output(nf.layers.scale(x, 3.0))
    >>> (out,) = blk()
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.ones((1, 2), "float32")}, fetch_list=[out])[0]
    array([[3., 3.]], dtype=float32)
    """

    def __init__(self, name: str | None = None):
        self._program = default_main_program()
        self._parent = current_block()
        self._name = name or unique_name.generate("block_op")
        self._block: Block | None = None
        self._outputs: list[VarDesc] | None = None
        self._building = False
        self._done = False

    @contextlib.contextmanager
    def block(self) -> Iterator[Block]:
        """`with blk.block():` builds the child block (once, in the block blk was made in)."""
        if self._done or self._block is not None:
            raise ControlFlowError(f"BlockOp '{self._name}': block() was already built")
        require_current_block(self._parent, "BlockOp", f"BlockOp '{self._name}': block()")
        with self._program.block_guard(self._parent.idx) as block:
            self._block, self._building = block, True
            try:
                yield block
            finally:
                self._building = False

    def output(self, *outs: VarDesc) -> None:
        """The variables whose values the block gives to the outside (call once)."""
        if not self._building:
            raise ControlFlowError(f"BlockOp '{self._name}': output() must be inside block()")
        if self._outputs is not None:
            raise ControlFlowError(f"BlockOp '{self._name}': output() called twice")
        for out in outs:
            if not isinstance(out, VarDesc):
                raise ControlFlowError(
                    f"BlockOp '{self._name}': output() takes variables, got {type(out).__name__}"
                )
        self._outputs = list(outs)

    def __call__(self) -> list[VarDesc]:
        """Append the block op; returns its outputs (a list, one per output())."""
        if self._done:
            raise ControlFlowError(f"BlockOp '{self._name}' was already called")
        if self._block is None or self._building:
            raise ControlFlowError(f"BlockOp '{self._name}': call it after building block()")
        writes = _outer_writes(self._block)
        if writes:
            raise ControlFlowError(
                f"BlockOp '{self._name}': the block writes outer variable(s) {writes}; make a "
                f"new variable in the block and pass it to output() instead"
            )
        inner = self._outputs or []
        # An output made outside the block is read by the op too (as IfElse does): the
        # executor keeps it for the op, and its gradient flows back through X.
        reads = _outer_reads(self._block)
        reads += [v.name for v in inner if v.name not in self._block.vars and v.name not in reads]
        outs = [
            self._parent.create_var(unique_name.generate(f"{self._name}.out"), v.shape, v.dtype)
            for v in inner
        ]
        scope = self._parent.create_var(
            unique_name.generate(f"{self._name}.scope"), type="step_scopes", stop_gradient=True
        )
        op = self._parent.append_op(
            "block",
            inputs={"X": reads},
            outputs={"Out": outs, "Scope": [scope]},
            attrs={"sub_block": self._block, "outs": [v.name for v in inner]},
        )
        _inputs_cover_sub_blocks.add(op)
        self._done = True
        return outs


def ifelse(cond: VarDesc | None = None, name: str | None = None) -> IfElse:
    """The seed's `pd.ifelse()`: an IfElse (condition given now or to the call).

    >>> x = nf.data("x", [-1, 1])
    >>> cond = nf.layers.greater_than(x, 15.0)
    >>> ie = nf.ifelse()
    >>> with ie.true_block():
    ...     ie.output(nf.layers.scale(x, 2.0))
    >>> with ie.false_block():
    ...     ie.output(nf.layers.scale(x, -1.0))
    >>> (out,) = ie(cond)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.array([[10], [20]], "float32")},
    ...     fetch_list=[out])[0]
    array([[-10.],
           [ 40.]], dtype=float32)
    """
    return IfElse(cond, name)


def _rename_reads(block: Block, renamed: dict[str, str]) -> None:
    """In a block nested in a loop body, reads of outer names follow the body's SSA renames
    (a nested block's own variable of the same name shadows the rename)."""
    pending = [(block, renamed)]
    while pending:
        one, names = pending.pop()
        local = {k: v for k, v in names.items() if k not in one.vars}
        if not local:
            continue
        for op in one.ops:
            for slot, inputs in op.inputs.items():
                op.inputs[slot] = [local.get(n, n) for n in inputs]
            pending.extend((sub, local) for sub in op.sub_blocks())


def _to_ssa(body: Block) -> list[tuple[str, str]]:
    """Rewrite `body` so each write of an outer variable goes to a fresh inner variable and
    later reads use it (CONTROL_FLOW.md's SSA rule). Returns (outer, last inner) pairs."""
    renamed: dict[str, str] = {}
    for op in body.ops:
        for slot, names in op.inputs.items():
            op.inputs[slot] = [renamed.get(n, n) for n in names]
        for sub in op.sub_blocks():
            _rename_reads(sub, renamed)
        for slot, names in op.outputs.items():
            new = []
            for name in names:
                if name and name not in body.vars:
                    outer = body.find_var(name)
                    inner = unique_name.generate(f"{name}@LOOP")
                    differentiable = np.dtype(outer.dtype).kind in "fc"
                    body.create_var(
                        inner,
                        outer.shape,
                        outer.dtype,
                        type=outer.type,
                        stop_gradient=not differentiable or outer.type == "step_scopes",
                    )
                    renamed[name] = name = inner
                new.append(name)
            op.outputs[slot] = new
    body.program._bump()
    return list(renamed.items())


class While:
    """`with w.block():` builds a loop body run while the bool [1] `cond` holds (seed 002).

    The body updates loop variables in place (`increment(i)`, `less_than(i, n, out=cond)`,
    `assign(new, output=x)`); it must write `cond` unless `max_steps` is given. After the loop
    the outer variables hold their final values. `max_steps` (None: no limit) makes a loop that
    runs longer raise MaxStepsExceededError. Gradients flow through loop-carried float
    variables and to outer variables the body reads (parameters get summed gradients).
    Memory: a loop with no gradient op keeps only its newest step scope; one with a gradient
    keeps every step, at most nestflow.ops.while_loop.MAX_KEPT_STEPS (100000) without
    max_steps (then MaxStepsExceededError: pass max_steps for a longer loop).

    >>> i = nf.layers.fill_constant([1], "int64", 0)
    >>> n = nf.layers.fill_constant([1], "int64", 3)
    >>> x = nf.layers.fill_constant([2], "float32", 1.0)
    >>> arr = nf.layers.create_array("float32")
    >>> cond = nf.layers.less_than(i, n)
    >>> w = nf.While(cond)
    >>> with w.block():
    ...     _ = nf.layers.array_write(nf.layers.scale(x, 2.0), i, array=arr)
    ...     _ = nf.layers.assign(nf.layers.scale(x, 2.0), output=x)
    ...     _ = nf.layers.increment(i)
    ...     _ = nf.layers.less_than(i, n, out=cond)
    >>> last = nf.layers.array_read(arr, nf.layers.fill_constant([1], "int64", 2))
    >>> length = nf.layers.array_length(arr)
    >>> stacked = nf.layers.array_to_tensor(arr)
    >>> out = nf.Executor(nf.CPUPlace()).run(fetch_list=[x, last, length, stacked])
    >>> out[0], out[1], int(out[2][0]), out[3].shape
    (array([8., 8.], dtype=float32), array([8., 8.], dtype=float32), 3, (3, 2))
    """

    def __init__(self, cond: VarDesc, max_steps: int | None = None, name: str | None = None):
        self._program = default_main_program()
        self._parent = current_block()
        self._name = name or unique_name.generate("while")
        cond = _check_cond_var(cond, f"While '{self._name}'")
        if any(d != 1 for d in cond.shape):
            raise ControlFlowError(
                f"While '{self._name}': the condition '{cond.name}' has shape "
                f"{list(cond.shape)}; it must hold one bool (shape [1])"
            )
        if max_steps is not None:
            max_steps = as_int(max_steps, f"While '{self._name}': max_steps")
            if max_steps < 0:
                raise ControlFlowError(f"While '{self._name}': max_steps must be >= 0")
        self._cond = cond
        self._max_steps = -1 if max_steps is None else max_steps
        self._built = False

    @contextlib.contextmanager
    def block(self) -> Iterator[Block]:
        """Build the loop body; the while op is appended when the `with` exits."""
        if self._built:
            raise ControlFlowError(f"While '{self._name}': block() was already built")
        require_current_block(self._parent, "While", f"While '{self._name}': block()")
        self._built = True
        with self._program.block_guard(self._parent.idx) as body:
            yield body
        self._finish(body)

    def _finish(self, body: Block) -> None:
        carried = _to_ssa(body)
        outer = [name for name, _ in carried]
        if self._cond.name not in outer and self._max_steps < 0:
            raise ControlFlowError(
                f"While '{self._name}': the body never writes the condition "
                f"'{self._cond.name}', so the loop could never stop; update it (e.g. "
                f"nf.layers.less_than(i, n, out=cond)) or pass max_steps"
            )
        reads = _outer_reads(body)
        inputs = reads + [n for n in outer if n not in reads]
        for name, inner in carried:
            # The loop's result is a new value under the old name: when the body computes it
            # from differentiable values it needs a gradient, whatever the initial value had
            # (e.g. a fill_constant or data initial state updated through parameters).
            new, var = body.find_var(inner), self._parent.find_var(name)
            if new is not None and var is not None and not new.stop_gradient:
                var.stop_gradient = False
        scopes = self._parent.create_var(
            unique_name.generate(f"{self._name}.scopes"), type="step_scopes", stop_gradient=True
        )
        op = self._parent.append_op(
            "while",
            inputs={"X": inputs, "Condition": [self._cond]},
            outputs={"Out": outer, "StepScopes": [scopes]},
            attrs={
                "sub_block": body,
                "carried": outer,
                "carried_inner": [inner for _, inner in carried],
                "max_steps": self._max_steps,
            },
        )
        _inputs_cover_sub_blocks.add(op)


def create_array(dtype: Any = "float32", name: str | None = None) -> VarDesc:
    """An empty tensor array (a list of tensors indexed by an int64 [1] variable).

    Gradients flow through a float array: into the tensors written and out of those read.

    >>> i = nf.layers.fill_constant([1], "int64", 0)
    >>> n = nf.layers.fill_constant([1], "int64", 3)
    >>> x = nf.layers.fill_constant([2], "float32", 1.0)
    >>> arr = nf.layers.create_array("float32")
    >>> cond = nf.layers.less_than(i, n)
    >>> w = nf.While(cond)
    >>> with w.block():
    ...     _ = nf.layers.array_write(nf.layers.scale(x, 2.0), i, array=arr)
    ...     _ = nf.layers.assign(nf.layers.scale(x, 2.0), output=x)
    ...     _ = nf.layers.increment(i)
    ...     _ = nf.layers.less_than(i, n, out=cond)
    >>> last = nf.layers.array_read(arr, nf.layers.fill_constant([1], "int64", 2))
    >>> length = nf.layers.array_length(arr)
    >>> stacked = nf.layers.array_to_tensor(arr)
    >>> out = nf.Executor(nf.CPUPlace()).run(fetch_list=[x, last, length, stacked])
    >>> out[0], out[1], int(out[2][0]), out[3].shape
    (array([8., 8.], dtype=float32), array([8., 8.], dtype=float32), 3, (3, 2))
    """
    block = current_block()
    floating = np.dtype(dtype_name(dtype)).kind in "fc"
    array = block.create_var(
        name or unique_name.generate("array"),
        dtype=dtype,
        type="tensor_array",
        stop_gradient=not floating,
    )
    block.append_op("create_array", outputs={"Out": [array]}, attrs={"dtype": array.dtype})
    return array


def array_write(x: VarDesc, i: VarDesc, array: VarDesc | None = None) -> VarDesc:
    """Set element `i` of `array` to `x` (in place; a new array if none); returns the array.

    >>> zero, one = (nf.layers.fill_constant([1], "int64", k) for k in (0, 1))
    >>> arr = nf.layers.array_write(nf.layers.fill_constant([2], "float32", 1.0), zero)
    >>> arr = nf.layers.array_write(nf.layers.fill_constant([2], "float32", 3.0), one, arr)
    >>> nf.Executor(nf.CPUPlace()).run(fetch_list=[nf.layers.array_read(arr, one)])[0]
    array([3., 3.], dtype=float32)
    """
    if array is None:
        array = create_array(x.dtype)
    return append_op("array_write", {"X": x, "I": i, "Array": array}, out=array)


def array_read(array: VarDesc, i: VarDesc) -> VarDesc:
    """Element `i` of `array` (ControlFlowError at run time if it was never written).

    >>> zero, one = (nf.layers.fill_constant([1], "int64", k) for k in (0, 1))
    >>> arr = nf.layers.array_write(nf.layers.fill_constant([2], "float32", 1.0), zero)
    >>> arr = nf.layers.array_write(nf.layers.fill_constant([2], "float32", 3.0), one, arr)
    >>> nf.Executor(nf.CPUPlace()).run(fetch_list=[nf.layers.array_read(arr, zero)])[0]
    array([1., 1.], dtype=float32)
    """
    return append_op("array_read", {"Array": array, "I": i})


def array_length(array: VarDesc) -> VarDesc:
    """The number of elements of `array` (int64 [1]).

    >>> zero, one = (nf.layers.fill_constant([1], "int64", k) for k in (0, 1))
    >>> arr = nf.layers.array_write(nf.layers.fill_constant([2], "float32", 1.0), zero)
    >>> arr = nf.layers.array_write(nf.layers.fill_constant([2], "float32", 3.0), one, arr)
    >>> nf.Executor(nf.CPUPlace()).run(fetch_list=[nf.layers.array_length(arr)])[0]
    array([2])
    """
    return append_op("array_length", {"Array": array}, stop_gradient=True)


def array_to_tensor(array: VarDesc, axis: int = 0) -> VarDesc:
    """The array's elements (all one shape) stacked along a new dim `axis`.

    >>> zero, one = (nf.layers.fill_constant([1], "int64", k) for k in (0, 1))
    >>> arr = nf.layers.array_write(nf.layers.fill_constant([2], "float32", 1.0), zero)
    >>> arr = nf.layers.array_write(nf.layers.fill_constant([2], "float32", 3.0), one, arr)
    >>> nf.Executor(nf.CPUPlace()).run(fetch_list=[nf.layers.array_to_tensor(arr)])[0]
    array([[1., 1.],
           [3., 3.]], dtype=float32)
    """
    return append_op("array_to_tensor", {"Array": array}, {"axis": axis})


__all__ = [
    "BlockOp",
    "IfElse",
    "While",
    "array_length",
    "array_read",
    "array_to_tensor",
    "array_write",
    "create_array",
    "ifelse",
]
