"""Backward: append gradient ops to a program (reverse-mode differentiation of op descriptions).

`append_backward(loss)` seeds `loss@GRAD` with ones and walks the loss's block in reverse; for
every op on a path from a variable needing a gradient to the loss it asks the op's grad maker
(`get_op_def(op.type).grad_maker(op, ctx)`) for gradient ops and appends them. Control-flow
ops build their sub-block's gradient block through `ctx.backward_block`, which runs the same
walk (`_GradBuilder.walk`) over the sub-block, recursively for nested control flow (with room
on the stack for the program's deepest nesting: nesting.stack_room).

Naming convention:
- In the block being differentiated by `append_backward` / `gradients`, the gradient of `x`
  is `x@GRAD`.
- In a gradient block made by `backward_block(sub_block, ...)`, the gradient of a variable
  declared in `sub_block` itself is `x@GRAD`; the gradient of a variable of an enclosing block
  (an outer read: a batch input, a parameter) is `x@GRAD@BLOCK<k>`, k = the gradient block's
  idx. So a grad block never writes the outer block's own `x@GRAD`; the control-flow grad op
  reads the block's contribution by that name and adds it into the outer gradient.
- Gradients of gradients (a program already holding gradient ops, differentiated again): where
  `x@GRAD` is taken (written by an op being differentiated), x's new gradient is `x@GRAD@2`
  (or the next free number).
- When a variable receives several contributions, each is written to a partial
  `<grad>@RENAME@<n>` and a `sum` op adds them into the gradient's name. A seed keeps the name
  its caller gave.

A variable needs a gradient when it is floating point (a dense tensor or a tensor array), not
`stop_gradient` and not in `no_grad_set`, depends on a source (a leaf of the block: a parameter
or a variable fed or set up before the block's ops write it; for a gradient block: the `wanted`
variables) and the loss (or a seeded variable) depends on it. Programs that overwrite a
variable (`assign(.., output=x)`, a while op's carried outputs) are handled in reverse order:
when the walk passes the op writing `x`, the gradient of the value it wrote is complete and
gradients arriving afterwards belong to the value before. For such an in-place op, a grad
maker's first `grad_of(x)` calls (one per output slot naming `x`) answer for the output and
later calls for the input: grad makers ask about outputs first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from nestflow.core.dtype import is_inexact
from nestflow.errors import NestflowError, TypeMismatchError
from nestflow.framework.nesting import nesting_depth, stack_room
from nestflow.framework.program import (
    GRAD_SUFFIX,
    Block,
    OpDesc,
    OpRole,
    VarDesc,
    default_main_program,
)
from nestflow.ops.registry import GradOpSpec, get_op_def

# Ops without a gradient whose outputs do not depend differentiably on their inputs (shapes,
# counts, zeros, metrics, loop counters): a walk passing them just stops there.
NON_DIFFERENTIABLE = frozenset(
    {
        "accuracy",
        "array_length",
        "equal",
        "fill_any_like",
        "fill_zeros_like",
        "greater_equal",
        "greater_than",
        "increment",
        "less_equal",
        "less_than",
        "logical_and",
        "logical_not",
        "logical_or",
        "logical_xor",
        "not_equal",
        "rnn_memory_boot",
    }
)


class _GradBuilder:
    """One reverse walk over `fwd`'s ops appending gradient ops to `gblk` (the GradContext
    grad makers see). `gblk` is `fwd` itself for append_backward, else a new child of `fwd`."""

    def __init__(self, fwd: Block, gblk: Block, no_grad: set[str], user_no_grad: set[str]):
        self.fwd, self.gblk = fwd, gblk
        self.no_grad = no_grad
        self.user_no_grad = user_no_grad  # passed on to gradient blocks of sub-blocks
        self.needs: set[str] = set()
        self.partials: dict[str, list[str]] = {}  # var -> names of its gradient contributions
        self.var_of: dict[str, str] = {}  # gradient name -> the forward variable
        self.rename: dict[str, str] = {}  # a lone partial -> the gradient's own name
        self.made: set[str] = set()  # partial names this walk made
        self.pending: list[tuple[GradOpSpec, str]] = []  # with the forward op's source line
        self.counter = 0
        self.op: OpDesc | None = None
        self.out_grad: dict[str, str | None] = {}
        self.out_asks: dict[str, int] = {}
        self.handed: dict[str, str] = {}  # partial names handed to the current grad maker
        self.taken: set[str] = set()  # names the differentiated ops write (gradients of old)
        self.bases: dict[str, str] = {}  # var -> its gradient's name where `x@GRAD` is taken

    # ---- the walk ----
    def walk(
        self, ops: Sequence[OpDesc], seeds: dict[str, str], sources: Iterable[str]
    ) -> dict[str, str]:
        """Append the gradient ops of `ops` given gradients `seeds` (var -> grad name); returns
        var -> final gradient name for every source that received a gradient."""
        sources = list(dict.fromkeys(sources))
        self.taken = {n for op in ops for n in op.output_names() if n}
        self.needs = self._needs_grad(ops, seeds, sources)
        for var, grad in seeds.items():
            self.partials[var] = [grad]
            self.var_of[grad] = var
        for op in reversed(ops):
            outs = [n for n in op.output_names() if self.partials.get(n)]
            ins = [n for n in op.input_names() if n in self.needs]
            if not outs or not ins:
                continue
            op_def = get_op_def(op.type)
            maker = op_def.grad_maker
            unsupported = op_def.extra.get("double_unsupported")
            reason = unsupported(op.attrs) if unsupported is not None and maker else None
            is_gradient = op_def.forward_type is not None or op.type.endswith("_grad")
            if is_gradient and (maker is None or reason):
                what = f" ({reason})" if reason else ""
                raise NestflowError(
                    f"higher-order gradient of {op.type}{what} is not supported: the gradient "
                    f"of {outs} must flow through this gradient op to {ins}",
                    location=op.location(),
                )
            if maker is None:
                if op.type in NON_DIFFERENTIABLE:
                    continue
                raise NestflowError(
                    f"op '{op.type}' has no gradient, but the gradient of {outs} must flow "
                    f"through it to {ins}; mark them stop_gradient or pass no_grad_set",
                    location=op.location(),
                )
            self.op = op
            self.out_grad = {n: self._finish(n) for n in op.output_names() if n}
            self.out_asks = {}
            for spec in maker(op, self):
                for name in (n for names in spec.outputs.values() for n in names):
                    if name in self.handed:
                        self.partials.setdefault(self.handed[name], []).append(name)
                self.pending.append((spec, op.source))
            self.handed = {}
        self.op = None
        got = {v: self._finish(v) for v in sources if self.partials.get(v)}
        self._append_pending()
        return got

    def _needs_grad(self, ops, seeds, sources) -> set[str]:
        """Differentiable variables downstream of a source and upstream of a seed."""
        down = {s for s in sources if self._may_have_grad(s)}
        for op in ops:
            if any(n in down for n in op.input_names()):
                down.update(n for n in op.output_names() if self._may_have_grad(n))
        up = set(seeds)
        for op in reversed(ops):
            if any(n in up for n in op.output_names()):
                up.update(n for n in op.input_names() if n)
        return down & up

    def _may_have_grad(self, name: str) -> bool:
        if not name or name in self.no_grad:
            return False
        var = self.fwd.find_var(name)
        return var is not None and _differentiable(var)

    # ---- gradient names ----
    def _base(self, var: str) -> str:
        if self.gblk is self.fwd or self.fwd.has_var(var):
            base = var + GRAD_SUFFIX
        else:
            base = f"{var}{GRAD_SUFFIX}@BLOCK{self.gblk.idx}"
        if base not in self.taken:
            return base
        fresh = self.bases.get(var)
        if fresh is None:
            order = 2
            while self.gblk.program.name_in_use(f"{base}@{order}"):
                order += 1
            fresh = self.bases[var] = f"{base}@{order}"
        return fresh

    def _finish(self, var: str) -> str | None:
        """The gradient name of `var`'s current value, summing its contributions if several."""
        parts = self.partials.pop(var, [])
        if not parts:
            return None
        if len(parts) == 1 and parts[0] not in self.made:
            return parts[0]  # a seed keeps its name
        base = self._base(var)
        self.var_of[base] = var
        if len(parts) == 1:
            self.rename[parts[0]] = base
        else:
            source = self.op.source if self.op is not None else ""
            self.pending.append((GradOpSpec("sum", {"X": list(parts)}, {"Out": [base]}), source))
        return base

    def _new_partial(self, var: str) -> str:
        base = self._base(var)
        program = self.gblk.program
        while True:
            name = f"{base}@RENAME@{self.counter}"
            self.counter += 1
            if not program.name_in_use(name):  # (not merely unseen from gblk: no walk up)
                break
        self.var_of[name] = var
        self.made.add(name)
        self.handed[name] = var
        return name

    # ---- GradContext ----
    def grad_of(self, name: str) -> str | None:
        """For an output of the op being differentiated: its gradient's name (None if no
        gradient reaches it). For an input: a fresh name to write its gradient to, or None."""
        op = self.op
        if name in self.out_grad:
            asked = self.out_asks.get(name, 0)
            if name not in op.input_names() or asked < op.output_names().count(name):
                self.out_asks[name] = asked + 1
                return self.out_grad[name]
        if name not in self.needs or name not in op.input_names():
            return None
        return self._new_partial(name)

    def backward_block(
        self, sub_block: Block, out_grads: dict[str, str], wanted: list[str]
    ) -> tuple[Block, dict[str, str]]:
        """A new block (child of `sub_block`, so forward names resolve) holding the gradient
        ops of `sub_block` seeded with `out_grads`; returns it and wanted var -> grad name."""
        program = sub_block.program
        with program.block_guard(sub_block.idx) as gblk:
            pass
        gblk.forward_block_idx = sub_block.idx
        for var, grad in out_grads.items():
            _declare_grad(gblk, sub_block.find_var(var), grad)
        own_stops = {n for n, v in sub_block.vars.items() if v.stop_gradient}
        no_grad = (self.user_no_grad | own_stops) - set(wanted)
        builder = _GradBuilder(sub_block, gblk, no_grad, self.user_no_grad)
        got = builder.walk(list(sub_block.ops), dict(out_grads), wanted)
        return gblk, got

    # ---- appending ----
    def _append_pending(self) -> None:
        rename = self.rename
        for spec, source in self.pending:
            inputs = {k: [rename.get(n, n) for n in v] for k, v in spec.inputs.items()}
            outputs = {k: [rename.get(n, n) for n in v] for k, v in spec.outputs.items()}
            for name in (n for names in outputs.values() for n in names if n):
                var = self.var_of.get(name)
                if var is not None:
                    _declare_grad(self.gblk, self.fwd.find_var(var), name)
            self.gblk.append_op(spec.type, inputs, outputs, spec.attrs, source=source)
        self.pending = []


