"""Program / Block / OpDesc / VarDesc: seed 002's SymbolTable and the protobuf program description."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, NestflowError, ShapeError, UnknownOpError
from nestflow.framework import framework_pb2 as pb
from nestflow.ops import register_op
from nestflow.ops.registry import _REGISTRY


class EveryAttrOp:
    """Test-only op carrying one attribute of every type framework.proto can store."""

    type = "test_every_attr"
    inputs, outputs = ("X",), ("Out",)
    attrs = {
        "i": 0,
        "f": 0.0,
        "s": "",
        "b": False,
        "ints": [0],
        "floats": [0.0],
        "strings": [""],
        "bools": [False],
        "sub_block": None,
        "sub_blocks": None,
        "unset": None,
    }

    def forward(X, **attrs):
        return X


@pytest.fixture(autouse=True, scope="module")
def every_attr_op():
    """Registered only while this module runs, so suites that walk the registry never see it."""
    register_op(EveryAttrOp)
    yield
    _REGISTRY.pop(EveryAttrOp.type)


def _line_of(marker: str) -> int:
    """The line number in this file of the statement containing `marker`."""
    source = Path(__file__).read_text().splitlines()
    return next(i + 1 for i, text in enumerate(source) if marker in text)


def _program_with_everything() -> nf.Program:
    """Two nested sub-blocks, vars of every flag and type, ops with attrs of every type."""
    main = nf.Program()
    main.random_seed = 1234
    with nf.program_guard(main), nf.unique_name.guard():
        x = nf.data("x", shape=[-1, 3], dtype="float32")
        nf.data("ids", shape=[-1, 1], dtype="int64")
        y = nf.layers.fc(x, size=4, act="relu", name="fc")
        glob = main.global_block()
        glob.create_var("scopes", type="step_scopes")
        glob.create_var("arr", type="tensor_array")
        glob.create_var("seq", [-1, -1, 3], is_sequence=True, lengths_var="seq_len")
        glob.create_var("frozen", [2], persistable=True, is_parameter=True, trainable=False)
        with main.block_guard() as sub:
            z = sub.create_var("z", [-1, 4])
            sub.append_op("relu", {"X": y}, {"Out": z})
            with main.block_guard() as subsub:
                subsub.append_op("scale", {"X": z}, {"Out": subsub.create_var("w")}, {"scale": 2})
        grad_block = main.create_block(parent_idx=0)
        grad_block.forward_block_idx = sub.idx
        main.rollback()
        glob.append_op(
            "test_every_attr",
            {"X": y},
            {"Out": glob.create_var("every")},
            {
                "i": -(2**40),
                "f": 0.1,
                "s": "héllo",
                "b": True,
                "ints": [1, -2, 3],
                "floats": [0.5, -1.25, 1e-30],
                "strings": ["a", "ü", ""],
                "bools": [True, False],
                "sub_block": sub,
                "sub_blocks": [sub, subsub],
            },
        )
    return main


def _snapshot(program: nf.Program) -> list:
    """Everything the Python objects hold, in plain values (blocks as indices)."""

    def plain(v):
        if isinstance(v, nf.Block):
            return ("block", v.idx)
        if isinstance(v, list):
            return [plain(e) for e in v]
        return v

    out = [program.random_seed]
    for b in program.blocks:
        out.append(("block", b.idx, b.parent_idx, b.forward_block_idx))
        for v in b.vars.values():
            out.append(
                (
                    v.name,
                    v.shape,
                    v.dtype,
                    v.type,
                    v.persistable,
                    v.stop_gradient,
                    v.is_parameter,
                    v.trainable,
                    v.is_sequence,
                    v.lengths_var,
                )
            )
        for op in b.ops:
            attrs = {k: plain(v) for k, v in sorted(op.attrs.items())}
            out.append((op.type, op.inputs, op.outputs, attrs, op.source))
    return out


# ---- Program and Block (the SymbolTable) ----


def test_new_program_has_one_global_block():
    """seed 002: a program is nested blocks; the global block has no parent."""
    p = nf.Program()
    glob = p.global_block()
    assert p.num_blocks == 1 and p.blocks == [glob]
    assert glob.idx == 0 and glob.parent_idx == -1 and glob.parent is None
    assert p.current_block() is glob
    assert glob.ops == [] and glob.vars == {}


def test_create_block_nests_under_the_current_block_or_parent_idx():
    """seed 002: "Child block's name scopes should inherit the parent's" — each block records
    its parent_idx."""
    p = nf.Program()
    b1 = p.create_block()
    assert (b1.idx, b1.parent_idx, b1.parent) == (1, 0, p.global_block())
    assert p.current_block() is b1
    b2 = p.create_block()  # nests under the current block, b1
    assert b2.parent is b1
    b3 = p.create_block(parent_idx=0)
    assert b3.parent_idx == 0 and p.block(3) is b3
    p.rollback()
    assert p.current_block() is p.global_block()
    with pytest.raises(NestflowError, match="no block 9"):
        p.block(9)


def test_block_guard_makes_a_child_block_current_then_restores():
    """seed 002: ops built inside `with` go into the sub-block; afterwards the parent again."""
    main = nf.Program()
    with nf.program_guard(main):
        x = nf.data("x", shape=[2])
        with main.block_guard() as sub:
            assert main.current_block() is sub and sub.parent_idx == 0
            y = nf.layers.relu(x)
        assert main.current_block() is main.global_block()
        z = nf.layers.relu(x)
    assert [op.type for op in sub.ops] == ["relu"]
    assert y.block is sub and z.block is main.global_block()
    assert sub.find_var(y.name, recursive=False) is y
    assert main.global_block().find_var(y.name) is None


def test_block_guard_restores_the_current_block_on_error():
    """seed 002: a failed build inside a sub-block does not leave the program in it."""
    main = nf.Program()
    with pytest.raises(RuntimeError), main.block_guard():
        raise RuntimeError("boom")
    assert main.current_block() is main.global_block()


def test_find_var_recursive_vs_local():
    """seed 002: "find a VarDesc by name, if recursive is true, find parent's SymbolTable
    recursively"."""
    p = nf.Program()
    glob = p.global_block()
    w = glob.create_var("fc.w", [3, 4], persistable=True)
    sub = p.create_block()
    subsub = p.create_block()
    assert subsub.find_var("fc.w") is w
    assert subsub.find_var("fc.w", recursive=True) is w
    assert subsub.find_var("fc.w", recursive=False) is None
    assert sub.find_var("nope") is None
    assert glob.find_var("fc.w", recursive=False) is w


