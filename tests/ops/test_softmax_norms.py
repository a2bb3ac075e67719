"""log_softmax, logsumexp, norm (l2_normalize's op) and cos_sim: NumPy references and float64
central differences through the harness (CPUPlace and the stand-in), PyTorch where it has the
op, and build-time errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from nestflow.layers.helper import append_op
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(31)


def rand(*shape, dtype="float64"):
    return R.standard_normal(shape).astype(dtype)


def _log_softmax_ref(X, axis=-1):
    shifted = X - X.max(axis=axis, keepdims=True) if X.size else X
    if not X.size:
        return {"Out": X.copy()}
    return {"Out": shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))}


def _logsumexp_ref(X, dim=(0,), keep_dim=False, reduce_all=False):
    axes = tuple(range(X.ndim)) if reduce_all or not dim else tuple(d % X.ndim for d in dim)
    with np.errstate(divide="ignore"):
        top = X.max(axis=axes, keepdims=True) if X.size else 0.0
        top = np.where(np.isfinite(top), top, 0.0)
        out = np.log(np.exp(X - top).sum(axis=axes, keepdims=True)) + top
    out = out if keep_dim else out.reshape([d for i, d in enumerate(X.shape) if i not in axes])
    return {"Out": out.astype(X.dtype)}


def _norm_ref(X, axis=1, epsilon=1e-10, is_test=False):
    norm = np.sqrt((X * X).sum(axis=axis, keepdims=True) + epsilon)
    return {"Out": X / norm, "Norm": norm}


def _cos_sim_ref(X, Y):
    x = X.reshape(len(X), int(np.prod(X.shape[1:])))
    y = Y.reshape(len(Y), -1)
    xn = np.linalg.norm(x, axis=1, keepdims=True)
    yn = np.linalg.norm(y, axis=1, keepdims=True)
    return {"Out": (x * y).sum(axis=1, keepdims=True) / (xn * yn), "XNorm": xn, "YNorm": yn}


NEG_INF_ROW = rand(3, 4)
NEG_INF_ROW[1] = -np.inf
NEG_INF_ROW[2, :2] = -np.inf

CASES = [
    OpCase("log_softmax", {"X": rand(3, 5)}, _log_softmax_ref, grad=("X",), id="log_softmax"),
    OpCase(
        "log_softmax",
        {"X": rand(2, 3, 4)},
        _log_softmax_ref,
        {"axis": 1},
        grad=("X",),
        id="log_softmax-axis1",
    ),  # fmt: skip
    OpCase("log_softmax", {"X": rand(0, 3)}, _log_softmax_ref, grad=("X",), id="log_softmax-empty"),
    OpCase("log_softmax", {"X": rand(1, 1)}, _log_softmax_ref, grad=("X",), id="log_softmax-1"),
    OpCase(
        "log_softmax",
        {"X": 50 * rand(4, 7, dtype="float32")},
        _log_softmax_ref,
        id="log_softmax-float32-large",
    ),  # fmt: skip
    OpCase(
        "logsumexp",
        {"X": rand(3, 5)},
        _logsumexp_ref,
        {"dim": [1]},
        grad=("X",),
        id="logsumexp-dim1",
    ),  # fmt: skip
    OpCase(
        "logsumexp",
        {"X": rand(2, 3, 5)},
        _logsumexp_ref,
        {"dim": [0, 2], "keep_dim": True},
        grad=("X",),
        id="logsumexp-keep",
    ),  # fmt: skip
    OpCase(
        "logsumexp",
        {"X": rand(2, 3)},
        _logsumexp_ref,
        {"reduce_all": True},
        grad=("X",),
        id="logsumexp-all",
    ),  # fmt: skip
    OpCase(
        "logsumexp",
        {"X": rand(0, 3)},
        _logsumexp_ref,
        {"dim": [0]},
        grad=("X",),
        id="logsumexp-empty",
    ),  # fmt: skip
    OpCase(
        "logsumexp", {"X": NEG_INF_ROW}, _logsumexp_ref, {"dim": [1]}, id="logsumexp-neg-inf"
    ),  # fmt: skip
    OpCase(
        "logsumexp",
        {"X": 80 * rand(3, 4, dtype="float32")},
        _logsumexp_ref,
        {"dim": [-1]},
        id="logsumexp-float32-large",
    ),  # fmt: skip
    OpCase("norm", {"X": rand(3, 4)}, _norm_ref, grad=("X",), id="norm-axis1"),
    OpCase(
        "norm",
        {"X": rand(2, 3, 5)},
        _norm_ref,
        {"axis": -1, "epsilon": 1e-12},
        grad=("X",),
        grad_outputs=("Out", "Norm"),
        id="norm-last-both-outputs",
    ),  # fmt: skip
    OpCase("norm", {"X": rand(0, 3)}, _norm_ref, grad=("X",), id="norm-empty"),
    OpCase("norm", {"X": rand(1, 1)}, _norm_ref, {"axis": 0}, grad=("X",), id="norm-1"),
    OpCase(
        "cos_sim",
        {"X": rand(4, 3), "Y": rand(4, 3)},
        _cos_sim_ref,
        grad=("X", "Y"),
        grad_outputs=("Out",),
        id="cos_sim",
    ),  # fmt: skip
    OpCase(
        "cos_sim",
        {"X": rand(5, 2, 3), "Y": rand(1, 2, 3)},
        _cos_sim_ref,
        grad=("X", "Y"),
        grad_outputs=("Out",),
        id="cos_sim-one-y-row",
    ),  # fmt: skip
    OpCase(
        "cos_sim",
        {"X": rand(0, 3), "Y": rand(1, 3)},
        _cos_sim_ref,
        grad=("X",),
        grad_outputs=("Out",),
        id="cos_sim-empty",
    ),  # fmt: skip
    OpCase(
        "cos_sim",
        {"X": rand(1, 1), "Y": rand(1, 1)},
        _cos_sim_ref,
        grad=("X", "Y"),
        grad_outputs=("Out",),
        id="cos_sim-1",
    ),  # fmt: skip
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


def test_log_softmax_and_logsumexp_equal_torch():
    torch = pytest.importorskip("torch")
    x = rand(3, 4, 5)
    for axis in (0, 1, -1):
        got = _run("log_softmax", x, {"axis": axis})
        want = torch.log_softmax(torch.from_numpy(x), dim=axis).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    got = _run("logsumexp", x, {"dim": [0, 2], "keep_dim": True})
    want = torch.logsumexp(torch.from_numpy(x), dim=(0, 2), keepdim=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _run(op_type, x, attrs):
    with nf.program_guard(nf.Program(), nf.Program()):
        v = nf.data("x", list(x.shape), str(x.dtype))
        out = append_op(op_type, {"X": v}, attrs)
        return nf.Executor().run(feed={"x": x}, fetch_list=[out])[0]


@pytest.mark.parametrize(
    "op_type, shapes, dtype, attrs, error, words",
    [
        ("log_softmax", ([2, 3],), "int64", {}, DTypeError, "floating-point X"),
        ("log_softmax", ([2, 3],), "float32", {"axis": 2}, ShapeError, "axis 2"),
        ("logsumexp", ([2, 3],), "float32", {"dim": [3]}, ShapeError, "dim 3"),
        ("norm", ([2, 3],), "float32", {"axis": -3}, ShapeError, "axis -3"),
        ("cos_sim", ([2, 3], [2, 4]), "float32", {}, ShapeError, "rows hold 3 and 4"),
        ("cos_sim", ([2, 3], [3, 3]), "float32", {}, ShapeError, "a single row"),
        ("cos_sim", ([2, 3], [2, 3]), "int32", {}, DTypeError, "floating-point"),
    ],
)
def test_bad_inputs_are_errors_naming_the_op(op_type, shapes, dtype, attrs, error, words):
    with nf.program_guard(nf.Program(), nf.Program()):
        inputs = {s: nf.data(s.lower(), shape, dtype) for s, shape in zip("XY", shapes)}
        outputs = {"cos_sim": ("Out", "XNorm", "YNorm"), "norm": ("Out", "Norm")}
        with pytest.raises(error, match=op_type) as raised:
            append_op(op_type, inputs, attrs, outputs=outputs.get(op_type, ("Out",)))
        assert words in str(raised.value)
