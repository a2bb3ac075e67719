"""Bad input gives the documented nf.errors class naming op, var, shapes and source line, and
leaves the scope's persistable variables unchanged (DESIGN: Errors; issue 2 item 7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import (
    ExecutionError,
    FeedError,
    FetchError,
    NanInfError,
    NestflowError,
    ProgramDecodeError,
    UninitializedError,
    UnknownOpError,
)
from nestflow.ops import register_op
from nestflow.ops.registry import _REGISTRY

_ran: list[str] = []


class RecordOp:
    """Test-only op: passes X through and records that it ran."""

    type = "test_record"
    inputs, outputs = ("X",), ("Out",)

    def forward(X):
        _ran.append("test_record")
        return X


@pytest.fixture(autouse=True, scope="module")
def record_op():
    """Registered only while this module runs, so suites that walk the registry never see it."""
    register_op(RecordOp)
    yield
    _REGISTRY.pop(RecordOp.type)


def _line_of(marker: str) -> int:
    """The line number in this file of the first line containing `marker`."""
    lines = Path(__file__).read_text().splitlines()
    return next(i + 1 for i, text in enumerate(lines) if marker in text)


def _built_here(marker: str) -> str:
    return f"built at {__file__}:{_line_of(marker)} "


class Model:
    """x [-1, 3] -> fc (params fc.w, fc.b) -> y; a persistable step counter updated by the
    program itself (like optimizer state), so a failed run that wrote it early would show."""

    def __init__(self):
        self.main, self.startup = nf.Program(), nf.Program()
        with nf.program_guard(self.main, self.startup):
            self.x = nf.data("x", shape=[-1, 3])
            self.ids = nf.data("ids", shape=[-1, 1], dtype="int64")
            counter = nf.layers.create_parameter(
                [1], name="counter", initializer=nf.initializer.Constant(0.0), trainable=False
            )
            block = self.main.global_block()
            plus_one = {"bias": 1.0}
            block.append_op("scale", {"X": counter}, {"Out": counter}, plus_one)  # marker: counter
            self.y = nf.layers.fc(self.x, size=2, name="fc")  # marker: fc
        self.scope = nf.Scope()
        self.exe = nf.Executor()
        self.exe.run(self.startup, scope=self.scope)

    def feed(self, rows: int = 2) -> dict:
        return {"x": np.ones((rows, 3), np.float32)}

    def snapshot(self) -> dict[str, np.ndarray]:
        return {
            name: self.scope.find_var(name).get(nf.Tensor).numpy()
            for name in self.scope.local_var_names()
        }

    def assert_unchanged(self, before: dict[str, np.ndarray]) -> None:
        after = self.snapshot()
        assert sorted(after) == sorted(before) == ["counter", "fc.b", "fc.w"]
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value, err_msg=name)


@pytest.fixture
def model() -> Model:
    m = Model()
    m.exe.run(m.main, feed=m.feed(), fetch_list=[m.y], scope=m.scope)  # counter is now 1
    return m


def test_model_updates_its_persistable_counter_on_success(model):
    """The fixture's counter does change on a successful run (so the checks below mean
    something)."""
    before = model.snapshot()
    model.exe.run(model.main, feed=model.feed(), scope=model.scope)
    assert model.snapshot()["counter"] == before["counter"] + 1


# ---- protobuf input ----


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff\xff garbage", b"\x0a\x05\x08", b"", b"\x10\x05"],
    ids=["corrupt", "truncated", "empty", "no-blocks"],
)
def test_malformed_protobuf_bytes_raise_program_decode_error(data):
    """DESIGN Errors: bad protobuf input gives a clear error."""
    with pytest.raises(ProgramDecodeError, match="ProgramDesc"):
        nf.Program.from_bytes(data)


def test_non_bytes_input_raises_program_decode_error():
    """DESIGN Errors: from_bytes of something that is not bytes says what it got."""
    with pytest.raises(ProgramDecodeError, match="expected bytes, got str"):
        nf.Program.from_bytes("main.pb")


def test_structurally_invalid_program_raises_program_decode_error(model):
    """A ProgramDesc that parses but describes an impossible program (bad block nesting,
    dangling block reference) is refused when loaded, not when run."""
    desc = model.main.to_desc()
    desc.blocks[0].idx = 4
    with pytest.raises(ProgramDecodeError, match="says its idx is 4"):
        nf.Program.from_desc(desc)
    desc = model.main.to_desc()
    desc.blocks.add(idx=1, parent_idx=5)
    with pytest.raises(ProgramDecodeError, match="invalid parent_idx 5"):
        nf.Program.from_desc(desc)
    desc = model.main.to_desc()
    desc.blocks[0].ops[0].attrs["scale"].block_idx = 7
    with pytest.raises(ProgramDecodeError, match="no block 7"):
        nf.Program.from_desc(desc)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("dtype", "floatz", "'floatz' is not a dtype"), ("type", 17, "unknown type '17'")],
)
def test_loaded_variable_of_unknown_dtype_or_type_raises_program_decode_error(
    model, field, value, message
):
    """A VarDesc with a dtype or variable type nestflow does not know is refused on load,
    naming the variable and its block."""
    desc = model.main.to_desc()
    setattr(desc.blocks[0].vars[0], field, value)
    name = desc.blocks[0].vars[0].name
    with pytest.raises(ProgramDecodeError, match=f"variable '{name}' of block 0: .*{message}"):
        nf.Program.from_bytes(desc.SerializeToString())


def test_loaded_program_with_bad_shapes_raises_program_decode_error(model):
    """A saved program is re-checked on load: shape inference errors name the op."""
    desc = model.main.to_desc()
    for var in desc.blocks[0].vars:
        if var.name == "fc.w":
            var.shape[:] = [7, 2]
    with pytest.raises(ProgramDecodeError, match="op 'mul'.*fc.w"):
        nf.Program.from_bytes(desc.SerializeToString())


# ---- unknown op types ----


def test_unknown_op_type_fails_at_append_time():
    """DESIGN Errors: an unknown op type is an error when the op is built, naming the type and
    the user's source line."""
    block = nf.Program().global_block()
    block.create_var("a", [1])
    with pytest.raises(UnknownOpError) as info:
        block.append_op("softmaxx", {"X": "a"}, {"Out": "b"})  # marker: unknown-append
    assert "'softmaxx'" in str(info.value)
    assert _built_here("marker: unknown-append") in str(info.value)
    assert block.ops == []


