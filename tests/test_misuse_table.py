"""A table of misuses of the public API (nf, nf.layers, nf.Executor, nf.Scope, nf.Tensor, nf.io,
nf.optimizer, nf.NetBuilder, program files): each raises an nf.errors error (a NestflowError,
never a bare TypeError / ValueError / AttributeError / RecursionError / MemoryError / IndexError
/ KeyError) whose message names the offending thing. Issue 12, item 6 and acceptance."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import NestflowError
from nestflow.framework import framework_pb2 as pb
from nestflow.framework import nesting

L = nf.layers


@dataclass(frozen=True)
class Misuse:
    """`act(tmp_path)` misuses the API; the error's message must contain every one of `words`."""

    id: str
    act: Callable[[Path], object]
    words: tuple[str, ...]


def _main() -> nf.Program:
    return nf.default_main_program()


def _block() -> nf.Block:
    return _main().global_block()


def _x(shape=(-1, 3), dtype="float32"):
    return nf.data("x", list(shape), dtype)


def _mlp():
    """x [-1, 3] -> fc softmax -> cross_entropy with y; returns (x, y, prob, loss)."""
    x = _x()
    y = nf.data("y", [-1, 1], "int64")
    prob = L.fc(x, 2, act="softmax", name="fc")
    return x, y, prob, L.mean(L.cross_entropy(prob, y))


def _run(fetch, feed, program=None):
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    return exe.run(program, feed=feed, fetch_list=fetch, scope=scope)


def _ok_feed(rows=2):
    return {"x": np.ones((rows, 3), "float32"), "y": np.zeros((rows, 1), "int64")}


def _load_desc(edit: Callable[[pb.ProgramDesc], None], build: Callable[[], object]) -> object:
    """Build a program, edit its ProgramDesc, load the bytes."""
    build()
    desc = _main().to_desc()
    edit(desc)
    return nf.Program.from_bytes(desc.SerializeToString())


def _op(desc: pb.ProgramDesc, op_type: str) -> pb.OpDesc:
    return next(op for op in desc.blocks[0].ops if op.type == op_type)


def _deep_blocks(levels: int):
    """`levels` BlockOps nested in one another around x * 2."""
    x = _x()
    ops, contexts = [], []
    for _ in range(levels):
        op = nf.BlockOp()
        context = op.block()
        context.__enter__()
        ops.append(op)
        contexts.append(context)
    value = L.scale(x, 2.0)
    for op, context in zip(reversed(ops), reversed(contexts)):
        op.output(value)
        context.__exit__(None, None, None)
        (value,) = op()
    return value


def _too_deep(tmp_path: Path):
    nesting_limit = nesting.MAX_NESTING
    nesting.MAX_NESTING = 40
    try:
        out = _deep_blocks(45)
        return _run([out], {"x": np.ones((1, 3), "float32")})
    finally:
        nesting.MAX_NESTING = nesting_limit


def _saved_model(tmp_path: Path) -> Path:
    x, _, prob, _ = _mlp()
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    nf.io.save_inference_model(tmp_path / "model", ["x"], [prob], _main(), scope)
    return tmp_path / "model"


def _rewrite_model_json(tmp_path: Path, change: Callable[[dict], object]) -> object:
    directory = _saved_model(tmp_path)
    meta_path = directory / "model.json"
    meta = json.loads(meta_path.read_text())
    meta = change(meta)
    meta_path.write_text(meta if isinstance(meta, str) else json.dumps(meta))
    return nf.io.load_inference_model(directory)


def _net_builder_fc(**kwargs):
    builder = nf.NetBuilder()
    builder.data("other", [-1, 3])
    return builder.add_op("fc", **kwargs)


def _tensor() -> nf.Tensor:
    return nf.Tensor()


def _while(max_steps):
    i = L.fill_constant([1], "int64", 0)
    cond = L.less_than(i, L.fill_constant([1], "int64", 3))
    return nf.While(cond, max_steps=max_steps)


def _set_attr(op_type: str, attr: str, value: pb.Attr) -> Callable[[pb.ProgramDesc], None]:
    def edit(desc):
        _op(desc, op_type).attrs[attr].CopyFrom(value)

    return edit


