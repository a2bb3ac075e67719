"""The design contract (the API the docs/ pages describe), read by a skeptical user: every
code block and bullet, with the exact spellings the page shows, checked against NumPy wherever there is a value.

Sections follow the contract in order. Each test is short and calls only what the page names (plus
NumPy, safetensors and protobuf to look at what nestflow produced); where the page is silent on
how something is reached, the comment says what the test assumes.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import nestflow as nf
from nestflow.framework import framework_pb2 as pb

L = nf.layers
HERE = pathlib.Path(__file__)
PACKAGE = pathlib.Path(nf.__file__).parent


def _line_of(marker: str) -> int:
    """The line number in this file of the line ending with the comment `# <marker>`."""
    lines = HERE.read_text().splitlines()
    return next(i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}"))


def _at(marker: str) -> str:
    """'<this file>:<line>' of a marked line, as an error message must name it."""
    return f"{__file__}:{_line_of(marker)}"


def _run(fetch, feed=None, main=None, startup=None, scope=None, exe=None):
    """Run `startup` then `main` (default programs if not given) once in a fresh scope."""
    main = main if main is not None else nf.default_main_program()
    startup = startup if startup is not None else nf.default_startup_program()
    scope = scope if scope is not None else nf.Scope()
    exe = exe if exe is not None else nf.Executor(nf.CPUPlace())
    exe.run(startup, scope=scope)
    return exe.run(main, feed=feed or {}, fetch_list=fetch, scope=scope)


def _value(scope: nf.Scope, name: str) -> np.ndarray:
    return scope.find_var(name).get(nf.Tensor).numpy()


def _numeric_grad(loss_of, value: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function `loss_of` at `value` (float64)."""
    grad = np.zeros_like(value)
    for idx in np.ndindex(*value.shape):
        up, down = value.copy(), value.copy()
        up[idx] += eps
        down[idx] -= eps
        grad[idx] = (loss_of(up) - loss_of(down)) / (2 * eps)
    return grad


def _param_grad_check(main, loss, scope, feed, names, rtol=1e-5, atol=1e-8):
    """The `<name>@GRAD` the program computes equals the numeric gradient of `loss`."""
    exe = nf.Executor(nf.CPUPlace())
    grads = exe.run(main, feed=feed, fetch_list=[n + "@GRAD" for n in names], scope=scope)
    for name, got in zip(names, grads):
        tensor = scope.find_var(name).get(nf.Tensor)
        saved = tensor.numpy()

        def loss_of(value, tensor=tensor, saved=saved):
            tensor.set(value)
            try:
                return float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0])
            finally:
                tensor.set(saved)

        want = _numeric_grad(loss_of, saved)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    return grads


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# ================================================================================================
# Layers (one-way dependencies, top uses bottom)
# ================================================================================================

_RANK = {"core": 0, "framework": 1, "ops": 2, "executor": 3}
_FRONTEND = {"layers", "optimizer", "io", "cli"}