def test_unknown_op_type_in_a_loaded_program_fails_at_load_time(model):
    """DESIGN Errors: a ProgramDesc naming an unregistered op is refused when loaded with
    UnknownOpError naming the op, its block and the source line it was built at."""
    desc = model.main.to_desc()
    desc.blocks[0].ops[0].type = "scale_v2"
    with pytest.raises(UnknownOpError) as info:
        nf.Program.from_bytes(desc.SerializeToString())
    msg = str(info.value)
    assert "'scale_v2'" in msg and "#0 in block 0" in msg
    assert _built_here("marker: counter") in msg


# ---- feeds ----


def test_missing_feed_names_the_variable_the_op_and_source_line(model):
    """DESIGN Errors: a missing feed is a FeedError naming the variable and who reads it."""
    before = model.snapshot()
    with pytest.raises(FeedError) as info:
        model.exe.run(model.main, feed={}, fetch_list=[model.y], scope=model.scope)
    msg = str(info.value)
    assert "'x' must be fed" in msg
    assert "op 'mul'" in msg
    assert f"{__file__}:{_line_of('marker: fc')}" in msg
    model.assert_unchanged(before)


def test_wrong_feed_shape_names_both_shapes(model):
    """DESIGN Errors: a feed of the wrong shape names the declared and the given shape."""
    before = model.snapshot()
    with pytest.raises(FeedError) as info:
        model.exe.run(
            model.main,
            feed={"x": np.ones((2, 4), np.float32)},
            fetch_list=[model.y],
            scope=model.scope,
        )
    msg = str(info.value)
    assert "'x'" in msg and "[2, 4]" in msg and "[-1, 3]" in msg
    assert "op 'mul'" in msg and f"{__file__}:{_line_of('marker: fc')}" in msg
    with pytest.raises(FeedError, match=r"\[3\].*\[-1, 3\]"):
        model.exe.run(model.main, feed={"x": np.ones(3, np.float32)}, scope=model.scope)
    model.assert_unchanged(before)