def _set_var(field: str, value) -> Callable[[pb.ProgramDesc], None]:
    def edit(desc):
        var = next(v for v in desc.blocks[0].vars if v.name == "x")
        setattr(var, field, value)

    return edit


def _random_seed(value):
    def act(_):
        _main().random_seed = value

    return act


MISUSES = [
    # ---- issue 12, item 6 (each as the issue reports it) ----
    Misuse("a program nested deeper than nestflow runs", _too_deep, ("nests", "46", "40")),
    Misuse(
        "deeply nested model.json",
        lambda t: _rewrite_model_json(t, lambda meta: "[" * 100_000 + "]" * 100_000),
        ("model.json", "nested"),
    ),
    Misuse(
        "list attr holding strings (built)",
        lambda _: L.reshape(_x((2, 3)), ["a", 3]),
        ("reshape", "'a'"),
    ),
    Misuse(
        "list attr holding strings (loaded)",
        lambda _: _load_desc(
            _set_attr("reshape", "shape", pb.Attr(strings=pb.StringList(values=["a"]))),
            lambda: L.reshape(_x((2, 3)), [3, 2]),
        ),
        ("op 'reshape'", "'a'"),
    ),
    Misuse(
        "structured dtype (built)", lambda _: nf.data("pairs", [2], "i8,i8"), ("'pairs'", "i8,i8")
    ),
    Misuse(
        "structured dtype (loaded)",
        lambda _: _load_desc(_set_var("dtype", "i8,i8"), _x),
        ("variable 'x'", "i8,i8"),
    ),
    Misuse("negative random_seed", _random_seed(-5), ("random_seed", "-5")),
    Misuse(
        "negative random_seed (loaded)",
        lambda _: _load_desc(lambda d: setattr(d, "random_seed", -5), _x),
        ("random_seed", "-5"),
    ),
    Misuse("random_seed a string", _random_seed("seed"), ("random_seed", "'seed'")),
    Misuse(
        "feed= a list that is not of pairs",
        lambda _: _run([], [1, 2], _mlp() and None),
        ("feed", "pair"),
    ),
    Misuse("Scope.erase_vars(None)", lambda _: nf.Scope().erase_vars(None), ("erase_vars",)),
    Misuse("Scope.erase_vars([1])", lambda _: nf.Scope().erase_vars([1]), ("erase_vars", "1")),
    Misuse(
        "Tensor.mutable_data negative dim",
        lambda _: _tensor().mutable_data((-1, 3)),
        ("mutable_data", "[-1, 3]"),
    ),
    Misuse(
        "Tensor.mutable_data too big",
        lambda _: _tensor().mutable_data((2**20, 2**20)),
        ("mutable_data", "[1048576, 1048576]", "allocate"),
    ),
    Misuse("layers.fc negative size", lambda _: L.fc(_x(), -4), ("fc", "size", "-4")),
    Misuse(
        "NetBuilder.add_op of an undeclared name",
        lambda _: _net_builder_fc(input="image", size=3),
        ("fc", "'image'"),
    ),
    Misuse(
        "non-Block sub_block attr",
        lambda _: _block().append_op(
            "block", {"X": [_x()]}, {"Out": []}, {"sub_block": 1, "outs": []}
        ),
        ("op 'block'", "sub_block", "int"),
    ),
    Misuse("empty variable name (data)", lambda _: nf.data("", [2]), ("variable name", "''")),
    Misuse(
        "empty variable name (create_var)",
        lambda _: _block().create_var(""),
        ("variable name", "''"),
    ),
    Misuse("empty variable name (scope)", lambda _: nf.Scope().var(""), ("variable name", "''")),
    Misuse(
        "empty variable name as an op input",
        lambda _: _block().append_op("relu", {"X": [""]}, {"Out": ["out"]}),
        ("op 'relu'", "slot 'X'"),
    ),
    Misuse(
        "cross_entropy batch sizes (built)",
        lambda _: L.cross_entropy(L.softmax(nf.data("p", [4, 3])), nf.data("l", [5, 1], "int64")),
        ("cross_entropy", "[5, 1]", "[4, 3]"),
    ),
    Misuse(
        "cross_entropy batch sizes (fed)",
        lambda _: _run(
            [_mlp()[3]],
            {"x": np.ones((4, 3), "float32"), "y": np.zeros((5, 1), "int64")},
        ),
        ("cross_entropy", "[5, 1]", "[4, 2]"),
    ),
    Misuse(
        "create_var of an existing name with another shape",
        lambda _: (_x(), _block().create_var("x", shape=[5]))[1],
        ("'x'", "[5]"),
    ),
    Misuse(
        "create_var of an existing name with another dtype",
        lambda _: (_x(), _block().create_var("x", dtype="int64"))[1],
        ("'x'", "int64"),
    ),
    Misuse("nf.prune(program, None)", lambda _: nf.prune(_main(), None), ("targets", "None")),
    Misuse(
        "array_read given a NumPy array",
        lambda _: L.array_read(L.create_array("float32"), np.array([0])),
        ("'I'", "ndarray"),
    ),
    # ---- nf: programs, blocks, ops ----
    Misuse("prune of a non-program", lambda _: nf.prune("main", ["x"]), ("Program", "str")),
    Misuse("prune target of a wrong type", lambda _: nf.prune(_main(), [3]), ("target", "int")),
    Misuse("block index out of range", lambda _: _main().block(99), ("block 99",)),
    Misuse("block index of a wrong type", lambda _: _main().block("a"), ("block 'a'",)),
    Misuse("create_block of a missing parent", lambda _: _main().create_block(42), ("42",)),
    Misuse(
        "append_op of an unknown op", lambda _: _block().append_op("no_such_op"), ("no_such_op",)
    ),
    Misuse(
        "append_op inputs not a mapping",
        lambda _: _block().append_op("relu", inputs=["x"]),
        ("relu", "inputs", "list"),
    ),
    Misuse(
        "op attr naming an outer block",
        lambda _: _block().append_op(
            "block", {"X": [_x()]}, {"Out": []}, {"sub_block": _block(), "outs": []}
        ),
        ("sub_block", "block 0", "not nested"),
    ),
    Misuse("program_guard of a non-program", lambda _: nf.program_guard("m").__enter__(), ("str",)),
    Misuse("from_bytes of a str", lambda _: nf.Program.from_bytes("main.pb"), ("bytes", "str")),
    Misuse("from_bytes of garbage", lambda _: nf.Program.from_bytes(b"\xff\xff"), ("ProgramDesc",)),
    Misuse(
        "loaded op of an unknown type",
        lambda _: _load_desc(lambda d: setattr(d.blocks[0].ops[0], "type", "nope_op"), _mlp),
        ("nope_op",),
    ),
    Misuse(
        "loaded op reading an undeclared variable",
        lambda _: _load_desc(
            lambda d: d.blocks[0].ops[0].inputs[0].arguments.__setitem__(0, "ghost"), _mlp
        ),
        ("ghost",),
    ),
    Misuse(
        "loaded variable of a negative dim",
        lambda _: _load_desc(lambda d: d.blocks[0].vars[0].shape.append(-7), _x),
        ("variable 'x'", "-7"),
    ),
    Misuse(
        "loaded sub_block reference to itself",
        lambda _: _load_desc(
            _set_attr("block", "sub_block", pb.Attr(block_idx=0)), lambda: _deep_blocks(1)
        ),
        ("op 'block'", "block 0"),
    ),
    Misuse("get_variable of a missing name", lambda _: nf.get_variable("nope"), ("'nope'",)),
    Misuse("append_backward of a missing name", lambda _: nf.append_backward("nope"), ("'nope'",)),
    Misuse(
        "append_backward of an integer variable",
        lambda _: nf.append_backward(nf.data("ids", [1], "int64")),
        ("'ids'", "int64"),
    ),
    Misuse("gradients of None", lambda _: nf.gradients(None, None), ("targets", "None")),
    # ---- nf.layers ----
    Misuse("fc size not an int", lambda _: L.fc(_x(), "4"), ("size", "'4'")),
    Misuse("relu of a NumPy array", lambda _: L.relu(np.ones(3)), ("'X'", "ndarray")),
    Misuse("relu of None", lambda _: L.relu(None), ("relu", "'X'")),
    Misuse("mean of a Python list", lambda _: L.mean([1, 2]), ("'X'", "int")),
    Misuse("concat of nothing", lambda _: L.concat([]), ("concat",)),
    Misuse("transpose by names", lambda _: L.transpose(_x((2, 3)), ["a", "b"]), ("transpose",)),
    Misuse(
        "create_parameter of a negative dim",
        lambda _: L.create_parameter([2, -5], name="p"),
        ("'p'", "-5"),
    ),
    Misuse("data redeclared", lambda _: (_x(), nf.data("x", [7]))[1], ("'x'", "[7]")),
    Misuse("data name not a str", lambda _: nf.data(3, [2]), ("variable name", "3")),
    Misuse("cast to an unknown dtype", lambda _: L.cast(_x(), "nope"), ("'nope'",)),
    Misuse(
        "matmul of misfit shapes",
        lambda _: L.matmul(nf.data("a", [2, 3]), nf.data("b", [4, 5])),
        ("[2, 3]", "[4, 5]"),
    ),
    Misuse(
        "softmax axis out of range", lambda _: L.softmax(_x((2, 3)), axis=5), ("axis 5", "[2, 3]")
    ),
    Misuse(
        "dropout probability out of range",
        lambda _: L.dropout(_x(), dropout_prob=2.0),
        ("dropout_prob", "2.0"),
    ),
    Misuse("While max_steps not an int", lambda _: _while("x"), ("max_steps", "'x'")),
    Misuse("While max_steps negative", lambda _: _while(-2), ("max_steps",)),
    Misuse(
        "While condition not bool",
        lambda _: nf.While(L.fill_constant([1], "int64", 1)),
        ("condition", "int64"),
    ),
    Misuse(
        "IfElse condition not bool",
        lambda _: nf.ifelse(nf.data("c", [-1, 1], "int64")),
        ("'c'", "int64"),
    ),
    Misuse(
        "IfElse output outside a branch",
        lambda _: nf.ifelse().output(_x()),
        ("output", "true_block"),
    ),
    Misuse(
        "array_write index a NumPy array",
        lambda _: L.array_write(_x(), np.array([0])),
        ("'I'", "ndarray"),
    ),
    Misuse("minibatch ragged", lambda _: nf.minibatch([[1, 2], [3]]), ("minibatch",)),
    Misuse("no such layer", lambda _: nf.layers.conv7d, ("conv7d",)),
    Misuse("data shape None", lambda _: nf.data("x", None), ("data 'x'", "shape", "None")),
    Misuse("fc of None", lambda _: L.fc(None, 3), ("fc", "Variable", "None")),
    Misuse("conv2d of an array", lambda _: L.conv2d(np.ones((1, 1, 4, 4)), 2, 3), ("conv2d",)),
    # ---- nf.Executor ----
    Misuse("Executor of a string place", lambda _: nf.Executor("cpu"), ("Place", "'cpu'")),
    Misuse("run of a non-program", lambda _: nf.Executor().run("main"), ("Program", "str")),
    Misuse(
        "run in a non-scope",
        lambda _: nf.Executor().run(_main(), scope="scope"),
        ("Scope", "str"),
    ),
    Misuse("feed not a mapping", lambda _: _run([], 5, _mlp() and None), ("feed", "int")),
    Misuse(
        "feed of an unknown name",
        lambda _: _run([], {**_ok_feed(), "ghost": np.ones(1)}, _mlp() and None),
        ("'ghost'",),
    ),
    Misuse(
        "feed of a wrong shape",
        lambda _: _run([], {"x": np.ones((2, 4), "float32")}, _mlp() and None),
        ("'x'", "[2, 4]", "[-1, 3]"),
    ),
    Misuse(
        "feed of a wrong dtype",
        lambda _: _run([], {"x": np.ones((2, 3), "int64")}, _mlp() and None),
        ("'x'", "int64", "float32"),
    ),
    Misuse(
        "feed cast that overflows",
        lambda _: _run(
            [], {**_ok_feed(), "y": np.full((2, 1), 2**63 + 1, "uint64")}, _mlp() and None
        ),
        ("'y'", "uint64", "int64"),
    ),
    Misuse("missing feed", lambda _: _run([_mlp()[2]], {}), ("'x'", "fed")),
    Misuse(
        "fetch of an unknown name",
        lambda _: _run(["ghost"], _ok_feed(), _mlp() and None),
        ("'ghost'",),
    ),
    Misuse(
        "run before the startup program",
        lambda _: nf.Executor().run(feed=_ok_feed(), fetch_list=[_mlp()[3]], scope=nf.Scope()),
        ("fc.w", "startup"),
    ),
    Misuse("eval with targets None", lambda _: nf.Executor().eval(_main(), None), ("targets",)),
    # ---- nf.Scope ----
    Misuse("scope.var of a non-str", lambda _: nf.Scope().var(3), ("variable name", "3")),
    Misuse("scope.rename of an absent name", lambda _: nf.Scope().rename("a", "b"), ("'a'",)),
    Misuse(
        "scope.rename to a non-str",
        lambda _: (lambda s: (s.var("a"), s.rename("a", 3)))(nf.Scope()),
        ("'a'", "3"),
    ),
    Misuse(
        "delete_scope of a stranger",
        lambda _: nf.Scope().delete_scope(nf.Scope()),
        ("delete_scope",),
    ),
    Misuse(
        "a variable used after its scope went",
        lambda _: (lambda s: (s.new_scope(), s.drop_kids()))(nf.Scope())[0].var("a"),
        ("destroyed",),
    ),
    Misuse(
        "variable holding nothing read as a Tensor",
        lambda _: nf.Scope().var("a").get(nf.Tensor),
        ("'a'", "Tensor"),
    ),
    # ---- nf.Tensor ----
    Misuse(
        "mutable_data of a non-sequence shape",
        lambda _: _tensor().mutable_data(5),
        ("mutable_data", "5"),
    ),
    Misuse("mutable_data of float dims", lambda _: _tensor().mutable_data((2.5, 3)), ("2.5",)),
    Misuse(
        "mutable_data of a structured dtype",
        lambda _: _tensor().mutable_data((2,), "i8,i8"),
        ("mutable_data", "i8,i8"),
    ),
    Misuse(
        "mutable_data of an unknown dtype",
        lambda _: _tensor().mutable_data((2,), "nope"),
        ("'nope'",),
    ),
    Misuse("data of an unallocated tensor", lambda _: _tensor().data(), ("mutable_data",)),
    Misuse("set of a ragged list", lambda _: _tensor().set([[1, 2], [3]]), ("Tensor.set",)),
    Misuse("set of strings", lambda _: _tensor().set(["a"]), ("Tensor.set", "str")),
    # ---- nf.io ----
    Misuse(
        "load_inference_model of a missing directory",
        lambda t: nf.io.load_inference_model(t / "missing"),
        ("missing",),
    ),
    Misuse(
        "load_params of a missing file",
        lambda t: nf.io.load_params(nf.Scope(), _main(), t / "missing.safetensors"),
        ("missing.safetensors",),
    ),
    Misuse(
        "load_params of a file that is no safetensors",
        lambda t: (
            (t / "bad.safetensors").write_bytes(b"not a safetensors file"),
            nf.io.load_params(nf.Scope(), _main(), t / "bad.safetensors"),
        ),
        ("bad.safetensors",),
    ),
    Misuse(
        "save_inference_model feeding an unknown name",
        lambda t: nf.io.save_inference_model(t / "m", ["ghost"], [_mlp()[2]], _main(), nf.Scope()),
        ("'ghost'",),
    ),
    Misuse(
        "save_inference_model of uninitialised parameters",
        lambda t: nf.io.save_inference_model(t / "m", ["x"], [_mlp()[2]], _main(), nf.Scope()),
        ("fc.w",),
    ),
    Misuse(
        "model.json feed a string",
        lambda t: _rewrite_model_json(t, lambda meta: {**meta, "feed": "xy"}),
        ("model.json", "feed"),
    ),
    Misuse(
        "model.json not JSON",
        lambda t: _rewrite_model_json(t, lambda meta: "{not json"),
        ("model.json",),
    ),
    # ---- nf.optimizer ----
    Misuse(
        "optimizer learning rate a string",
        lambda _: nf.optimizer.SGD(learning_rate="a"),
        ("learning_rate", "'a'"),
    ),
    Misuse(
        "optimizer learning rate negative",
        lambda _: nf.optimizer.Adam(learning_rate=-1).minimize(_mlp()[3]),
        ("learning_rate", "-1"),
    ),
    Misuse(
        "optimizer unknown option",
        lambda _: nf.optimizer.SGD(learning_rate=0.1, momentum=0.9),
        ("momentum",),
    ),
    Misuse(
        "minimize of a missing loss",
        lambda _: nf.optimizer.SGD(0.1).minimize("loss"),
        ("'loss'",),
    ),
    # ---- nf.NetBuilder ----
    Misuse(
        "NetBuilder.add_op of an unknown layer",
        lambda _: nf.NetBuilder().add_op("nope"),
        ("'nope'",),
    ),
    Misuse(
        "NetBuilder.add_op with an argument the layer lacks",
        lambda _: _net_builder_fc(input="other", size=3, bogus=1),
        ("fc", "bogus"),
    ),
    Misuse(
        "NetBuilder.run before backward_from",
        lambda _: nf.NetBuilder().run(nf.Scope()),
        ("backward_from",),
    ),
]