@contextmanager
def _unchanged_on_error(program) -> Iterator[None]:
    """Leaves `program` as it was (ops, variables, blocks) when the body raises: a failed
    gradients call appends nothing (not even its seed)."""
    blocks = len(program.blocks)
    kept = [(b, len(b.ops), set(b.vars)) for b in program.blocks]
    try:
        yield
    except BaseException:
        del program.blocks[blocks:]
        for block, ops, names in kept:
            del block.ops[ops:]
            for name in [n for n in block.vars if n not in names]:
                block.remove_var(name)
        program._bump()
        raise


def _differentiable(var: VarDesc) -> bool:
    return var.type in ("lod_tensor", "tensor_array") and is_inexact(var.dtype)


def _declare_grad(block: Block, var: VarDesc | None, grad: str) -> VarDesc:
    """Declare `grad` in `block` with the shape and dtype of the variable it is the gradient of."""
    if var is None:
        return block.vars.get(grad) or block.create_var(grad)
    kind = "tensor_array" if var.type == "tensor_array" else "lod_tensor"
    return block.vars.get(grad) or block.create_var(grad, var.shape, var.dtype, type=kind)


def _names(items: Iterable[Any] | None) -> set[str]:
    return {v.name if isinstance(v, VarDesc) else str(v) for v in (items or ())}