def test_float_feed_into_int64_names_both_dtypes(model):
    """DESIGN Errors: a feed of the wrong dtype (float into int64) names both dtypes."""
    before = model.snapshot()
    feed = dict(model.feed(), ids=np.full((2, 1), 1.5))
    with pytest.raises(FeedError) as info:
        model.exe.run(model.main, feed=feed, fetch_list=[model.y], scope=model.scope)
    msg = str(info.value)
    assert "'ids'" in msg and "float64" in msg and "int64" in msg
    model.assert_unchanged(before)


def test_int_feed_into_float_is_refused(model):
    """DESIGN Errors: integer data fed to a float variable is a dtype error, not a silent cast;
    the error names the op that reads the feed and the line that built it."""
    before = model.snapshot()
    with pytest.raises(FeedError, match="int64.*float32") as info:
        model.exe.run(model.main, feed={"x": np.ones((2, 3), np.int64)}, scope=model.scope)
    msg = str(info.value)
    assert "'x'" in msg and "op 'mul'" in msg
    assert f"{__file__}:{_line_of('marker: fc')}" in msg
    model.assert_unchanged(before)


def test_bad_feed_to_eval_names_the_reading_op(model):
    """DESIGN Errors: Executor.eval checks feeds the same way as run: a misshaped feed names
    the variable, both shapes, the op reading it and its source line."""
    before = model.snapshot()
    with pytest.raises(FeedError) as info:
        model.exe.eval(
            model.main, [model.y], feed={"x": np.ones((2, 5), np.float32)}, scope=model.scope
        )
    msg = str(info.value)
    assert "'x'" in msg and "[2, 5]" in msg and "[-1, 3]" in msg and "op 'mul'" in msg
    assert f"{__file__}:{_line_of('marker: fc')}" in msg
    model.assert_unchanged(before)


def test_feed_of_unknown_variable_is_refused(model):
    """DESIGN Errors: a feed naming no variable of the program is a FeedError."""
    before = model.snapshot()
    with pytest.raises(FeedError, match="'z' is not a variable"):
        model.exe.run(model.main, feed=dict(model.feed(), z=np.ones(1)), scope=model.scope)
    model.assert_unchanged(before)


# ---- failures while running ----


def _broadcast_program():
    main = nf.Program()
    with nf.program_guard(main):
        a = nf.data("a", shape=[-1, 3])
        b = nf.data("b", shape=[-1, 3])
        out = nf.layers.relu(a + b)  # marker: runtime-add
    return main, out


def test_kernel_failure_raises_execution_error_naming_op_shapes_and_line():
    """DESIGN Errors: an op failing at run time names the op, its inputs' shapes and the line
    that built it."""
    main, out = _broadcast_program()
    feed = {"a": np.ones((2, 3), np.float32), "b": np.ones((4, 3), np.float32)}
    with pytest.raises(ExecutionError) as info:
        nf.Executor().run(main, feed=feed, fetch_list=[out], scope=nf.Scope())
    msg = str(info.value)
    assert "op 'elementwise_add' (#0 in block 0)" in msg
    assert "a: float32[2, 3]" in msg and "b: float32[4, 3]" in msg
    assert _built_here("marker: runtime-add") in msg
    assert info.value.location.op_type == "elementwise_add"
    assert isinstance(info.value.__cause__, ValueError)  # the kernel's own error is kept


def test_kernel_failure_leaves_persistables_unchanged(model):
    """DESIGN Errors: the counter update ran before the failing op, yet the scope keeps the old
    value: persistables are written back only after every op succeeded."""
    with nf.program_guard(model.main):
        b = nf.data("b", shape=[-1, 2])
        nf.layers.elementwise_add(model.y, b)
    before = model.snapshot()
    feed = dict(model.feed(rows=2), b=np.ones((5, 2), np.float32))
    with pytest.raises(ExecutionError, match="elementwise_add"):
        model.exe.run(model.main, feed=feed, scope=model.scope)
    model.assert_unchanged(before)