def test_child_block_var_shadows_the_parents():
    """seed 002: "VarDesc in a block should have its name scope to avoid local variables
    affecting parent block's name scope"."""
    p = nf.Program()
    glob = p.global_block()
    outer = glob.create_var("h", [2])
    sub = p.create_block()
    inner = sub.create_var("h", [5, 5], "int64")
    assert inner is not outer
    assert sub.find_var("h") is inner
    assert glob.find_var("h") is outer and outer.shape == (2,)


def test_var_returns_local_var_and_raises_for_missing():
    """DESIGN Program description: blk.var(name) is this block's VarDesc; absent -> error
    naming the variable and block."""
    p = nf.Program()
    glob = p.global_block()
    x = glob.create_var("x", [1])
    assert glob.var("x") is x and glob.has_var("x")
    sub = p.create_block()
    with pytest.raises(NestflowError, match="block 1 has no variable 'x'"):
        sub.var("x")


def test_create_var_declares_once():
    """seed 002: SymbolTable.Var(name) declares a variable; the same name gives the same
    VarDesc; no name generates one."""
    glob = nf.Program().global_block()
    a = glob.create_var("a", [2, 3], "float64", persistable=True)
    assert glob.create_var("a") is a
    assert (a.shape, a.dtype, a.persistable, a.ndim) == ((2, 3), "float64", True, 2)
    fresh = glob.create_var()
    assert fresh.name in glob.vars and fresh.name != "a"
    with pytest.raises(NestflowError, match="unknown type"):
        glob.create_var("bad", type="sparse")


