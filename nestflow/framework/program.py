"""Program, Block (the seed's SymbolTable), VarDesc and OpDesc: the Python side of framework.proto.

A Program is a list of Blocks; block 0 is the global block and every other block names its
parent, so blocks nest like C++ scopes (seed 002). Python objects are the working form; `to_desc`
/ `from_desc` convert to and from the protobuf, which holds everything a program needs to run.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from nestflow.core.dtype import dtype_name
from nestflow.core.tensor import numeric_dtype
from nestflow.errors import (
    AttrError,
    NestflowError,
    OpLocation,
    ProgramDecodeError,
    ShapeError,
    TypeMismatchError,
    UnknownOpError,
)
from nestflow.framework import framework_pb2 as pb
from nestflow.framework import unique_name

GRAD_SUFFIX = "@GRAD"


class OpRole:
    """What an op is for, Fluid's `op_role` bits, kept in the op's "op_role" attribute (an op
    without one is FORWARD). append_backward/gradients mark their ops BACKWARD, the
    optimizer's clip, regularization, all-reduce and update ops OPTIMIZE, the learning-rate
    schedules LR_SCHED; `Program.clone(for_test=True)` drops every op of TRAINING roles."""

    FORWARD = 0
    BACKWARD = 1
    OPTIMIZE = 2
    LR_SCHED = 16
    LOSS = 256
    TRAINING = BACKWARD | OPTIMIZE | LR_SCHED


def op_role(op: OpDesc) -> int:
    """The op's OpRole bits (FORWARD when it has no "op_role" attribute)."""
    role = op.attrs.get("op_role")
    return role if isinstance(role, int) and not isinstance(role, bool) else OpRole.FORWARD


VAR_TYPES = {
    "lod_tensor": pb.LOD_TENSOR,
    "step_scopes": pb.STEP_SCOPES,
    "tensor_array": pb.TENSOR_ARRAY,
    "raw": pb.RAW,
    "selected_rows": pb.SELECTED_ROWS,
}
_VAR_TYPE_NAMES = {v: k for k, v in VAR_TYPES.items()}


def grad_var_name(name: str) -> str:
    return name + GRAD_SUFFIX


_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
_STDLIB_DIR = os.path.join(os.path.dirname(os.__file__), "")
_USER, _STDLIB, _NESTFLOW = 0, 1, 2
_file_kinds: dict[str, int] = {}


def _file_kind(filename: str) -> int:
    kind = _file_kinds.get(filename)
    if kind is None:
        if filename.startswith(_PACKAGE_DIR):
            kind = _NESTFLOW
        elif filename.startswith("<frozen ") or (
            filename.startswith(_STDLIB_DIR)
            and not {"site-packages", "dist-packages"} & set(filename.split(os.sep))
        ):
            kind = _STDLIB
        else:
            kind = _USER
        _file_kinds[filename] = kind
    return kind


def in_user_code(filename: str) -> bool:
    """Whether code of `filename` is the user's own: not nestflow (nor a block it generated),
    the standard library or an installed package."""
    return (
        _file_kind(filename) == _USER
        and not filename.startswith("<nestflow ")
        and not {"site-packages", "dist-packages"} & set(filename.split(os.sep))
    )


def user_source_line() -> str:
    """'file.py:12 in fn' for the innermost frame of the user's code, outside the nestflow
    package and the standard library: ops a @contextmanager builds when its `with` block
    exits (a While's op) have contextlib's frames between them and the user's `with` line.
    With no such frame, the innermost one outside nestflow."""
    frame = sys._getframe(1)
    fallback = None
    while frame is not None:
        kind = _file_kind(frame.f_code.co_filename)
        if kind == _USER:
            break
        if kind == _STDLIB and fallback is None:
            fallback = frame
        frame = frame.f_back
    frame = frame if frame is not None else fallback
    if frame is None:
        return ""
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class VarDesc:
    """A variable as the program describes it: name, shape (-1 = unknown), dtype and flags.

    Layers return these; `+ - * /` on them append elementwise ops (installed by nestflow.layers).

    >>> x = nf.data("x", shape=[-1, 3], dtype="float32")
    >>> x.name, tuple(x.shape), x.dtype, x.persistable
    ('x', (-1, 3), 'float32', False)
    >>> y = x * 2 + 1  # appends scale ops
    >>> [op.type for op in nf.default_main_program().global_block().ops]
    ['scale', 'scale']
    """

    def __init__(
        self,
        block: Block,
        name: str,
        shape: Sequence[int] = (),
        dtype: Any = "float32",
        type: str = "lod_tensor",
        persistable: bool = False,
        stop_gradient: bool = False,
        is_parameter: bool = False,
        trainable: bool = True,
        is_sequence: bool = False,
        lengths_var: str = "",
    ):
        if not isinstance(name, str) or not name:
            raise TypeMismatchError(f"a variable name must be a non-empty str, got {name!r}")
        if type not in VAR_TYPES:
            raise NestflowError(f"variable '{name}': unknown type '{type}'")
        self.block = block
        self.name = name
        self.shape = _checked_shape(shape, f"variable '{name}'")
        self.dtype = numeric_dtype(dtype, f"variable '{name}'").name
        self.type = type
        self.persistable = persistable
        self.stop_gradient = stop_gradient
        self.is_parameter = is_parameter
        self.trainable = trainable
        self.is_sequence = is_sequence
        self.lengths_var = lengths_var

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def program(self) -> Program:
        return self.block.program

    def to_desc(self) -> pb.VarDesc:
        return pb.VarDesc(
            name=self.name,
            type=VAR_TYPES[self.type],
            dtype=self.dtype,
            shape=list(self.shape),
            persistable=self.persistable,
            stop_gradient=self.stop_gradient,
            is_parameter=self.is_parameter,
            trainable=self.trainable,
            is_sequence=self.is_sequence,
            lengths_var=self.lengths_var,
        )

    def __repr__(self) -> str:
        flags = [
            f
            for f in ("persistable", "is_parameter", "stop_gradient", "is_sequence")
            if getattr(self, f)
        ]
        shape = "[" + ", ".join(str(d) for d in self.shape) + "]"
        kind = "" if self.type == "lod_tensor" else f" {self.type}"
        extra = f" ({', '.join(flags)})" if flags else ""
        return f"{self.name}: {self.dtype}{shape}{kind}{extra}"

    # Hashing by identity keeps VarDescs usable as dict keys despite the overloaded operators.
    __hash__ = object.__hash__