def _variables(items: VarDesc | Sequence[VarDesc], what: str) -> list[VarDesc]:
    """gradients' `targets` or `inputs` as a non-empty list of variables (TypeMismatchError
    naming `what` otherwise)."""
    items = [items] if isinstance(items, VarDesc) else items
    if not isinstance(items, (list, tuple)) or not items:
        raise TypeMismatchError(
            f"gradients: {what} must be a variable or a non-empty list of them, got {items!r}"
        )
    odd = [v for v in items if not isinstance(v, VarDesc)]
    if odd:
        raise TypeMismatchError(f"gradients: {what} must be variables, got {odd!r}")
    return list(items)


def _as_var(block: Block, item: VarDesc | str) -> VarDesc:
    if isinstance(item, VarDesc):
        return item
    var = block.find_var(str(item))
    if var is None:
        raise NestflowError(f"no variable named '{item}' in block {block.idx}")
    return var


def _ops_until(block: Block, names: set[str]) -> list[OpDesc]:
    """The block's ops up to the last one writing any of `names`: later ops (an optimizer's
    updates) cannot influence them."""
    last = max((i for i, op in enumerate(block.ops) if names & set(op.output_names())), default=-1)
    return list(block.ops[: last + 1])


def _stop_names(block: Block) -> set[str]:
    stops = set()
    while block is not None:
        stops.update(n for n, v in block.vars.items() if v.stop_gradient)
        block = block.parent
    return stops


