"""nf.onnx.load: an ONNX model as an ordinary nestflow Program.

    program, feed_names, fetch_vars = nf.onnx.load("model.onnx", scope)
    out, = nf.Executor().run(program, feed={feed_names[0]: x}, fetch_list=fetch_vars, scope=scope)

Each ONNX node is turned into nestflow ops by one small mapper per op type
(nestflow.onnx.importers, by op family). Floating-point initializers become trainable
parameters holding their values in `scope` (append backward and an optimizer to train the
imported model); other initializers and Constant nodes are constants. A node whose inputs are
all constants is folded when the model is imported (its kernel runs once, the result is a
constant): shape arithmetic such as Shape -> Gather -> Concat -> Reshape on inputs of known
shape becomes a plain reshape; where a shape is only known at run time, the same nodes run as
ops. A constant an op reads is a persistable, non-trainable variable in `scope`.

Graph inputs keep their ONNX names (the feed names) with unknown dims as -1; `input_shapes`
overrides declared shapes (fixing a dynamic dim the importer cannot resolve). Graph outputs
are the fetch variables, in order.

Errors (all nf.errors classes): ProgramDecodeError for bytes or a file that is no ONNX model,
a graph that reads a value nothing defines or that ONNX forbids (check_graph), or external
data it may not read; UnknownOpError for an op type outside the importer's table or the
default ONNX domain (naming op and node); AttrError for an opset outside MIN_OPSET..MAX_OPSET
or an attribute value the mapper does not support or ONNX does not allow; DTypeError for an
element type nestflow has no dtype for (strings, bfloat16, float8, complex); ShapeError for a
shape the importer needs and cannot resolve, or a constant too big to compute at import. A
model is untrusted input: see docs/saving.md, "Untrusted ONNX models".
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nestflow.core.scope import Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import (
    AttrError,
    DTypeError,
    NestflowError,
    ProgramDecodeError,
    ShapeError,
    UnknownOpError,
    suggest_names,
)
from nestflow.framework import unique_name
from nestflow.framework.program import Block, Program, VarDesc, program_guard
from nestflow.ops.registry import VarInfo, get_op_def, place_args

# The default-domain opsets whose op semantics the mappers implement. Below 7, Add & co.
# took a `broadcast` attribute instead of NumPy broadcasting; 28 is the newest opset of onnx
# 1.23 (the version the importer is tested with).
MIN_OPSET = 7
MAX_OPSET = 28

# ONNX element types nestflow has a dtype for (TensorProto.DataType -> NumPy name).
ELEMENT_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
}
DTYPE_ELEMENTS = {v: k for k, v in ELEMENT_DTYPES.items()}

# Ops that are never folded into constants: they draw random numbers.
_NOT_FOLDED = frozenset({"uniform_random", "gaussian_random", "dropout"})

# The largest constant (in bytes) the importer computes when it imports a model. One whose
# shape is known beforehand and exceeds it is left to run time (ConstantOfShape, Expand): a
# hostile model's 10**6 x 10**6 constant must not be allocated just by importing it.
MAX_FOLDED_BYTES = 2**28

# Subgraphs (If branches, Loop bodies) nested deeper than this are refused. The importer
# recurses a few Python frames per level; protobuf's own depth limit stops a serialised model
# at about 30 levels, an in-memory ModelProto has none.
MAX_SUBGRAPH_DEPTH = 32


def load(
    model: Any,
    scope: Scope | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    base_dir: str | os.PathLike | None = None,
) -> tuple[Program, list[str], list[VarDesc]]:
    """Import an ONNX model: returns (program, feed_names, fetch_vars).

    `model`: a path (str or os.PathLike) to an .onnx file, its bytes, or an onnx.ModelProto.
    `scope` (default: nf.global_scope()) receives the initializers (float ones as trainable
    parameters) and the constants the program reads. `input_shapes` maps graph input names to
    shapes replacing the declared ones (-1 or None: any size). `base_dir`: the directory
    external tensor data is read from (default: the model file's directory; bytes and a
    ModelProto with external data need it, nothing is read from the working directory).

    Raises ProgramDecodeError, UnknownOpError, AttrError, DTypeError or ShapeError (see the
    module docstring); nothing is put into `scope` when the import fails. ModuleNotFoundError
    when the onnx package is missing (pip install 'nestflow[onnx]').

    >>> import onnx, nestflow as nf                                       # doctest: +SKIP
    >>> program, feeds, fetches = nf.onnx.load("model.onnx", nf.Scope())  # doctest: +SKIP
    """
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise ModuleNotFoundError(
            "nf.onnx.load needs the onnx package: pip install 'nestflow[onnx]'"
        ) from None
    proto = read_model(model, base_dir)
    opset = default_opset(proto)
    if scope is None:
        from nestflow.executor import global_scope

        scope = global_scope()
    if not isinstance(scope, Scope):
        raise DTypeError(f"nf.onnx.load: scope must be a nf.Scope, got {type(scope).__name__}")
    importer = GraphImporter(proto, opset, dict(input_shapes or {}))
    program, feeds, fetches = importer.build()
    for name, value in importer.scope_values().items():
        scope.var(name).get_mutable(Tensor).set(value)
    return program, feeds, fetches


def read_model(model: Any, base_dir: str | os.PathLike | None = None):
    """`model` (path, bytes or ModelProto) as an onnx.ModelProto, its external data read from
    `base_dir` (a path's default: the file's directory); ProgramDecodeError if it is not a
    valid model (see check_graph)."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        proto, what = model, "the ModelProto given"
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto, what = _parse(bytes(model), "the bytes given"), "the bytes given"
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ProgramDecodeError(f"cannot read ONNX model '{path}': {exc}") from None
        proto, what = _parse(data, f"'{path}'"), f"ONNX model '{path}'"
        if base_dir is None:
            base_dir = os.path.dirname(os.path.abspath(path))
    else:
        raise ProgramDecodeError(
            f"nf.onnx.load takes a path, bytes or an onnx.ModelProto, got {type(model).__name__}"
        )
    if not proto.HasField("graph"):
        raise ProgramDecodeError("the ONNX model has no graph (is this an .onnx file?)")
    check_graph(proto.graph)
    for function in proto.functions:  # their subgraphs too, before onnx's loaders recurse
        for sub in _subgraphs(function.node):
            check_graph(sub, 1)
    proto = _load_external_data(proto, base_dir, what)
    if len(proto.functions):  # model-local functions (torch's dynamo exporter makes them)
        from onnx.inliner import inline_local_functions

        try:
            proto = inline_local_functions(proto)
        except Exception as exc:
            raise ProgramDecodeError(f"the model's local functions do not inline: {exc}") from None
        check_graph(proto.graph)
    return proto


