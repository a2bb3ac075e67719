"""Net and PlainNet (seed 003): a list of ops run directly in a scope.

Unlike `Executor.run`, which keeps temporaries in the run's own env and writes back only
persistables, a Net runs in the scope it is given: every variable its ops write is left there
(seed 003's `Run(scope)`), so step nets of an RNN can run one per step scope and a caller can read
any intermediate. A PlainNet wraps a one-block Program (its ops and VarDescs) plus a startup
Program holding the ops that initialise its parameters and optimizer state; `run` initialises,
on first use in a scope, whichever of those persistables the scope does not hold yet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from nestflow.core.place import Place, is_array
from nestflow.core.scope import Scope
from nestflow.errors import (
    DTypeError,
    NestflowError,
    ShapeError,
    UninitializedError,
)
from nestflow.executor.executor import Executor, _scope_value, _store
from nestflow.executor.optimize import append_optimizer_ops
from nestflow.executor.plan import BlockPlan, Frame
from nestflow.executor.prune import prune
from nestflow.framework import framework_pb2 as pb
from nestflow.framework.program import (
    OpDesc,
    Program,
    VarDesc,
    program_guard,
    user_source_line,
)
from nestflow.ops.registry import get_op_def, validate_op


class Net:
    """The seed's Net: ops that run in a given scope. `Net.create(desc)` picks the kind.

    >>> net = nf.Net.create()
    >>> net.add_op("scale", inputs={"X": ["a"]}, outputs={"Out": ["b"]}, attrs={"scale": 3.0})
    0
    >>> scope = nf.Scope()
    >>> scope.var("a").get_mutable(nf.Tensor).set(np.ones(2, "float32"))
    >>> net.run(scope)
    >>> scope.find_var("b").get(nf.Tensor).numpy()  # left in the scope given to run
    array([3., 3.], dtype=float32)
    """

    @staticmethod
    def create(desc: pb.NetDesc | None = None) -> Net:
        """A PlainNet (for no desc or model_type PLAIN) or a RecurrentNet (RECURRENT)."""
        if desc is None or desc.model_type == pb.NetDesc.PLAIN:
            return PlainNet(desc)
        if desc.model_type == pb.NetDesc.RECURRENT:
            try:
                from nestflow.executor.recurrent_net import RecurrentNet
            except ImportError as exc:
                raise NestflowError(
                    "NetDesc model_type RECURRENT needs nestflow.executor.recurrent_net, "
                    f"which is not available ({exc})"
                ) from None
            return RecurrentNet(desc)
        raise NestflowError(f"NetDesc has unknown model_type {desc.model_type}")

    def add_op(self, op, inputs=None, outputs=None, attrs=None) -> int:
        raise NotImplementedError

    def infer_shape(self, scope: Scope) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def run(self, scope: Scope, context: Any = None, begin: int = -1, end: int = -1) -> None:
        raise NotImplementedError

    def add_backward_ops(self, loss) -> list:
        raise NotImplementedError

    def add_optimizer_ops(self, attrs: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def to_desc(self) -> pb.NetDesc:
        raise NotImplementedError

    @property
    def desc(self) -> pb.NetDesc:
        return self.to_desc()


class PlainNet(Net):
    """Runs its ops in sequence in the scope given to `run` (seed 003's PlainNet).

    Ops whose inputs are declared get their outputs' shapes inferred when added (errors at build
    time). An input that is not declared yet is taken from the scope at run time; ops reading
    it (and what they compute) have their shapes inferred by `infer_shape(scope)`.

    >>> net = nf.PlainNet()
    >>> with net.building():
    ...     x = nf.data("x", shape=[-1, 2], dtype="float32")
    ...     y = nf.layers.reduce_sum(nf.layers.square(x))
    >>> len(net), [op.type for op in net.ops]
    (2, ['square', 'reduce_sum'])
    >>> scope = nf.Scope()
    >>> scope.var("x").get_mutable(nf.Tensor).set(np.array([[1.0, 2.0]], "float32"))
    >>> net.run(scope)
    >>> scope.find_var(y.name).get(nf.Tensor).numpy()
    array(5., dtype=float32)
    """

    def __init__(self, desc: pb.NetDesc | None = None):
        self.program = Program()
        self.startup_program = Program()
        self._deferred: set[str] = set()  # declared without a known shape: known at run time
        self._plan: BlockPlan | None = None
        self._ranges: dict[tuple[int, int], _RangeOps] = {}
        # Per caller scope, the local scopes kept by partial runs (see `run`), each with the
        # step-scope variables that still need it. Weak both ways: the caller holds its kids.
        self._kept: weakref.WeakKeyDictionary[
            Scope, list[tuple[weakref.ref[Scope], frozenset[str]]]
        ] = weakref.WeakKeyDictionary()
        self._executors: dict[Any, Executor] = {}
        self._initialised: weakref.WeakKeyDictionary[Scope, int] = weakref.WeakKeyDictionary()
        self._params_grads: list | None = None
        self._loss: VarDesc | None = None
        if desc is not None:
            if desc.model_type != pb.NetDesc.PLAIN:
                raise NestflowError("PlainNet needs a NetDesc of model_type PLAIN")
            declared = Program.from_desc(
                pb.ProgramDesc(blocks=[pb.BlockDesc(idx=0, parent_idx=-1, vars=desc.vars)])
            )
            self.program.blocks[0].vars = declared.global_block().vars
            for var in self.program.blocks[0].vars.values():
                var.block = self.program.blocks[0]
            for op_desc in desc.ops:
                self.add_op(op_desc)

    # ---- building ----
    @property
    def block(self):
        return self.program.global_block()

    @property
    def ops(self) -> list[OpDesc]:
        return self.block.ops

    def __len__(self) -> int:
        return len(self.block.ops)

    @contextlib.contextmanager
    def building(self) -> Iterator[PlainNet]:
        """Within the block, nf.layers append to this net (and its startup program)."""
        with program_guard(self.program, self.startup_program):
            yield self

    def add_var(
        self, name: str, shape: Sequence[int], dtype: Any = "float32", **flags: Any
    ) -> VarDesc:
        """Declare a variable of the net (the NetDesc's vars); returns its VarDesc."""
        self._deferred.discard(name)
        var = self.block.create_var(name, shape, dtype, **flags)
        var.shape = tuple(int(d) for d in shape)
        return var

    def add_op(
        self,
        op: pb.OpDesc | OpDesc | str,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> int:
        """Append an op, given as an OpDesc protobuf or as a type plus slot and attr dicts;
        returns its index. Output variables not declared yet are declared, shaped by the op."""
        if isinstance(op, pb.OpDesc):
            inputs = {s.parameter: list(s.arguments) for s in op.inputs}
            outputs = {s.parameter: list(s.arguments) for s in op.outputs}
            attrs = _attrs_of(op, self.program)
            op_type, source = op.type, op.source or user_source_line()
        elif isinstance(op, OpDesc):
            op_type, inputs, outputs, attrs = op.type, op.inputs, op.outputs, op.attrs
            source = op.source or user_source_line()
        else:
            op_type, source = str(op), user_source_line()
        block = self.block
        in_names = _slot_names(inputs)
        out_names = _slot_names(outputs)
        deferred_in = False
        for name in (n for names in in_names.values() for n in names if n):
            if block.find_var(name) is None:
                block.create_var(name)
                self._deferred.add(name)
            deferred_in = deferred_in or name in self._deferred
        desc = OpDesc(block, op_type, in_names, out_names, attrs, source)
        block.ops.append(desc)
        try:
            validate_op(desc)
        except (ShapeError, DTypeError):
            if not deferred_in:
                block.ops.pop()
                raise
        except BaseException:
            block.ops.pop()
            raise
        for name in (n for names in out_names.values() for n in names if n):
            if block.find_var(name) is None:
                block.create_var(name)
            if deferred_in:
                self._deferred.add(name)
        self.program._bump()
        return len(block.ops) - 1

    def add_backward_ops(
        self, loss: VarDesc | str, parameter_list=None, no_grad_set=None
    ) -> list[tuple[VarDesc, VarDesc]]:
        """Append the gradient ops of `loss` (nf.append_backward); returns [(param, grad)]."""
        from nestflow.executor.backward import append_backward

        loss_var = self._var(loss)
        with self.building():
            self._params_grads = append_backward(loss_var, parameter_list, no_grad_set)
        self._loss = loss_var
        return self._params_grads

    def add_optimizer_ops(self, attrs: Mapping[str, Any]) -> None:
        """Append optimizer ops for the gradients add_backward_ops made, e.g.
        `{"type": "adam", "learning_rate": 1e-4, "beta1": 0.9}`: "type" is one of
        nestflow.executor.optimize.UPDATE_RULES (sgd, momentum, adam, adagrad, rmsprop, ...;
        default sgd) and the other keys are nf.optimizer's arguments of that name
        (regularization and grad_clip included). Optimizer state (moments, learning rate) is
        created in the scope the first time the net runs there."""
        if self._params_grads is None:
            raise NestflowError("add_optimizer_ops needs add_backward_ops(loss) first")
        options = dict(attrs)
        kind = str(options.pop("type", "sgd")).lower()
        learning_rate = options.pop("learning_rate", None)
        with self.building():
            append_optimizer_ops(self._params_grads, kind, learning_rate, **options)

    # ---- running ----
    def infer_shape(self, scope: Scope) -> dict[str, tuple[int, ...]]:
        """Shapes of every variable of the net given the tensors now in `scope` (seed 003's
        InferShape): each op's inference runs on the actual input shapes, so a mismatch raises
        ShapeError naming the op, its inputs' shapes and the line that built it. The variables
        the ops write are created in `scope` (empty until the net runs)."""
        trial = Program.from_desc(self.program.to_desc())
        block = trial.global_block()
        for var in block.vars.values():
            held = _scope_value(scope, var.name)
            if is_array(held):
                var.shape, var.dtype = tuple(held.shape), held.dtype.name
        for op in block.ops:
            validate_op(op)
        for op in block.ops:
            for name in op.output_names():
                if name and scope.find_var(name) is None:
                    scope.var(name)
        return {name: var.shape for name, var in block.vars.items()}

    def initialize(self, scope: Scope, context: Any = None) -> None:
        """Run the startup ops for the persistables (parameters, optimizer state) `scope` does
        not hold yet; what it holds is kept. `run` calls this on first use of a scope."""
        startup = self.startup_program
        if self._initialised.get(scope) == startup.version:
            return
        missing = [
            name
            for op in startup.global_block().ops
            for name in op.output_names()
            if name and _scope_value(scope, name) is None
        ]
        if missing:
            self._executor(context).run(prune(startup, sorted(set(missing))), scope=scope)
        self._initialised[scope] = startup.version

    def run(self, scope: Scope, context: Any = None, begin: int = -1, end: int = -1) -> None:
        """Run ops [begin, end) (all when negative) in `scope`; what they write is stored in
        the scope's variables (found up the parent chain, else created in `scope`). Nothing is
        stored if an op fails. `context` may be a Place (or have a `.place`).

        Control-flow ops make their step scopes in a local kid of `scope`, dropped when the run
        ends (Executor.run's local scope). A run that stops before the ops reading those step
        scopes (a forward range before its gradient ops) keeps it until a later run in `scope`
        writes the same step-scope variables again."""
        count = len(self.block.ops)
        begin = 0 if begin < 0 else begin
        end = count if end < 0 else min(end, count)
        self.initialize(scope, context)
        plan = self._plan
        device = self._executor(context).device
        if plan is None or plan.version != self.program.version or plan.device is not device:
            plan = self._plan = BlockPlan(self.block, device)
            plan.version = self.program.version
            self._ranges = {}
        ops = self._ranges.get((begin, end))
        if ops is None:
            ops = self._ranges[(begin, end)] = _RangeOps.of(plan, begin, end)
        local = scope.new_scope() if ops.has_sub_blocks else scope
        keep = False
        try:
            frame = Frame(plan, local, self._executor(context))
            env = frame.env
            slot_of = plan.slot_of
            for name, required in ops.needs:
                value = _scope_value(scope, name)
                if value is None:
                    if not required:
                        continue
                    raise UninitializedError(
                        f"variable '{name}' is not in the scope: it is read by "
                        f"{_reader(plan, name, begin, end)}"
                    )
                env[slot_of[name]] = value
            _run_steps(frame, begin, end)
            for name in ops.written:
                value = env[slot_of[name]]
                if value is not None:  # where the variable lives, up the parent chain
                    _store(scope.find_scope(name) or scope, name, value)
            keep = local is not scope and bool(ops.read_later)
            self._retire_kept(scope, ops.written, local if keep else None, ops.read_later)
        finally:
            if local is not scope and not keep:
                scope.delete_scope(local)

    def _retire_kept(
        self, scope: Scope, written: frozenset[str], local: Scope | None, names: frozenset[str]
    ) -> None:
        """Drop the kept local scopes of `scope` whose step-scope variables were all written
        again; keep `local` (if given) for the step-scope variables `names`."""
        kept = self._kept.get(scope)
        if not kept and local is None:
            return
        still = []
        for ref, held in kept or ():
            old, held = ref(), held - written
            if old is None or not old.alive:
                continue
            if held:
                still.append((ref, held))
            elif old.parent is scope and scope.alive:
                scope.delete_scope(old)
        if local is not None:
            still.append((weakref.ref(local), names))
        if still:
            self._kept[scope] = still
        else:
            self._kept.pop(scope, None)

    def _executor(self, context: Any) -> Executor:
        place = context if isinstance(context, Place) else getattr(context, "place", None)
        exe = self._executors.get(place)
        if exe is None:
            exe = self._executors[place] = Executor(place)
        return exe

    def _var(self, var: VarDesc | str) -> VarDesc:
        name = var.name if isinstance(var, VarDesc) else str(var)
        found = self.block.find_var(name)
        if found is None:
            raise NestflowError(f"net has no variable '{name}'")
        return found

    # ---- description ----
    def to_desc(self) -> pb.NetDesc:
        """The NetDesc (model_type PLAIN) of the net's ops and variables. Initialisation lives
        outside it: a net made from it expects its persistables in the scope it runs in."""
        block = self.block.to_desc()
        # A variable whose shape is only known at run time stays undeclared, as it was built.
        declared = [v for v in block.vars if v.name not in self._deferred]
        return pb.NetDesc(model_type=pb.NetDesc.PLAIN, ops=block.ops, vars=declared)

    def __str__(self) -> str:
        lines = ["PlainNet {"]
        for var in self.block.vars.values():
            lines.append(f"  var {var!r}")
        for i, op in enumerate(self.block.ops):
            lines.append(f"  op {i}: {op!r}")
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"PlainNet(ops={len(self)})"


def _attrs_of(op: pb.OpDesc, program: Program) -> dict[str, Any]:
    from nestflow.framework.program import _attr_from_desc

    return {k: _attr_from_desc(v, program) for k, v in op.attrs.items()}


def _slot_names(slots: Mapping[str, Any] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for slot, value in (slots or {}).items():
        items = value if isinstance(value, (list, tuple)) else [value]
        out[slot] = [v.name if isinstance(v, VarDesc) else str(v) for v in items]
    return out


@dataclasses.dataclass(frozen=True)
class _RangeOps:
    """What a run of ops [begin, end) of a plan needs, resolved once per range."""

    needs: list[tuple[str, bool]]  # read before written: from the scope (name, required)
    written: frozenset[str]  # stored in the scope after the run
    has_sub_blocks: bool  # control flow: step scopes go in a local kid scope
    read_later: frozenset[str]  # step-scope variables written here that later ops read

    @classmethod
    def of(cls, plan: BlockPlan, begin: int, end: int) -> _RangeOps:
        ops = plan.ops[begin:end]
        written = frozenset(n for op in ops for n in op.output_names() if n)
        later = {n for op in plan.ops[end:] for n in op.input_names()}
        block = plan.block
        read_later = frozenset(
            n
            for n in written & later
            if (var := block.find_var(n)) is not None and var.type == "step_scopes"
        )
        return cls(
            _range_inputs(ops),
            written,
            any(op.sub_blocks() for op in ops),
            read_later,
        )


def _range_inputs(ops: Sequence[OpDesc]) -> list[tuple[str, bool]]:
    """(name, required) for what `ops` read before any of them writes it: these come from
    the scope. An optional input (a gradient no op produced) may be absent."""
    written: set[str] = set()
    needs: dict[str, bool] = {}
    for op in ops:
        op_def = get_op_def(op.type)
        for slot, names in op.inputs.items():
            spec = op_def.input_slot(slot)
            required = spec is None or not spec.optional or op_def.run is not None
            for name in names:
                if name and name not in written:
                    needs[name] = needs.get(name, False) or required
        written.update(n for n in op.output_names() if n)
    return list(needs.items())


def _reader(plan: BlockPlan, name: str, begin: int, end: int) -> str:
    for i in range(begin, end):
        op = plan.ops[i]
        if name in op.input_names():
            return f"op '{op.type}' (#{i})" + (f" built at {op.source}" if op.source else "")
    return "the net"


def _run_steps(frame: Frame, begin: int, end: int) -> None:
    env, steps, plan = frame.env, frame.plan.steps, frame.plan
    index = begin
    try:
        for index in range(begin, end):
            steps[index](env, frame)
    except NestflowError as exc:
        if exc.location is not None:
            raise
        raise type(exc)(exc.message, location=plan.ops[index].location()) from exc
    except Exception as exc:
        raise plan.runtime_error(index, env, exc) from exc


__all__ = ["Net", "PlainNet"]