@pytest.mark.parametrize("case", MISUSES, ids=[case.id for case in MISUSES])
def test_misuse_raises_a_nestflow_error_naming_what_is_wrong(case, tmp_path):
    with pytest.raises(Exception) as info:  # noqa: PT011 (the class is checked below)
        case.act(tmp_path)
    error = info.value
    assert isinstance(error, NestflowError), (
        f"{case.id}: raised a bare {type(error).__name__}: {error}"
    )
    message = str(error)
    missing = [word for word in case.words if word not in message]
    assert not missing, f"{case.id}: the message lacks {missing}:\n{message}"


def test_every_issue_12_item_6_case_is_in_the_table():
    ids = " | ".join(case.id for case in MISUSES)
    for reported in (
        "deeply nested model.json",
        "list attr holding strings",
        "structured dtype",
        "negative random_seed",
        "feed= a list",
        "Scope.erase_vars(None)",
        "Tensor.mutable_data negative",
        "Tensor.mutable_data too big",
        "layers.fc negative size",
        "NetBuilder.add_op of an undeclared name",
        "non-Block sub_block",
        "empty variable name",
        "cross_entropy batch sizes",
        "create_var of an existing name",
        "random_seed a string",
        "nf.prune(program, None)",
        "array_read given a NumPy array",
    ):
        assert reported in ids, reported