def _checked_shape(shape: Any, what: str) -> tuple[int, ...]:
    """`shape` as a tuple of ints, each -1 (unknown) or >= 0; ShapeError naming `what`."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"{what}: shape {shape!r} is not a sequence of ints") from None
    if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims):
        raise ShapeError(f"{what}: shape {list(dims)!r} must hold ints (-1: any size)")
    dims = tuple(int(d) for d in dims)
    if any(d < -1 for d in dims):
        raise ShapeError(f"{what}: shape {list(dims)} has a negative dim other than -1")
    return dims


class _Attrs(dict):
    """An op's attributes. Any write marks the program changed, so executors prepare it again
    (a plan binds attribute values into its kernels)."""

    __slots__ = ("_op",)

    def _changed(self) -> None:
        op = getattr(self, "_op", None)
        if op is not None:
            op._sub_blocks = None
        program = getattr(getattr(op, "block", None), "program", None)
        if program is not None:
            program._bump()

    def __setitem__(self, key, value):
        op = getattr(self, "_op", None)
        if op is not None and _blocks_in(value):
            check_sub_block_refs(op, {key: value})
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key):
        super().__delitem__(key)
        self._changed()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self._changed()

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, *args):
        value = super().pop(*args)
        self._changed()
        return value

    def popitem(self):
        item = super().popitem()
        self._changed()
        return item

    def clear(self):
        super().clear()
        self._changed()


class OpDesc:
    """One operator in a block: its type, named input/output slots, attributes and source line.

    >>> block = nf.default_main_program().global_block()
    >>> x = block.create_var("x", [2, 3], "float32")
    >>> y = block.create_var("y", [2, 3], "float32")
    >>> op = block.append_op("scale", inputs={"X": [x]}, outputs={"Out": [y]},
    ...                      attrs={"scale": 2.0})
    >>> op.type, op.input("X"), op.output("Out"), op.attr("scale")
    ('scale', ['x'], ['y'], 2.0)
    """

    def __init__(
        self,
        block: Block,
        type: str,
        inputs: Mapping[str, list[str]] | None = None,
        outputs: Mapping[str, list[str]] | None = None,
        attrs: Mapping[str, Any] | None = None,
        source: str = "",
    ):
        self.block = block
        self.type = type
        self.inputs: dict[str, list[str]] = {k: list(v) for k, v in (inputs or {}).items()}
        self.outputs: dict[str, list[str]] = {k: list(v) for k, v in (outputs or {}).items()}
        self._sub_blocks: list[Block] | None = None
        self.attrs = attrs or {}
        self.source = source

    @property
    def attrs(self) -> dict[str, Any]:
        return self._attrs

    @attrs.setter
    def attrs(self, values: Mapping[str, Any]) -> None:
        attrs = _Attrs(values)
        attrs._op = self
        self._attrs = attrs
        attrs._changed()

    def input(self, slot: str) -> list[str]:
        return self.inputs.get(slot, [])

    def output(self, slot: str) -> list[str]:
        return self.outputs.get(slot, [])

    def input_names(self) -> list[str]:
        return [n for names in self.inputs.values() for n in names]

    def output_names(self) -> list[str]:
        return [n for names in self.outputs.values() for n in names]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def set_attr(self, name: str, value: Any) -> None:
        self.attrs[name] = value  # marks the program changed

    def sub_blocks(self) -> list[Block]:
        """The blocks the op's attributes refer to (remembered until an attribute changes:
        walks over nested blocks ask for them often)."""
        found = self._sub_blocks
        if found is None:
            found = []
            for value in self.attrs.values():
                if isinstance(value, Block):
                    found.append(value)
                elif isinstance(value, list) and value and all(isinstance(b, Block) for b in value):
                    found.extend(value)
            self._sub_blocks = found
        return list(found)

    def block_attr(self, name: str, optional: bool = False) -> Block | None:
        """The sub-block held by attribute `name`; AttrError (naming the attribute and what it
        holds) when it is not a Block, unless it is unset and `optional`. Control-flow ops
        check their block attributes with it when appended or loaded."""
        value = self.attrs.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, Block):
            raise AttrError(
                f"attribute '{name}' must be a sub-block (a Block of this program), got "
                f"{type(value).__name__} ({value!r})"
            )
        return value

    @property
    def index(self) -> int:
        return self.block.ops.index(self)

    def location(self) -> OpLocation:
        try:
            index = self.index
        except ValueError:
            index = -1
        return OpLocation(
            op_type=self.type,
            op_index=index,
            block_idx=self.block.idx,
            source=self.source,
            inputs=self.inputs,
            outputs=self.outputs,
        )

    def to_desc(self) -> pb.OpDesc:
        desc = pb.OpDesc(type=self.type, source=self.source)
        for slot, names in self.inputs.items():
            desc.inputs.add(parameter=slot, arguments=names)
        for slot, names in self.outputs.items():
            desc.outputs.add(parameter=slot, arguments=names)
        for name, value in self.attrs.items():
            _attr_to_desc(desc.attrs[name], value, self)
        return desc

    def __repr__(self) -> str:
        outs = ", ".join(f"{k}={v}" for k, v in self.outputs.items())
        ins = ", ".join(f"{k}={v}" for k, v in self.inputs.items())
        attrs = []
        for k, v in sorted(self.attrs.items()):
            if isinstance(v, Block):
                text = f"block[{v.idx}]"
            elif isinstance(v, list) and v and all(isinstance(b, Block) for b in v):
                text = "[" + ", ".join(f"block[{b.idx}]" for b in v) + "]"
            else:
                text = repr(v)
            attrs.append(f"{k}={text}")
        attr_text = f" {{{', '.join(attrs)}}}" if attrs else ""
        return f"{{{outs}}} = {self.type}({ins}){attr_text}"


def _attr_to_desc(attr: pb.Attr, value: Any, op: OpDesc) -> None:
    if value is None:
        return  # an unset optional attr: the empty Attr reads back as None
    if isinstance(value, Block):
        attr.block_idx = value.idx
    elif isinstance(value, bool):
        attr.b = value
    elif isinstance(value, int):
        attr.i = value
    elif isinstance(value, float):
        attr.f = value
    elif isinstance(value, str):
        attr.s = value
    elif isinstance(value, (list, tuple)):
        values = list(value)
        if values and all(isinstance(v, Block) for v in values):
            attr.blocks_idx.values.extend(b.idx for b in values)
        elif all(isinstance(v, bool) for v in values) and values:
            attr.bools.values.extend(values)
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            attr.ints.values.extend(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            attr.floats.values.extend(float(v) for v in values)
        elif all(isinstance(v, str) for v in values):
            attr.strings.values.extend(values)
        else:
            raise NestflowError(f"attribute list {value!r} mixes types", location=op.location())
    else:
        # NumPy scalars are common in user code; store them as the Python scalar they hold.
        item = getattr(value, "item", None)
        if item is None:
            raise NestflowError(
                f"attribute value {value!r} of type {type(value).__name__} cannot be stored",
                location=op.location(),
            )
        _attr_to_desc(attr, item(), op)


def _attr_from_desc(attr: pb.Attr, program: Program) -> Any:
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    if kind == "block_idx":
        return program.block(attr.block_idx)
    if kind == "blocks_idx":
        return [program.block(i) for i in attr.blocks_idx.values]
    value = getattr(attr, kind)
    if kind in ("ints", "floats", "strings", "bools"):
        return list(value.values)
    return value


def _blocks_in(value: Any) -> list[Any]:
    """The Blocks an attribute value holds (a Block, or a list with Blocks in it)."""
    if isinstance(value, Block):
        return [value]
    if isinstance(value, (list, tuple)) and any(isinstance(v, Block) for v in value):
        return list(value)
    return []


def check_sub_block_refs(
    op: OpDesc, attrs: Mapping[str, Any] | None = None, tree: _BlockTree | None = None
) -> None:
    """AttrError unless every block `op`'s attributes refer to is a block of the op's program
    nested strictly inside the op's block: its parent chain reaches the op's block (or, in a
    gradient block, the forward block it differentiates, whose names it reads). References
    also go to higher block indices only, so no chain of them comes back to where it started:
    running, pruning or differentiating the program always ends. `tree`: the program's block
    tree, when many ops are checked at once."""
    home = op.block
    blocks = home.program.blocks
    roots = [home.idx]
    if 0 <= home.forward_block_idx < home.idx:
        roots.append(home.forward_block_idx)
    for name, value in (op.attrs if attrs is None else attrs).items():
        for sub in _blocks_in(value):
            if not isinstance(sub, Block):
                raise AttrError(f"attribute '{name}' mixes blocks with {type(sub).__name__}s")
            if not (0 <= sub.idx < len(blocks) and blocks[sub.idx] is sub):
                raise AttrError(f"attribute '{name}' refers to a block of another program")
            if tree is None:
                nested = _parent_chain_reaches(sub, roots)
            else:
                nested = any(tree.nested_in(sub.idx, root) for root in roots)
            if sub.idx <= home.idx or not nested:
                raise AttrError(
                    f"attribute '{name}' refers to block {sub.idx} (parent {sub.parent_idx}), "
                    f"which is not nested in block {home.idx}: an op may only run a "
                    f"sub-block of its own block, so that running it ends"
                )


def _parent_chain_reaches(block: Block, roots: list[int]) -> bool:
    blocks = block.program.blocks
    idx, steps = block.parent_idx, 0
    while 0 <= idx < len(blocks) and steps < len(blocks):
        if idx in roots:
            return True
        idx, steps = blocks[idx].parent_idx, steps + 1
    return False


class _BlockTree:
    """Which block is nested in which, in constant time per question: the entry and exit times
    of one walk over the tree of blocks (every parent_idx lower than its block's idx)."""

    def __init__(self, blocks: list[Block]):
        kids: list[list[int]] = [[] for _ in blocks]
        for block in blocks[1:]:
            kids[block.parent_idx].append(block.idx)
        self.enter = [0] * len(blocks)
        self.leave = [0] * len(blocks)
        clock = 0
        pending = [(0, False)]
        while pending:
            idx, done = pending.pop()
            if done:
                self.leave[idx] = clock
            else:
                self.enter[idx] = clock
                pending.append((idx, True))
                pending.extend((kid, False) for kid in reversed(kids[idx]))
            clock += 1

    def nested_in(self, idx: int, root: int) -> bool:
        """Whether block `idx` lies strictly inside block `root`."""
        return self.enter[root] < self.enter[idx] and self.leave[idx] < self.leave[root]


# Set by nestflow.ops at import: checks an op against its registered definition and infers the
# shapes and dtypes of its outputs. The framework layer cannot import ops (ops sit above it).
OpValidator = Callable[[OpDesc], None]
_op_validator: OpValidator | None = None


def install_op_validator(validator: OpValidator) -> None:
    global _op_validator
    _op_validator = validator


class Block:
    """A block of the program (the seed's SymbolTable): its variables and its ops, in order.

    `find_var` falls back to the parent block, so a sub-block sees its parents' variables, and
    a child's variable of the same name shadows the parent's.

    >>> prog = nf.Program()
    >>> outer = prog.global_block()
    >>> w = outer.create_var("w", [2], "float32")
    >>> inner = prog.create_block()  # a sub-block of the global block
    >>> inner.parent is outer, inner.find_var("w") is w, inner.has_var("w")
    (True, True, False)
    >>> shadow = inner.create_var("w", [3], "float32")  # shadows the parent's w
    >>> inner.find_var("w") is shadow
    True
    >>> prog.rollback()  # back to the global block
    """

    def __init__(self, program: Program, idx: int, parent_idx: int = -1):
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.forward_block_idx = -1
        self.vars: dict[str, VarDesc] = {}
        self.ops: list[OpDesc] = []
        # find_var's answers from ancestor blocks, each valid while no block declares or
        # removes a variable of its name (Program._declared): deep nests look up outer names
        # often, and the walk up stops at the first ancestor that knows the answer.
        self._found: dict[str, tuple[VarDesc, int]] = {}

    @property
    def parent(self) -> Block | None:
        return None if self.parent_idx < 0 else self.program.block(self.parent_idx)

    def var(self, name: str) -> VarDesc:
        """The variable `name` of this block (not its parents); raises if absent."""
        found = self.vars.get(name)
        if found is None:
            raise NestflowError(f"block {self.idx} has no variable '{name}'")
        return found

    def has_var(self, name: str) -> bool:
        return name in self.vars

    def find_var(self, name: str, recursive: bool = True) -> VarDesc | None:
        """The VarDesc `name` here, else (if recursive) in the nearest ancestor block; or None."""
        found = self.vars.get(name)
        if found is not None or not recursive:
            return found
        program = self.program
        epoch = program._declared.get(name, 0)
        blocks = program.blocks
        block = self
        while True:
            known = block._found.get(name)  # what this block found above itself
            if (
                known is not None
                and known[1] == epoch
                and known[0].block.vars.get(name) is known[0]
            ):
                found = known[0]
                break
            idx = block.parent_idx
            if not 0 <= idx < len(blocks):
                return None
            block = blocks[idx]
            found = block.vars.get(name)
            if found is not None:
                break
        self._found[name] = (found, epoch)
        return found

    def create_var(
        self,
        name: str | None = None,
        shape: Sequence[int] | None = None,
        dtype: Any = None,
        **flags: Any,
    ) -> VarDesc:
        """Declare a variable in this block (shape () and float32 unless given), or return the
        existing one of that name. ShapeError if a `shape` or `dtype` given differs from the
        existing variable's: the caller would otherwise compute with a variable it did not
        describe (as `nf.data` refuses a second declaration)."""
        if name is None:
            name = unique_name.generate("tmp")
        existing = self.vars.get(name)
        if existing is not None:
            what = f"block {self.idx} already has a variable '{name}' ({existing!r})"
            if shape is not None and _checked_shape(shape, f"variable '{name}'") != existing.shape:
                raise ShapeError(f"{what}; it cannot be declared again with shape {list(shape)}")
            if dtype is not None and dtype_name(dtype) != existing.dtype:
                raise ShapeError(f"{what}; it cannot be declared again as {dtype_name(dtype)}")
            return existing
        shape = () if shape is None else shape
        var = VarDesc(self, name, shape, "float32" if dtype is None else dtype, **flags)
        self.vars[name] = var
        self.program._declared_again(name)
        self.program._bump()
        return var

    def create_parameter(
        self, name: str, shape: Sequence[int], dtype: Any = "float32", trainable: bool = True
    ) -> VarDesc:
        """A persistable, trainable variable; parameters always live in the global block."""
        glob = self.program.global_block()
        if name in glob.vars:
            return glob.vars[name]
        return glob.create_var(
            name, shape, dtype, persistable=True, is_parameter=True, trainable=trainable
        )

    def remove_var(self, name: str) -> None:
        self.vars.pop(name, None)
        self.program._declared_again(name)
        self.program._bump()

    def all_parameters(self) -> list[VarDesc]:
        return [v for v in self.vars.values() if v.is_parameter]

    def _make_op(self, type, inputs, outputs, attrs, source) -> OpDesc:
        for what, value in (("inputs", inputs), ("outputs", outputs), ("attrs", attrs)):
            if value is not None and not isinstance(value, Mapping):
                raise TypeMismatchError(
                    f"op '{type}': {what} must be a mapping (slot or attribute name -> value), "
                    f"got {value.__class__.__name__}"
                )
        role = self.program._op_role
        if role != OpRole.FORWARD and (attrs is None or "op_role" not in attrs):
            attrs = {**(attrs or {}), "op_role": role}
        return OpDesc(
            self,
            type,
            _names(inputs),
            _names(outputs),
            attrs,
            source if source is not None else user_source_line(),
        )

    def append_op(
        self,
        type: str | None = None,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
        source: str | None = None,
    ) -> OpDesc:
        """Append an op; its attributes are checked and its outputs' shapes inferred right away.

        Slot values may be names, VarDescs, or lists of either. On a shape/dtype/attr error
        nothing is appended. Fluid's `append_op()` with no type, then edited through its desc,
        is refused (AttrError): an op is checked when appended, so give it whole.
        """
        if type is None:
            raise AttrError(
                "Block.append_op() needs the op's type: nestflow checks an op and infers its "
                "outputs when it is appended, so Fluid's append_op() then desc editing is not "
                "supported; give type, inputs, outputs and attrs in one call "
                "(docs/departures.md)"
            )
        return self.insert_op(len(self.ops), type, inputs, outputs, attrs, source)

    def insert_op(self, index, type, inputs=None, outputs=None, attrs=None, source=None) -> OpDesc:
        op = self._make_op(type, inputs, outputs, attrs, source)
        self.ops.insert(index, op)
        try:
            check_sub_block_refs(op)
            if _op_validator is not None:
                _op_validator(op)
        except NestflowError as exc:
            location = op.location()
            self.ops.remove(op)
            if exc.location is not None:
                raise
            raise exc.__class__(exc.message, location=location) from None
        except _INFER_FAILURES as exc:
            # The op's shape inference met inputs or attributes it cannot work with (a list
            # attr holding strings, say): an AttrError naming the op and what it was given.
            location = op.location()
            self.ops.remove(op)
            raise AttrError(
                f"checking it failed with {exc.__class__.__name__}: {exc}; its attributes are "
                f"{_short_repr(dict(op.attrs), 300)}",
                location=location,
            ) from exc
        except BaseException:
            self.ops.remove(op)
            raise
        self.program._bump()
        return op

    def prepend_op(self, type, inputs=None, outputs=None, attrs=None, source=None) -> OpDesc:
        return self.insert_op(0, type, inputs, outputs, attrs, source)

    def remove_op(self, index: int) -> None:
        del self.ops[index]
        self.program._bump()

    def to_desc(self) -> pb.BlockDesc:
        return pb.BlockDesc(
            idx=self.idx,
            parent_idx=self.parent_idx,
            forward_block_idx=self.forward_block_idx,
            vars=[v.to_desc() for v in self.vars.values()],
            ops=[op.to_desc() for op in self.ops],
        )

    def __repr__(self) -> str:
        return f"Block(idx={self.idx}, parent_idx={self.parent_idx}, ops={len(self.ops)})"


def _mentioned(op: OpDesc) -> list[str]:
    """Every name `op` may use: its inputs and outputs, and its string attributes (a control-
    flow op names variables of its sub-block there)."""
    names = op.input_names() + op.output_names()
    for value in op.attrs.values():
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, list):
            names += [v for v in value if isinstance(v, str)]
    return names


