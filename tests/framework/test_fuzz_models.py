"""Fuzzing saved models (issue 12 acceptance): random bytes, truncations, bit flips and chunk
edits of a program file and of every file of a saved inference-model directory, structural
mutations of the ProgramDesc (sub-block cycles, endless loops, deep nesting, odd dtypes,
shapes, names and attributes), seeded and driven by hypothesis.

Each input runs in a worker process with a time limit and an address-space limit. Every one
must either load and run (a directory that loads must give exactly the saved model's outputs:
its checksums catch every changed byte) or raise an nf.errors error: no hang, no other
exception.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import nestflow as nf
from nestflow.framework import framework_pb2 as pb

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
# The worker limits its address space and reads its size from /proc.
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fuzz worker is Linux-only")

L = nf.layers
ROOT = Path(__file__).resolve().parents[2]
CASE_SECONDS = 30  # the worker's alarm for one input: past it the input is a hang
WORKER_SECONDS = 90  # the parent's limit for an answer: a worker stuck in C code is a hang
SEED = 20260512

# ---- the worker: loads and runs one input per request ----

_WORKER = r'''
import os, pickle, resource, signal, struct, sys, tempfile, traceback
import numpy as np
import nestflow as nf

class Expired(BaseException):  # not an Exception: no handler in nestflow may swallow it
    pass

def expire(signum, frame):
    raise Expired()

signal.signal(signal.SIGALRM, expire)
with open("/proc/self/statm") as f:
    in_use = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
limit = in_use + 1536 * 2**20  # a mutated shape may ask for terabytes: MemoryError instead
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
scratch = tempfile.mkdtemp(prefix="nestflow-fuzz-")

def outputs(program, feed, fetch, scope):
    return nf.Executor().run(program, feed=feed, fetch_list=fetch, scope=scope)

def run_program(case):
    """A bare ProgramDesc: load, prune, clone, round-trip, then run with the saved params."""
    program = nf.Program.from_bytes(case["data"])
    program.clone()
    nf.Program.from_bytes(program.to_bytes())
    nf.prune(program, case["fetch"])
    scope = nf.Scope()
    nf.io.load_params(scope, program, case["params"])
    return outputs(program, case["feed"], case["fetch"], scope)

def run_directory(case):
    """A saved inference model's files (some mutated): load and run it."""
    directory = tempfile.mkdtemp(dir=scratch)
    for name, data in case["files"].items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    program, feed_names, fetch_names, scope = nf.io.load_inference_model(directory)
    feed = {name: case["feed"][name] for name in feed_names if name in case["feed"]}
    return outputs(program, feed, fetch_names, scope)

def answer(result):
    data = pickle.dumps(result)
    sys.stdout.buffer.write(struct.pack("<Q", len(data)) + data)
    sys.stdout.buffer.flush()

while True:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        break
    case = pickle.loads(sys.stdin.buffer.read(struct.unpack("<Q", head)[0]))
    run = run_directory if "files" in case else run_program
    try:
        signal.setitimer(signal.ITIMER_REAL, case["seconds"])
        try:
            got = run(case)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        result = ("ok", [np.asarray(v) for v in got])
    except Expired:
        result = ("hang", f"still running after {case['seconds']} s")
    except nf.errors.NestflowError as exc:
        result = ("nf", type(exc).__name__, str(exc)[-400:])
    except BaseException as exc:
        result = ("other", type(exc).__name__, traceback.format_exc()[-3000:])
    answer(result)