def test_create_parameter_lives_in_the_global_block():
    """seed 002: a sub-block reaches parameters of the parent ("reuse fc's parameter")."""
    p = nf.Program()
    sub = p.create_block()
    w = sub.create_parameter("fc.w", [3, 4])
    assert p.global_block().var("fc.w") is w
    assert w.persistable and w.is_parameter and w.trainable
    assert sub.find_var("fc.w") is w and sub.find_var("fc.w", recursive=False) is None
    assert p.all_parameters() == [w]


def test_append_op_records_slots_attrs_and_source_line():
    """seed 002: SymbolTable stores the definitions of operators; nestflow adds where each op
    was built."""
    main = nf.Program()
    glob = main.global_block()
    x = glob.create_var("x", [2, 3])
    op = glob.append_op("scale", {"X": x}, {"Out": "y"}, {"scale": 3})  # marker: append-scale
    assert op.type == "scale" and glob.ops == [op] and op.index == 0
    assert op.input("X") == ["x"] and op.output("Out") == ["y"]
    assert op.input_names() == ["x"] and op.output_names() == ["y"]
    assert op.attr("scale") == 3.0 and isinstance(op.attr("scale"), float)  # coerced
    assert op.attr("bias") == 0.0  # defaults filled in
    assert glob.var("y").shape == (2, 3)  # inferred at append time
    assert op.source.startswith(f"{__file__}:{_line_of('marker: append-scale')} ")
    assert op.location().source == op.source


def test_insert_prepend_and_remove_op():
    """seed 003: a net's op list can be edited (AddOp); indices follow the list."""
    glob = nf.Program().global_block()
    x = glob.create_var("x", [2])
    a = glob.append_op("relu", {"X": x}, {"Out": "a"})
    first = glob.prepend_op("scale", {"X": x}, {"Out": "p"})
    mid = glob.insert_op(1, "sigmoid", {"X": x}, {"Out": "m"})
    assert glob.ops == [first, mid, a] and a.index == 2
    glob.remove_op(1)
    assert glob.ops == [first, a]


def test_program_guard_switches_and_restores_default_programs():
    """DESIGN Program description: layers append to the guarded programs; the previous
    defaults come back afterwards, also when the body raises."""
    outer_main, outer_startup = nf.default_main_program(), nf.default_startup_program()
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        assert nf.default_main_program() is main
        assert nf.default_startup_program() is startup
        x = nf.data("x", shape=[-1, 3])
        nf.layers.fc(x, size=2, name="g")
        inner = nf.Program()
        with nf.program_guard(inner):  # startup not given: stays `startup`
            assert nf.default_main_program() is inner
            assert nf.default_startup_program() is startup
        assert nf.default_main_program() is main
    assert nf.default_main_program() is outer_main
    assert nf.default_startup_program() is outer_startup
    assert "g.w" in main.global_block().vars
    assert [op.type for op in startup.global_block().ops] == ["uniform_random", "fill_constant"]
    assert outer_main.global_block().ops == []
    with pytest.raises(ValueError), nf.program_guard(nf.Program()):
        raise ValueError
    assert nf.default_main_program() is outer_main
    with pytest.raises(TypeError):
        with nf.program_guard("not a program"):
            pass


# ---- serialization ----


def test_to_bytes_from_bytes_round_trip_preserves_everything():
    """DESIGN Program description: "Everything a program needs to run is in the protobuf" —
    blocks, vars (all flags), ops, attrs of every type incl. block refs, source lines."""
    program = _program_with_everything()
    data = program.to_bytes()
    assert isinstance(data, bytes)
    loaded = nf.Program.from_bytes(data)
    assert _snapshot(loaded) == _snapshot(program)
    assert loaded.to_bytes() == data
    every = loaded.global_block().ops[-1]
    assert every.attr("sub_block") is loaded.block(1)
    assert every.attr("sub_blocks") == [loaded.block(1), loaded.block(2)]
    assert every.attr("unset") is None
    assert every.attr("i") == -(2**40) and every.attr("f") == 0.1
    assert loaded.block(3).forward_block_idx == 1
    assert all(op.source.startswith(__file__) for b in loaded.blocks for op in b.ops)