def check_graph(graph, depth: int = 0) -> None:
    """Refuse what ONNX's checker refuses and the importer would otherwise take: a value
    assigned twice in one graph (two nodes writing one output, a node overwriting a graph
    input or initializer, a repeated input or initializer) and subgraphs nested deeper than
    MAX_SUBGRAPH_DEPTH. Run on every model, a ModelProto built in memory included, before
    anything else walks the graph."""
    if depth > MAX_SUBGRAPH_DEPTH:
        raise ProgramDecodeError(
            f"the ONNX model nests subgraphs (If branches, Loop bodies) more than "
            f"{MAX_SUBGRAPH_DEPTH} deep"
        )
    where = f"subgraph '{graph.name}'" if depth else "the ONNX graph"
    defined: set[str] = set()
    for kind, names in (
        ("input", [v.name for v in graph.input]),
        ("initializer", [t.name for t in graph.initializer]),
    ):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ProgramDecodeError(f"{where} lists {kind} '{name}' twice")
            seen.add(name)
        defined |= seen
    for index, node in enumerate(graph.node):
        for name in node.output:
            if name and name in defined:
                raise ProgramDecodeError(
                    f"{where}: node '{node.name or index}' ({node.op_type}) writes '{name}', "
                    f"which the graph already defines (an input, an initializer or an earlier "
                    f"node's output): ONNX graphs assign each value once"
                )
            defined.add(name)
    for sub in _subgraphs(graph.node):
        check_graph(sub, depth + 1)