def test_check_nan_inf_stops_at_the_first_op_producing_nan(model):
    """DESIGN Errors: with check_nan_inf, the first op whose output has NaN raises NanInfError
    naming the op, the output and the line; later ops do not run; persistables are kept."""
    with nf.program_guard(model.main):
        ratio = nf.layers.elementwise_div(model.y, model.y)  # marker: nan-div
        nested = nf.layers.elementwise_div(ratio, ratio)
        model.main.global_block().append_op("test_record", {"X": nested}, {"Out": "recorded"})
    before = model.snapshot()
    _ran.clear()
    zeros = {"x": np.zeros((2, 3), np.float32)}  # fc.b is zero, so y == 0 and y / y is NaN
    with np.errstate(all="ignore"), pytest.raises(NanInfError) as info:
        model.exe.run(model.main, feed=zeros, scope=model.scope, check_nan_inf=True)
    msg = str(info.value)
    assert "op 'elementwise_div'" in msg and f"'{ratio.name}' contains NaN" in msg
    assert _built_here("marker: nan-div") in msg
    assert _ran == []
    model.assert_unchanged(before)
    # The flag is per run: without it the same program runs and yields NaN.
    with np.errstate(all="ignore"):
        model.exe.run(model.main, feed=zeros, scope=model.scope)
    assert _ran == ["test_record"]


def test_check_nan_inf_reports_inf_and_can_be_set_on_the_executor():
    """DESIGN Errors: Inf is caught too; Executor(check_nan_inf=True) checks every run."""
    main = nf.Program()
    with nf.program_guard(main):
        x = nf.data("x", shape=[-1])
        one = nf.layers.fill_constant([1], value=1.0)
        inv = nf.layers.elementwise_div(one, x)
    exe = nf.Executor(check_nan_inf=True)
    with np.errstate(all="ignore"), pytest.raises(NanInfError, match=f"'{inv.name}' contains Inf"):
        exe.run(main, feed={"x": np.zeros(1, np.float32)}, fetch_list=[inv], scope=nf.Scope())
    (ok,) = exe.run(main, feed={"x": np.full(1, 4.0, np.float32)}, fetch_list=[inv])
    assert ok.tolist() == [0.25]


def test_nan_inf_error_is_an_execution_error():
    """DESIGN Errors: NanInfError is an ExecutionError, itself a NestflowError."""
    assert issubclass(NanInfError, ExecutionError) and issubclass(ExecutionError, NestflowError)


def test_forgetting_the_startup_program_is_a_clear_error():
    """DESIGN Errors: a parameter that was never initialised says to run startup and names the
    op reading it."""
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", shape=[-1, 3])
        y = nf.layers.fc(x, size=2, name="fc")  # marker: uninit-fc
    scope = nf.Scope()
    with pytest.raises(UninitializedError) as info:
        nf.Executor().run(
            main, feed={"x": np.ones((1, 3), np.float32)}, fetch_list=[y], scope=scope
        )
    msg = str(info.value)
    assert "'fc.w'" in msg and "startup" in msg and "op 'mul'" in msg
    assert f"{__file__}:{_line_of('marker: uninit-fc')}" in msg
    assert scope.local_var_names() == []


def test_unknown_fetch_target_is_a_fetch_error(model):
    """DESIGN Errors: fetching a variable the run did not produce is a FetchError naming it;
    the scope is untouched."""
    before = model.snapshot()
    with pytest.raises(FetchError, match="'no_such_var'"):
        model.exe.run(model.main, feed=model.feed(), fetch_list=["no_such_var"], scope=model.scope)
    model.assert_unchanged(before)


def test_check_nan_inf_inside_a_sub_block_names_the_inner_op_and_line():
    """check_nan_inf reaches ops in sub-blocks: a NaN made in a While body is reported at the
    body's op, with the body's source line."""
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", shape=[-1])
        i = nf.layers.fill_constant([1], "int64", 0)
        n = nf.layers.fill_constant([1], "int64", 2)
        cond = nf.layers.less_than(i, n)
        loop = nf.While(cond)
        with loop.block():
            bad = nf.layers.elementwise_div(x, x)  # marker: nan-in-body
            nf.layers.assign(bad, output=x)
            nf.layers.increment(i)
            nf.layers.less_than(i, n, out=cond)
    feed = {"x": np.zeros(2, np.float32)}
    with np.errstate(all="ignore"), pytest.raises(NanInfError) as info:
        nf.Executor().run(main, feed=feed, scope=nf.Scope(), check_nan_inf=True)
    msg = str(info.value)
    assert "op 'elementwise_div'" in msg and f"'{bad.name}' contains NaN" in msg
    assert _built_here("marker: nan-in-body") in msg