def _required(layer) -> list:
    import inspect

    params = inspect.signature(layer).parameters.values()
    empty = inspect.Parameter.empty
    return [p for p in params if p.default is empty and p.kind <= p.POSITIONAL_OR_KEYWORD]


def _layer_functions() -> list[str]:
    """The layer functions nf.layers exports that take a required argument."""
    import inspect

    return [
        n
        for n in sorted(L.__all__)
        if inspect.isfunction(getattr(L, n)) and _required(getattr(L, n))
    ]


@pytest.mark.parametrize("name", _layer_functions())
def test_every_layer_given_none_for_its_first_argument_raises_an_nf_error(name):
    """A sweep over nf.layers: None where the first argument goes (1 for the other required
    ones) is an nf.errors error naming the layer, never a bare Python error."""
    layer = getattr(L, name)
    args = [None] + [1] * (len(_required(layer)) - 1)
    with nf.program_guard(nf.Program(), nf.Program()), pytest.raises(NestflowError) as caught:
        layer(*args)
    assert caught.value.message


def test_an_error_of_the_users_own_code_inside_a_layer_passes_through_unchanged():
    def true_fn():
        raise ValueError("the user's own bug")

    with nf.program_guard(nf.Program(), nf.Program()):
        pred = L.fill_constant([1], "bool", True)
        with pytest.raises(ValueError, match="the user's own bug") as caught:
            L.cond(pred, true_fn, lambda: L.fill_constant([1], "float32", 0.0))
    assert not isinstance(caught.value, NestflowError)


def test_a_bare_error_inside_a_layer_becomes_an_nf_error_naming_layer_and_arguments():
    with nf.program_guard(nf.Program(), nf.Program()):
        x = nf.data("x", [-1, 3])
        with pytest.raises(nf.errors.TypeMismatchError) as caught:
            L.reshape(x, 6)
    message = str(caught.value)
    assert "reshape" in message and "Variable 'x' float32[-1, 3]" in message
    assert "test_misuse_table.py" in message  # the user's source line
    assert isinstance(caught.value.__cause__, TypeError)
