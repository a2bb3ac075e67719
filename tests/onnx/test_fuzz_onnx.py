"""Fuzzing nf.onnx.load (issue 32): 1,000 seeded mutations of models nf.onnx.export wrote
(bit flips, truncations and other byte edits; fields edited and the model re-serialised),
handed over as a file, as bytes or as a ModelProto, plus the hand-made hostile models of
hostile_models.py.

Cases run in a worker process (tests/framework/test_fuzz_models.py's Worker: many cases per
process, each under a time bound, the process under an address-space cap). Each must raise
an nf.errors error or load and run; a model that runs is run by onnxruntime too and, where
onnxruntime runs it, must give the same outputs. An audit hook in the worker fails any case
that opens a file of the scratch directory outside its model's own directory (the scratch
directory and the worker's working directory hold a file named hostile_models.SECRET).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("hypothesis")  # test_fuzz_models' module needs it

import nestflow as nf  # noqa: E402
from nestflow.onnx.exporter import build_model  # noqa: E402
from tests.framework.test_fuzz_models import Worker, mutate_bytes  # noqa: E402
from tests.onnx import hostile_models as hostile  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fuzz worker is Linux-only")

L = nf.layers
SEED = 20260532
MUTATIONS = 1000

_WORKER = r'''
import os, pickle, resource, signal, struct, sys, tempfile, traceback
import numpy as np
import onnx, onnxruntime
import nestflow as nf
import nestflow.onnx.importer
from tests.onnx import hostile_models as hostile

class Expired(BaseException):  # not an Exception: no handler in nestflow may swallow it
    pass

def expire(signum, frame):
    raise Expired()

signal.signal(signal.SIGALRM, expire)
scratch = os.path.realpath(tempfile.mkdtemp(prefix="nestflow-onnx-fuzz-"))
with open(os.path.join(scratch, hostile.SECRET), "wb") as f:
    f.write(np.eye(4, dtype=np.float32).tobytes())
watch = {"case": None, "outside": []}

def audit(event, args):
    # a case may open files of its own directory only, of all the scratch directory's
    if event == "open" and watch["case"] is not None and isinstance(args[0], (str, bytes)):
        path = os.path.realpath(os.fsdecode(args[0]))
        inside = path == watch["case"] or path.startswith(watch["case"] + os.sep)
        if not inside and (path.startswith(scratch) or hostile.SECRET in path):
            watch["outside"].append(path)

sys.addaudithook(audit)
options = onnxruntime.SessionOptions()
options.intra_op_num_threads = options.inter_op_num_threads = 1
options.log_severity_level = 4
with open("/proc/self/statm") as f:
    in_use = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
limit = in_use + 1536 * 2**20  # a mutated shape may ask for terabytes: MemoryError instead
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

def given(case, directory):
    """(what nf.onnx.load is handed, feed, base_dir) of a case."""
    if "hostile" in case:
        return hostile.build(case["hostile"], directory)
    if case["as"] == "file":
        path = os.path.join(directory, "model.onnx")
        with open(path, "wb") as f:
            f.write(case["data"])
        return path, case["feed"], None
    if case["as"] == "proto":
        return onnx.ModelProto.FromString(case["data"]), case["feed"], None
    return case["data"], case["feed"], None

def run(case):
    directory = tempfile.mkdtemp(dir=scratch)
    os.chdir(scratch)  # a model read from the working directory would find SECRET
    model, feed, base_dir = given(case, directory)
    watch["case"], watch["outside"] = os.path.realpath(directory), []
    try:
        scope = nf.Scope()
        program, feed_names, fetches = nf.onnx.load(model, scope, base_dir=base_dir)
        feed = {n: feed[n] for n in feed_names if n in feed}
        got = nf.Executor().run(program, feed=feed, fetch_list=fetches, scope=scope)
    finally:
        watch["case"] = None
    # onnxruntime on the same model, its external data read where nestflow read it
    proto = nestflow.onnx.importer.read_model(model, base_dir)
    try:
        session = onnxruntime.InferenceSession(proto.SerializeToString(), options)
        want = session.run(None, feed)
    except Exception as exc:
        want = f"{type(exc).__name__}: {str(exc)[:200]}"
    return [np.asarray(v) for v in got], want

def answer(result):
    data = pickle.dumps(result)
    sys.stdout.buffer.write(struct.pack("<Q", len(data)) + data)
    sys.stdout.buffer.flush()

while True:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        break
    case = pickle.loads(sys.stdin.buffer.read(struct.unpack("<Q", head)[0]))
    try:
        signal.setitimer(signal.ITIMER_REAL, case["seconds"])
        try:
            got, want = run(case)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        result = ("ok", got, want)
    except Expired:
        result = ("hang", f"still running after {case['seconds']} s")
    except nf.errors.NestflowError as exc:
        result = ("nf", type(exc).__name__, str(exc)[-400:])
    except BaseException as exc:
        result = ("other", type(exc).__name__, traceback.format_exc()[-3000:])
    if watch["outside"]:
        result = ("outside", sorted(set(watch["outside"])), result[:2])
    answer(result)
'''


# ---- the models fuzzed: exported by nf.onnx.export ----


def _mlp():
    x = L.data("x", [-1, 4])
    h = L.fc(x, 8, act="relu", name="fc1")
    return {"x": x}, [L.fc(h, 3, act="softmax", name="fc2")]


def _conv():
    x = L.data("x", [-1, 1, 6, 6])
    h = L.conv2d(x, 2, 3, padding=1, act="relu", name="conv")
    h = L.pool2d(h, 2, "max", 2)
    return {"x": x}, [L.fc(h, 3, name="fc")]


def _loop():
    """A While over a fed trip count: an ONNX Loop whose body reads a parameter."""
    x = L.data("x", [-1, 3])
    n = L.data("n", [1], "int64")
    w = L.create_parameter([3, 3], "float32", name="w")
    i = L.fill_constant([1], "int64", 0)
    h = L.assign(x)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():
        L.assign(L.tanh(L.matmul(h, w)), output=h)
        L.increment(i)
        L.less_than(i, n, out=cond)
    return {"x": x, "n": n}, [h]


_FEEDS = {
    "mlp": {"x": np.linspace(-1, 1, 20, dtype="float32").reshape(5, 4)},
    "conv": {"x": np.linspace(-1, 1, 72, dtype="float32").reshape(2, 1, 6, 6)},
    "loop": {"x": np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3), "n": np.int64([3])},
}


@pytest.fixture(scope="module")
def models():
    """name -> (the exported model's bytes, its feed)."""
    found = {}
    for name, build in (("mlp", _mlp), ("conv", _conv), ("loop", _loop)):
        main, startup = nf.Program(), nf.Program()
        with nf.program_guard(main, startup), nf.unique_name.guard():
            feeds, fetches = build()
        scope = nf.Scope()
        nf.Executor().run(startup, scope=scope)
        proto = build_model(main, list(feeds), fetches, scope)
        found[name] = (proto.SerializeToString(), _FEEDS[name])
    return found


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("onnx-fuzz-cwd")
    (cwd / hostile.SECRET).write_bytes(np.eye(4, dtype=np.float32).tobytes())
    pool = [Worker(_WORKER, cwd), Worker(_WORKER, cwd)]
    yield pool
    for worker in pool:
        worker.close()


# ---- mutations: re-serialised field edits ----

_EDITS = [
    "dims",
    "raw_data",
    "attr_int",
    "attr_float",
    "attr_ints",
    "op_type",
    "input",
    "output",
    "drop_node",
    "dup_node",
    "shuffle",
    "opset",
    "elem_type",
    "shape",
    "external",
    "subgraph",
]


def _graphs(graph):
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                found.extend(_graphs(attr.g))
    return found


def mutate_fields(data: bytes, rng: random.Random) -> bytes:
    """One structural edit of a model, as a hostile writer would make it."""
    proto = onnx.ModelProto.FromString(data)
    graph = rng.choice(_graphs(proto.graph))
    nodes = list(graph.node)
    tensors = [*proto.graph.initializer, *graph.initializer]
    tensors += [a.t for n in nodes for a in n.attribute if a.HasField("t")]
    attrs = [a for n in nodes for a in n.attribute]
    values = [v.name for v in graph.input] + [o for n in nodes for o in n.output]
    edit = rng.choice(_EDITS)
    if edit == "dims" and tensors:
        tensor = rng.choice(tensors)
        tensor.dims[:] = rng.choice([[-1, 4], [0], [2**40, 2**40], [3], [], [1] * 40])
    elif edit == "raw_data" and tensors:
        tensor = rng.choice(tensors)
        tensor.raw_data = tensor.raw_data[: rng.randrange(len(tensor.raw_data) + 1)]
        tensor.data_type = rng.choice([tensor.data_type, 1, 7, 8, 16, 11])
    elif edit == "attr_int" and attrs:
        attr = rng.choice(attrs)
        attr.i = rng.choice([0, -1, 2**62, -(2**63), 7])
    elif edit == "attr_float" and attrs:
        attr = rng.choice(attrs)
        attr.f = rng.choice([float("nan"), float("inf"), -1e30, 0.0])
    elif edit == "attr_ints" and attrs:
        attr = rng.choice(attrs)
        attr.ints[:] = rng.choice([[0, 0], [-1], [2**40] * 4, [], [1, 1, 1, 1, 1]])
    elif edit == "op_type" and nodes:
        rng.choice(nodes).op_type = rng.choice(
            ["Loop", "If", "Conv", "Reshape", "Expand", "ConstantOfShape", "Tile", "Gemm", "X"]
        )
    elif edit == "input" and nodes:
        node = rng.choice(nodes)
        if node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(["", "ghost", *values])
    elif edit == "output" and nodes:
        node = rng.choice(nodes)
        if node.output:
            node.output[rng.randrange(len(node.output))] = rng.choice(["", *values])
    elif edit == "drop_node" and nodes:
        graph.node.remove(rng.choice(nodes))
    elif edit == "dup_node" and nodes:
        graph.node.add().CopyFrom(rng.choice(nodes))
    elif edit == "shuffle" and nodes:
        copies = [onnx.NodeProto.FromString(n.SerializeToString()) for n in nodes]
        rng.shuffle(copies)
        del graph.node[:]
        graph.node.extend(copies)
    elif edit == "opset":
        proto.opset_import[0].version = rng.choice([1, 6, 7, 11, 13, 29, 10**6])
    elif edit == "elem_type" and graph.input:
        value = rng.choice(graph.input)
        value.type.tensor_type.elem_type = rng.choice([0, 8, 16, 14, 7, 9, 100])
    elif edit == "shape" and graph.input:
        value = rng.choice(graph.input)
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 2**40, 5])
    elif edit == "external" and tensors:
        tensor = rng.choice(tensors)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        location = rng.choice([hostile.SECRET, f"../{hostile.SECRET}", "/etc/passwd", "nope"])
        tensor.external_data.add(key="location", value=location)
    elif edit == "subgraph":
        node = rng.choice(nodes) if nodes else None
        if node is not None:
            whole = onnx.GraphProto.FromString(proto.graph.SerializeToString())
            attr = node.attribute.add(name="body", type=onnx.AttributeProto.GRAPH)
            attr.g.CopyFrom(whole)  # (a graph copied into itself crashes protobuf)
    return proto.SerializeToString()