def _upward_imports(package: str) -> list[str]:
    """Imports (module-level or inside functions) in nestflow/<package> of a higher layer;
    NetBuilder, a frontend class by the diagram, may use the frontend."""
    found = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        builder = [
            n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "NetBuilder"
        ]
        in_builder = {id(n) for cls in builder for n in ast.walk(cls)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for mod in mods:
                parts = mod.split(".")
                if package == "core" and parts[0] == "google":
                    found.append(f"{path.name}:{node.lineno} {mod}")
                if parts[0] != "nestflow" or len(parts) < 2 or id(node) in in_builder:
                    continue
                higher = parts[1] in _FRONTEND or _RANK.get(parts[1], -1) > _RANK[package]
                if higher:
                    found.append(f"{path.name}:{node.lineno} {mod}")
    return found


@pytest.mark.parametrize("package", ["core", "framework", "ops"])
def test_lower_layers_never_import_higher_ones(package):
    """core knows nothing of protobuf or ops; framework nothing of ops; ops nothing of the
    executor or frontend."""
    assert _upward_imports(package) == []


def test_executor_never_imports_the_frontend():
    assert _upward_imports("executor") == []


# ================================================================================================
# Core runtime (seeds 000, 001, 004)
# ================================================================================================


def test_core_runtime_snippet():
    scope = nf.Scope()  # a root (global) scope
    v = scope.var("w")  # create-or-get in THIS scope
    assert scope.var("w") is v
    assert scope.find_var("w") is v
    assert scope.find_var("nope") is None
    assert scope.find_local_var("w") is v
    kid = scope.new_scope()
    assert kid.parent is scope and scope.parent is None
    assert scope.kids == [kid]
    assert kid.find_var("w") is v  # this scope, then parents
    assert kid.find_local_var("w") is None  # this scope only
    assert kid.var("w") is not v  # var() creates in THIS scope
    assert scope.local_var_names() == ["w"]


def test_scope_erase_rename_and_drop_kids():
    scope = nf.Scope()
    scope.var("w")
    a = scope.var("a")
    scope.erase_vars(["w"])
    assert scope.find_var("w") is None
    scope.rename("a", "b")
    assert scope.find_var("b") is a and scope.find_var("a") is None
    kid = scope.new_scope()
    grandkid = kid.new_scope()
    kid_var = kid.var("t")
    scope.drop_kids()  # destroys every kid scope and their variables
    assert scope.kids == []
    with pytest.raises(nf.errors.ScopeDestroyedError):
        kid_var.get_mutable(nf.Tensor)
    with pytest.raises(nf.errors.ScopeDestroyedError):
        grandkid.var("x")


def test_variable_is_lazy_and_tensor_allocates_at_mutable_data():
    scope = nf.Scope()
    v = scope.var("w")
    assert not v.is_type(nf.Tensor)  # a Variable holds nothing until get_mutable
    t = v.get_mutable(nf.Tensor)
    assert v.is_type(nf.Tensor) and v.get(nf.Tensor) is t
    assert not t.is_allocated()  # memory is allocated at mutable_data, not before
    a = t.mutable_data((100, 200), "float16")
    assert t.is_allocated()
    assert a.shape == (100, 200) and a.dtype == np.float16
    assert t.shape == (100, 200) and t.dtype == np.float16
    assert t.place == nf.CPUPlace()


def test_variable_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        nf.Variable("w")
    with pytest.raises(TypeError):
        nf.Variable()


def test_variable_holds_any_type_and_get_checks_it():
    scope = nf.Scope()
    steps = scope.var("steps")
    held = steps.get_mutable(list)  # e.g. a list of step scopes
    held.append(scope.new_scope())
    assert steps.get(list) is held and steps.is_type(list)
    w = scope.var("w")
    w.get_mutable(nf.Tensor)
    with pytest.raises(nf.errors.TypeMismatchError) as info:
        w.get(list)
    message = str(info.value)
    assert "'w'" in message and "list" in message and "Tensor" in message
    assert isinstance(info.value, nf.errors.NestflowError)


def test_kept_references_raise_scope_destroyed_error():
    root = nf.Scope()
    kid = root.new_scope()
    v = kid.var("x")
    v.get_mutable(nf.Tensor).set(np.ones(3, np.float32))
    root.drop_kids()
    for use in (lambda: v.get(nf.Tensor), lambda: kid.find_var("x"), lambda: kid.new_scope()):
        with pytest.raises(nf.errors.ScopeDestroyedError) as info:
            use()
        assert isinstance(info.value, nf.errors.NestflowError)


def test_scope_is_thread_safe():
    scope = nf.Scope()
    got: list = []
    barrier = threading.Barrier(8)

    def work():
        barrier.wait()
        for i in range(200):
            got.append(scope.var(f"v{i % 10}"))
            scope.new_scope()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(scope.kids) == 8 * 200
    assert sorted(scope.local_var_names()) == sorted(f"v{i}" for i in range(10))
    by_name: dict = {}
    for v in got:
        assert by_name.setdefault(v.name, v) is v  # one Variable per name


def test_tensor_api():
    t = nf.Tensor()
    assert not t.is_allocated()
    with pytest.raises(nf.errors.NestflowError):
        t.data()  # raises if unallocated
    a = t.mutable_data((2, 3), "float32")
    assert t.mutable_data((2, 3), "float32") is a  # same shape and dtype: no reallocation
    b = t.mutable_data((3, 2), "float32")
    assert b is not a and b.shape == (3, 2)
    assert t.mutable_data((3, 2), "float64").dtype == np.float64
    t.set(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.shape == (2, 3) and t.dtype == np.float32
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(np.asarray(t), np.arange(6).reshape(2, 3))  # __array__
    assert isinstance(t.place, nf.CPUPlace)


def test_tensor_dlpack_is_zero_copy_with_numpy_and_torch():
    t = nf.Tensor()
    t.set(np.zeros(4, np.float32))
    view = np.from_dlpack(t)
    view[1] = 5.0
    assert t.numpy()[1] == 5.0  # shares memory
    torch = pytest.importorskip("torch")
    tt = torch.from_dlpack(t)
    tt[2] = 7.0
    assert t.numpy().tolist() == [0.0, 5.0, 7.0, 0.0]


def test_places():
    assert isinstance(nf.CPUPlace(), nf.Place)
    pytest.importorskip("cupy")
    t = nf.Tensor(nf.CUDAPlace(0))
    t.set(np.ones(3, np.float32))
    assert t.numpy().tolist() == [1.0, 1.0, 1.0]


# ================================================================================================
# Program description (seed 002)
# ================================================================================================


def _mlp():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", shape=[-1, 784], dtype="float32")
        y = nf.data("y", shape=[-1, 1], dtype="int64")
        h = nf.layers.fc(x, size=512, act="relu")
        p = nf.layers.fc(h, size=10, act="softmax")
        loss = nf.layers.mean(nf.layers.cross_entropy(p, y))
        nf.optimizer.SGD(learning_rate=0.01).minimize(loss)
    return main, startup, x, y, h, p, loss


def _mlp_params(scope):
    """The MLP's parameters by their (distinct) shapes: w1, b1, w2, b2."""
    by_shape = {}
    for name in scope.local_var_names():
        var = scope.find_var(name)
        if var.is_type(nf.Tensor):
            by_shape[var.get(nf.Tensor).shape] = var.get(nf.Tensor).numpy()
    return by_shape[(784, 512)], by_shape[(512,)], by_shape[(512, 10)], by_shape[(10,)]


def _mlp_numpy(xs, ys, w1, b1, w2, b2):
    h = np.maximum(xs @ w1 + b1, 0)
    p = _softmax(h @ w2 + b2)
    return p, float(np.mean(-np.log(p[np.arange(len(ys)), ys[:, 0]])))


def test_framework_proto_messages_have_the_listed_fields():
    fields = lambda m: set(m.DESCRIPTOR.fields_by_name)  # noqa: E731
    assert "blocks" in fields(pb.ProgramDesc)
    assert {"idx", "parent_idx", "vars", "ops"} <= fields(pb.BlockDesc)
    assert {"name", "type", "dtype", "shape", "persistable"} <= fields(pb.VarDesc)
    assert {"type", "inputs", "outputs", "attrs"} <= fields(pb.OpDesc)
    assert "block_idx" in fields(pb.Attr)
    assert {"ops", "model_type"} <= fields(pb.NetDesc)
    assert {"PLAIN", "RECURRENT"} <= set(pb.NetDesc.ModelType.keys())
    assert (PACKAGE / "framework" / "framework.proto").is_file()


def test_program_description_snippet(capsys):
    main, startup, x, y, h, p, loss = _mlp()
    blk = main.global_block()
    assert blk.var("x") is x and tuple(blk.var("x").shape) == (-1, 784)  # -1 for unknown
    assert blk.find_var("x", recursive=True) is x
    assert blk.parent_idx == -1
    types = [op.type for op in blk.ops]
    assert types[:2] == ["mul", "elementwise_add"] and "sgd" in types
    print(main)  # readable listing of every block, var and op
    listing = capsys.readouterr().out
    assert "block 0" in listing
    for name in (x.name, y.name, h.name, p.name, loss.name):
        assert name in listing
    for op_type in set(types):
        assert op_type in listing


def test_program_round_trips_through_bytes():
    main, startup, x, y, h, p, loss = _mlp()
    data = main.to_bytes()
    again = nf.Program.from_bytes(data)
    assert again.to_bytes() == data
    desc = pb.ProgramDesc()
    desc.ParseFromString(data)
    (block,) = desc.blocks
    assert (block.idx, block.parent_idx) == (0, -1)
    xdesc = next(v for v in block.vars if v.name == "x")
    assert list(xdesc.shape) == [-1, 784] and xdesc.dtype == "float32"
    assert sum(v.persistable for v in block.vars) >= 4  # two fc weights, two biases
    assert [op.type for op in block.ops] == [op.type for op in main.global_block().ops]


def test_prune_keeps_what_the_target_needs(rng):
    main, startup, x, y, h, p, loss = _mlp()
    count = len(main.global_block().ops)
    small = nf.prune(main, targets=[p])
    types = [op.type for op in small.global_block().ops]
    assert types == ["mul", "elementwise_add", "relu", "mul", "elementwise_add", "softmax"]
    assert len(main.global_block().ops) == count  # the original is untouched
    scope = nf.Scope()
    xs = rng.normal(size=(4, 784)).astype(np.float32)
    (got,) = _run([p], {"x": xs}, small, startup, scope)  # y is not needed
    want, _ = _mlp_numpy(xs, np.zeros((4, 1), np.int64), *_mlp_params(scope))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_block_attr_references_a_sub_block_by_index():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", shape=[-1, 1], dtype="float32")
        ie = nf.ifelse()
        with ie.true_block():
            ie.output(nf.layers.scale(x, 2.0))
        with ie.false_block():
            ie.output(x)
        ie(nf.layers.greater_than(x, 0.0))
    desc = pb.ProgramDesc()
    desc.ParseFromString(main.to_bytes())
    assert [(b.idx, b.parent_idx) for b in desc.blocks] == [(0, -1), (1, 0), (2, 0)]
    refs = {
        a.block_idx if a.WhichOneof("value") == "block_idx" else tuple(a.blocks_idx.values)
        for op in desc.blocks[0].ops
        for a in op.attrs.values()
        if a.WhichOneof("value") in ("block_idx", "blocks_idx")
    }
    assert refs and set().union(*(r if isinstance(r, tuple) else (r,) for r in refs)) == {1, 2}


_FRESH_PROCESS = """
import json, sys, numpy as np, nestflow as nf
d, fetch = sys.argv[1], json.loads(sys.argv[2])
main = nf.Program.from_bytes(open(d + "/main.pb", "rb").read())
startup = nf.Program.from_bytes(open(d + "/startup.pb", "rb").read())
feed = {k: np.load(d + "/" + k + ".npy") for k in json.loads(sys.argv[3])}
scope, exe = nf.Scope(), nf.Executor(nf.CPUPlace())
exe.run(startup, scope=scope)
print(json.dumps([a.tolist() for a in exe.run(main, feed=feed, fetch_list=fetch, scope=scope)]))
"""


def _run_in_fresh_process(tmp_path, main, startup, feed, fetch):
    """Save the programs as .pb (and the feed as .npy), load and run them in a new Python."""
    (tmp_path / "main.pb").write_bytes(main.to_bytes())
    (tmp_path / "startup.pb").write_bytes(startup.to_bytes())
    for name, value in feed.items():
        np.save(tmp_path / f"{name}.npy", value)
    args = [str(tmp_path), json.dumps([v.name for v in fetch]), json.dumps(list(feed))]
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, *args], capture_output=True, text=True, check=True
    )
    return [np.array(v) for v in json.loads(done.stdout)]


def test_program_saved_as_protobuf_runs_in_a_fresh_process(tmp_path, rng):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", shape=[-1, 3], dtype="float32")
        w = nf.layers.create_parameter(
            [3, 2], "float32", name="w", initializer=nf.initializer.Constant(0.5)
        )
        out = nf.layers.tanh(nf.layers.matmul(x, w))
    xs = rng.normal(size=(2, 3)).astype(np.float32)
    (got,) = _run_in_fresh_process(tmp_path, main, startup, {"x": xs}, [out])
    np.testing.assert_allclose(got, np.tanh(xs @ np.full((3, 2), 0.5)), rtol=1e-6)


def test_seed_rnn_program_saved_as_protobuf_runs_in_a_fresh_process(tmp_path):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.sequence([10, 20, 30])
        m, W, U = nf.var(0), nf.var(0.314, param=True), nf.var(0.375, param=True)
        rnn = nf.rnn()
        with rnn.step():
            h = rnn.memory(init=m)
            a = nf.layers.matmul(x, W)
            b = nf.layers.matmul(rnn.previous_memory(h), U)
            rnn.update_memory(h, nf.sigmoid(nf.add(a, b)))
            rnn.output(a, b)
        o1, o2 = rnn()
    r1, r2 = _run_in_fresh_process(tmp_path, main, startup, {}, [o1, o2])
    np.testing.assert_allclose(r1, [[3.14, 6.28, 9.42]], rtol=1e-6)
    np.testing.assert_allclose(r2, [[0, 0.35944, 0.37451]], rtol=1e-4, atol=1e-7)