def test_to_bytes_is_deterministic():
    """A program serialises to the same bytes every time (so saved files diff cleanly)."""
    assert _program_with_everything().to_bytes() == _program_with_everything().to_bytes()


def test_loaded_program_runs_like_the_original():
    """seed 002: the protobuf message is the "binary executable": run it after loading."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", shape=[-1, 3])
        y = nf.layers.fc(x, size=2, act="tanh", name="fc")
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    xs = np.arange(6, dtype=np.float32).reshape(2, 3)
    (want,) = exe.run(main, feed={"x": xs}, fetch_list=[y], scope=scope)
    (got,) = exe.run(
        nf.Program.from_bytes(main.to_bytes()), feed={"x": xs}, fetch_list=[y.name], scope=scope
    )
    np.testing.assert_array_equal(got, want)


def test_desc_is_the_protobuf_message():
    """DESIGN: framework.proto's ProgramDesc { blocks { idx, parent_idx, vars, ops } }."""
    program = _program_with_everything()
    desc = program.desc
    assert isinstance(desc, pb.ProgramDesc)
    assert [b.idx for b in desc.blocks] == [0, 1, 2, 3]
    assert [b.parent_idx for b in desc.blocks] == [-1, 0, 1, 0]
    every = desc.blocks[0].ops[-1]
    assert every.attrs["sub_block"].block_idx == 1
    assert list(every.attrs["sub_blocks"].blocks_idx.values) == [1, 2]
    assert nf.Program.from_desc(desc).to_bytes() == program.to_bytes()


def test_clone_is_a_deep_independent_copy():
    """DESIGN: clone() copies every block, var and op; editing the copy leaves the original."""
    program = _program_with_everything()
    before = program.to_bytes()
    copy = program.clone()
    assert copy is not program and copy.to_bytes() == before
    assert _snapshot(copy) == _snapshot(program)
    copy.global_block().append_op("relu", {"X": "x"}, {"Out": "extra"})
    copy.global_block().var("x").shape = (7, 7)
    assert program.to_bytes() == before
    assert "extra" not in program.global_block().vars


def test_str_lists_every_block_var_and_op():
    """DESIGN: print(main) is a "readable listing of every block, variable (shape, dtype,
    persistable) and op"."""
    program = _program_with_everything()
    text = str(program)
    for block in program.blocks:
        head = f"block {block.idx}" + (f" (parent {block.parent_idx})" if block.idx else "")
        assert head in text
        for var in block.vars.values():
            assert var.name in text
        for op in block.ops:
            assert op.type in text
    lines = text.splitlines()
    assert "  var x: float32[-1, 3] (stop_gradient)" in lines
    assert "  var fc.w: float32[3, 4] (persistable, is_parameter)" in lines
    assert "  var scopes: float32[] step_scopes" in lines
    assert any(
        line.startswith("  op 0: {Out=['fc.tmp_0']} = mul(X=['x'], Y=['fc.w'])") for line in lines
    )
    assert any("sub_block=block[1]" in line for line in lines)
    assert any("sub_blocks=[block[1], block[2]]" in line for line in lines)
    assert sum(line.startswith("  op ") for line in lines) == sum(
        len(b.ops) for b in program.blocks
    )


# ---- errors ----


def test_shape_mismatch_fails_at_build_time_naming_op_slot_shapes_and_line():
    """DESIGN: a mismatch "fails at build time with an error naming the op, the slot, both
    shapes and the user's source line"; nothing is appended."""
    main = nf.Program()
    with nf.program_guard(main):
        x = nf.data("x", shape=[-1, 3])
        w = nf.data("w", shape=[5, 6])
        with pytest.raises(ShapeError) as info:
            nf.layers.matmul(x, w)  # marker: bad-matmul
    msg = str(info.value)
    assert "op 'matmul'" in msg
    assert "'X': ['x']" in msg and "'Y': ['w']" in msg
    assert "[-1, 3]" in msg and "[5, 6]" in msg
    assert f"{__file__}:{_line_of('marker: bad-matmul')}" in msg
    assert info.value.location.op_type == "matmul"
    assert main.global_block().ops == []
    assert set(main.global_block().vars) == {"x", "w"}  # no orphan output variable


