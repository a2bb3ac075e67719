"""Program, Block (the seed's SymbolTable), VarDesc and OpDesc: the Python side of framework.proto.

A Program is a list of Blocks; block 0 is the global block and every other block names its
parent, so blocks nest like C++ scopes (seed 002). Python objects are the working form; `to_desc`
/ `from_desc` convert to and from the protobuf, which holds everything a program needs to run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from nestflow.core.dtype import dtype_name
from nestflow.errors import (
    NestflowError,
    OpLocation,
    ProgramDecodeError,
    TypeMismatchError,
    UnknownOpError,
)
from nestflow.framework import framework_pb2 as pb
from nestflow.framework import unique_name

GRAD_SUFFIX = "@GRAD"

VAR_TYPES = {
    "lod_tensor": pb.LOD_TENSOR,
    "step_scopes": pb.STEP_SCOPES,
    "tensor_array": pb.TENSOR_ARRAY,
    "raw": pb.RAW,
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
        if type not in VAR_TYPES:
            raise NestflowError(f"variable '{name}': unknown type '{type}'")
        self.block = block
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype_name(dtype)
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


class _Attrs(dict):
    """An op's attributes. Any write marks the program changed, so executors prepare it again
    (a plan binds attribute values into its kernels)."""

    __slots__ = ("_op",)

    def _changed(self) -> None:
        op = getattr(self, "_op", None)
        program = getattr(getattr(op, "block", None), "program", None)
        if program is not None:
            program._bump()

    def __setitem__(self, key, value):
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
    """One operator in a block: its type, named input/output slots, attributes and source line."""

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
        found = []
        for value in self.attrs.values():
            if isinstance(value, Block):
                found.append(value)
            elif isinstance(value, list) and value and all(isinstance(b, Block) for b in value):
                found.extend(value)
        return found

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
    """

    def __init__(self, program: Program, idx: int, parent_idx: int = -1):
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.forward_block_idx = -1
        self.vars: dict[str, VarDesc] = {}
        self.ops: list[OpDesc] = []

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
        block: Block | None = self
        while block is not None:
            found = block.vars.get(name)
            if found is not None or not recursive:
                return found
            block = block.parent
        return None

    def create_var(
        self,
        name: str | None = None,
        shape: Sequence[int] = (),
        dtype: Any = "float32",
        **flags: Any,
    ) -> VarDesc:
        """Declare a variable in this block (or return the existing one of that name)."""
        if name is None:
            name = unique_name.generate("tmp")
        existing = self.vars.get(name)
        if existing is not None:
            return existing
        var = self.vars[name] = VarDesc(self, name, shape, dtype, **flags)
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
        self.program._bump()

    def all_parameters(self) -> list[VarDesc]:
        return [v for v in self.vars.values() if v.is_parameter]

    def _make_op(self, type, inputs, outputs, attrs, source) -> OpDesc:
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
        type: str,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
        source: str | None = None,
    ) -> OpDesc:
        """Append an op; its attributes are checked and its outputs' shapes inferred right away.

        Slot values may be names, VarDescs, or lists of either. On a shape/dtype/attr error
        nothing is appended.
        """
        return self.insert_op(len(self.ops), type, inputs, outputs, attrs, source)

    def insert_op(self, index, type, inputs=None, outputs=None, attrs=None, source=None) -> OpDesc:
        op = self._make_op(type, inputs, outputs, attrs, source)
        self.ops.insert(index, op)
        try:
            if _op_validator is not None:
                _op_validator(op)
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


def _names(slots: Mapping[str, Any] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for slot, value in (slots or {}).items():
        if value is None:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        out[slot] = [v.name if isinstance(v, VarDesc) else str(v) for v in items]
    return out


class Program:
    """A ProgramDesc: nested blocks of ops; block 0 is global. Printable, serialisable, cloneable."""

    def __init__(self):
        self.blocks: list[Block] = [Block(self, 0, -1)]
        self._current_idx = 0
        self.random_seed = 0
        self._version = 0

    def _bump(self) -> None:
        # Executors cache prepared plans per program; any edit invalidates them.
        self._version += 1

    @property
    def version(self) -> int:
        return self._version

    def global_block(self) -> Block:
        return self.blocks[0]

    def block(self, idx: int) -> Block:
        if not 0 <= idx < len(self.blocks):
            raise NestflowError(f"program has no block {idx} (it has {len(self.blocks)})")
        return self.blocks[idx]

    def current_block(self) -> Block:
        return self.blocks[self._current_idx]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def create_block(self, parent_idx: int | None = None) -> Block:
        """Add a child block of the current block (or of `parent_idx`) and make it current."""
        parent = self._current_idx if parent_idx is None else parent_idx
        block = Block(self, len(self.blocks), parent)
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
            block = Block(program, i, bdesc.parent_idx)
            block.forward_block_idx = bdesc.forward_block_idx
            program.blocks.append(block)
        for bdesc, block in zip(desc.blocks, program.blocks):
            for vdesc in bdesc.vars:
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
                        f"variable '{vdesc.name}' of block {block.idx}: {exc.message}"
                    ) from None
            for odesc in bdesc.ops:
                try:
                    attrs = {k: _attr_from_desc(v, program) for k, v in odesc.attrs.items()}
                except NestflowError as exc:
                    raise ProgramDecodeError(f"op '{odesc.type}': {exc.message}") from None
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
        program.random_seed = desc.random_seed
        if _op_validator is not None:
            for block in program.blocks:
                for op in block.ops:
                    try:
                        _op_validator(op)
                    except UnknownOpError:
                        raise  # already names the op, its block and source line
                    except NestflowError as exc:
                        raise ProgramDecodeError(str(exc)) from None
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
        """A deep copy; with for_test, ops switch to inference behaviour (is_test=True)."""
        copy = Program.from_desc(self.to_desc())
        if for_test:
            for block in copy.blocks:
                for op in block.ops:
                    if "is_test" in op.attrs:
                        op.attrs["is_test"] = True
        return copy

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
    return _main_program


def default_startup_program() -> Program:
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
    """Within the block, layers append to `main_program` and initializers to `startup_program`."""
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