def test_control_flow_program_round_trips_and_runs_the_same(rng):
    def build():
        x = nf.data("x", shape=[-1, -1, 2], dtype="float64")
        cond = nf.data("c", shape=[-1, 1], dtype="bool")
        init = nf.initializer.Constant(0.3)
        u = L.create_parameter([2, 2], "float64", name="u", initializer=init)
        h0 = L.fill_constant([3, 2], "float64", 0.0)
        rnn = nf.rnn()
        with rnn.step():
            h = rnn.memory(init=h0)
            new = L.tanh(rnn.step_input(x) + L.matmul(rnn.previous_memory(h), u))
            rnn.update_memory(h, new)
            rnn.output(new, h)
        out, _ = rnn()
        ie = nf.ifelse()
        with ie.true_block():
            ie.output(L.scale(L.reduce_sum(out, dim=1), 2.0))
        with ie.false_block():
            ie.output(L.square(L.reduce_sum(out, dim=1)))
        (o,) = ie(cond)
        loss = L.mean(o)
        nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
        return loss

    loss = build()
    main, startup = nf.default_main_program(), nf.default_startup_program()
    assert all(f"block {i}" in str(main) for i in range(1, 4))
    feed = {"x": rng.normal(size=(3, 4, 2)), "c": np.array([[True], [False], [True]])}
    fetch = [loss.name, "u@GRAD", "u"]
    first = _run(fetch, feed, main, startup)
    loaded_main = nf.Program.from_bytes(main.to_bytes())
    loaded_startup = nf.Program.from_bytes(startup.to_bytes())
    again = _run(fetch, feed, loaded_main, loaded_startup)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_child_block_vars_shadow_the_parent_and_lookups_fall_back():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", shape=[-1, 2], dtype="float32")
        nf.layers.fc(x, size=2, name="fc")
        fc_w = main.global_block().var("fc.w")
        ie = nf.ifelse()
        with ie.true_block():
            sub = main.current_block()
            assert sub.parent_idx == 0
            assert nf.get_variable("fc.w") is fc_w  # found in the parent block
            assert sub.find_var("fc.w", recursive=True) is fc_w
            assert sub.find_var("fc.w", recursive=False) is None
            shadow = sub.create_var("x", shape=[5], dtype="float64")
            assert sub.find_var("x") is shadow and tuple(shadow.shape) == (5,)
            assert nf.get_variable("x") is shadow
    assert main.global_block().find_var("x") is x


def test_shape_and_dtype_are_inferred_when_an_op_is_appended():
    main, startup, x, y, h, p, loss = _mlp()
    assert tuple(h.shape) == (-1, 512) and h.dtype == "float32"
    assert tuple(p.shape) == (-1, 10) and p.dtype == "float32"


def test_shape_mismatch_fails_at_build_time_naming_op_slots_shapes_and_line():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        a = nf.data("a", shape=[-1, 3], dtype="float32")
        b = nf.data("b", shape=[-1, 4], dtype="float32")
        count = len(main.global_block().ops)
        with pytest.raises(nf.errors.ShapeError) as info:
            nf.layers.elementwise_add(a, b)  # marker: add-mismatch
    message = str(info.value)
    for part in ("elementwise_add", "X", "Y", "[-1, 3]", "[-1, 4]", _at("marker: add-mismatch")):
        assert part in message
    assert isinstance(info.value, nf.errors.NestflowError)
    assert len(main.global_block().ops) == count  # nothing appended


def test_dtype_mismatch_fails_at_build_time():
    with nf.program_guard(nf.Program(), nf.Program()):
        a = nf.data("a", shape=[-1, 3], dtype="float32")
        b = nf.data("b", shape=[-1, 3], dtype="float64")
        with pytest.raises(nf.errors.NestflowError) as info:
            nf.layers.elementwise_add(a, b)  # marker: dtype-mismatch
    message = str(info.value)
    assert "float32" in message and "float64" in message and "elementwise_add" in message
    assert _at("marker: dtype-mismatch") in message


# ================================================================================================
# Execution (seeds 002, 003)
# ================================================================================================


def test_execution_snippet_matches_numpy(rng):
    main, startup, x, y, h, p, loss = _mlp()
    scope = nf.Scope()
    xs = rng.normal(size=(8, 784)).astype(np.float32)
    ys = rng.integers(0, 10, size=(8, 1)).astype(np.int64)
    exe = nf.Executor(nf.CPUPlace())
    exe.run(startup, scope=scope)  # initialise parameters
    params = _mlp_params(scope)
    (out,) = exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss], scope=scope)
    _, want_loss = _mlp_numpy(xs, ys, *params)
    np.testing.assert_allclose(float(out), want_loss, rtol=1e-5)
    trained = _mlp_params(scope)
    assert not np.allclose(trained[0], params[0])  # SGD updated the persistable weights
    (val,) = exe.eval(main, targets=[p], feed={"x": xs}, scope=scope)  # Eval = Prune + Run
    want_p, _ = _mlp_numpy(xs, ys, *trained)
    np.testing.assert_allclose(val, want_p, rtol=1e-5, atol=1e-6)
    for before, after in zip(trained, _mlp_params(scope)):
        np.testing.assert_array_equal(before, after)  # eval trains nothing


def test_eval_accepts_the_same_feed_as_run(rng):
    main, startup, x, y, h, p, loss = _mlp()
    scope, exe = nf.Scope(), nf.Executor(nf.CPUPlace())
    exe.run(startup, scope=scope)
    feed = {"x": rng.normal(size=(2, 784)).astype(np.float32), "y": np.zeros((2, 1), np.int64)}
    (val,) = exe.eval(main, targets=[p], feed=feed, scope=scope)
    assert val.shape == (2, 10)


def test_sgd_step_matches_numpy(rng):
    main, startup, x, y, h, p, loss = _mlp()
    scope = nf.Scope()
    xs = rng.normal(size=(4, 784)).astype(np.float32)
    ys = rng.integers(0, 10, size=(4, 1)).astype(np.int64)
    exe = nf.Executor(nf.CPUPlace())
    exe.run(startup, scope=scope)
    w1, b1, w2, b2 = _mlp_params(scope)
    exe.run(main, feed={"x": xs, "y": ys}, scope=scope)
    # NumPy backward of mean(cross_entropy(softmax(relu(x w1 + b1) w2 + b2), y))
    hid = np.maximum(xs @ w1 + b1, 0)
    prob = _softmax(hid @ w2 + b2)
    dz = prob.copy()
    dz[np.arange(4), ys[:, 0]] -= 1
    dz /= 4
    dw2, db2 = hid.T @ dz, dz.sum(0)
    dh = (dz @ w2.T) * (hid > 0)
    dw1, db1 = xs.T @ dh, dh.sum(0)
    for got, (w, g) in zip(_mlp_params(scope), [(w1, dw1), (b1, db1), (w2, dw2), (b2, db2)]):
        np.testing.assert_allclose(got, w - 0.01 * g, rtol=1e-4, atol=1e-6)


def test_persistables_live_in_the_given_scope_and_temporaries_do_not(rng):
    main, startup, x, y, h, p, loss = _mlp()
    scope = nf.Scope()
    exe = nf.Executor(nf.CPUPlace())
    exe.run(startup, scope=scope)
    params = set(scope.local_var_names())
    feed = {"x": rng.normal(size=(2, 784)).astype(np.float32), "y": np.zeros((2, 1), np.int64)}
    exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    for temp in (h, p, loss):
        assert scope.find_var(temp.name) is None
    assert set(scope.local_var_names()) == params
    assert scope.kids == []  # the run's local scope was dropped when the minibatch completed


def test_control_flow_keeps_child_scopes_in_a_step_scopes_variable():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", shape=[-1, 1], dtype="float32")
        ie = nf.ifelse()
        with ie.true_block():
            ie.output(nf.layers.scale(x, 2.0))
        with ie.false_block():
            ie.output(x)
        (out,) = ie(nf.layers.greater_than(x, 0.0))
    desc = pb.ProgramDesc()
    desc.ParseFromString(main.to_bytes())
    kinds = {v.name: v.type for v in desc.blocks[0].vars}
    (op,) = [o for o in desc.blocks[0].ops if o.type not in ("fill_constant", "greater_than")]
    written = [n for slot in op.outputs for n in slot.arguments]
    assert any(kinds.get(n) == pb.STEP_SCOPES for n in written)
    scope = nf.Scope()
    (got,) = _run([out], {"x": np.array([[-1.0], [2.0]], np.float32)}, main, nf.Program(), scope)
    assert got.ravel().tolist() == [-1.0, 4.0]
    assert scope.kids == []  # destroyed when the minibatch ended