def _names(slots: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Slot -> variable names; TypeMismatchError for a value that is neither a variable nor a
    name (a NumPy array's printed text is no variable name)."""
    out: dict[str, list[str]] = {}
    for slot, value in (slots or {}).items():
        if value is None:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        names = []
        for v in items:
            if isinstance(v, VarDesc):
                names.append(v.name)
            elif isinstance(v, str):
                names.append(v)
            else:
                raise TypeMismatchError(
                    f"slot '{slot}' takes variables (or their names), got {type(v).__name__} "
                    f"{_short_repr(v)}"
                )
        out[slot] = names
    return out


# What an op's checks raise when given values they were not written for.
_INFER_FAILURES = (TypeError, ValueError, IndexError, KeyError, AttributeError, ArithmeticError)


def _where(op: OpDesc) -> str:
    return f"op '{op.type}' (#{op.index} in block {op.block.idx})"


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Program:
    """A ProgramDesc: nested blocks of ops; block 0 is global. Printable, serialisable, cloneable.

    >>> main, startup = nf.Program(), nf.Program()
    >>> with nf.program_guard(main, startup):
    ...     x = nf.data("x", shape=[-1, 2], dtype="float32")
    ...     y = nf.layers.fc(x, size=3)
    >>> [op.type for op in main.global_block().ops]
    ['mul', 'elementwise_add']
    >>> [op.type for op in startup.global_block().ops]  # the parameters' initialisers
    ['uniform_random', 'fill_constant']
    >>> again = nf.Program.from_bytes(main.to_bytes())  # the ProgramDesc round trip
    >>> [op.type for op in again.global_block().ops], main.num_blocks
    (['mul', 'elementwise_add'], 1)
    """

    def __init__(self):
        self.blocks: list[Block] = [Block(self, 0, -1)]
        self._current_idx = 0
        self._random_seed = 0
        self._version = 0
        self._declared: dict[str, int] = {}  # name -> declarations and removals of it
        self._op_role = OpRole.FORWARD  # the role of the ops appended now (op_role_guard)

    def _declared_again(self, name: str) -> None:
        # A new declaration may shadow what find_var remembered for this name.
        self._declared[name] = self._declared.get(name, 0) + 1

    def name_in_use(self, name: str) -> bool:
        """Whether a block of the program declares a variable `name`, or did once (a quick,
        conservative test for picking a fresh name: no walk over the blocks)."""
        return name in self._declared or name in self.blocks[0].vars

    @property
    def random_seed(self) -> int:
        """The seed of the program's random ops (0: the global stream, `nf.seed`); an int in
        [0, 2**63). Anything else is an AttrError when assigned."""
        return self._random_seed

    @random_seed.setter
    def random_seed(self, seed: int) -> None:
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
            raise AttrError(
                f"Program.random_seed must be an int, got {type(seed).__name__} ({seed!r})"
            )
        if not 0 <= seed < 2**63:
            raise AttrError(f"Program.random_seed must lie in [0, 2**63), got {seed}")
        self._random_seed = int(seed)

    def _bump(self) -> None:
        # Executors cache prepared plans per program; any edit invalidates them.
        self._version += 1

    @property
    def version(self) -> int:
        return self._version

    def global_block(self) -> Block:
        return self.blocks[0]

    def block(self, idx: int) -> Block:
        """Block `idx`; NestflowError if the program has none of that index."""
        if not isinstance(idx, numbers.Integral) or not 0 <= idx < len(self.blocks):
            raise NestflowError(f"program has no block {idx!r} (it has {len(self.blocks)})")
        return self.blocks[idx]

    def current_block(self) -> Block:
        return self.blocks[self._current_idx]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def create_block(self, parent_idx: int | None = None) -> Block:
        """Add a child block of the current block (or of `parent_idx`) and make it current."""
        parent = self._current_idx if parent_idx is None else parent_idx
        if not isinstance(parent, numbers.Integral) or not 0 <= parent < len(self.blocks):
            raise NestflowError(
                f"create_block: parent_idx {parent!r} is not a block of the program (it has "
                f"{len(self.blocks)})"
            )
        block = Block(self, len(self.blocks), int(parent))
        self.blocks.append(block)
        self._current_idx = block.idx
        self._bump()
        return block

    def rollback(self) -> None:
        """Make the current block's parent current again."""
        self._current_idx = max(self.current_block().parent_idx, 0)

    @contextlib.contextmanager
    def block_guard(self, parent_idx: int | None = None):
        """`with program.block_guard() as blk:` builds ops into a new child block."""
        saved = self._current_idx
        block = self.create_block(parent_idx)
        try:
            yield block
        finally:
            self._current_idx = saved

    @contextlib.contextmanager
    def op_role_guard(self, role: int):
        """Ops appended to any block of the program inside `with program.op_role_guard(role)`
        carry the OpRole `role` (unless they set "op_role" themselves); guards nest."""
        saved = self._op_role
        self._op_role = role
        try:
            yield
        finally:
            self._op_role = saved

    def list_vars(self) -> Iterable[VarDesc]:
        for block in self.blocks:
            yield from block.vars.values()

    def all_parameters(self) -> list[VarDesc]:
        return self.global_block().all_parameters()

    # ---- protobuf ----
    def to_desc(self) -> pb.ProgramDesc:
        return pb.ProgramDesc(
            blocks=[b.to_desc() for b in self.blocks], random_seed=self.random_seed, version=1
        )

    @property
    def desc(self) -> pb.ProgramDesc:
        return self.to_desc()

    def to_bytes(self) -> bytes:
        return self.to_desc().SerializeToString(deterministic=True)

    @classmethod
    def from_desc(cls, desc: pb.ProgramDesc) -> Program:
        """The Program a ProgramDesc describes. Everything in it is checked before it is used:
        block nesting, sub-block references (only to blocks nested in the referencing one, so
        nothing can run itself), variables, attributes, and each op against its definition.
        Anything wrong raises ProgramDecodeError naming the block, variable or op; an op type
        no registered operator has raises UnknownOpError."""
        program = cls()
        if not desc.blocks:
            raise ProgramDecodeError("ProgramDesc has no blocks")
        program.blocks = []
        for i, bdesc in enumerate(desc.blocks):
            if bdesc.idx != i:
                raise ProgramDecodeError(f"block at position {i} says its idx is {bdesc.idx}")
            if i == 0 and bdesc.parent_idx != -1:
                raise ProgramDecodeError("block 0 must be the global block (parent_idx -1)")
            if i > 0 and not 0 <= bdesc.parent_idx < i:
                raise ProgramDecodeError(f"block {i} has invalid parent_idx {bdesc.parent_idx}")
            forward = bdesc.forward_block_idx
            if i == 0 and forward == 0:
                forward = -1  # the proto default of a desc written by another tool
            if not -1 <= forward < i:
                # A gradient block is made after the block it differentiates.
                raise ProgramDecodeError(f"block {i} has invalid forward_block_idx {forward}")
            block = Block(program, i, bdesc.parent_idx)
            block.forward_block_idx = forward
            program.blocks.append(block)
        for bdesc, block in zip(desc.blocks, program.blocks):
            for vdesc in bdesc.vars:
                if not vdesc.name and vdesc.type == pb.LOD_TENSOR:
                    continue  # declared by earlier versions for a gradient nobody takes
                program._declared_again(vdesc.name)
                try:
                    block.vars[vdesc.name] = VarDesc(
                        block,
                        vdesc.name,
                        vdesc.shape,
                        vdesc.dtype or "float32",
                        _VAR_TYPE_NAMES.get(vdesc.type, str(vdesc.type)),
                        vdesc.persistable,
                        vdesc.stop_gradient,
                        vdesc.is_parameter,
                        vdesc.trainable,
                        vdesc.is_sequence,
                        vdesc.lengths_var,
                    )
                except NestflowError as exc:
                    raise ProgramDecodeError(
                        f"variable {vdesc.name!r} of block {block.idx}: {exc.message}"
                    ) from None
            for index, odesc in enumerate(bdesc.ops):
                where = f"op '{odesc.type}' (#{index} in block {block.idx})"
                attrs = {}
                for name, value in odesc.attrs.items():
                    try:
                        attrs[name] = _attr_from_desc(value, program)
                    except NestflowError as exc:
                        message = f"{where}: attribute '{name}': {exc.message}"
                        raise ProgramDecodeError(message) from None
                block.ops.append(
                    OpDesc(
                        block,
                        odesc.type,
                        {s.parameter: list(s.arguments) for s in odesc.inputs},
                        {s.parameter: list(s.arguments) for s in odesc.outputs},
                        attrs,
                        odesc.source,
                    )
                )
        try:
            program.random_seed = desc.random_seed
        except AttrError as exc:
            raise ProgramDecodeError(exc.message) from None
        # Every sub-block reference first: an op's own check may walk its sub-blocks.
        tree = _BlockTree(program.blocks)
        for block in program.blocks:
            for op in block.ops:
                try:
                    check_sub_block_refs(op, tree=tree)
                except AttrError as exc:
                    raise ProgramDecodeError(f"{_where(op)}: {exc.message}") from None
        from nestflow.framework import nesting  # (nesting imports this module)

        depth = nesting.nesting_depth(program)
        if depth > nesting.MAX_NESTING:
            raise ProgramDecodeError(
                f"the program nests sub-blocks {depth} deep; nestflow runs at most "
                f"{nesting.MAX_NESTING} (nestflow.framework.nesting.MAX_NESTING)"
            )
        if _op_validator is not None:
            for block in program.blocks:
                for op in block.ops:
                    try:
                        _op_validator(op)
                    except UnknownOpError:
                        raise  # already names the op, its block and source line
                    except NestflowError as exc:
                        raise ProgramDecodeError(str(exc)) from None
                    except Exception as exc:  # an op's checks met values no builder makes
                        raise ProgramDecodeError(
                            f"{_where(op)}: checking it failed with {type(exc).__name__}: {exc}; "
                            f"its attributes are {_short_repr(dict(op.attrs), 300)}"
                        ) from None
        return program

    @classmethod
    def from_bytes(cls, data: bytes) -> Program:
        """Parse serialized ProgramDesc bytes; anything malformed raises ProgramDecodeError,
        an op type no registered operator has raises UnknownOpError."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ProgramDecodeError(f"expected bytes, got {type(data).__name__}")
        desc = pb.ProgramDesc()
        try:
            desc.ParseFromString(bytes(data))
        except DecodeError as exc:
            raise ProgramDecodeError(f"bytes are not a ProgramDesc: {exc}") from None
        return cls.from_desc(desc)

    def clone(self, for_test: bool = False) -> Program:
        """A deep copy. With for_test (Fluid's evaluation program): without the ops that
        train, those of OpRole.TRAINING roles (backward, optimizer updates, learning-rate
        schedule steps), so running it changes no parameter, optimizer state or step
        counter; the temporaries only those ops used are dropped with them; and ops with
        an is_test attribute (dropout, batch_norm) switch to inference behaviour. A clone
        made before minimize has no such ops, and is the same program with is_test set."""
        copy = Program.from_desc(self.to_desc())
        if for_test:
            dropped: set[str] = set()
            for block in copy.blocks:
                kept = []
                for op in block.ops:
                    if op_role(op) & OpRole.TRAINING:
                        dropped.update(op.input_names() + op.output_names())
                    else:
                        kept.append(op)
                        if "is_test" in op.attrs:
                            op.attrs["is_test"] = True
                block.ops = kept
            if dropped:
                used = {n for block in copy.blocks for op in block.ops for n in _mentioned(op)}
                for block in copy.blocks:
                    for name in dropped - used:
                        var = block.vars.get(name)
                        if var is not None and not var.persistable:
                            block.remove_var(name)
            copy._bump()
        return copy

    def to_dot(self, name: str = "program") -> str:
        """Graphviz DOT text of the program: each sub-block a cluster nested inside the
        control-flow op that runs it, parameters drawn apart from data (see framework/dot.py)."""
        from nestflow.framework.dot import to_dot

        return to_dot(self, name)

    def __str__(self) -> str:
        lines = []
        for block in self.blocks:
            head = f"block {block.idx}"
            if block.parent_idx >= 0:
                head += f" (parent {block.parent_idx})"
            lines.append(head + " {")
            for var in block.vars.values():
                lines.append(f"  var {var!r}")
            for i, op in enumerate(block.ops):
                lines.append(f"  op {i}: {op!r}")
            lines.append("}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        ops = sum(len(b.ops) for b in self.blocks)
        return f"Program(blocks={len(self.blocks)}, ops={ops})"


# ---- the default programs and program_guard (the familiar static-graph entry points) ----
_main_program = Program()
_startup_program = Program()


def default_main_program() -> Program:
    """The program layers append their ops to (outside a program_guard).

    >>> x = nf.data("x", shape=[-1, 2], dtype="float32")
    >>> y = nf.layers.relu(x)
    >>> [op.type for op in nf.default_main_program().global_block().ops]
    ['relu']
    """
    return _main_program


def default_startup_program() -> Program:
    """The program layers append their parameters' initialisers to: run it once first.

    >>> x = nf.data("x", shape=[-1, 2], dtype="float32")
    >>> y = nf.layers.fc(x, size=1)
    >>> [op.type for op in nf.default_startup_program().global_block().ops]
    ['uniform_random', 'fill_constant']
    """
    return _startup_program


def switch_main_program(program: Program) -> Program:
    global _main_program
    previous, _main_program = _main_program, program
    return previous


def switch_startup_program(program: Program) -> Program:
    global _startup_program
    previous, _startup_program = _startup_program, program
    return previous


@contextlib.contextmanager
def program_guard(main_program: Program, startup_program: Program | None = None):
    """Within the block, layers append to `main_program` and initializers to `startup_program`.

    >>> main, startup = nf.Program(), nf.Program()
    >>> with nf.program_guard(main, startup):
    ...     x = nf.data("x", shape=[-1, 2], dtype="float32")
    ...     y = nf.layers.fc(x, size=1)
    >>> len(main.global_block().ops), len(startup.global_block().ops)
    (2, 2)
    >>> nf.default_main_program() is main  # restored on leaving the block
    False
    """
    if not isinstance(main_program, Program):
        raise TypeMismatchError(
            f"program_guard expects a nf.Program as main_program, got {type(main_program).__name__}"
        )
    previous_main = switch_main_program(main_program)
    previous_startup = (
        switch_startup_program(startup_program) if startup_program is not None else None
    )
    try:
        yield
    finally:
        switch_main_program(previous_main)
        if previous_startup is not None:
            switch_startup_program(previous_startup)
