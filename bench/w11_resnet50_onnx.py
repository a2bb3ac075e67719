"""W11: ResNet-50 forward from ONNX at batch 1 and 8: nestflow (the model imported by
nf.onnx.load) vs onnxruntime vs PyTorch eager, one thread each, interleaved; peak RSS.

The model is the onnx wheel's light_resnet50 (onnx/backend/test/data/light: ResNet-50 with
every weight a ConstantOfShape of 0.02). Its Reshape before the classifier hard-codes batch
1 ([1, 2048]); the bench rewrites that shape to [0, -1] (ONNX's "copy dim 0") and the input's
batch dim to a symbolic one, so one model serves every batch in all three runtimes.

PyTorch side: torchvision is not installed, so the same ONNX graph runs op by op in PyTorch
eager (F.conv2d, F.batch_norm, F.relu, F.max_pool2d, F.avg_pool2d, +, reshape, F.linear,
softmax) from the graph's own weights (TorchGraph below, a 50-line interpreter): the same
network and weights as the other two, PyTorch's kernels. onnxruntime: an InferenceSession with
intra_op_num_threads=1 and inter_op_num_threads=1 on the CPU provider. nestflow: one
Executor.run per forward under threadpool_limits(1) (and torch.set_num_threads(1)).

Peak RSS: one fresh child process per runtime that imports only that runtime, builds the model
and runs 3 forwards at batch 8; VmHWM, the median of 3 children (as W6).

The three runtimes' logits (the classifier's Gemm, added as a second graph output) are checked
to agree before timing, to 1e-4 of their largest magnitude: with every weight 0.02 the logits
of an image are equal (about 1e19) and the softmax over them is ill-conditioned (a difference
of one float32 ulp in the logits changes it completely), so the softmax is not compared.

    python bench/w11_resnet50_onnx.py            # print the rows
    python bench/w11_resnet50_onnx.py --child nestflow   # one RSS child
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from timing import error_line, interleaved, main, row, unavailable

BATCHES = (1, 8)
RSS_BATCH = 8
RUNTIMES = ("nestflow", "onnxruntime", "torch")


def model_proto():
    """light_resnet50 with a batch-free classifier reshape and a symbolic input batch."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = os.path.join(
        os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_resnet50.onnx"
    )
    proto = onnx.load(path)
    graph = proto.graph
    for node in graph.node:
        if node.op_type != "Reshape":
            continue
        for k, tensor in enumerate(graph.initializer):
            if tensor.name == node.input[1]:
                shape = np.asarray([0, -1], np.int64)
                graph.initializer[k].CopyFrom(numpy_helper.from_array(shape, tensor.name))
    initialized = {t.name for t in graph.initializer}
    data = next(v for v in graph.input if v.name not in initialized)
    data.type.tensor_type.shape.dim[0].dim_param = "batch"
    for output in graph.output:
        output.type.tensor_type.shape.dim[0].dim_param = "batch"
    logits = next(n for n in graph.node if n.op_type == "Gemm").output[0]
    graph.output.append(helper.make_tensor_value_info(logits, TensorProto.FLOAT, None))
    return proto, data.name


def image(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).random((batch, 3, 224, 224), np.float32)


def make_nestflow(proto, feed_name: str) -> Callable[[np.ndarray], list]:
    import nestflow as nf

    scope = nf.Scope()
    program, feeds, fetches = nf.onnx.load(proto, scope)
    exe = nf.Executor()
    return lambda x: exe.run(program, feed={feed_name: x}, fetch_list=fetches, scope=scope)


def make_onnxruntime(proto, feed_name: str) -> Callable[[np.ndarray], list]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # the light model's unused initializers are warned about
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return lambda x: session.run(None, {feed_name: x})


class TorchGraph:
    """The ONNX graph run op by op in PyTorch eager (the ops light_resnet50 holds)."""

    def __init__(self, proto, torch):
        from onnx import helper, numpy_helper

        self.torch, self.F = torch, torch.nn.functional
        self.proto = proto
        self.values = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        self.nodes = []
        for node in proto.graph.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "ConstantOfShape":  # the light model's weights
                value = numpy_helper.to_array(attrs["value"]).reshape(-1)[0]
                shape = [int(d) for d in self.values[node.input[0]]]
                self.values[node.output[0]] = np.full(shape, value, np.float32)
                continue
            self.nodes.append((node.op_type, list(node.input), list(node.output), attrs))
        self.weights = {k: torch.from_numpy(np.array(v)) for k, v in self.values.items()}

    def __call__(self, x: np.ndarray) -> list:
        torch, F = self.torch, self.F
        env = dict(self.weights)
        env[self.proto.graph.input[0].name] = torch.from_numpy(x)
        with torch.no_grad():
            for op, inputs, outputs, attrs in self.nodes:
                args = [env[name] for name in inputs if name]
                env[outputs[0]] = self._run(op, args, attrs, F)
            return [env[output.name].numpy() for output in self.proto.graph.output]

    def _run(self, op, args, attrs, F):
        torch = self.torch
        if op == "Conv":
            pads = attrs.get("pads", [0, 0, 0, 0])
            assert pads[:2] == pads[2:], "asymmetric pads"
            return F.conv2d(
                *args,
                stride=attrs.get("strides", 1),
                padding=pads[:2],
                groups=attrs.get("group", 1),
            )
        if op == "BatchNormalization":
            x, scale, bias, mean, var = args
            return F.batch_norm(x, mean, var, scale, bias, False, 0.0, attrs.get("epsilon", 1e-5))
        if op == "Relu":
            return F.relu(args[0])
        if op == "MaxPool":
            pads = attrs.get("pads", [0, 0, 0, 0])
            return F.max_pool2d(args[0], attrs["kernel_shape"], attrs.get("strides"), pads[:2])
        if op == "AveragePool":
            return F.avg_pool2d(args[0], attrs["kernel_shape"], attrs.get("strides"))
        if op == "Sum":
            out = args[0]
            for other in args[1:]:
                out = out + other
            return out
        if op == "Reshape":
            dims = [int(d) for d in args[1]]
            return args[0].reshape([args[0].shape[i] if d == 0 else d for i, d in enumerate(dims)])
        if op == "Gemm":
            assert attrs.get("transB") == 1
            return F.linear(args[0], args[1], args[2])
        if op == "Softmax":
            return torch.softmax(args[0], dim=attrs.get("axis", 1))
        raise NotImplementedError(f"TorchGraph: op {op}")