def _subgraphs(nodes) -> list:
    """The subgraphs the attributes of `nodes` hold (If branches, Loop and Scan bodies)."""
    found = []
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("g"):
                found.append(attr.g)
            found.extend(attr.graphs)
    return found


def _parse(data: bytes, what: str):
    import onnx

    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError and kin
        raise ProgramDecodeError(f"{what} is not an ONNX model: {exc}") from None
    if not proto.HasField("graph") or proto.ir_version <= 0:
        raise ProgramDecodeError(
            f"{what} is not an ONNX model (no graph or no IR version: "
            f"{len(data)} bytes that protobuf parsed as an empty model)"
        )
    return proto


def _load_external_data(proto, base_dir: str | os.PathLike | None, what: str):
    """`proto` with its external tensor data read from `base_dir` (a copy: a ModelProto
    given by the caller is left as it was). onnx's loader refuses a location that leaves
    the directory (../, absolute paths, symlinks) and one that is no regular file. Without a
    base directory external data is refused: reading it from the working directory would
    let a model name any file there."""
    from onnx.external_data_helper import (
        _get_all_tensors,
        load_external_data_for_model,
        uses_external_data,
    )

    external = [t.name for t in _get_all_tensors(proto) if uses_external_data(t)]
    if not external:
        return proto
    if base_dir is None:
        raise ProgramDecodeError(
            f"{what} keeps tensors {external[:5]} in external data files; nestflow reads "
            f"them only from a directory you name: nf.onnx.load(..., base_dir=...)"
        )
    copy = type(proto)()
    copy.CopyFrom(proto)
    try:
        load_external_data_for_model(copy, os.fspath(base_dir))
    except Exception as exc:
        raise ProgramDecodeError(f"cannot read the external data of {what}: {exc}") from None
    return copy


def default_opset(proto) -> int:
    """The model's opset of the default ONNX domain; AttrError outside MIN_OPSET..MAX_OPSET."""
    versions = {o.domain: o.version for o in proto.opset_import}
    version = versions.get("", versions.get("ai.onnx"))
    if version is None:
        raise ProgramDecodeError(
            "the ONNX model imports no opset of the default domain (opset_import lists "
            f"{sorted(versions) or 'nothing'})"
        )
    if version < MIN_OPSET:
        raise AttrError(
            f"the ONNX model uses opset {version}, older than the oldest nestflow imports "
            f"({MIN_OPSET}); convert it first (onnx.version_converter.convert_version)"
        )
    if version > MAX_OPSET:
        raise AttrError(
            f"the ONNX model uses opset {version}, newer than the newest nestflow imports "
            f"({MAX_OPSET})"
        )
    return version


def element_dtype(elem_type: int, what: str) -> str:
    """The nestflow dtype of an ONNX element type; DTypeError naming `what` if there is none."""
    dtype = ELEMENT_DTYPES.get(elem_type)
    if dtype is None:
        import onnx

        try:
            kind = onnx.TensorProto.DataType.Name(elem_type)
        except ValueError:
            kind = str(elem_type)
        raise DTypeError(
            f"{what} has element type {kind}, which nestflow has no dtype for (it has "
            f"{sorted(ELEMENT_DTYPES.values())})"
        )
    return dtype


def tensor_array(tensor, what: str) -> np.ndarray:
    """An ONNX TensorProto's value as a NumPy array of a nestflow dtype."""
    from onnx import TensorProto, numpy_helper

    dtype = element_dtype(tensor.data_type, what)
    if tensor.data_location == TensorProto.EXTERNAL:  # to_array would read it from the cwd
        raise ProgramDecodeError(f"{what}: its data is in an external file nestflow did not read")
    if any(d < 0 for d in tensor.dims):
        raise ProgramDecodeError(f"{what}: its dims {list(tensor.dims)} include a negative one")
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as exc:
        raise ProgramDecodeError(f"{what}: its tensor data cannot be read ({exc})") from None
    return np.asarray(array).astype(dtype, copy=False)


