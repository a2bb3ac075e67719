"""Every onnx_* op of nestflow.ops.onnx_compat exports back to ONNX: each op alone, exported at
every opset 13..21 that has what it needs, run by onnxruntime and compared with nestflow's run
(float32 to 1e-5) at batch sizes 1, 7 and 0; an opset that lacks it is a clear AttrError; an
ONNX model of one node imported by nf.onnx.load exports again to what the original computes;
and the registry's onnx_* ops all have a mapper or a NOT_EXPORTED reason.

(tests/onnx/test_export_onnx_compat.py covers the shape/axes ops: reshape, slice, pad, ...)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, UnknownOpError
from tests.onnx.export_harness import Feed, OpExport, Param, case_id, compare, session

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from nestflow.onnx.exporter import MAX_OPSET, MIN_OPSET, NOT_EXPORTED, build_model  # noqa: E402

OPSETS = range(MIN_OPSET, MAX_OPSET + 1)
X = Feed([-1, 3, 4])


def _i(*values, dtype="int64"):
    return Param(np.array(values, dtype))


def _f(*values):
    return Param(np.array(values, "float32"))


def _uniform(low, high, shape, dtype="float32"):
    def make(rng, n):
        return rng.uniform(low, high, [n if d == -1 else d for d in shape]).astype(dtype)

    return Feed(shape, dtype, make)


def _special(rng, n):
    """Normal floats with NaN, +inf and -inf among them."""
    x = rng.normal(size=(n, 3, 4)).astype("float32")
    flat = x.reshape(-1)
    picks = rng.integers(0, 4, flat.size)
    flat[picks == 1] = np.nan
    flat[picks == 2] = np.inf
    flat[picks == 3] = -np.inf
    return x


def _nonzero_ints(dtype):
    def make(rng, n):
        y = rng.integers(1, 5, (n, 3, 4)) * rng.choice([-1, 1], (n, 3, 4))
        return y.astype(dtype)

    return Feed([-1, 3, 4], dtype, make)


def _divisors(rng, n):
    return (rng.uniform(0.5, 2.0, (n, 3, 4)) * rng.choice([-1, 1], (n, 3, 4))).astype("float32")


def _distinct_rows(rng, n):
    """Index [n, 2, 4] of distinct positions along axis 1 of a [n, 3, 4] X (negative too)."""
    index = np.argsort(rng.random((n, 3, 4)), axis=1)[:, :2, :]
    return np.where(rng.random(index.shape) < 0.3, index - 3, index).astype("int64")


def _coordinates(rng, n):
    """Index [n, 2]: n distinct (row, column) pairs of a [5, 3, 4] X, some negative."""
    flat = rng.choice(15, n, replace=False)
    index = np.stack([flat // 3, flat % 3], axis=1)
    return np.where(rng.random(index.shape) < 0.3, index - [5, 3], index).astype("int64")


def _ints(dtype, low, high, shape=(-1, 3, 4)):
    return Feed(list(shape), dtype, low=low, high=high)


@dataclass
class Case:
    """An OpExport and the oldest opset that exports it (older ones raise AttrError)."""

    export: OpExport
    since: int = MIN_OPSET


def _case(op_type, inputs, attrs=None, since=MIN_OPSET, **kwargs) -> Case:
    return Case(OpExport(op_type, inputs, attrs or {}, **kwargs), since)


UNARY = [
    ("floor", X),
    ("ceil", X),
    ("round", _uniform(-3, 3, [-1, 3, 4])),
    ("sin", X),
    ("cos", X),
    ("tan", _uniform(-1.4, 1.4, [-1, 3, 4])),
    ("asin", _uniform(-0.99, 0.99, [-1, 3, 4])),
    ("acos", _uniform(-0.99, 0.99, [-1, 3, 4])),
    ("atan", X),
    ("sinh", X),
    ("cosh", X),
    ("asinh", X),
    ("acosh", _uniform(1.01, 5, [-1, 3, 4])),
    ("atanh", _uniform(-0.95, 0.95, [-1, 3, 4])),
]

SPECIAL = Feed([-1, 3, 4], make=_special)
SCATTER_X = Param(np.random.default_rng(5).normal(size=(5, 3, 4)).astype("float32"))
COORDS = Feed([-1, 2], "int64", _coordinates)
ROWS = Feed([-1, 2, 4], "int64", _distinct_rows)
IMAGE = Feed([-1, 2, 4, 5])

CASES = [
    *[_case(f"onnx_{name}", {"X": feed}) for name, feed in UNARY],
    _case("onnx_isnan", {"X": SPECIAL}),
    _case("onnx_isinf", {"X": SPECIAL}),
    _case("onnx_isinf", {"X": SPECIAL}, {"detect_negative": False}, id="onnx_isinf-positive"),
    _case("onnx_isinf", {"X": SPECIAL}, {"detect_positive": False}, id="onnx_isinf-negative"),
    _case("onnx_mod", {"X": X, "Y": Feed([-1, 3, 4], make=_divisors)}, id="onnx_mod-float"),
    _case(
        "onnx_mod",
        {"X": X, "Y": Feed([-1, 3, 4], make=_divisors)},
        {"fmod": True},
        id="onnx_mod-float-fmod",
    ),
    _case(
        "onnx_mod", {"X": _ints("int32", -9, 10), "Y": _nonzero_ints("int32")}, id="onnx_mod-int"
    ),
    _case(
        "onnx_mod",
        {"X": _ints("int64", -9, 10), "Y": _i(3, -2, 5, -7)},
        {"fmod": True},
        id="onnx_mod-int-fmod-broadcast",
    ),
    *[
        _case(
            f"onnx_bitwise_{name}",
            {"X": _ints(dtype, -60, 60), "Y": _ints(dtype, -60, 60)},
            since=18,
            id=f"onnx_bitwise_{name}-{dtype}",
        )
        for name in ("and", "or", "xor")
        for dtype in ("int32", "int64")
    ],
    _case(
        "onnx_bitwise_and",
        {"X": _ints("uint8", 0, 256), "Y": Param(np.array([3, 12, 255, 0], "uint8"))},
        since=18,
        id="onnx_bitwise_and-uint8-broadcast",
    ),
    _case("onnx_bitwise_not", {"X": _ints("int32", -60, 60)}, since=18),
    _case("onnx_bitwise_not", {"X": _ints("uint8", 0, 256)}, since=18, id="onnx_bitwise_not-uint8"),
    *[
        _case(
            f"onnx_shift_{direction}",
            {"X": _ints(dtype, low, high), "Y": _ints(dtype, 0, bits)},
            id=f"onnx_shift_{direction}-{dtype}",
        )
        for direction in ("left", "right")
        for dtype, low, high, bits in (
            ("int64", -(2**40), 2**40, 24),
            ("int32", -(2**20), 2**20, 12),
            ("int8", -128, 128, 8),
            ("uint8", 0, 256, 8),
            ("uint64", 0, 2**40, 24),
        )
    ],
    _case(
        "onnx_shift_right",
        {"X": _ints("int16", -3000, 3000), "Y": _i(0, 1, 5, 15, dtype="int16")},
        id="onnx_shift_right-int16-broadcast",
    ),
    _case("onnx_trilu", {"X": Feed([-1, 4, 5])}),
    _case(
        "onnx_trilu", {"X": Feed([-1, 4, 5]), "K": _i(1)}, {"upper": False}, id="onnx_trilu-lower-k"
    ),
    _case(
        "onnx_trilu", {"X": Feed([-1, 4, 5]), "K": _i(-2, dtype="int32")}, id="onnx_trilu-upper-k"
    ),
    _case(
        "onnx_trilu",
        {"X": _ints("int64", -9, 9, (2, 5, 3)), "K": _i(0)},
        {"upper": False},
        id="onnx_trilu-int",
    ),
    _case("onnx_cumsum", {"X": X, "Axis": _i(1)}),
    _case(
        "onnx_cumsum",
        {"X": X, "Axis": _i(-1, dtype="int32")},
        {"exclusive": True, "reverse": True},
        id="onnx_cumsum-exclusive-reverse",
    ),
    _case(
        "onnx_cumsum",
        {"X": _ints("int64", -9, 9), "Axis": _i(0)},
        {"reverse": True},
        id="onnx_cumsum-int-batch",
    ),
    _case("onnx_cumprod", {"X": X, "Axis": _i(2)}),
    *[
        _case(
            "onnx_cumprod",
            {"X": X, "Axis": _i(-2)},
            {"exclusive": exclusive, "reverse": reverse},
            id=f"onnx_cumprod-{exclusive}-{reverse}",
        )
        for exclusive in (False, True)
        for reverse in (False, True)
    ],
    _case(
        "onnx_cumprod",
        {"X": _ints("int64", -3, 4), "Axis": _i(0, dtype="int32")},
        {"exclusive": True},
        id="onnx_cumprod-int-batch",
    ),
    _case(
        "onnx_cumprod", {"X": Feed([-1]), "Axis": _i(0)}, {"reverse": True}, id="onnx_cumprod-rank1"
    ),
    _case("onnx_gather_elements", {"X": X, "Index": ROWS}, {"axis": 1}),
    _case(
        "onnx_gather_elements",
        {"X": X, "Index": _ints("int32", -4, 4, (-1, 3, 6))},
        {"axis": -1},
        id="onnx_gather_elements-int32-last",
    ),
    _case(
        "onnx_scatter_elements", {"X": X, "Index": ROWS, "Updates": Feed([-1, 2, 4])}, {"axis": 1}
    ),
    *[
        _case(
            "onnx_scatter_elements",
            {"X": X, "Index": _ints("int64", -4, 4, (-1, 3, 6)), "Updates": Feed([-1, 3, 6])},
            {"axis": 2, "reduction": reduction},
            since=since,
            id=f"onnx_scatter_elements-{reduction}",
        )
        for reduction, since in (("add", 16), ("mul", 16), ("max", 18), ("min", 18))
    ],
    _case("onnx_scatter_nd", {"X": SCATTER_X, "Index": COORDS, "Updates": Feed([-1, 4])}),
    _case(
        "onnx_scatter_nd",
        {
            "X": SCATTER_X,
            "Index": Feed([-1, 1], "int32", low=-5, high=5),
            "Updates": Feed([-1, 3, 4]),
        },
        {"reduction": "add"},
        since=16,
        id="onnx_scatter_nd-add-int32",
    ),
    *[
        _case(
            "onnx_scatter_nd",
            {"X": SCATTER_X, "Index": Feed([-1, 3], "int64", low=0, high=3), "Updates": Feed([-1])},
            {"reduction": reduction},
            since=since,
            id=f"onnx_scatter_nd-{reduction}",
        )
        for reduction, since in (("mul", 16), ("max", 18), ("min", 18))
    ],
    _case(
        "onnx_one_hot",
        {"Indices": _ints("int64", -5, 7, (-1, 3)), "Depth": _i(5), "Values": _f(-1, 2)},
    ),
    _case(
        "onnx_one_hot",
        {
            "Indices": _ints("int32", -4, 4, (-1, 3)),
            "Depth": _i(4, dtype="int32"),
            "Values": _i(0, 7),
        },
        {"axis": 1},
        id="onnx_one_hot-int64-values-axis1",
    ),
    _case(
        "onnx_one_hot",
        {
            "Indices": _ints("int64", -5, 7, (-1, 3)),
            "Depth": _i(5),
            "Values": Param(np.array([0.5, -2.0])),
        },
        {"axis": 0},
        id="onnx_one_hot-float64-values-axis0",
    ),
    _case(
        "onnx_one_hot",
        {
            "Indices": _ints("int64", -3, 4, (-1, 2)),
            "Depth": Param(np.array(3, "int64")),
            "Values": _i(1, 9, dtype="int32"),
        },
        {"axis": -2},
        id="onnx_one_hot-int32-values",
    ),
    _case(
        "onnx_einsum",
        {"Inputs": [X, Param(np.arange(20, dtype="float32").reshape(4, 5) / 7)]},
        {"equation": "bij,jk->bik"},
    ),
    _case(
        "onnx_einsum",
        {"Inputs": [Feed([-1, 3, 3])]},
        {"equation": "bii->bi"},
        id="onnx_einsum-diagonal",
    ),
    _case(
        "onnx_einsum",
        {"Inputs": [X, Feed([-1, 3, 4]), Feed([4])]},
        {"equation": "bij,bij,j"},
        id="onnx_einsum-implicit-three",
    ),
    _case(
        "onnx_einsum",
        {"Inputs": [_ints("int64", -5, 5), _ints("int64", -5, 5, (4, 2))]},
        {"equation": "...j,jk->...k"},
        id="onnx_einsum-int-ellipsis",
    ),
    _case("onnx_resize", {"X": IMAGE, "Scales": _f(1, 1, 2, 1.5)}),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Scales": _f(1, 1, 1.7, 0.6)},
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": "floor",
        },
        id="onnx_resize-nearest-asymmetric-floor",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Scales": _f(1, 1, 2.5, 2)},
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "align_corners",
            "nearest_mode": "round_prefer_ceil",
        },
        id="onnx_resize-nearest-corners-ceil",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Scales": _f(1, 1, 2, 0.8)},
        {"mode": "linear"},
        id="onnx_resize-linear",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Scales": _f(1, 1, 1.5, 2)},
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
        id="onnx_resize-linear-pytorch",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Sizes": _i(2, 2, 7, 3)},
        {"mode": "cubic", "coordinate_transformation_mode": "align_corners", "cubic_coeff_a": -0.5},
        batches=(2,),
        id="onnx_resize-cubic-sizes",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Scales": _f(1, 1, 2, 1.5)},
        {"mode": "cubic", "exclude_outside": True},
        id="onnx_resize-cubic-exclude",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Roi": _f(0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2), "Scales": _f(1, 1, 2, 2)},
        {
            "mode": "linear",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 5.0,
        },
        id="onnx_resize-crop",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Scales": _f(1, 1, 0.5, 0.6)},
        {"mode": "linear", "antialias": True},
        since=18,
        id="onnx_resize-antialias",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Scales": _f(2, 0.5)},
        {"mode": "linear", "axes": [2, -1]},
        since=18,
        id="onnx_resize-axes",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Sizes": _i(7, 7)},
        {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
        since=18,
        id="onnx_resize-keep-aspect",
    ),
    _case(
        "onnx_resize",
        {"X": IMAGE, "Scales": _f(1, 1, 1.5, 2)},
        {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
        since=19,
        id="onnx_resize-half-pixel-symmetric",
    ),
]


def _params(cases):
    """(case, opset) for every opset that has what the case needs."""
    return [
        pytest.param(case, opset, id=f"{case_id(case.export)}-{opset}")
        for case in cases
        for opset in OPSETS
        if opset >= case.since
    ]


@pytest.mark.parametrize(("case", "opset"), _params(CASES))
def test_onnx_compat_op_exports_at_every_opset(case, opset):
    export = case.export
    # every batch size at the newest opset; at the others one batch
    batches = export.batches if opset == MAX_OPSET else export.batches[1:2] or export.batches
    replace(export, opset=opset, batches=batches).check()


@pytest.mark.parametrize(
    ("case", "opset"),
    [
        pytest.param(case, opset, id=f"{case_id(case.export)}-{opset}")
        for case in CASES
        for opset in sorted({MIN_OPSET, case.since - 1})
        if MIN_OPSET <= opset < case.since
    ],
)
def test_an_opset_lacking_an_option_is_an_attr_error(case, opset):
    with pytest.raises(AttrError, match=f"needs ONNX opset >= {case.since}, not {opset}") as info:
        replace(case.export, opset=opset, batches=(1,)).check()
    assert info.value.location is not None  # the op's source line


def test_cumprod_over_an_axis_computed_at_run_time_is_refused():
    case = OpExport("onnx_cumprod", {"X": X, "Axis": Feed([1], "int64")})
    with pytest.raises(UnknownOpError, match="'onnx_cumprod' cannot be exported.*Axis is computed"):
        case.check()


def test_every_onnx_compat_op_has_a_mapper_or_a_reason():
    from nestflow.onnx import exporters
    from nestflow.ops.registry import registered_ops
    from tests.onnx.test_export_onnx_compat import CASES as SHAPE_CASES

    ops = {t for t in registered_ops() if t.startswith("onnx_") and not t.endswith("_grad")}
    assert len(ops) >= 44
    missing = sorted(t for t in ops if t not in exporters.MAPPERS and not NOT_EXPORTED.get(t))
    assert not missing, (
        f"onnx_* ops with neither an ONNX mapper nor a NOT_EXPORTED reason: {missing}"
    )
    tested = {c.export.op_type for c in CASES} | {c.op_type for c in SHAPE_CASES}
    untested = sorted(t for t in ops if t in exporters.MAPPERS and t not in tested)
    assert not untested, f"onnx_* ops exported but not checked by a round trip: {untested}"


# ---- ONNX models of one node: imported, exported again, the same results ----


@dataclass
class Node:
    op_type: str
    inputs: list  # arrays (graph inputs) or ("init", array) (initializers)
    attrs: dict
    opset: int
    out_dtype: int = TensorProto.FLOAT


def _model(node: Node):
    inputs, initializers, names = [], [], []
    for i, item in enumerate(node.inputs):
        name = f"in{i}"
        names.append(name)
        if isinstance(item, tuple):
            initializers.append(onnx.numpy_helper.from_array(item[1], name))
        else:
            dtype = helper.np_dtype_to_tensor_dtype(item.dtype)
            inputs.append(helper.make_tensor_value_info(name, dtype, list(item.shape)))
    graph = helper.make_graph(
        [helper.make_node(node.op_type, names, ["y"], **node.attrs)],
        "one",
        inputs,
        [helper.make_tensor_value_info("y", node.out_dtype, None)],
        initializer=initializers,
    )
    opsets = [helper.make_opsetid("", node.opset)]
    return helper.make_model(
        graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets)
    )


R = np.random.default_rng(11)
F = R.normal(size=(2, 3, 4)).astype("float32")
I32 = R.integers(-40, 40, (2, 3, 4)).astype("int32")

NODES = {
    "Sin": Node("Sin", [F], {}, 17),
    "Atanh": Node("Atanh", [np.tanh(F)], {}, 13),
    "IsInf": Node(
        "IsInf", [np.where(F > 0, F, -np.inf)], {"detect_negative": 0}, 20, TensorProto.BOOL
    ),
    "Mod": Node("Mod", [F, np.abs(F) + 0.5], {"fmod": 1}, 13),
    "BitwiseXor": Node("BitwiseXor", [I32, I32[::-1]], {}, 18, TensorProto.INT32),
    "BitShift": Node(
        "BitShift",
        [I32.astype("uint32") % 200, np.full((4,), 3, "uint32")],
        {"direction": "RIGHT"},
        18,
        TensorProto.UINT32,
    ),
    "Trilu": Node("Trilu", [F, np.array(1, np.int64)], {"upper": 0}, 14),
    "CumSum": Node("CumSum", [F, np.array(2, np.int64)], {"exclusive": 1}, 14),
    "CumProd": Node("CumProd", [F, ("init", np.array(1, np.int64))], {"reverse": 1}, 26),
    "GatherElements": Node("GatherElements", [F, R.integers(-3, 3, (2, 5, 4))], {"axis": 1}, 13),
    "ScatterElements": Node(
        "ScatterElements",
        [F, R.integers(0, 4, (2, 3, 6)), R.normal(size=(2, 3, 6)).astype("float32")],
        {"axis": 2, "reduction": "add"},
        18,
    ),
    "ScatterND": Node(
        "ScatterND",
        [F, np.array([[1, 0], [0, 2]]), R.normal(size=(2, 4)).astype("float32")],
        {},
        13,
    ),
    "OneHot": Node(
        "OneHot",
        [R.integers(-4, 4, (2, 3)), np.array(4, np.int64), np.array([0, 3], "float32")],
        {"axis": 1},
        13,
    ),
    "Einsum": Node("Einsum", [F, F], {"equation": "bij,bkj->bik"}, 13),
    "Resize": Node(
        "Resize",
        [
            R.normal(size=(1, 2, 4, 5)).astype("float32"),
            np.zeros(0, "float32"),
            np.array([1, 1, 1.5, 2], "float32"),
        ],
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        13,
    ),
}


@pytest.mark.parametrize("name", list(NODES))
def test_a_one_node_onnx_model_imported_exports_again(name):
    node = NODES[name]
    original = _model(node)
    scope = nf.Scope()
    program, feeds, fetches = nf.onnx.load(original, scope)
    ops = {op.type for op in program.global_block().ops}
    assert any(t.startswith("onnx_") for t in ops), ops  # the importer's onnx_* op is exported
    feed = {
        f: value for f, value in zip(feeds, [v for v in node.inputs if not isinstance(v, tuple)])
    }
    opset = min(max(node.opset, 18), MAX_OPSET)  # where every option the nodes use exists
    again = build_model(program, feeds, fetches, scope, opset)
    got = session(again).run(None, feed)
    want = nf.Executor().run(program, feed=feed, fetch_list=fetches, scope=scope)
    names = [f.name for f in fetches]
    compare(got, want, names, 1e-5, 1e-5)
    if node.opset <= MAX_OPSET:  # onnxruntime runs the original too
        compare(got, session(original).run(None, feed), names, 1e-5, 1e-5)