def test_net_create_and_add_op_and_run():
    net = nf.Net.create(desc=None)
    assert isinstance(net, nf.PlainNet)
    op_desc = pb.OpDesc(type="scale")
    op_desc.inputs.add(parameter="X", arguments=["a"])
    op_desc.outputs.add(parameter="Out", arguments=["b"])
    op_desc.attrs["scale"].f = 5.0
    from_desc = nf.Net.create(pb.NetDesc(model_type=pb.NetDesc.PLAIN, ops=[op_desc]))
    assert isinstance(from_desc, nf.PlainNet)
    scope = nf.Scope()
    scope.var("a").get_mutable(nf.Tensor).set(np.array([1.0], np.float32))
    from_desc.run(scope)
    assert _value(scope, "b").tolist() == [5.0]
    index = net.add_op("scale", inputs={"X": ["a"]}, outputs={"Out": ["b"]}, attrs={"scale": 2.0})
    assert index == 0
    op_desc = pb.OpDesc(type="scale")
    op_desc.inputs.add(parameter="X", arguments=["b"])
    op_desc.outputs.add(parameter="Out", arguments=["c"])
    op_desc.attrs["scale"].f = 3.0
    assert net.add_op(op_desc) == 1
    scope = nf.Scope()
    scope.var("a").get_mutable(nf.Tensor).set(np.array([1.0, 2.0], np.float32))
    net.infer_shape(scope)
    net.run(scope, context=None, begin=-1, end=-1)
    assert _value(scope, "b").tolist() == [2.0, 4.0]
    assert _value(scope, "c").tolist() == [6.0, 12.0]
    scope.find_var("a").get(nf.Tensor).set(np.array([10.0, 20.0], np.float32))
    net.run(scope, begin=0, end=1)  # only op 0
    assert _value(scope, "b").tolist() == [20.0, 40.0]
    assert _value(scope, "c").tolist() == [6.0, 12.0]


def test_net_create_recurrent_desc_gives_a_recurrent_net():
    desc = pb.NetDesc(model_type=pb.NetDesc.RECURRENT)
    assert isinstance(nf.Net.create(desc), nf.RecurrentNet)


def test_net_infer_shape_reports_a_mismatch():
    net = nf.Net.create()
    net.add_op("elementwise_add", inputs={"X": ["a"], "Y": ["b"]}, outputs={"Out": ["c"]})
    scope = nf.Scope()
    scope.var("a").get_mutable(nf.Tensor).set(np.ones((2, 3), np.float32))
    scope.var("b").get_mutable(nf.Tensor).set(np.ones((2, 4), np.float32))
    with pytest.raises(nf.errors.ShapeError) as info:
        net.infer_shape(scope)
    assert "elementwise_add" in str(info.value) and "[2, 3]" in str(info.value)


def test_net_backward_and_adam_optimizer_ops():
    net = nf.Net.create()
    builder = nf.NetBuilder(net)
    x = builder.data("x", [-1, 3])  # DESIGN names no way to declare a net input; this exists
    loss = builder.add_op("mean", builder.add_op("fc", input=x, size=1, name="fc"))
    pairs = net.add_backward_ops(loss)
    assert {param.name for param, _ in pairs} == {"fc.w", "fc.b"}
    assert all(grad.name == param.name + "@GRAD" for param, grad in pairs)
    net.add_optimizer_ops({"type": "adam", "learning_rate": 1e-4})
    assert "adam" in [op.type for op in net.ops]
    scope = nf.Scope()
    scope.var("x").get_mutable(nf.Tensor).set(np.ones((4, 3), np.float32))
    net.run(scope)
    w0 = _value(scope, "fc.w")
    net.run(scope)  # Adam's first steps move each weight by about lr against the gradient (+)
    np.testing.assert_allclose(_value(scope, "fc.w") - w0, -1e-4, rtol=1e-3)


def test_net_builder_forward_only_and_training_runs(rng):
    net = nf.Net.create()
    builder = nf.NetBuilder(net)
    image = builder.data("image", [-1, 784])
    label = builder.data("label", [-1, 1], "int64")
    hidden = builder.add_op("fc", input=image, size=100, activation="sigmoid")
    assert tuple(hidden.shape) == (-1, 100)
    pred = builder.add_op("fc", input=hidden, size=10, activation="softmax")
    loss = builder.add_op("mean", builder.add_op("cross_entropy", pred, label))
    builder.backward_from(loss)
    builder.add_optimization(1e-4, "adam")
    scope = nf.Scope()
    scope.var("image").get_mutable(nf.Tensor).set(rng.normal(size=(4, 784)).astype(np.float32))
    scope.var("label").get_mutable(nf.Tensor).set(np.array([[1], [2], [3], [4]], np.int64))
    builder.run(scope, context=None, need_backward=False)  # forward ops only
    params = {n: _value(scope, n) for n in scope.local_var_names() if n.endswith((".w", ".b"))}
    assert len(params) == 4
    assert scope.find_var(loss.name) is not None
    assert not any(n.endswith("@GRAD") for n in scope.local_var_names())
    forward_loss = float(_value(scope, loss.name))
    builder.run(scope, context=None, need_backward=True)
    assert any(not np.array_equal(_value(scope, n), v) for n, v in params.items())
    assert float(_value(scope, loss.name)) == pytest.approx(forward_loss, rel=1e-6)


# ================================================================================================
# Layer catalogue (nf.layers)
# ================================================================================================


def test_data_marks_unknown_dims_with_minus_one():
    x = nf.layers.data("x", shape=[-1, 3], dtype="float32")
    assert x is nf.default_main_program().global_block().var("x")
    assert tuple(x.shape) == (-1, 3) and x.dtype == "float32"
    (got,) = _run([L.scale(x, 2.0)], {"x": np.ones((5, 3), np.float32)})
    assert got.shape == (5, 3)


def test_a_fed_variable_can_be_fetched_back():
    x = nf.data("x", shape=[-1, 3], dtype="float32")
    (got,) = _run([x], {"x": np.ones((5, 3), np.float32)})
    np.testing.assert_array_equal(got, np.ones((5, 3)))