def _value_names(graph, names: set[str]) -> set[str]:
    """Every value name of `graph` and its subgraphs (kept free for them)."""
    import onnx

    names.update(i.name for i in graph.input)
    names.update(i.name for i in graph.initializer)
    for node in graph.node:
        names.update(node.output)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _value_names(attr.g, names)
            for sub in attr.graphs:
                _value_names(sub, names)
    names.discard("")
    return names


def _readers(graph, readers: dict[str, list]) -> dict[str, list]:
    """value name -> the nodes (of `graph` and its subgraphs) reading it; a graph output
    counts as a reader (None)."""
    import onnx

    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                _readers(sub, readers)
    for value in graph.output:
        readers.setdefault(value.name, []).append(None)
    return readers


class GraphImporter:
    """Builds the Program of one ONNX model: its name tables, constants and parameters.

    Value names: `self.scopes` is a stack of dicts (one per graph being imported, the main
    graph first) mapping ONNX value names to nestflow variable names; a subgraph sees its
    enclosing graphs' values. `self.consts` holds every value known when importing (nestflow
    name -> array); `self.params` the initial values of the trainable parameters.
    """

    def __init__(self, proto, opset: int, input_shapes: dict[str, Sequence[int]]):
        self.proto = proto
        self.opset = opset
        self.input_shapes = input_shapes
        self.program = Program()
        self.scopes: list[dict[str, str]] = [{}]
        self.consts: dict[str, np.ndarray] = {}
        self.params: dict[str, np.ndarray] = {}
        self.materialized: dict[str, np.ndarray] = {}
        self.taken = _value_names(proto.graph, set())
        self.readers = _readers(proto.graph, {})
        # the output name of a node another node's mapper already computed (a Conv absorbing
        # the BatchNormalization after it) -> the variable holding it
        self.absorbed: dict[str, str] = {}

    @property
    def block(self) -> Block:
        return self.program.current_block()

    # ---- names ----
    def lookup(self, onnx_name: str) -> str | None:
        for table in reversed(self.scopes):
            if onnx_name in table:
                return table[onnx_name]
        return None

    def bind(self, onnx_name: str, name: str) -> None:
        self.scopes[-1][onnx_name] = name

    def fresh(self, base: str) -> str:
        """A variable name no ONNX value and no variable of the program has."""
        name = base
        while name in self.taken or self._declared(name):
            name = unique_name.generate(base)
        self.taken.add(name)
        return name

    def claim(self, onnx_name: str, fallback: str) -> str:
        """`onnx_name` as a variable name if no variable has it yet (else a fresh one)."""
        if onnx_name and not self._declared(onnx_name) and onnx_name not in self.consts:
            return onnx_name
        return self.fresh(fallback)

    def _declared(self, name: str) -> bool:
        return any(name in b.vars for b in self.program.blocks) or name in self.consts

    # ---- values ----
    def is_const(self, name: str) -> bool:
        return name in self.consts

    def info(self, name: str) -> VarInfo:
        if name in self.consts:
            value = self.consts[name]
            return VarInfo(tuple(value.shape), value.dtype.name)
        var = self.block.find_var(name)
        if var is None:
            raise ProgramDecodeError(f"value '{name}' is not visible where it is read")
        return VarInfo(tuple(var.shape), var.dtype)

    def var(self, name: str) -> str:
        """`name` as a variable ops can read: a constant becomes a persistable variable."""
        if name in self.consts and name not in self.materialized:
            value = self.consts[name]
            self.program.global_block().create_var(
                name,
                value.shape,
                value.dtype.name,
                persistable=True,
                stop_gradient=True,
                trainable=False,
            )
            self.materialized[name] = value
        return name

    def new_const(self, base: str, value: np.ndarray) -> str:
        name = base if base and not self._declared(base) else self.fresh(base)
        self.taken.add(name)
        self.consts[name] = np.asarray(value)
        return name

    def scope_values(self) -> dict[str, np.ndarray]:
        """What the program reads from its scope: parameters and materialized constants."""
        return {**self.params, **self.materialized}

    def fold(self, op_type: str, inputs: dict[str, Any], attrs: dict[str, Any]) -> tuple:
        """Run op `op_type`'s kernel on constant inputs; its outputs, one per output slot."""
        op_def = get_op_def(op_type)
        checked = op_def.check_attrs(attrs)
        kwargs = {k: v for k, v in checked.items() if k in op_def.attrs}
        args = []
        for slot in op_def.inputs:
            names = inputs.get(slot.name)
            if slot.duplicable:
                args.append([self.consts[n] for n in names or []])
            else:
                args.append(None if names is None else self.consts[names])
        try:
            # constants fold on the host: place_args gives a kernel CPUPlace's xp and device
            result = op_def.forward(*args, **kwargs, **place_args(op_def.forward))
        except NestflowError:
            raise
        except (ValueError, TypeError, IndexError, ArithmeticError, MemoryError) as exc:
            shapes = [getattr(a, "shape", None) for a in args]
            raise ShapeError(
                f"folding {op_type} on constant inputs of shapes {shapes} failed: {exc}"
            ) from None
        if len(op_def.outputs) == 1:
            result = (result,)
        return tuple(
            [np.asarray(r) for r in value] if isinstance(value, list) else np.asarray(value)
            for value in result
        )

    @staticmethod
    def small(shape: Sequence[int], dtype: Any) -> bool:
        """Whether a constant of `shape` and `dtype` is small enough to compute at import
        (MAX_FOLDED_BYTES); checked before allocating it."""
        size = np.dtype(dtype).itemsize
        for dim in shape:
            size *= max(int(dim), 0)  # a negative dim: the kernel's error, not ours
        return size <= MAX_FOLDED_BYTES

    def foldable(self, op_type: str, names: list[str]) -> bool:
        if op_type in _NOT_FOLDED or not all(n in self.consts for n in names):
            return False
        op_def = get_op_def(op_type)
        return op_def.forward is not None and op_def.run is None

    # ---- building ----
    def build(self) -> tuple[Program, list[str], list[VarDesc]]:
        graph = self.proto.graph
        with unique_name.guard(), program_guard(self.program, Program()):
            self._initializers(graph)
            feeds = self._inputs(graph)
            self.import_nodes(graph.node)
            fetches = [self.program.global_block().var(n) for n in self.outputs(graph)]
        return self.program, feeds, fetches

    def _initializers(self, graph) -> None:
        if len(graph.sparse_initializer):
            raise ProgramDecodeError(
                f"the ONNX graph has sparse initializers "
                f"({[t.values.name for t in graph.sparse_initializer][:5]}), which nestflow "
                f"does not import; densify them first"
            )
        block = self.program.global_block()
        for tensor in graph.initializer:
            value = tensor_array(tensor, f"initializer '{tensor.name}'")
            if value.dtype.kind == "f":
                block.create_parameter(tensor.name, value.shape, value.dtype.name)
                self.params[tensor.name] = value
            else:
                self.consts[tensor.name] = value
            self.bind(tensor.name, tensor.name)

    def _inputs(self, graph) -> list[str]:
        feeds = []
        initialized = {t.name for t in graph.initializer}
        unknown = set(self.input_shapes) - {i.name for i in graph.input}
        if unknown:
            raise ShapeError(
                f"input_shapes names {sorted(unknown)}, which are not inputs of the graph "
                f"(its inputs: {[i.name for i in graph.input if i.name not in initialized]})"
            )
        for value in graph.input:
            if value.name in initialized:
                continue  # an initializer listed as an input too (IR < 4): a parameter
            shape, dtype = self.value_type(value, f"graph input '{value.name}'")
            if value.name in self.input_shapes:
                given = self.input_shapes[value.name]
                shape = tuple(-1 if d is None else int(d) for d in given)
            if shape is None:
                raise ShapeError(
                    f"graph input '{value.name}' has no shape (not even a rank); give it one "
                    f"with nf.onnx.load(..., input_shapes={{'{value.name}': [...]}})"
                )
            self.program.global_block().create_var(value.name, shape, dtype, stop_gradient=True)
            self.bind(value.name, value.name)
            feeds.append(value.name)
        return feeds

    @staticmethod
    def value_type(value, what: str) -> tuple[tuple[int, ...] | None, str]:
        """(shape or None when not even the rank is known, dtype) of a ValueInfoProto."""
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            raise DTypeError(
                f"{what} is of ONNX type '{kind}'; nestflow imports tensors only (no "
                f"sequences, maps or optionals)"
            )
        tensor_type = value.type.tensor_type
        dtype = element_dtype(tensor_type.elem_type, what)
        if not tensor_type.HasField("shape"):
            return None, dtype
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
        return dims, dtype

    def import_nodes(self, nodes) -> None:
        from nestflow.onnx.importers import MAPPERS, Node

        for index, proto in enumerate(nodes):
            where = f"ONNX node '{proto.name}'" if proto.name else f"ONNX node #{index}"
            if proto.output and proto.output[0] in self.absorbed:
                self.bind(proto.output[0], self.absorbed.pop(proto.output[0]))
                continue
            if proto.domain not in ("", "ai.onnx"):
                raise UnknownOpError(
                    f"{where}: op '{proto.domain}.{proto.op_type}' is outside the default "
                    f"ONNX domain; nestflow imports ai.onnx ops only"
                )
            mapper = MAPPERS.get(proto.op_type)
            if mapper is None:
                raise UnknownOpError(
                    f"{where}: op '{proto.op_type}' is not supported by nestflow's ONNX "
                    f"importer{suggest_names(proto.op_type, MAPPERS)}"
                )
            for name in proto.input:
                if name and self.lookup(name) is None:
                    raise ProgramDecodeError(
                        f"{where} ({proto.op_type}) reads '{name}', which no input, "
                        f"initializer or earlier node defines (nodes must be in topological "
                        f"order)"
                    )
            node = Node(self, proto, where)
            try:
                mapper(node)
            except NestflowError as exc:
                if exc.message.startswith("ONNX node"):
                    raise
                raise type(exc)(
                    f"{where} ({proto.op_type}): {exc.message}", location=exc.location
                ) from None
            for name in proto.output:
                if name and self.lookup(name) is None:
                    raise NestflowError(f"{where} ({proto.op_type}): output '{name}' not mapped")

    def import_subgraph(self, graph, bindings: Sequence[str]) -> list[str]:
        """Import a subgraph (If branch, Loop body) into the current block: its inputs bound
        to the variables `bindings`, outer values visible; returns its outputs' variable
        names (constants made variables)."""
        self.scopes.append({})
        try:
            if type(graph).__name__ != "GraphProto":  # absent, or an attribute of another type
                raise AttrError("its subgraph attribute (If's branches, Loop's body) is missing")
            if len(bindings) != len(graph.input):
                raise ProgramDecodeError(
                    f"subgraph '{graph.name}' has {len(graph.input)} inputs, but its node "
                    f"gives it {len(bindings)}"
                )
            for value, name in zip(graph.input, bindings):
                self.bind(value.name, name)
            for tensor in graph.initializer:
                name = self.new_const(tensor.name, tensor_array(tensor, f"'{tensor.name}'"))
                self.bind(tensor.name, name)
            self.import_nodes(graph.node)
            names = []
            for value in graph.output:
                name = self.lookup(value.name)
                if name is None:
                    raise ProgramDecodeError(
                        f"subgraph '{graph.name}': output '{value.name}' is not computed"
                    )
                names.append(self.var(name))
            return names
        finally:
            self.scopes.pop()

    def outputs(self, graph) -> list[str]:
        """The variable names of a graph's outputs: each an op's output (constants, inputs and
        values also output under another name are copied by an assign op)."""
        names = []
        for value in graph.output:
            name = self.lookup(value.name)
            if name is None:
                raise ProgramDecodeError(
                    f"graph output '{value.name}' is not computed by any node of the graph"
                )
            if self.is_const(name) or self._fed_or_param(name) or name in names:
                source = self.var(name)
                name = self.claim(value.name, f"{value.name}.copy")
                if name == source:
                    name = self.fresh(f"{value.name}.copy")
                self.block.create_var(name)
                self.block.append_op("assign", {"X": [source]}, {"Out": [name]})
            names.append(name)
        return names

    def _fed_or_param(self, name: str) -> bool:
        var = self.block.find_var(name)
        if var is None:
            return False
        return var.persistable or not any(name in op.output_names() for op in var.block.ops)