def _cases(models, rng: random.Random, count: int):
    """(label, case) of `count` seeded mutations: half byte edits, half field edits, each
    handed over as a file, bytes or a ModelProto."""
    names = sorted(models)
    for index in range(count):
        name = names[index % len(names)]
        data, feed = models[name]
        kind = "bytes" if rng.random() < 0.5 else "fields"
        mutated = mutate_bytes(data, rng) if kind == "bytes" else mutate_fields(data, rng)
        how = rng.choice(["file", "bytes", "proto"])
        if how == "proto":
            try:
                onnx.ModelProto.FromString(mutated)
            except Exception:  # (a caller cannot hand over a proto that does not parse)
                how = "bytes"
        yield f"{name} {kind} as {how} #{index}", {"data": mutated, "feed": feed, "as": how}


class Tally:
    """Counts by outcome; collects what breaks the rules: hangs, crashes, exceptions other
    than nf.errors, a file read outside the model's directory, outputs that differ from
    onnxruntime's."""

    def __init__(self):
        self.kinds: Counter = Counter()
        self.failures: list[str] = []

    def judge(self, label: str, result: tuple) -> str:
        kind = result[0]
        if kind == "ok":
            got, want = result[1], result[2]
            if isinstance(want, str):
                kind = "ok, onnxruntime refuses"
            elif len(got) == len(want) and all(
                a.shape == np.shape(b) and np.allclose(a, b, 1e-4, 1e-5, equal_nan=True)
                for a, b in zip(got, want)
            ):
                kind = "ok, equal to onnxruntime"
            else:
                kind = "ok, differs from onnxruntime"
                self.failures.append(f"{label}: {kind}")
        elif kind in ("hang", "other", "outside"):
            self.failures.append(f"{label}: {result}")
        self.kinds[kind] += 1
        return kind

    def check(self) -> None:
        assert not self.failures, f"{len(self.failures)} of {sum(self.kinds.values())} " + (
            "inputs broke the rules:\n" + "\n".join(self.failures[:20])
        )


