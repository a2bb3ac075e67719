"""nf.onnx.export: a nestflow program as an ONNX model that onnxruntime runs to the same results.

    nf.onnx.export(main, "model.onnx", ["x"], [prediction], scope, opset_version=17)

What is exported: the ops of `program` that computing `fetch_vars` from `feed_names` needs (ops
writing a fed variable are dropped, as Fluid's save_inference_model prunes with its feeds), in
inference form (the program cloned for_test: batch_norm uses its running statistics, dropout
passes its input through). Parameters and other persistable variables the graph reads become
initializers holding their values in `scope`. Feeds become graph inputs whose unknown (-1)
dims stay symbolic: "N" for the first (batch) dim, "<feed>_d<i>" for others. Fetches become
graph outputs named as the fetched variables.

Each op type is converted by one small mapper (nestflow.onnx.exporters, by op family); the
control-flow ops export as follows: per-row `ifelse` splits the rows by the condition
(NonZero + Gather), runs both branches inline on their rows and merges them back
(ScatterND); `conditional_block` (nf.layers.cond) becomes If; `recurrent` (nf.rnn, with
per-row lengths) a Loop over the time steps whose memories and outputs are masked past each
row's length; `while` a Loop; tensor arrays are ONNX sequences; `block` is inlined.

Ops that do not export (UnknownOpError naming the op and its source line): the optimizer
updates, the random fills, print (NOT_EXPORTED says why for each), every gradient op and the
collective (c_*) ops of data-parallel training.
Supported opsets: 13 to 21 (MIN_OPSET, MAX_OPSET: the opsets onnxruntime >= 1.18 runs, from
the one where Split/Squeeze/Unsqueeze/ReduceSum take their axes as inputs); a few options
need more (scatter with overwrite=False: 16).

The importer's onnx_* ops (nestflow.ops.onnx_compat) export back to the ONNX operators they
mirror, so an imported model exports again; what an opset lacks is composed (Trilu at 13,
CumProd as a Scan whose axis must be known at export) or an AttrError naming the opset it
needs (the bitwise ops: 18; see nestflow.onnx.exporters.onnx_compat).

Departures from the nestflow run: a While with max_steps stops after max_steps iterations in
ONNX where nestflow raises MaxStepsExceededError; a per-row IfElse branch that gets no rows
still runs (on zero rows) where nestflow skips it; array_write past the end of a tensor array
appends (nestflow leaves holes, which it cannot read back either); run-time errors nestflow
raises on bad values (ids outside a table, lengths outside [0, time]) are left to
onnxruntime, which may clamp, wrap or fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from nestflow.errors import (
    AttrError,
    FeedError,
    FetchError,
    NestflowError,
    TypeMismatchError,
    UnknownOpError,
)
from nestflow.framework.program import Block, OpDesc, Program, VarDesc

MIN_OPSET = 13
MAX_OPSET = 21
DEFAULT_OPSET = 17

# op type -> why it has no ONNX export (also the message of the error)
NOT_EXPORTED: dict[str, str] = {
    **{
        name: "optimizer update ops change parameters during training; export the forward "
        "(inference) program"
        for name in (
            "sgd",
            "momentum",
            "adam",
            "adamw",
            "adamax",
            "adagrad",
            "adadelta",
            "rmsprop",
            "lamb",
        )
    },
    **{
        name: "random ops draw from nestflow's generator, whose numbers ONNX cannot reproduce"
        for name in ("uniform_random", "gaussian_random")
    },
    "print": "print writes to stdout as a side effect that ONNX graphs do not have",
}


def export(
    program: Program,
    path: str | os.PathLike,
    feed_names: Sequence[str | VarDesc],
    fetch_vars: Sequence[VarDesc | str],
    scope: Any = None,
    opset_version: int = DEFAULT_OPSET,
) -> Any:
    """Write `program` as an ONNX model to `path` and return it (an onnx.ModelProto).

    `feed_names` become the model's inputs, `fetch_vars` its outputs, and the persistable
    variables it reads initializers holding their values in `scope` (default: the global
    scope). The file is written whole or not at all (a temporary file renamed over `path`).
    The model passes onnx.checker (full_check) and strict shape inference.

    Raises UnknownOpError for an op with no ONNX export (naming the op and where it was
    built), AttrError for an opset outside [MIN_OPSET, MAX_OPSET], ShapeError for a dim an
    export needs at build time that is unknown (-1), FeedError for a variable the graph
    reads that is neither fed, computed nor in the scope, FetchError for a fetch that is not
    a variable, FileWriteError when `path` cannot be written; ModuleNotFoundError when the
    onnx package is missing (pip install 'nestflow[onnx]').

    >>> nf.onnx.export(main, "mlp.onnx", ["x"], [prediction], scope)  # doctest: +SKIP
    """
    from nestflow.io.atomic import write_atomic

    model = build_model(program, feed_names, fetch_vars, scope, opset_version)
    write_atomic(os.fspath(path), model.SerializeToString())
    return model


def build_model(
    program: Program,
    feed_names: Sequence[str | VarDesc],
    fetch_vars: Sequence[VarDesc | str],
    scope: Any = None,
    opset_version: int = DEFAULT_OPSET,
) -> Any:
    """The onnx.ModelProto `export` writes (same arguments and errors, no file)."""
    onnx = _require_onnx()
    if not isinstance(program, Program):
        raise TypeMismatchError(f"export takes a nestflow Program, got {type(program).__name__}")
    feeds = _names(feed_names, "feed_names", FeedError)
    fetches = _names(fetch_vars, "fetch_vars", FetchError)
    opset = _check_opset(opset_version)
    if scope is None:
        from nestflow.executor import global_scope

        scope = global_scope()
    small = inference_program(program, feeds, fetches)
    builder = ModelBuilder(small, scope, opset)
    model = builder.build(feeds, fetches)
    try:
        onnx.checker.check_model(model, full_check=True)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise NestflowError(
            f"the exported model fails ONNX's checks (a bug in nestflow's exporter): {exc}"
        ) from None
    return model


def export_inference_model(
    model_dir: str | os.PathLike, path: str | os.PathLike, opset_version: int = DEFAULT_OPSET
) -> Any:
    """Export a directory written by nf.io.save_inference_model (what `nestflow export` runs):
    its feeds, fetches and parameters. Returns the onnx.ModelProto written to `path`."""
    from nestflow.io.inference import load_inference_model

    program, feeds, fetches, scope = load_inference_model(os.fspath(model_dir))
    return export(program, path, feeds, fetches, scope, opset_version)


def _require_onnx():
    try:
        import onnx
    except ImportError:
        raise ModuleNotFoundError(
            "nf.onnx needs the onnx package (and onnxruntime to run the models): "
            "pip install 'nestflow[onnx]'"
        ) from None
    return onnx


def _names(items: Any, what: str, error: type[NestflowError]) -> list[str]:
    if isinstance(items, (str, VarDesc)):
        items = [items]
    if not isinstance(items, (list, tuple)):
        raise error(f"{what} must be a list of variables or names, got {type(items).__name__}")
    names = []
    for item in items:
        if not isinstance(item, (str, VarDesc)) or not item:
            raise error(f"{what} must hold variables or names, got {item!r}")
        name = item if isinstance(item, str) else item.name
        if name in names:
            raise error(f"{what} names '{name}' twice")
        names.append(name)
    return names


def _check_opset(opset_version: Any) -> int:
    if not isinstance(opset_version, int) or isinstance(opset_version, bool):
        raise AttrError(f"opset_version must be an int, got {opset_version!r}")
    if not MIN_OPSET <= opset_version <= MAX_OPSET:
        raise AttrError(
            f"opset_version {opset_version} is not supported: nestflow exports ONNX opsets "
            f"{MIN_OPSET} to {MAX_OPSET}"
        )
    return opset_version


def inference_program(program: Program, feeds: list[str], fetches: list[str]) -> Program:
    """`program` without the ops that write fed variables, pruned to `fetches`, for_test."""
    from nestflow.executor.prune import prune

    glob = program.global_block()
    for name in feeds:
        var = glob.find_var(name, recursive=False)
        if var is None:
            raise FeedError(f"feed '{name}' is not a variable of the program's global block")
        if var.type != "lod_tensor":
            raise FeedError(f"feed '{name}' is a {var.type}, not a tensor")
    for name in fetches:
        var = glob.find_var(name, recursive=False)
        if var is None:
            raise FetchError(f"fetch '{name}' is not a variable of the program's global block")
        if var.type != "lod_tensor":
            raise FetchError(f"fetch '{name}' is a {var.type}, not a tensor")
    copy = Program.from_desc(program.to_desc())
    fed = set(feeds)
    block = copy.global_block()
    for index in reversed(range(len(block.ops))):
        outs = [n for n in block.ops[index].output_names() if n]
        if outs and all(n in fed for n in outs):
            block.remove_op(index)
    small = prune(copy, fetches).clone(for_test=True)
    # A copy infers its variables' shapes again from its ops: a fed variable that an op wrote
    # (the seeds' minibatch) keeps the shape the user declared, not that op's.
    for name in feeds:
        var = small.global_block().find_var(name, recursive=False)
        if var is not None:
            var.shape = glob.var(name).shape
    return small


class ModelBuilder:
    """The state of one export: the program, scope, opset, unique names and initializers."""

    def __init__(self, program: Program, scope: Any, opset: int):
        from nestflow.onnx import exporters
        from nestflow.onnx.exporters.graph import Env, Graph, Names

        self.program = program
        self.scope = scope
        self.opset = opset
        self.mappers = exporters.MAPPERS
        self.names = Names()
        self.initializers: list[Any] = []
        self._constants: dict[tuple, str] = {}
        self._arrays: dict[str, np.ndarray] = {}  # initializer name -> its value
        self.main = Graph("nestflow")
        self.main_env = Env()

    # ---- values ----

    def constant(self, array: np.ndarray) -> str:
        from onnx import numpy_helper

        key = (array.dtype.str, array.shape, array.tobytes())
        name = self._constants.get(key)
        if name is None:
            name = self.names.fresh("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._constants[key] = name
            self._arrays[name] = array
        return name

    def initializer_value(self, onnx_name: str) -> np.ndarray | None:
        """The value of an initializer (a constant or a persistable variable), else None."""
        return self._arrays.get(onnx_name)

    def lookup(self, env: Any, name: str, user: OpDesc | None) -> Any:
        value = env.find(name)
        if value is not None:
            return value
        return self._load_persistable(name, user)

    def _load_persistable(self, name: str, user: OpDesc | None) -> Any:
        from onnx import numpy_helper

        from nestflow.core.tensor import Tensor
        from nestflow.onnx.exporters.graph import Value

        var = self.program.global_block().find_var(name, recursive=False)
        where = f" (read by op '{user.type}', built at {user.source or '?'})" if user else ""
        if var is None or not var.persistable:
            raise FeedError(
                f"variable '{name}'{where} is neither fed, computed by the exported ops, nor a "
                f"persistable variable: add it to feed_names"
            )
        found = self.scope.find_var(name)
        if found is None or not found.is_type(Tensor) or not found.get(Tensor).is_allocated():
            raise FeedError(
                f"persistable variable '{name}'{where} has no value in the scope: run the "
                f"startup program (or load the parameters) in the scope given to export"
            )
        array = np.asarray(found.get(Tensor).numpy())
        if array.dtype.name != var.dtype:
            array = array.astype(var.dtype)
        onnx_name = self.names.fresh(name)
        self.initializers.append(numpy_helper.from_array(array, onnx_name))
        self._arrays[onnx_name] = array
        value = Value(onnx_name, var.dtype)
        self.main_env.bind(name, value)
        return value

    # ---- ops ----

    def convert_block(self, block: Block, graph: Any, env: Any) -> None:
        """Append the ONNX nodes of every op of `block` to `graph`, reading/binding `env`."""
        for op in block.ops:
            self.convert_op(op, graph, env)

    def convert_op(self, op: OpDesc, graph: Any, env: Any) -> None:
        from nestflow.onnx.exporters.graph import OpContext

        mapper = self.mappers.get(op.type)
        if mapper is None:
            raise UnknownOpError(_no_export_message(op.type), location=op.location())
        try:
            mapper(OpContext(self, graph, env, op))
        except NestflowError as exc:
            if exc.location is not None:
                raise
            raise type(exc)(exc.message, location=op.location()) from None

    # ---- the model ----

    def build(self, feeds: list[str], fetches: list[str]) -> Any:
        from onnx import helper

        from nestflow.onnx.exporters.graph import Value, onnx_dtype

        glob = self.program.global_block()
        self.names.reserved = set(fetches) - set(feeds)
        for name in feeds:
            var = glob.var(name)
            dims = [
                ("N" if i == 0 else f"{name}_d{i}") if d < 0 else d for i, d in enumerate(var.shape)
            ]
            onnx_name = self.names.fresh(name)
            self.main.inputs.append(
                helper.make_tensor_value_info(onnx_name, onnx_dtype(var.dtype), dims)
            )
            self.main_env.bind(name, Value(onnx_name, var.dtype))
        self.convert_block(glob, self.main, self.main_env)
        outputs = [self.lookup(self.main_env, name, None) for name in fetches]
        for name, value in zip(fetches, outputs):
            if value.sequence:
                raise FetchError(f"fetch '{name}' is a tensor array; fetch a tensor")
        final = _name_outputs(self, fetches, outputs)
        self.main.outputs = [
            v.value_info(n, glob.var(f).ndim) for v, n, f in zip(outputs, final, fetches)
        ]
        graph = self.main.to_proto(self.initializers)
        _remove_dead_nodes(graph)
        used = _used_names(graph)
        kept = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        opsets = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(
            graph,
            opset_imports=opsets,
            producer_name="nestflow",
            producer_version=_version(),
            ir_version=helper.find_min_ir_version_for(opsets),
        )
        return model


def _version() -> str:
    import nestflow

    return nestflow.__version__


def _no_export_message(op_type: str) -> str:
    why = NOT_EXPORTED.get(op_type)
    if why is None and op_type.endswith("_grad"):
        why = "gradient ops belong to training; export the forward program"
    if why is None and op_type.startswith("c_"):
        why = "collective ops exchange tensors between MPI ranks; export one rank's program"
    if why is None:
        why = "no ONNX mapper is registered for it"
    return f"op '{op_type}' cannot be exported to ONNX: {why}"


def _name_outputs(builder: ModelBuilder, fetches: list[str], values: list[Any]) -> list[str]:
    """Graph outputs named as the fetched variables: the value producing each is renamed to
    its fetch name (or copied by an Identity when a graph input or initializer holds it)."""
    from onnx import helper

    produced = {out for node in builder.main.nodes for out in node.output}
    renames: dict[str, str] = {}
    names = []
    for fetch, value in zip(fetches, values):
        if value.name == fetch:
            names.append(fetch)
            continue
        if fetch in builder.names.reserved:
            builder.names.reserved.discard(fetch)
            target = fetch
        else:  # a fed variable written again: its name is the graph input's
            target = builder.names.fresh(fetch)
        builder.names.used.add(target)
        if value.name in produced and value.name not in renames:
            renames[value.name] = target
        else:
            source = renames.get(value.name, value.name)
            builder.main.nodes.append(helper.make_node("Identity", [source], [target]))
        names.append(target)
    if renames:
        _rename(builder.main.nodes, renames)
    return names


def _rename(nodes: Sequence[Any], renames: dict[str, str]) -> None:
    """Rename values everywhere in `nodes` and the subgraphs they hold."""
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for i, name in enumerate(node.output):
            if name in renames:
                node.output[i] = renames[name]
        for graph in _subgraphs(node):
            _rename(graph.node, renames)
            for out in graph.output:
                if out.name in renames:
                    out.name = renames[out.name]


def _subgraphs(node: Any) -> list[Any]:
    found = []
    for attr in node.attribute:
        if attr.HasField("g"):
            found.append(attr.g)
        found.extend(attr.graphs)
    return found


def _used_names(graph: Any) -> set[str]:
    """Every name a node of `graph` (or of a subgraph in it) reads, plus its outputs."""
    used = {out.name for out in graph.output}
    for node in graph.node:
        used.update(node.input)
        for sub in _subgraphs(node):
            used |= _used_names(sub)
    return used


def _remove_dead_nodes(graph: Any) -> None:
    """Drop the nodes of `graph` (and of its subgraphs) whose outputs nothing uses: outputs a
    mapper computes for every slot (batch_norm's saved statistics, XShape...) and nobody
    fetches."""
    needed = {out.name for out in graph.output}
    kept = []
    for node in reversed(graph.node):
        if not any(out in needed for out in node.output):
            continue
        for sub in _subgraphs(node):
            _remove_dead_nodes(sub)
            needed |= _used_names(sub)
        needed.update(node.input)
        kept.append(node)
    del graph.node[:]
    graph.node.extend(reversed(kept))