def test_fc_with_its_listed_signature(rng):
    x = nf.data("x", shape=[-1, 3], dtype="float32")
    out = L.fc(x, 4, act="tanh", param_attr=None, bias_attr=None, name="fc")
    no_bias = L.fc(input=x, size=2, bias_attr=False, name="nb")
    xs = rng.normal(size=(5, 3)).astype(np.float32)
    scope = nf.Scope()
    got, got_nb = _run([out, no_bias], {"x": xs}, scope=scope)
    want = np.tanh(xs @ _value(scope, "fc.w") + _value(scope, "fc.b"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_nb, xs @ _value(scope, "nb.w"), rtol=1e-5, atol=1e-6)
    assert scope.find_var("nb.b") is None
    assert _value(scope, "fc.w").shape == (3, 4) and _value(scope, "fc.b").shape == (4,)


def test_create_parameter_and_fill_constant():
    w = L.create_parameter([2, 3], "float32", name="w", initializer=nf.initializer.Constant(0.5))
    anon = L.create_parameter([4], "float64")
    c = L.fill_constant([2, 3], "float32", 1.5)
    glob = nf.default_main_program().global_block()
    assert glob.var("w") is w and w.persistable and anon.persistable
    scope = nf.Scope()
    got_w, got_c, got_anon = _run([w, c, anon], scope=scope)
    np.testing.assert_array_equal(got_w, np.full((2, 3), 0.5, np.float32))
    np.testing.assert_array_equal(got_c, np.full((2, 3), 1.5, np.float32))
    assert got_anon.shape == (4,) and got_anon.dtype == np.float64
    assert scope.find_var("w") is not None  # a persistable lives in the scope


def test_matmul(rng):
    a = nf.data("a", shape=[-1, 3], dtype="float64")
    b = nf.data("b", shape=[3, 4], dtype="float64")
    av, bv = rng.normal(size=(2, 3)), rng.normal(size=(3, 4))
    (got,) = _run([L.matmul(a, b)], {"a": av, "b": bv})
    np.testing.assert_allclose(got, av @ bv)


@pytest.mark.parametrize("y_shape", [(2, 3), (3,), (1, 3), (2, 1), (1,)])
def test_elementwise_ops_broadcast_like_numpy(rng, y_shape):
    x = nf.data("x", shape=[2, 3], dtype="float64")
    y = nf.data("y", shape=list(y_shape), dtype="float64")
    xv, yv = rng.normal(size=(2, 3)), rng.uniform(1, 2, size=y_shape)
    ops = [L.elementwise_add, L.elementwise_sub, L.elementwise_mul, L.elementwise_div]
    got = _run([op(x, y) for op in ops], {"x": xv, "y": yv})
    for value, want in zip(got, [xv + yv, xv - yv, xv * yv, xv / yv]):
        np.testing.assert_allclose(value, want)


def test_add_scalar_and_scale(rng):
    x = nf.data("x", shape=[-1, 2], dtype="float32")
    one = nf.var(1)
    xv = rng.normal(size=(3, 2)).astype(np.float32)
    outs = [L.add_scalar(x, 2.5), L.add_scalar(x, one), L.scale(x, scale=3.0, bias=1.0), L.scale(x)]
    got = _run(outs, {"x": xv})
    for value, want in zip(got, [xv + 2.5, xv + 1, 3 * xv + 1, xv]):
        np.testing.assert_allclose(value, want, rtol=1e-6)


def test_activations_and_softmax(rng):
    x = nf.data("x", shape=[-1, 4], dtype="float64")
    xv = rng.normal(size=(3, 4))
    outs = [L.relu(x), L.sigmoid(x), L.tanh(x), L.softmax(x), L.square(x)]
    got = _run(outs, {"x": xv})
    wants = [np.maximum(xv, 0), _sigmoid(xv), np.tanh(xv), _softmax(xv), xv**2]
    for value, want in zip(got, wants):
        np.testing.assert_allclose(value, want, rtol=1e-12)


def test_cross_entropy_and_softmax_with_cross_entropy(rng):
    logits = nf.data("logits", shape=[-1, 5], dtype="float64")
    label = nf.data("label", shape=[-1, 1], dtype="int64")
    lv, yv = rng.normal(size=(4, 5)), np.array([[0], [4], [2], [2]], np.int64)
    ce = L.cross_entropy(L.softmax(logits), label)
    swce = L.softmax_with_cross_entropy(logits, label)
    got_ce, got_swce = _run([ce, swce], {"logits": lv, "label": yv})
    want = -np.log(_softmax(lv)[np.arange(4), yv[:, 0]])[:, None]
    np.testing.assert_allclose(got_ce, want, rtol=1e-10)
    np.testing.assert_allclose(got_swce, want, rtol=1e-10)


def test_mean_and_reductions(rng):
    x = nf.data("x", shape=[-1, 3], dtype="float64")
    xv = rng.normal(size=(4, 3))
    outs = [L.mean(x), L.reduce_sum(x), L.reduce_mean(x), L.reduce_sum(x, dim=1),
            L.reduce_mean(x, dim=0, keep_dim=True)]  # fmt: skip
    got = _run(outs, {"x": xv})
    wants = [xv.mean(), xv.sum(), xv.mean(), xv.sum(1), xv.mean(0, keepdims=True)]
    for value, want in zip(got, wants):
        np.testing.assert_allclose(np.asarray(value), want, rtol=1e-12)
        assert np.shape(value) == np.shape(want) or np.size(want) == 1


def test_comparisons_and_logical_ops():
    x = nf.data("x", shape=[-1], dtype="float32")
    y = nf.data("y", shape=[-1], dtype="float32")
    xv, yv = np.array([1, 2, 3], np.float32), np.array([2, 2, 2], np.float32)
    gt, lt, eq = L.greater_than(x, y), L.less_than(x, y), L.equal(x, y)
    outs = [gt, lt, eq, L.logical_and(gt, eq), L.logical_or(gt, eq), L.logical_not(gt)]
    got = _run(outs, {"x": xv, "y": yv})
    wants = [xv > yv, xv < yv, xv == yv, (xv > yv) & (xv == yv), xv >= yv, ~(xv > yv)]
    for value, want in zip(got, wants):
        assert value.dtype == np.bool_
        np.testing.assert_array_equal(value, want)


def test_cast_slice_concat_split_reshape_transpose():
    x = nf.data("x", shape=[-1, 4], dtype="float32")
    xv = np.arange(12, dtype=np.float32).reshape(3, 4)
    cast = L.cast(x, "int64")
    sliced = L.slice(x, [1], [1], [3])  # slice(x, axes, starts, ends)
    joined = L.concat([x, x], axis=1)
    left, right = L.split(x, 2, 1)  # split(input, num_or_sections, dim)
    first, rest = L.split(x, [1, 3], 1)
    shaped = L.reshape(x, [-1, 2, 2])
    swapped = L.transpose(x, [1, 0])
    outs = [cast, sliced, joined, left, right, first, rest, shaped, swapped]
    got = _run(outs, {"x": xv})
    wants = [xv.astype(np.int64), xv[:, 1:3], np.concatenate([xv, xv], 1), xv[:, :2], xv[:, 2:],
             xv[:, :1], xv[:, 1:], xv.reshape(3, 2, 2), xv.T]  # fmt: skip
    assert got[0].dtype == np.int64
    for value, want in zip(got, wants):
        np.testing.assert_array_equal(value, want)


def test_embedding_picks_rows_of_the_table():
    ids = nf.data("ids", shape=[-1], dtype="int64")
    out = L.embedding(ids, size=[5, 3], name="emb")
    scope = nf.Scope()
    (got,) = _run([out], {"ids": np.array([4, 0, 4], np.int64)}, scope=scope)
    table = _value(scope, "emb.w")
    assert table.shape == (5, 3)
    np.testing.assert_array_equal(got, table[[4, 0, 4]])


def test_dropout_zeroes_about_p_and_keeps_the_rest_proportional():
    x = nf.data("x", shape=[-1, 100], dtype="float32")
    xv = np.ones((100, 100), np.float32)
    dropped = L.dropout(x, dropout_prob=0.3)
    kept = L.dropout(x, dropout_prob=0.0)
    got, got_kept = _run([dropped, kept], {"x": xv})
    assert abs((got == 0).mean() - 0.3) < 0.03
    assert np.unique(got[got != 0]).size == 1  # one factor for every kept element
    np.testing.assert_array_equal(got_kept, xv)


def test_accuracy_is_the_fraction_of_top1_hits():
    scores = nf.data("scores", shape=[-1, 3], dtype="float32")
    label = nf.data("label", shape=[-1, 1], dtype="int64")
    sv = np.array([[0.1, 0.8, 0.1], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.4, 0.1]], "float32")
    (got,) = _run([L.accuracy(scores, label)], {"scores": sv, "label": [[1], [1], [2], [0]]})
    assert float(np.asarray(got).ravel()[0]) == pytest.approx(0.75)


def test_increment_and_assign():
    i = L.fill_constant([1], "int64", 3)
    same = L.increment(i)  # in place, by 1
    x = nf.data("x", shape=[-1, 2], dtype="float32")
    copy = L.assign(x)
    target = L.fill_constant([2, 2], "float32", 0.0)
    L.assign(x, target)
    xv = np.array([[1, 2], [3, 4]], np.float32)
    got_i, got_same, got_copy, got_target = _run([i, same, copy, target], {"x": xv})
    assert got_i.tolist() == [4] and got_same.tolist() == [4]
    np.testing.assert_array_equal(got_copy, xv)
    np.testing.assert_array_equal(got_target, xv)


def test_assign_takes_a_numpy_array_like_paddle():
    got = _run([L.assign(np.array([[1, 2]], np.int64)), L.assign([0.5, 1.5])])
    assert got[0].dtype == np.int64 and got[0].tolist() == [[1, 2]]
    assert got[1].tolist() == [0.5, 1.5]


def test_layers_accept_the_listed_parameter_names_as_keywords(rng):
    x = nf.data(name="x", shape=[-1, 3], dtype="float32")
    w = L.create_parameter(shape=[3, 2], dtype="float32", name="w", initializer=None)
    c = L.fill_constant(shape=[1], dtype="float32", value=2.0)
    h = L.fc(input=x, size=2, act=None, param_attr=None, bias_attr=None, name="fc")
    s = L.scale(x=h, scale=2.0, bias=1.0)
    cut = L.slice(x=x, axes=[1], starts=[0], ends=[2])
    xv, scope = rng.normal(size=(2, 3)).astype(np.float32), nf.Scope()
    got_s, got_cut, got_c = _run([s, cut, c], {"x": xv}, scope=scope)
    want = 2 * (xv @ _value(scope, "fc.w") + _value(scope, "fc.b")) + 1
    np.testing.assert_allclose(got_s, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_cut, xv[:, :2])
    assert got_c.tolist() == [2.0] and _value(scope, w.name).shape == (3, 2)


def test_arithmetic_operators_append_elementwise_ops(rng):
    x = nf.data("x", shape=[-1, 2], dtype="float64")
    y = nf.data("y", shape=[-1, 2], dtype="float64")
    outs = [x + y, x - y, x * y, x / y]
    types = [op.type for op in nf.default_main_program().global_block().ops]
    assert types == ["elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div"]
    xv, yv = rng.normal(size=(3, 2)), rng.uniform(1, 2, size=(3, 2))
    got = _run(outs, {"x": xv, "y": yv})
    for value, want in zip(got, [xv + yv, xv - yv, xv * yv, xv / yv]):
        np.testing.assert_allclose(value, want)


def test_every_catalogue_layer_exists():
    names = """data fc create_parameter fill_constant matmul elementwise_add elementwise_sub
    elementwise_mul elementwise_div add_scalar scale relu sigmoid tanh softmax cross_entropy
    softmax_with_cross_entropy square mean reduce_sum reduce_mean greater_than less_than equal
    logical_and logical_or logical_not cast slice concat split reshape transpose embedding
    dropout accuracy increment assign""".split()
    assert [n for n in names if not callable(getattr(nf.layers, n, None))] == []