def _seed_ones(block: Block, target: VarDesc) -> str:
    """Append the op setting `target@GRAD` to ones of target's shape; returns its name."""
    if not _differentiable(target):
        raise NestflowError(
            f"cannot differentiate '{target.name}': it is {target.dtype} {target.type}, "
            f"not a floating-point tensor"
        )
    grad = target.name + GRAD_SUFFIX
    _declare_grad(block, target, grad)
    # A 0-d declared shape may stand for a shape a Net learns only at run time: copy the
    # value's shape then.
    if target.shape and all(d >= 0 for d in target.shape):
        attrs = {"shape": list(target.shape), "dtype": target.dtype, "value": 1.0}
        block.append_op("fill_constant", {}, {"Out": [grad]}, attrs)
    else:
        attrs = {"value": 1.0, "dtype": target.dtype}
        block.append_op("fill_any_like", {"X": [target.name]}, {"Out": [grad]}, attrs)
    return grad


def append_backward(
    loss: VarDesc | str,
    parameter_list: Sequence[VarDesc | str] | None = None,
    no_grad_set: Iterable[VarDesc | str] | None = None,
) -> list[tuple[VarDesc, VarDesc]]:
    """Append to `loss`'s block the ops computing `d loss / d x` into `x@GRAD` for every
    variable needing a gradient; returns (parameter, gradient) for each parameter of
    `parameter_list` (default: every trainable parameter) that received one.

    `loss` may have any shape (0-d or [1] usually); its gradient is seeded with ones. Variables
    with stop_gradient, in `no_grad_set` (names or VarDescs), non-trainable or unlisted
    parameters and integer/bool variables get no gradient. Raises NestflowError if an op
    without a gradient lies on a path gradients must take.

    >>> x = nf.data("x", shape=[-1, 2], dtype="float32")
    >>> y = nf.layers.fc(x, size=1, name="fc")
    >>> loss = nf.layers.mean(y)
    >>> [(p.name, g.name) for p, g in nf.append_backward(loss)]
    [('fc.w', 'fc.w@GRAD'), ('fc.b', 'fc.b@GRAD')]
    >>> exe = nf.Executor()
    >>> _ = exe.run(nf.default_startup_program())
    >>> exe.run(feed={"x": np.array([[1.0, 2.0], [3.0, 4.0]], "float32")},
    ...         fetch_list=["fc.w@GRAD", "fc.b@GRAD"])  # d mean / d w = mean of the rows
    [array([[2.],
           [3.]], dtype=float32), array([1.], dtype=float32)]
    """
    block = loss.block if isinstance(loss, VarDesc) else default_main_program().global_block()
    loss = _as_var(block, loss)
    program = block.program
    if parameter_list is None:
        params = [p for p in program.all_parameters() if p.trainable]
    else:
        params = [_as_var(block, p) for p in parameter_list]
    listed = {p.name for p in params}
    user_no_grad = _names(no_grad_set)
    unlisted = {p.name for p in program.all_parameters()} - listed
    no_grad = _stop_names(block) | user_no_grad | unlisted
    ops = _ops_until(block, {loss.name})
    written: set[str] = set()
    leaves: list[str] = []
    for op in ops:
        leaves += [n for n in op.input_names() if n and n not in written]
        written.update(op.output_names())
    with program.op_role_guard(OpRole.BACKWARD), _unchanged_on_error(program):
        seed = _seed_ones(block, loss)
        builder = _GradBuilder(block, block, no_grad, user_no_grad)
        with stack_room(nesting_depth(program, block), f"block {block.idx}"):
            got = builder.walk(ops, {loss.name: seed}, leaves + sorted(listed))
    return [(p, block.find_var(got[p.name])) for p in params if p.name in got]