def _drive(workers, cases, tally: Tally) -> None:
    lock = threading.Lock()

    def drive(worker: Worker, share: list) -> None:
        for label, case in share:
            result = worker.evaluate(case)
            with lock:
                tally.judge(label, result)

    threads = [
        threading.Thread(target=drive, args=(worker, cases[i :: len(workers)]))
        for i, worker in enumerate(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_seeded_mutations_of_exported_models(models, workers):
    """1,000 seeded mutations over two workers: 0 hangs, 0 crashes, 0 exceptions other than
    nf.errors, 0 files read outside the model's directory, 0 outputs unlike onnxruntime's."""
    started = time.perf_counter()
    cases = list(_cases(models, random.Random(SEED), MUTATIONS))
    tally = Tally()
    _drive(workers, cases, tally)
    seconds = time.perf_counter() - started
    print(f"\nONNX fuzz: {len(cases)} tried in {seconds:.1f} s: {dict(tally.kinds)}")
    tally.check()
    # The fuzzing reached both outcomes: refused models and ones that still ran.
    assert tally.kinds["nf"] > 200, tally.kinds
    assert tally.kinds["ok, equal to onnxruntime"] > 50, tally.kinds


@pytest.mark.parametrize("name", sorted(hostile.CASES))
def test_hostile_models_in_the_worker(workers, name):
    """Issue 32's hostile models under the worker's time bound and memory cap: the nf.errors
    error named, or run and equal to onnxruntime."""
    tally = Tally()
    result = workers[0].evaluate({"hostile": name})
    kind = tally.judge(name, result)
    tally.check()
    expected = hostile.CASES[name]
    if expected == "ok":
        assert kind == "ok, equal to onnxruntime", result
    else:
        assert result[:2] == ("nf", expected), result