def test_top_level_aliases():
    assert nf.layer is nf.layers
    for name in ("add", "sigmoid", "var", "minibatch", "sequence", "ifelse", "rnn", "While",
                 "get_variable"):  # fmt: skip
        assert callable(getattr(nf, name)), name
    x = nf.minibatch([10, 20, 30])  # a [N, 1] minibatch variable with these rows
    y = nf.var(1)  # a [1] variable
    w = nf.var(0.5, param=True)  # a parameter
    assert tuple(x.shape) == (-1, 1) and tuple(y.shape) == (1,)
    assert w.persistable and not y.persistable
    s = nf.sequence([10, 20, 30])  # one sequence of 3 steps, 1 feature
    assert nf.get_variable(x.name) is x
    got = _run([x, y, w, nf.add(x, y), nf.sigmoid(x), s])
    assert (
        got[0].tolist() == [[10], [20], [30]]
        and got[1].tolist() == [1]
        and got[2].tolist() == [0.5]
    )
    np.testing.assert_allclose(got[3], [[11], [21], [31]])
    np.testing.assert_allclose(got[4], _sigmoid(np.array([[10], [20], [30]])), rtol=1e-6)
    assert got[5].reshape(-1).tolist() == [10, 20, 30] and got[5].size == 3


# ================================================================================================
# Backward and optimizers
# ================================================================================================


def test_append_backward_returns_param_grad_pairs_named_at_grad(rng):
    x = nf.data("x", shape=[-1, 3], dtype="float64")
    out = L.fc(x, size=2, act="tanh", name="fc")
    loss = L.mean(L.square(out))
    pairs = nf.append_backward(loss, parameter_list=None, no_grad_set=None)
    assert sorted((p.name, g.name) for p, g in pairs) == [
        ("fc.b", "fc.b@GRAD"),
        ("fc.w", "fc.w@GRAD"),
    ]
    main, scope = nf.default_main_program(), nf.Scope()
    feed = {"x": rng.normal(size=(4, 3))}
    _run([loss], feed, scope=scope)
    _param_grad_check(main, loss, scope, feed, ["fc.w", "fc.b"])


def test_append_backward_parameter_list_and_no_grad_set():
    x = nf.data("x", shape=[-1, 3], dtype="float64")
    loss = L.mean(L.fc(L.fc(x, size=3, name="a"), size=1, name="b"))
    pairs = nf.append_backward(loss, parameter_list=["a.w", "b.w"], no_grad_set={"a.w"})
    assert [p.name for p, _ in pairs] == ["b.w"]


def test_several_contributions_to_one_gradient_are_summed(rng):
    x = nf.data("x", shape=[-1, 2], dtype="float64")
    w = L.create_parameter([2, 2], "float64", name="w")
    loss = L.mean(L.matmul(x, w) * L.tanh(L.matmul(x, w)))  # w used twice
    nf.append_backward(loss)
    ops = nf.default_main_program().global_block().ops
    assert any(op.type == "sum" and "w@GRAD" in op.output("Out") for op in ops)
    scope, feed = nf.Scope(), {"x": rng.normal(size=(3, 2))}
    _run([loss], feed, scope=scope)
    _param_grad_check(nf.default_main_program(), loss, scope, feed, ["w"])


@pytest.mark.parametrize("kind", ["SGD", "Momentum", "Adam"])
def test_optimizers_are_ops_and_minimize_the_loss(rng, kind):
    x = nf.data("x", shape=[-1, 3], dtype="float32")
    y = nf.data("y", shape=[-1, 1], dtype="float32")
    loss = L.mean(L.square(L.fc(x, size=1) - y))
    args = {"SGD": {}, "Momentum": {"momentum": 0.9}, "Adam": {}}[kind]
    getattr(nf.optimizer, kind)(learning_rate=0.05, **args).minimize(loss)
    types = [op.type for op in nf.default_main_program().global_block().ops]
    assert kind.lower() in types
    xs = rng.normal(size=(16, 3)).astype(np.float32)
    feed = {"x": xs, "y": xs @ np.array([[1.0], [-2.0], [0.5]], np.float32)}
    scope, exe = nf.Scope(), nf.Executor(nf.CPUPlace())
    exe.run(nf.default_startup_program(), scope=scope)
    losses = [float(exe.run(feed=feed, fetch_list=[loss], scope=scope)[0]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_momentum_and_adam_steps_match_numpy(rng):
    w1 = L.create_parameter([3], "float64", name="w1", initializer=nf.initializer.Constant(1.0))
    w2 = L.create_parameter([3], "float64", name="w2", initializer=nf.initializer.Constant(1.0))
    c = nf.data("c", shape=[3], dtype="float64")
    loss1, loss2 = L.reduce_sum(w1 * c), L.reduce_sum(w2 * c)  # gradients: c
    nf.optimizer.Momentum(learning_rate=0.1, momentum=0.9).minimize(loss1)
    nf.optimizer.Adam(learning_rate=0.1).minimize(loss2)
    cv = np.array([1.0, -2.0, 0.5])
    scope, exe = nf.Scope(), nf.Executor(nf.CPUPlace())
    exe.run(nf.default_startup_program(), scope=scope)
    for _ in range(2):
        exe.run(feed={"c": cv}, scope=scope)
    velocity = cv + 0.9 * cv  # v1 = g, v2 = 0.9 v1 + g
    np.testing.assert_allclose(_value(scope, "w1"), 1.0 - 0.1 * (cv + velocity))
    m, v, w = np.zeros(3), np.zeros(3), np.ones(3)
    for t in (1, 2):
        m, v = 0.9 * m + 0.1 * cv, 0.999 * v + 0.001 * cv**2
        w = w - 0.1 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    np.testing.assert_allclose(_value(scope, "w2"), w, rtol=1e-6)


# ================================================================================================
# Control flow (seed 002: the two programs must run)
# ================================================================================================


def test_seed_ifelse_program_runs_as_written():
    import nestflow as pd

    x = pd.minibatch([10, 20, 30])  # a [N, 1] minibatch variable with these rows
    y = pd.var(1)  # a [1] variable; pd.var(v, param=True) makes a parameter
    z = pd.minibatch([10, 20, 30])
    cond = pd.layers.greater_than(x, 15)  # seed's larger_than: [False, True, True]
    ie = pd.ifelse()
    with ie.true_block():
        d = pd.layers.add_scalar(x, y)  # x + y on the rows where cond holds
        ie.output(d, pd.layers.softmax(d))
    with ie.false_block():
        d = pd.layers.fc(z, size=1)
        ie.output(d, d + 1)
    o1, o2 = ie(cond)  # rows merged back in their original order

    scope = pd.Scope()
    c, a, b = _run([cond, o1, o2], scope=scope)
    assert c.ravel().tolist() == [False, True, True]
    assert a.shape == b.shape == (3, 1)
    # examples/seed_ifelse.py: fc weight 0.474449 (Xavier, seed 0), bias 0
    np.testing.assert_allclose(a.ravel(), [4.744492, 21, 31], rtol=1e-6)
    np.testing.assert_allclose(b.ravel(), [5.744492, 1, 1], rtol=1e-6)
    w, bias = _value(scope, "fc_0.w")[0, 0], _value(scope, "fc_0.b")[0]
    np.testing.assert_allclose(a.ravel()[0], 10 * w + bias, rtol=1e-6)  # the same by NumPy


def test_seed_rnn_program_runs_as_written():
    import nestflow as pd

    x = pd.sequence([10, 20, 30])  # one sequence of 3 steps, 1 feature
    m = pd.var(0)
    W = pd.var(0.314, param=True)
    U = pd.var(0.375, param=True)
    rnn = pd.rnn()
    with rnn.step():
        h = rnn.memory(init=m)
        h_prev = rnn.previous_memory(h)
        a = pd.layers.matmul(x, W)  # the seed's layer.fc(W, x): x times the given weight
        b = pd.layers.matmul(h_prev, U)
        s = pd.add(a, b)
        act = pd.sigmoid(s)
        rnn.update_memory(h, act)
        rnn.output(a, b)
    o1, o2 = rnn()  # stacked over time steps

    r1, r2 = _run([o1, o2])
    np.testing.assert_allclose(r1, [[3.14, 6.28, 9.42]], rtol=1e-6)
    np.testing.assert_allclose(r2, [[0, 0.35944, 0.37451]], rtol=1e-4, atol=1e-7)
    hand, want = 0.0, []
    for x_t in (10, 20, 30):
        want.append(0.375 * hand)
        hand = float(_sigmoid(0.314 * x_t + 0.375 * hand))
    np.testing.assert_allclose(r2.ravel(), want, rtol=1e-6)


def test_ifelse_input_splits_explicitly_and_non_batch_vars_pass_whole():
    x = nf.data("x", shape=[4, 2], dtype="float32")  # no -1 batch dim: split by input()
    bias = nf.var([100.0, 200.0])  # a [2] variable: not a batch, passes whole
    cond = nf.data("cond", shape=[-1, 1], dtype="bool")
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(ie.input(x) + bias)
    with ie.false_block():
        ie.output(L.scale(ie.input(x), -1.0))
    (out,) = ie(cond)
    xv = np.arange(8, dtype=np.float32).reshape(4, 2)
    cv = np.array([[True], [False], [False], [True]])
    (got,) = _run([out], {"x": xv, "cond": cv})
    np.testing.assert_allclose(got, np.where(cv, xv + [100.0, 200.0], -xv))


def test_rnn_batch_with_lengths_stops_rows_past_their_length():
    x = nf.data("x", shape=[-1, -1, 1], dtype="float32")  # [batch, time, 1]
    lengths = nf.data("lengths", shape=[-1], dtype="int64")
    h0 = nf.data("h0", shape=[-1, 1], dtype="float32")
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(init=h0)
        new = nf.add(rnn.previous_memory(h), xt)  # a running sum
        rnn.update_memory(h, new)
        rnn.output(new, xt)
    total, seen = rnn()
    xv = np.array([[1, 2, 3], [4, 5, 6]], np.float32)[:, :, None]
    feed = {"x": xv, "lengths": np.array([3, 1], np.int64), "h0": np.array([[0], [10]], "float32")}
    got_total, got_seen = _run([total, seen], feed)
    np.testing.assert_allclose(got_total.reshape(2, 3), [[1, 3, 6], [14, 0, 0]])
    np.testing.assert_allclose(got_seen.reshape(2, 3), [[1, 2, 3], [4, 0, 0]])


def test_rnn_step_input_without_lengths(rng):
    x = nf.data("x", shape=[-1, -1, 2], dtype="float64")
    h0 = nf.data("h0", shape=[-1, 2], dtype="float64")
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=None)
        h = rnn.memory(init=h0)
        new = L.tanh(rnn.previous_memory(h) + xt)
        rnn.update_memory(h, new)
        rnn.output(new, L.scale(xt, 2.0))
    out, doubled = rnn()
    xv, h0v = rng.normal(size=(3, 4, 2)), rng.normal(size=(3, 2))
    got, got2 = _run([out, doubled], {"x": xv, "h0": h0v})
    want, hv = [], h0v
    for t in range(4):
        hv = np.tanh(hv + xv[:, t])
        want.append(hv)
    np.testing.assert_allclose(got, np.stack(want, axis=1), rtol=1e-12)
    np.testing.assert_allclose(got2, 2 * xv, rtol=1e-12)


def _while_program():
    """h <- tanh(h @ w) three times; loss = mean(h)."""
    x = nf.data("x", shape=[-1, 2], dtype="float64")
    w = L.create_parameter([2, 2], "float64", name="w", initializer=nf.initializer.Uniform(-1, 1))
    h = L.assign(x)
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 3)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.tanh(L.matmul(h, w)), h)
        L.increment(i)
        L.assign(L.less_than(i, n), cond)
    return x, w, h, i, L.mean(h)