'''


class Worker:
    """A worker process answering one input at a time; restarted after a hang. `script` is
    the worker's code (the ONNX fuzz has its own), `cwd` where it runs."""

    def __init__(self, script: str = _WORKER, cwd: Path = ROOT):
        self.process: subprocess.Popen | None = None
        self.script, self.cwd = script, cwd
        self.temp: str | None = None

    def _start(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        # A killed worker cleans up nothing: its scratch folders go in a temp folder of its own
        # that close() removes, so the run leaves nothing in the system's temp folder.
        self.temp = tempfile.mkdtemp(prefix="nestflow-fuzz-worker-")
        env["TMPDIR"] = self.temp
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-c", self.script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=self.cwd,
            env=env,
        )

    def evaluate(self, case: dict) -> tuple:
        if self.process is None or self.process.poll() is not None:
            self._start()
        data = pickle.dumps(dict(case, seconds=CASE_SECONDS))
        self.process.stdin.write(struct.pack("<Q", len(data)) + data)
        self.process.stdin.flush()
        answer: list = []
        reader = threading.Thread(target=lambda: answer.append(self._read()), daemon=True)
        reader.start()
        reader.join(WORKER_SECONDS)
        if not answer:
            self.close()
            return ("hang", f"no answer in {WORKER_SECONDS} s (the worker was killed)")
        return answer[0]

    def _read(self) -> tuple:
        head = self.process.stdout.read(8)
        if len(head) < 8:
            return ("other", "WorkerDied", f"exit code {self.process.wait()}")
        return pickle.loads(self.process.stdout.read(struct.unpack("<Q", head)[0]))

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        if self.temp is not None:
            shutil.rmtree(self.temp, ignore_errors=True)
            self.temp = None


# ---- the models fuzzed ----


def _mlp_model():
    x = nf.data("x", [-1, 4], "float32")
    h = L.fc(x, 8, act="relu", name="fc1")
    return {"x": x}, [L.fc(L.dropout(h, 0.5, is_test=True), 3, act="softmax", name="fc2")]


def _control_flow_model():
    """IfElse over rows, a While with max_steps and a fed trip count, a BlockOp."""
    x = nf.data("x", [-1, 3], "float64")
    n = nf.data("n", [1], "int64")
    w = L.create_parameter([3, 3], "float64", name="w", initializer=nf.initializer.Uniform(-1, 1))
    ie = nf.ifelse(L.greater_than(L.reduce_sum(x, dim=1, keep_dim=True), 0.0))
    with ie.true_block():
        ie.output(L.tanh(L.matmul(x, w)))
    with ie.false_block():
        ie.output(L.scale(x, -0.5))
    (h,) = ie()
    i = L.fill_constant([1], "int64", 0)
    cond = L.less_than(i, n)
    loop = nf.While(cond, max_steps=20)
    with loop.block():
        block = nf.BlockOp()
        with block.block():
            block.output(L.sigmoid(L.matmul(h, w)))
        (inner,) = block()
        L.assign(inner, output=h)
        L.increment(i)
        L.less_than(i, n, out=cond)
    return {"x": x, "n": n}, [h, L.reduce_mean(h)]


_FEEDS = {
    "mlp": {"x": np.linspace(-1, 1, 20, dtype="float32").reshape(5, 4)},
    "control_flow": {
        "x": np.linspace(-2, 2, 12).reshape(4, 3),
        "n": np.array([3], "int64"),
    },
}


class Model:
    """A saved inference model: its directory's files, program bytes and reference outputs."""

    def __init__(self, name: str, build, directory: Path):
        main, startup = nf.Program(), nf.Program()
        with nf.program_guard(main, startup), nf.unique_name.guard():
            feeds, fetches = build()
        scope = nf.Scope()
        nf.Executor().run(startup, scope=scope)
        nf.io.save_inference_model(directory, list(feeds), fetches, main, scope)
        self.name = name
        self.feed = _FEEDS[name]
        self.files = {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}
        self.program_file = next(n for n in self.files if n.endswith(".pb"))
        self.params_path = str(next(p for p in directory.iterdir() if p.suffix == ".safetensors"))
        self.fetch = [v.name for v in fetches]

    def program_case(self, data: bytes) -> dict:
        return {"data": data, "params": self.params_path, "feed": self.feed, "fetch": self.fetch}

    def directory_case(self, files: dict[str, bytes]) -> dict:
        return {"files": files, "feed": self.feed}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return [
        Model(name, build, tmp_path_factory.mktemp(name))
        for name, build in (("mlp", _mlp_model), ("control_flow", _control_flow_model))
    ]


@pytest.fixture(scope="module")
def workers():
    pool = [Worker(), Worker()]
    yield pool
    for worker in pool:
        worker.close()


@pytest.fixture(scope="module")
def references(models, workers):
    """Each model's outputs as a worker computes them from the files as saved."""
    found = {}
    for model in models:
        result = workers[0].evaluate(model.directory_case(dict(model.files)))
        assert result[0] == "ok", result
        found[model.name] = result[1]
        again = workers[0].evaluate(model.program_case(model.files[model.program_file]))
        assert again[0] == "ok", again
        for a, b in zip(again[1], result[1]):
            np.testing.assert_array_equal(a, b)
    return found


# ---- mutations ----


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to three byte-level edits: bit flips, truncation, chunk deletion, duplication,
    replacement, insertion or swap; sometimes random bytes altogether."""
    if rng.random() < 0.05:
        return rng.randbytes(rng.randrange(0, 300))
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        size = len(out)
        kind = rng.choice(
            ["flip", "flip", "flip", "truncate", "delete", "dup", "replace", "insert", "swap"]
        )
        if size == 0:
            out += rng.randbytes(rng.randrange(1, 16))
            continue
        at = rng.randrange(size)
        length = rng.randint(1, max(1, min(64, size - at)))
        if kind == "flip":
            out[at] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del out[at:]
        elif kind == "delete":
            del out[at : at + length]
        elif kind == "dup":
            out[at:at] = out[at : at + length]
        elif kind == "replace":
            out[at : at + length] = rng.randbytes(length)
        elif kind == "insert":
            out[at:at] = rng.randbytes(length)
        else:
            other = rng.randrange(size)
            out[at], out[other] = out[other], out[at]
    return bytes(out)


_DTYPES = ["i8,i8", "object", "U3", "S2", "datetime64", "", "nope", "float16", "bool", "complex64"]


def mutate_desc(data: bytes, rng: random.Random) -> bytes:
    """A structural edit of a ProgramDesc: what a hostile file writer would change."""
    desc = pb.ProgramDesc()
    desc.ParseFromString(data)
    blocks = desc.blocks
    ops = [(b, op) for b in blocks for op in b.ops]
    block_attrs = [
        (b, op, name)
        for b, op in ops
        for name, attr in op.attrs.items()
        if attr.WhichOneof("value") in ("block_idx", "blocks_idx")
    ]
    kind = rng.choice(
        [
            "cycle",
            "cycle",
            "endless",
            "seed",
            "dtype",
            "shape",
            "name",
            "attr",
            "ops",
            "parent",
            "forward",
            "deep",
            "input",
        ]
    )
    if kind == "cycle" and block_attrs:
        _, op, name = rng.choice(block_attrs)
        target = rng.randint(-2, len(blocks) + 1)
        if op.attrs[name].WhichOneof("value") == "block_idx":
            op.attrs[name].block_idx = target
        else:
            op.attrs[name].blocks_idx.values.append(target)
    elif kind == "endless":
        for _, op in ops:
            if op.type == "while":
                op.attrs["max_steps"].i = rng.choice([-1, 10**9])
                if rng.random() < 0.5:
                    del op.attrs["carried"].strings.values[:]
                    del op.attrs["carried_inner"].strings.values[:]
    elif kind == "seed":
        desc.random_seed = rng.choice([-1, -(2**63), 2**62, 7])
    elif kind == "dtype":
        var = rng.choice([v for b in blocks for v in b.vars])
        var.dtype = rng.choice(_DTYPES)
    elif kind == "shape":
        var = rng.choice([v for b in blocks for v in b.vars])
        del var.shape[:]
        var.shape.extend(rng.choice([[-5], [2**40, 2**40], [0], [], [-1, -1, -1, 3]]))
    elif kind == "name":
        var = rng.choice([v for b in blocks for v in b.vars])
        var.name = rng.choice(["", var.name + "@x", blocks[0].vars[0].name])
    elif kind == "attr" and ops:
        _, op = rng.choice(ops)
        if op.attrs:
            attr = op.attrs[rng.choice(sorted(op.attrs))]
            choice = rng.randrange(5)
            if choice == 0:
                attr.strings.values.extend(["a", ""])
            elif choice == 1:
                attr.i = rng.choice([-1, 2**62, 0])
            elif choice == 2:
                attr.f = rng.choice([float("nan"), float("inf"), -1e300])
            elif choice == 3:
                attr.ints.values.extend([-3, 2**40])
            else:
                attr.block_idx = rng.randint(-1, len(blocks))
    elif kind == "ops" and ops:
        block, op = rng.choice(ops)
        action = rng.randrange(3)
        if action == 0:
            block.ops.remove(op)
        elif action == 1:
            block.ops.add().CopyFrom(op)
        else:
            order = list(block.ops)
            rng.shuffle(order)
            copies = [pb.OpDesc.FromString(o.SerializeToString()) for o in order]
            del block.ops[:]
            block.ops.extend(copies)
    elif kind == "parent" and len(blocks) > 1:
        rng.choice(blocks[1:]).parent_idx = rng.randint(-2, len(blocks))
    elif kind == "forward":
        rng.choice(blocks).forward_block_idx = rng.randint(-2, len(blocks))
    elif kind == "deep":
        _nest_deeply(desc, rng.choice([50, 2000, 6000]))
    elif kind == "input" and ops:
        _, op = rng.choice(ops)
        slots = [s for s in op.inputs if s.arguments]
        if slots:
            slot = rng.choice(slots)
            names = [v.name for b in blocks for v in b.vars]
            slot.arguments[rng.randrange(len(slot.arguments))] = rng.choice(["", "ghost"] + names)
    return desc.SerializeToString()


def _nest_deeply(desc: pb.ProgramDesc, levels: int) -> None:
    """Append a chain of `levels` blocks, each run by a forward-only block op in the one
    before (from block 0): legal up to nestflow's MAX_NESTING, refused beyond."""
    parent = 0
    for _ in range(levels):
        idx = len(desc.blocks)
        desc.blocks.add(idx=idx, parent_idx=parent, forward_block_idx=-1)
        op = desc.blocks[parent].ops.add(type="block")
        op.attrs["sub_block"].block_idx = idx
        parent = idx


# ---- judging the results ----


class Tally:
    """Counts results by kind; collects what breaks the rules (hangs, other exceptions,
    silent changes)."""

    def __init__(self):
        self.kinds: Counter = Counter()
        self.failures: list[str] = []

    def judge(self, label: str, result: tuple, expected: list | None) -> None:
        self.kinds[result[0]] += 1
        if result[0] in ("hang", "other"):
            self.failures.append(f"{label}: {result}")
        elif result[0] == "ok" and expected is not None:
            same = len(result[1]) == len(expected) and all(
                a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
                for a, b in zip(result[1], expected)
            )
            if not same:
                self.failures.append(f"{label}: loaded and ran, but its outputs changed")

    def check(self) -> None:
        assert not self.failures, f"{len(self.failures)} of {sum(self.kinds.values())} " + (
            "inputs broke the rules:\n" + "\n".join(self.failures[:20])
        )


def _cases(models, rng: random.Random, count: int):
    """Seeded inputs: mutated program bytes, structurally mutated descs, and directories with
    one file mutated, removed, emptied or joined by a stray one."""
    for index in range(count):
        model = models[index % len(models)]
        program = model.files[model.program_file]
        what = rng.random()
        if what < 0.3:
            data = mutate_bytes(program, rng)
            expected = None if data != program else "reference"
            yield f"{model.name} program bytes #{index}", model.program_case(data), expected
        elif what < 0.55:
            data = mutate_desc(program, rng)
            yield f"{model.name} program structure #{index}", model.program_case(data), None
        else:
            files = dict(model.files)
            name = rng.choice(sorted(files))
            action = rng.random()
            if action < 0.8:
                files[name] = mutate_bytes(files[name], rng)
            elif action < 0.87:
                del files[name]
            elif action < 0.94:
                files[name] = b""
            else:
                files[f"stray{index}.tmp"] = rng.randbytes(32)
            label = f"{model.name} directory ({name}) #{index}"
            yield label, model.directory_case(files), "reference"


def test_seeded_mutations_of_saved_models_load_and_run_or_raise_nf_errors(
    models, workers, references
):
    """~1000 seeded inputs over two workers: 0 hangs, 0 other exceptions, 0 silent changes."""
    rng = random.Random(SEED)
    cases = list(_cases(models, rng, 1000))
    tally = Tally()
    lock = threading.Lock()

    def drive(worker: Worker, share: list) -> None:
        for label, case, expected in share:
            model = label.split(" ")[0]
            result = worker.evaluate(case)
            with lock:
                tally.judge(label, result, references[model] if expected else None)

    threads = [
        threading.Thread(target=drive, args=(worker, cases[i :: len(workers)]))
        for i, worker in enumerate(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tally.check()
    # The fuzzing reached every outcome: rejected inputs and ones that still ran.
    assert tally.kinds["nf"] > 100 and tally.kinds["ok"] > 50, tally.kinds


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        ("self_cycle", "ProgramDecodeError"),
        ("endless_while", "ProgramDecodeError"),
        ("nest_2000", None),
        ("nest_6000", "ProgramDecodeError"),
    ],
)
def test_hostile_programs_in_the_worker(models, workers, references, edit, error):
    """The hostile cases of the issue, through the same worker: rejected with the nf.errors
    error named, or (legal deep nesting) run to the saved outputs."""
    model = next(m for m in models if m.name == "control_flow")
    desc = pb.ProgramDesc.FromString(model.files[model.program_file])
    if edit == "self_cycle":
        op = next(op for op in desc.blocks[0].ops if op.type == "while")
        op.attrs["sub_block"].block_idx = 0
    elif edit == "endless_while":
        op = next(op for op in desc.blocks[0].ops if op.type == "while")
        op.attrs["max_steps"].i = -1
        del op.attrs["carried"].strings.values[:]
        del op.attrs["carried_inner"].strings.values[:]
    else:
        _nest_deeply(desc, int(edit.split("_")[1]))
    result = workers[1].evaluate(model.program_case(desc.SerializeToString()))
    if error is None:
        tally = Tally()
        tally.judge(edit, result, references[model.name])
        tally.check()  # the chain of blocks changes nothing the model computes
    else:
        assert result[0] == "nf" and result[1] == error, result


@hypothesis.settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
@hypothesis.given(data=st.data())
def test_hypothesis_mutations_load_and_run_or_raise_nf_errors(models, workers, references, data):
    """Hypothesis picks the model, the file and the edits (and shrinks a failure to the
    smallest edit that breaks the rules)."""
    model = data.draw(st.sampled_from(models), label="model")
    name = data.draw(st.sampled_from(sorted(model.files)), label="file")
    original = model.files[name]
    edits = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(["flip", "truncate", "replace", "insert", "delete"]),
                st.integers(0, max(0, len(original) - 1)),
                st.binary(min_size=1, max_size=16),
            ),
            min_size=1,
            max_size=3,
        ),
        label="edits",
    )
    changed = bytearray(original)
    for kind, at, chunk in edits:
        at = min(at, len(changed))
        if kind == "flip" and at < len(changed):
            changed[at] ^= chunk[0] or 1
        elif kind == "truncate":
            del changed[at:]
        elif kind == "replace":
            changed[at : at + len(chunk)] = chunk
        elif kind == "insert":
            changed[at:at] = chunk
        else:
            del changed[at : at + len(chunk)]
    as_program = data.draw(st.booleans(), label="as a bare program") and name == model.program_file
    tally = Tally()
    if as_program:
        result = workers[0].evaluate(model.program_case(bytes(changed)))
        tally.judge(f"{model.name} program {edits}", result, None)
    else:
        files = dict(model.files, **{name: bytes(changed)})
        result = workers[0].evaluate(model.directory_case(files))
        tally.judge(f"{model.name} {name} {edits}", result, references[model.name])
    tally.check()