def make_torch(proto, feed_name: str, torch) -> Callable[[np.ndarray], list]:
    return TorchGraph(proto, torch)


@contextmanager
def single_threaded(torch):
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads() if torch is not None else None
    try:
        if torch is not None:
            torch.set_num_threads(1)
        with threadpool_limits(limits=1):
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(threads)


def contenders(proto, feed_name: str, torch) -> tuple[dict, dict]:
    """The forward functions that could be built, and an 'n/a (why)' for the others."""
    makers = {
        "nestflow": lambda: make_nestflow(proto, feed_name),
        "onnxruntime": lambda: make_onnxruntime(proto, feed_name),
        "torch": lambda: make_torch(proto, feed_name, torch),
    }
    built, missing = {}, {}
    for name, make in makers.items():
        if name == "torch" and torch is None:
            missing[name] = "n/a (torch not installed)"
            continue
        try:
            built[name] = make()
        except Exception as exc:  # report it, never fake a number
            missing[name] = unavailable(exc)
    return built, missing


def run(rounds: int = 5) -> dict:
    try:
        import torch
    except ImportError:
        torch = None
    proto, feed_name = model_proto()
    rows, notes = [], []
    with single_threaded(torch):
        built, missing = contenders(proto, feed_name, torch)
        for batch in BATCHES:
            x = image(batch)
            if "onnxruntime" in built:
                want = built["onnxruntime"](x)[1]
                for name, forward in built.items():
                    got = forward(x)[1]
                    if (
                        got.shape != want.shape
                        or np.abs(got - want).max() > 1e-4 * np.abs(want).max()
                    ):
                        notes.append(f"batch {batch}: {name}'s logits differ from onnxruntime's")
            cases = {name: (lambda f=f, x=x: f(x)) for name, f in built.items()}
            times = interleaved(cases, rounds=rounds, budget_s=0.5, warmup=1)
            ms = {name: t * 1e3 for name, t in times.items()}
            ms.update(missing)
            targets = [("torch", 2.0)] if batch == 8 else []
            rows.append(
                row(
                    f"batch {batch} forward vs onnxruntime (onnxruntime in the PyTorch column)",
                    "ms",
                    ms["nestflow"],
                    torch=ms["onnxruntime"],
                    targets=targets,
                )
            )
            rows.append(
                row(
                    f"batch {batch} forward vs PyTorch eager",
                    "ms",
                    ms["nestflow"],
                    torch=ms["torch"],
                    targets=[("torch", 1.0)] if batch == 8 else [],
                )
            )
    del built
    peaks = peak_rss()
    rows.append(
        row(
            f"peak RSS, batch {RSS_BATCH} (onnxruntime: {fmt_mib(peaks['onnxruntime'])})",
            "MiB",
            peaks["nestflow"],
            torch=peaks["torch"],
        )
    )
    return {
        "workload": "W11 ResNet-50 (light) from ONNX, forward, 1 thread",
        "rows": rows,
        "notes": notes,
    }


def fmt_mib(value) -> str:
    return f"{value:.0f} MiB" if isinstance(value, float) else str(value)


# ---- peak RSS, one child per runtime ----


def child(runtime: str) -> None:
    from w6_peak_rss import peak_rss_kib

    torch = None
    if runtime == "torch":
        import torch
    proto, feed_name = model_proto()
    with single_threaded(torch):
        if runtime == "nestflow":
            forward = make_nestflow(proto, feed_name)
        elif runtime == "onnxruntime":
            forward = make_onnxruntime(proto, feed_name)
        else:
            forward = make_torch(proto, feed_name, torch)
        del proto
        x = image(RSS_BATCH)
        for _ in range(3):
            forward(x)
    print(peak_rss_kib())


def peak_rss(rounds: int = 3) -> dict[str, float | str]:
    samples: dict[str, list] = {r: [] for r in RUNTIMES}
    for _ in range(rounds):
        for runtime in RUNTIMES:
            done = subprocess.run(
                [sys.executable, str(Path(__file__)), "--child", runtime],
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            if done.returncode != 0:
                samples[runtime].append(unavailable(RuntimeError(error_line(done.stderr))))
            else:
                samples[runtime].append(int(done.stdout.strip().splitlines()[-1]) / 1024.0)
    out = {}
    for runtime, values in samples.items():
        failed = [v for v in values if isinstance(v, str)]
        out[runtime] = failed[0] if failed else statistics.median(values)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=RUNTIMES)
    args = parser.parse_args()
    if args.child:
        child(args.child)
    else:
        main(run)