def test_while_runs_until_the_condition_is_false(rng):
    x, w, h, i, loss = _while_program()
    xv, scope = rng.normal(size=(4, 2)), nf.Scope()
    got_h, got_i = _run([h, i], {"x": xv}, scope=scope)
    want, wv = xv, _value(scope, "w")
    for _ in range(3):
        want = np.tanh(want @ wv)
    assert got_i.tolist() == [3]
    np.testing.assert_allclose(got_h, want, rtol=1e-12)
    assert scope.kids == []


def test_while_gradients_match_numeric(rng):
    x, w, h, i, loss = _while_program()
    nf.append_backward(loss)
    scope, feed = nf.Scope(), {"x": rng.normal(size=(4, 2))}
    _run([loss], feed, scope=scope)
    _param_grad_check(nf.default_main_program(), loss, scope, feed, ["w"])


def test_ifelse_gradients_match_numeric(rng):
    x = nf.data("x", shape=[-1, 3], dtype="float64")
    cond = nf.data("cond", shape=[-1, 1], dtype="bool")
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.fc(x, size=2, act="tanh", name="t"))
    with ie.false_block():
        ie.output(L.square(L.fc(x, size=2, name="f")))
    (out,) = ie(cond)
    loss = L.mean(out * out)
    nf.append_backward(loss)
    feed = {"x": rng.normal(size=(5, 3)), "cond": np.array([[1], [0], [1], [0], [0]], bool)}
    scope = nf.Scope()
    _run([loss], feed, scope=scope)
    _param_grad_check(nf.default_main_program(), loss, scope, feed, ["t.w", "t.b", "f.w", "f.b"])


def test_rnn_gradients_match_numeric(rng):
    x = nf.data("x", shape=[-1, -1, 2], dtype="float64")
    h0 = nf.data("h0", shape=[-1, 2], dtype="float64")
    u = L.create_parameter([2, 2], "float64", name="u")
    rnn = nf.rnn()
    with rnn.step():
        h = rnn.memory(init=h0)
        xt = rnn.step_input(x)
        new = L.tanh(L.fc(xt, size=2, name="in") + L.matmul(rnn.previous_memory(h), u))
        rnn.update_memory(h, new)
        rnn.output(new, xt)
    out, _ = rnn()
    loss = L.mean(L.square(out))
    nf.append_backward(loss)
    feed = {"x": rng.normal(size=(2, 3, 2)), "h0": rng.normal(size=(2, 2))}
    scope = nf.Scope()
    _run([loss], feed, scope=scope)
    _param_grad_check(nf.default_main_program(), loss, scope, feed, ["u", "in.w", "in.b"])


# ================================================================================================
# Errors (a user's first contact with a bug)
# ================================================================================================


def test_every_error_kind_derives_from_nestflow_error():
    kinds = [
        v for v in vars(nf.errors).values() if isinstance(v, type) and issubclass(v, Exception)
    ]
    assert len(kinds) > 10
    assert [k.__name__ for k in kinds if not issubclass(k, nf.errors.NestflowError)] == []


def _one_data_program():
    program = nf.Program()
    with nf.program_guard(program, nf.Program()):
        L.scale(nf.data("x", shape=[-1, 1], dtype="float32"), 2.0)
    return program


_BAD_CALLS = {
    "data shape of strings": lambda: nf.data("x", shape=[-1, "a"]),
    "data unknown dtype": lambda: nf.data("x", shape=[-1, 2], dtype="floatz"),
    "fc size not an int": lambda: L.fc(nf.data("x", shape=[-1, 2]), size="a"),
    "fc unknown act": lambda: L.fc(nf.data("x", shape=[-1, 2]), size=2, act="nope"),
    "fc bad param_attr": lambda: L.fc(nf.data("x", shape=[-1, 2]), size=2, param_attr=3),
    "fill_constant value": lambda: L.fill_constant([2], "float32", "abc"),
    "scale not a number": lambda: L.scale(nf.data("x", shape=[-1, 2]), scale="a"),
    "minibatch of strings": lambda: nf.minibatch(["a", "b"]),
    "var of a string": lambda: nf.var("abc"),
    "ragged sequence": lambda: nf.sequence([[1, 2], [3]]),
    "assign a ragged list": lambda: L.assign([[1, 2], [3]]),
    "program_guard(str)": lambda: nf.program_guard("main").__enter__(),
    "from_bytes(None)": lambda: nf.Program.from_bytes(None),
    "get_variable absent": lambda: nf.get_variable("nope"),
    "blk.var absent": lambda: nf.default_main_program().global_block().var("nope"),
    "ifelse on floats": lambda: nf.ifelse()(nf.data("x", shape=[-1, 1])),
    "While on floats": lambda: nf.While(nf.data("x", shape=[1])),
    "prune unknown target": lambda: nf.prune(nf.Program(), targets=["nope"]),
    "Net.add_op unknown": lambda: nf.Net.create().add_op("nope", inputs={}, outputs={}),
    "NetBuilder unknown": lambda: nf.NetBuilder(nf.Net.create()).add_op("nope"),
    "Tensor.mutable_data dtype": lambda: nf.Tensor().mutable_data((2,), "floatz"),
    "Tensor.set ragged": lambda: nf.Tensor().set([[1, 2], [3]]),
    "exe.run(str)": lambda: nf.Executor(nf.CPUPlace()).run("main"),
    "exe.run bad scope": lambda: nf.Executor(nf.CPUPlace()).run(nf.Program(), scope={}),
    "feed ragged": lambda: nf.Executor().run(feed={"x": [[1.0], []]}, program=_one_data_program()),
}


@pytest.mark.parametrize("call", _BAD_CALLS.values(), ids=list(_BAD_CALLS))
def test_bad_calls_raise_nestflow_errors(call):
    """All raised errors derive from nf.errors.NestflowError (not a bare NumPy/Python one)."""
    with pytest.raises(nf.errors.NestflowError):
        call()


