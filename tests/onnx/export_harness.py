"""Round-trip checks of nf.onnx.export: a program is exported, the model is checked by onnx
(checker with full_check, strict shape inference) and run by onnxruntime, and every fetched
output must equal what nestflow's own run of the same (pruned, for_test) program gives.

    roundtrip(main, scope, {"x": xs}, [prediction])

`OpExport` does the same for one op appended by hand with inputs fed (batch-shaped, so every
case runs at several batch sizes, an empty batch included) or held as parameters in the scope.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import nestflow as nf

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from nestflow.onnx.exporter import build_model, inference_program  # noqa: E402

BATCHES = (1, 7, 0)


def session(model: Any) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only (a Loop that runs no step warns)
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def check_model(model: Any) -> None:
    """ONNX's own checks pass on the model (export runs them too; asserted here apart)."""
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)


def nestflow_run(program, scope, feeds: dict, fetches: Sequence) -> list[np.ndarray]:
    names = [f if isinstance(f, str) else f.name for f in fetches]
    small = inference_program(program, list(feeds), names)
    return nf.Executor().run(small, feed=feeds, fetch_list=names, scope=scope)


def compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray], names, atol, rtol) -> None:
    for name, g, w in zip(names, got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"{name}: onnxruntime gives {g.dtype}, nestflow {w.dtype}"
        assert g.shape == w.shape, (
            f"{name}: onnxruntime gives {list(g.shape)}, nestflow {list(w.shape)}"
        )
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)


def roundtrip(
    program,
    scope,
    feeds: dict,
    fetches: Sequence,
    *,
    opset: int = 17,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    runs: Sequence[dict] = (),
) -> Any:
    """Export, check, and compare onnxruntime with nestflow on `feeds` (and on each of the
    other feed dicts in `runs`, through the same model). Returns the model."""
    names = [f if isinstance(f, str) else f.name for f in fetches]
    model = build_model(program, list(feeds), names, scope, opset)
    check_model(model)
    sess = session(model)
    outputs = [o.name for o in sess.get_outputs()]
    for output, name in zip(outputs, names):
        # a fed variable that ops write again cannot give its name to the output as well
        assert output == name or (name in feeds and output.startswith(name)), (outputs, names)
    for feed in (feeds, *runs):
        got = sess.run(None, feed)
        want = nestflow_run(program, scope, feed, names)
        compare(got, want, names, atol, rtol)
    return model


# ---- one op ----


@dataclass
class Feed:
    """A fed input: `shape` with -1 for the batch dim; `make(rng, n)` gives its value for a
    batch of n (default: normal floats / small ints of `shape` with -1 -> n)."""

    shape: Sequence[int]
    dtype: str = "float32"
    make: Callable[[np.random.Generator, int], np.ndarray] | None = None
    low: int = 0
    high: int = 4

    def value(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.make is not None:
            return np.asarray(self.make(rng, n))
        shape = [n if d == -1 else d for d in self.shape]
        kind = np.dtype(self.dtype).kind
        if kind == "f":
            return rng.normal(size=shape).astype(self.dtype)
        if kind == "b":
            return rng.random(size=shape) < 0.5
        return rng.integers(self.low, self.high, size=shape).astype(self.dtype)


@dataclass
class Param:
    """An input held by a persistable variable (an initializer of the model)."""

    value: np.ndarray


@dataclass
class OpExport:
    """One op appended by hand, exported and compared at several batch sizes."""

    op_type: str
    inputs: dict[str, Any]  # slot -> Feed | Param | list of them
    attrs: dict = field(default_factory=dict)
    outputs: dict[str, int] = field(default_factory=lambda: {"Out": 1})  # slot -> count
    batches: Sequence[int] = BATCHES
    opset: int = 17
    atol: float = 1e-5
    rtol: float = 1e-5
    id: str = ""

    def check(self) -> Any:
        main = nf.Program()
        scope = nf.Scope()
        feeds: dict[str, Feed] = {}
        block = main.global_block()
        inputs: dict[str, list[str]] = {}
        for slot, specs in self.inputs.items():
            specs = specs if isinstance(specs, list) else [specs]
            names = []
            for i, spec in enumerate(specs):
                name = f"{slot.lower()}_{i}"
                if isinstance(spec, Param):
                    value = np.asarray(spec.value)
                    block.create_var(name, value.shape, value.dtype.name, persistable=True)
                    scope.var(name).get_mutable(nf.Tensor).set(value)
                else:
                    block.create_var(name, spec.shape, spec.dtype)
                    feeds[name] = spec
                names.append(name)
            inputs[slot] = names
        outputs = {
            slot: [block.create_var(f"out_{slot.lower()}_{i}").name for i in range(count)]
            for slot, count in self.outputs.items()
        }
        block.append_op(self.op_type, inputs, outputs, dict(self.attrs))
        fetches = [name for names in outputs.values() for name in names]
        rng = np.random.default_rng(0)
        runs = [{name: f.value(rng, n) for name, f in feeds.items()} for n in self.batches]
        return roundtrip(
            main,
            scope,
            runs[0],
            fetches,
            opset=self.opset,
            atol=self.atol,
            rtol=self.rtol,
            runs=runs[1:],
        )


def case_id(case: OpExport) -> str:
    return case.id or case.op_type
