"""The importer's onnx_* ops (nestflow.ops.onnx_compat) export back to their ONNX operators:
onnxruntime equals nestflow on random inputs, batch sizes 1, 7 and 0, old and new opsets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from nestflow.errors import AttrError
from tests.onnx.export_harness import Feed, OpExport, Param, case_id

pytest.importorskip("onnxruntime")

R = np.random.default_rng(3)
X = Feed([-1, 3, 4])


def _i(*values):
    return Param(np.array(values, np.int64))


def _reduce(kind, axes=None, **attrs):
    inputs = {"X": X} if axes is None else {"X": X, "Axes": _i(*axes)}
    name = f"onnx_reduce-{kind}-{axes}-{'-'.join(attrs)}"
    return OpExport("onnx_reduce", inputs, {"kind": kind, **attrs}, id=name)


CASES = [
    OpExport("onnx_erf", {"X": X}),
    OpExport("onnx_log_softmax", {"X": X}, {"axis": 1}),
    OpExport("onnx_reshape", {"X": X, "Shape": _i(0, 12)}),
    OpExport("onnx_reshape", {"X": X, "Shape": _i(-1, 2, 6)}, id="onnx_reshape-inferred"),
    OpExport(
        "onnx_reshape",
        {"X": Param(np.zeros((2, 0, 3), "f4")), "Shape": _i(0, 3, 0)},
        {"allowzero": True},
        batches=(1,),
        id="onnx_reshape-allowzero",
    ),
    OpExport(
        "onnx_constant_of_shape",
        {"Input": Param(np.array([2, 3], "int32"))},
        {"value": 1.5},
        batches=(1,),
    ),
    OpExport("onnx_unsqueeze", {"X": X, "Axes": _i(0, -1)}),
    OpExport("onnx_squeeze", {"X": Feed([-1, 1, 4, 1]), "Axes": _i(-1, 1)}),
    OpExport("onnx_squeeze", {"X": Feed([-1, 1, 4, 1])}, batches=(7,), id="onnx_squeeze-all"),
    OpExport("onnx_tile", {"X": X, "Repeats": _i(1, 2, 3)}),
    OpExport("onnx_slice", {"Input": X, "Starts": _i(1), "Ends": _i(3), "Axes": _i(1)}),
    OpExport(
        "onnx_slice",
        {
            "Input": X,
            "Starts": _i(-1, 0),
            "Ends": _i(-100, 9),
            "Axes": _i(2, 1),
            "Steps": _i(-2, 2),
        },
        id="onnx_slice-steps",
    ),
    OpExport(
        "onnx_slice",
        {"Input": X, "Starts": _i(0, 1), "Ends": _i(9, 3), "Steps": _i(1, 1)},
        id="onnx_slice-steps-default-axes",
    ),
    OpExport("onnx_gather", {"X": X, "Index": _i(0, -1)}, {"axis": 2}),
    OpExport(
        "onnx_gather",
        {"X": X, "Index": Param(np.array([[1, 0], [2, -3]]))},
        {"axis": 1},
        id="onnx_gather-2d",
    ),
    OpExport("onnx_split", {"X": Feed([-1, 7])}, {"axis": 1, "num": 3}, outputs={"Out": 3}),
    OpExport(
        "onnx_split",
        {"X": Feed([-1, 7]), "Split": _i(2, 5)},
        {"axis": -1, "num": 2},
        outputs={"Out": 2},
        id="onnx_split-sizes",
    ),
    OpExport("onnx_pad", {"X": X, "Pads": _i(0, 1, 2, 0, 2, 1)}),
    OpExport(
        "onnx_pad",
        {"X": X, "Pads": _i(1, 2, 0, 1), "Axes": _i(1, -1), "Value": Param(np.array([2.5], "f4"))},
        id="onnx_pad-axes-value",
    ),
    OpExport(
        "onnx_pad",
        {"X": X, "Pads": _i(0, 2, 1, 0, 1, 2)},
        {"mode": "reflect"},
        batches=(1, 7),
        id="onnx_pad-reflect",
    ),
    OpExport(
        "onnx_pad",
        {"X": X, "Pads": _i(0, 2, 1, 0, 1, 2)},
        {"mode": "edge"},
        batches=(1, 7),
        id="onnx_pad-edge",
    ),
    OpExport(
        "onnx_pad",
        {"X": X, "Pads": _i(0, 2, 1, 0, 1, 2)},
        {"mode": "wrap"},
        opset=19,
        batches=(1, 7),
        id="onnx_pad-wrap",
    ),
    *[_reduce(kind, [1]) for kind in ("sum", "mean", "max", "min", "prod")],
    _reduce("sum", [0, -1], keepdims=False),
    _reduce("mean", None, keepdims=False),
    _reduce("max", [], noop_with_empty_axes=True),
]

# cases whose axes or sizes older opsets take differently (attributes, no num_outputs)
OLD_OPSET = [
    "onnx_split",
    "onnx_pad-axes-value",
    "onnx_reduce-max-[1]-",
    "onnx_reduce-mean-None-keepdims",
    "onnx_reduce-max-[]-noop_with_empty_axes",
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_onnx_compat_op_exports(case):
    case.check()


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("case", [c for c in CASES if case_id(c) in OLD_OPSET], ids=case_id)
def test_onnx_compat_op_exports_under_other_opsets(case, opset):
    replace(case, opset=opset, batches=(1, 7)).check()


def test_options_older_opsets_lack_are_errors():
    with pytest.raises(AttrError, match="wrap mode needs ONNX opset >= 19"):
        wrap = next(c for c in CASES if case_id(c) == "onnx_pad-wrap")
        replace(wrap, opset=18).check()
    with pytest.raises(AttrError, match="allowzero needs ONNX opset >= 14"):
        OpExport(
            "onnx_reshape",
            {"X": X, "Shape": _i(0, 12)},
            {"allowzero": True},
            opset=13,
        ).check()
    with pytest.raises(AttrError, match="run time needs ONNX opset >= 18"):
        OpExport(
            "onnx_reduce", {"X": X, "Axes": Feed([1], "int64")}, {"kind": "max"}, opset=17
        ).check()