def test_broadcast_mismatch_names_both_shapes_at_append():
    """DESIGN: shapes are inferred when an op is appended; elementwise shapes must broadcast."""
    glob = nf.Program().global_block()
    glob.create_var("a", [4, 3])
    glob.create_var("b", [4, 5])
    with pytest.raises(ShapeError) as info:
        glob.append_op("elementwise_add", {"X": "a", "Y": "b"}, {"Out": "c"})  # marker: bad-add
    msg = str(info.value)
    assert "elementwise_add" in msg and "[4, 3]" in msg and "[4, 5]" in msg
    assert f":{_line_of('marker: bad-add')} " in msg
    assert glob.ops == []


def test_unknown_op_fails_at_append():
    """DESIGN Errors: unknown op types give a clear error naming the type and source line."""
    glob = nf.Program().global_block()
    glob.create_var("a", [1])
    with pytest.raises(UnknownOpError) as info:
        glob.append_op("no_such_op", {"X": "a"}, {"Out": "b"})  # marker: unknown-op
    assert "'no_such_op'" in str(info.value)
    assert f":{_line_of('marker: unknown-op')} " in str(info.value)
    assert glob.ops == []


def test_bad_attr_and_slot_fail_at_append():
    """seed 002: the SymbolTable makes "type checking" possible; attrs and slots are checked."""
    glob = nf.Program().global_block()
    glob.create_var("a", [1])
    with pytest.raises(AttrError, match="'scale' must be float"):
        glob.append_op("scale", {"X": "a"}, {"Out": "b"}, {"scale": "big"})
    with pytest.raises(AttrError, match="unknown attribute"):
        glob.append_op("relu", {"X": "a"}, {"Out": "b"}, {"alpha": 1.0})
    with pytest.raises(AttrError, match="unknown input slot 'Z'"):
        glob.append_op("relu", {"Z": "a"}, {"Out": "b"})
    with pytest.raises(NestflowError, match="'undeclared' is not declared"):
        glob.append_op("relu", {"X": "undeclared"}, {"Out": "b"})
    assert glob.ops == []


def test_attr_of_unstorable_type_is_an_error():
    """Attributes are stored in protobuf; a value protobuf cannot hold is refused clearly."""
    glob = nf.Program().global_block()
    glob.create_var("a", [1])
    op = glob.append_op("test_every_attr", {"X": "a"}, {"Out": "b"}, {"unset": object()})
    with pytest.raises(NestflowError, match="cannot be stored"):
        op.to_desc()
    op.set_attr("unset", np.float32(1.5))  # NumPy scalars are stored as the scalar they hold
    assert op.to_desc().attrs["unset"].f == 1.5


def test_direct_attribute_edit_is_seen_by_the_next_run():
    """Plans are cached per program version: writing an op's attrs dict must invalidate them."""
    import numpy as np

    import nestflow as nf

    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3])
        out = nf.layers.scale(x, scale=2.0)
    exe = nf.Executor()
    feed = {"x": np.ones((1, 3), "float32")}
    np.testing.assert_array_equal(exe.run(main, feed=feed, fetch_list=[out])[0], [[2, 2, 2]])
    version = main.version
    main.global_block().ops[-1].attrs["scale"] = 5.0
    assert main.version > version
    np.testing.assert_array_equal(exe.run(main, feed=feed, fetch_list=[out])[0], [[5, 5, 5]])
    main.global_block().ops[-1].attrs.update(bias=1.0)
    np.testing.assert_array_equal(exe.run(main, feed=feed, fetch_list=[out])[0], [[6, 6, 6]])