def test_runtime_error_names_op_index_block_vars_shapes_and_line():
    a = nf.data("a", shape=[-1, -1], dtype="float32")
    w = L.create_parameter([3, 2], "float32", name="w")
    out = L.matmul(a, w)  # marker: runtime-matmul
    with pytest.raises(nf.errors.NestflowError) as info:
        _run([out], {"a": np.ones((2, 4), np.float32)})
    message = str(info.value)
    for part in ("matmul", "#0", "block 0", "'a'", "'w'", "[2, 4]", "[3, 2]"):
        assert part in message, part
    assert _at("marker: runtime-matmul") in message


def test_error_inside_a_sub_block_names_that_block():
    x = nf.data("x", shape=[-1, -1], dtype="float32")
    cond = nf.data("cond", shape=[-1, 1], dtype="bool")
    w = L.create_parameter([3, 2], "float32", name="w")
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.matmul(x, w))  # marker: sub-block-matmul
    with ie.false_block():
        ie.output(L.matmul(x, w))
    (out,) = ie(cond)
    scope = nf.Scope()
    with pytest.raises(nf.errors.NestflowError) as info:
        _run([out], {"x": np.ones((2, 4), np.float32), "cond": np.ones((2, 1), bool)}, scope=scope)
    message = str(info.value)
    for part in ("matmul", "block 1", "[3, 2]", _at("marker: sub-block-matmul")):
        assert part in message, part
    assert scope.kids == []  # the failed run's scopes are dropped too


def test_bad_protobuf_bytes_raise_a_clear_error():
    for data in (b"\xff\xff\xff garbage", b"", b"not a program at all"):
        with pytest.raises(nf.errors.NestflowError, match="ProgramDesc"):
            nf.Program.from_bytes(data)


def test_unknown_op_type_is_named_when_built_and_when_loaded():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", shape=[-1, 2], dtype="float32")
        L.scale(x, 2.0)
        with pytest.raises(nf.errors.NestflowError) as info:
            main.global_block().append_op("no_such_op", inputs={"X": [x]}, outputs={"Out": ["o"]})
    assert "no_such_op" in str(info.value)
    desc = pb.ProgramDesc()
    desc.ParseFromString(main.to_bytes())
    desc.blocks[0].ops[0].type = "warp_drive"
    with pytest.raises(nf.errors.NestflowError) as info:
        nf.Program.from_bytes(desc.SerializeToString())
    assert "warp_drive" in str(info.value)


class _Model:
    """x -> fc -> mean, trained by SGD, plus a persistable counter the program increments in
    its first op: a failed run that wrote any persistable back would show."""

    def __init__(self):
        self.main, self.startup = nf.Program(), nf.Program()
        with nf.program_guard(self.main, self.startup):
            counter = L.create_parameter(
                [1], "float32", name="counter", initializer=nf.initializer.Constant(0.0)
            )
            L.increment(counter)
            self.x = nf.data("x", shape=[-1, -1], dtype="float32")
            w = L.create_parameter([3, 2], "float32", name="w")
            self.out = L.matmul(self.x, w)  # marker: model-matmul
            self.div = L.elementwise_div(self.out, L.fill_constant([1], "float32", 0.0))
            self.loss = L.mean(self.out)
            nf.optimizer.SGD(learning_rate=0.1).minimize(self.loss)
        self.scope = nf.Scope()
        nf.Executor(nf.CPUPlace()).run(self.startup, scope=self.scope)

    def state(self):
        return {n: _value(self.scope, n) for n in sorted(self.scope.local_var_names())}


@pytest.mark.filterwarnings("ignore:divide by zero")
@pytest.mark.parametrize(
    ("case", "error", "words"),
    [
        ("missing feed", nf.errors.FeedError, ["'x'", "matmul", _at("marker: model-matmul")]),
        ("wrong dtype", nf.errors.FeedError, ["'x'", "int64", "float32"]),
        ("bad shape", nf.errors.ExecutionError, ["matmul", "[2, 4]", _at("marker: model-matmul")]),
        ("nan/inf", nf.errors.NanInfError, ["elementwise_div", "Inf"]),
        ("unknown fetch", nf.errors.FetchError, ["no_such_var"]),
    ],
)
def test_failed_runs_give_clear_errors_and_leave_persistables_unchanged(case, error, words):
    model = _Model()
    exe = nf.Executor(nf.CPUPlace())
    good = {"x": np.ones((2, 3), np.float32)}
    exe.run(model.main, feed=good, scope=model.scope)
    before = model.state()
    assert before["counter"].tolist() == [1.0]
    run = {
        "missing feed": lambda: exe.run(model.main, feed={}, scope=model.scope),
        "wrong dtype": lambda: exe.run(
            model.main, feed={"x": np.ones((2, 3), np.int64)}, scope=model.scope
        ),
        "bad shape": lambda: exe.run(
            model.main, feed={"x": np.ones((2, 4), np.float32)}, scope=model.scope
        ),
        "nan/inf": lambda: exe.run(
            model.main, feed=good, fetch_list=[model.div], scope=model.scope, check_nan_inf=True
        ),
        "unknown fetch": lambda: exe.run(
            model.main, feed=good, fetch_list=["no_such_var"], scope=model.scope
        ),
    }[case]
    with pytest.raises(error) as info:
        run()
    assert isinstance(info.value, nf.errors.NestflowError)
    for word in words:
        assert word in str(info.value), word
    after = model.state()
    assert list(after) == list(before)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    exe.run(model.main, feed=good, scope=model.scope)  # and the scope still works
    assert model.state()["counter"].tolist() == [2.0]


def test_nan_inf_check_names_the_op_and_line_when_on_in_the_executor():
    x = nf.data("x", shape=[-1, 2], dtype="float32")
    bad = L.elementwise_div(x, L.fill_constant([1], "float32", 0.0))  # marker: div-by-zero
    exe = nf.Executor(nf.CPUPlace(), check_nan_inf=True)
    with pytest.raises(nf.errors.NanInfError) as info, np.errstate(divide="ignore"):
        _run([bad], {"x": np.ones((2, 2), np.float32)}, exe=exe)
    assert "elementwise_div" in str(info.value) and _at("marker: div-by-zero") in str(info.value)
    with np.errstate(divide="ignore"):
        (got,) = _run([bad], {"x": np.ones((2, 2), np.float32)})  # off by default
    assert np.isinf(got).all()


def test_missing_feed_names_the_variable_and_its_reader():
    x = nf.data("x", shape=[-1, 2], dtype="float32")
    out = L.relu(x)  # marker: relu-reader
    with pytest.raises(nf.errors.FeedError) as info:
        _run([out])
    assert "'x'" in str(info.value) and "relu" in str(info.value)
    assert _at("marker: relu-reader") in str(info.value)


# ================================================================================================
# Files users keep
# ================================================================================================


def test_parameters_are_safetensors_files(tmp_path, rng):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    main, startup, x, y, h, p, loss = _mlp()
    scope = nf.Scope()
    nf.Executor(nf.CPUPlace()).run(startup, scope=scope)
    path = tmp_path / "params.safetensors"
    nf.io.save_params(scope, main, path)  # DESIGN names no save function; nf.io has this one
    stored = safetensors_numpy.load_file(str(path))
    assert set(stored) == set(scope.local_var_names())
    for name, array in stored.items():
        np.testing.assert_array_equal(array, _value(scope, name))
    fresh = nf.Scope()
    nf.io.load_params(fresh, main, path)
    xs = rng.normal(size=(2, 784)).astype(np.float32)
    exe = nf.Executor(nf.CPUPlace())
    (a,) = exe.eval(main, targets=[p], feed={"x": xs}, scope=scope)
    (b,) = exe.eval(main, targets=[p], feed={"x": xs}, scope=fresh)
    np.testing.assert_array_equal(a, b)


def test_programs_are_protobuf_files(tmp_path, rng):
    main, startup, x, y, h, p, loss = _mlp()
    (tmp_path / "main.pb").write_bytes(main.to_bytes())
    desc = pb.ProgramDesc()
    desc.ParseFromString((tmp_path / "main.pb").read_bytes())  # plain protobuf
    assert nf.Program.from_bytes((tmp_path / "main.pb").read_bytes()).to_bytes() == main.to_bytes()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_nothing_loads_pickles(tmp_path):
    marker = str(tmp_path / "unpickled")
    data = pickle.dumps({"w": _Payload(marker)})
    (tmp_path / "params.safetensors").write_bytes(data)
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        L.create_parameter([1], "float32", name="w")
    with pytest.raises(nf.errors.NestflowError):
        nf.io.load_params(nf.Scope(), main, tmp_path / "params.safetensors")
    with pytest.raises(nf.errors.NestflowError):
        nf.Program.from_bytes(data)
    assert not os.path.exists(marker)
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    for path, text in sources.items():
        for needle in ("import pickle", "cPickle", "allow_pickle=True", "torch.load", "dill"):
            assert needle not in text, f"{path}: {needle}"