def gradients(
    targets: VarDesc | Sequence[VarDesc],
    inputs: VarDesc | Sequence[VarDesc],
    target_gradients: Sequence[VarDesc | None] | None = None,
    no_grad_set: Iterable[VarDesc | str] | None = None,
) -> list[VarDesc | None]:
    """Append ops computing d(sum of targets)/d input for each of `inputs` (like
    paddle.static.gradients / tf.gradients); returns the gradient variables, None for an input
    the targets do not depend on. `target_gradients` seed the targets (default: ones).

    The program may already hold gradient ops: they are differentiated too (a gradient
    penalty, a Hessian-vector product), through their ops' second-order rules; a gradient op
    without one raises NestflowError ("higher-order gradient of OP is not supported"). A call
    that raises leaves the program as it was.

    >>> x = nf.data("x", shape=[-1, 3], dtype="float64")
    >>> x.stop_gradient = False
    >>> y = nf.layers.reduce_sum(nf.layers.square(x))  # sum of x^2
    >>> (dx,) = nf.gradients(y, x)
    >>> nf.Executor().run(feed={"x": np.array([[1.0, 2.0, 3.0]])}, fetch_list=[dx])
    [array([[2., 4., 6.]])]
    >>> (ddx,) = nf.gradients(nf.layers.reduce_sum(nf.layers.square(dx)), x)  # d(4 x^2)/dx
    >>> nf.Executor().run(feed={"x": np.array([[1.0, 2.0, 3.0]])}, fetch_list=[ddx])
    [array([[ 8., 16., 24.]])]
    """
    targets, inputs = _variables(targets, "targets"), _variables(inputs, "inputs")
    block = targets[0].block
    given = list(target_gradients or [None] * len(targets))
    if len(given) != len(targets):
        raise NestflowError(f"gradients: {len(targets)} targets but {len(given)} target_gradients")
    user_no_grad = _names(no_grad_set)
    wanted = [v.name for v in inputs]
    no_grad = (_stop_names(block) | user_no_grad) - set(wanted)
    ops = _ops_until(block, {t.name for t in targets})
    seeds = {}
    with block.program.op_role_guard(OpRole.BACKWARD), _unchanged_on_error(block.program):
        for target, grad in zip(targets, given):
            seeds[target.name] = grad.name if grad is not None else _seed_ones(block, target)
        builder = _GradBuilder(block, block, no_grad, user_no_grad)
        with stack_room(nesting_depth(block.program, block), f"block {block.idx}"):
            got = builder.walk(ops, seeds, wanted)
    return [block.find_var(got[n]) if n in got else None for n in wanted]


__all__ = ["NON_DIFFERENTIABLE", "append_backward", "gradients"]
