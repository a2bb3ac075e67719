"""elementwise_max/min/pow (broadcasting with Fluid's axis rule, gradients, ties, PyTorch) and
matmul's 1-D operands under Fluid's rule (every rank and transpose combination)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from tests.ops.harness import OpCase, case_id
from tests.ops.test_activation_ext import nf_value_and_grads, torch_value_and_grads
from tests.ops.test_math import paddle_align

rng = np.random.default_rng(4242)


def untied(x_shape, y_shape, attrs, gap=0.05):
    """Normal X and Y whose broadcast pairs all differ by at least `gap` (no ties for max/min
    to split a central difference across)."""
    while True:
        x, y = rng.standard_normal(x_shape), rng.standard_normal(y_shape)
        if x.size == 0 or np.all(np.abs(x - paddle_align(x, y, attrs.get("axis", -1))) >= gap):
            return x, y


# (id, X shape, Y shape, attrs)
BROADCASTS = [
    ("same", (3, 4), (3, 4), {}),
    ("col_vs_row", (3, 1), (1, 4), {}),
    ("trailing", (2, 3, 4), (4,), {}),
    ("axis1", (2, 3, 4), (3,), {"axis": 1}),
    ("axis0", (2, 3, 4), (2, 3), {"axis": 0}),
    ("y_wider", (4,), (3, 4), {}),
    ("size1", (1, 1), (1,), {}),
    ("odd", (5, 7), (7,), {}),
    ("zero_d", (), (), {}),
    ("empty_batch", (0, 4), (4,), {}),
]

REFS = {"elementwise_max": np.maximum, "elementwise_min": np.minimum, "elementwise_pow": np.power}


def reference(op):
    def ref(X, Y, axis=-1):
        return {"Out": np.asarray(REFS[op](X, paddle_align(X, Y, axis)))}

    return ref


CASES = []
for name, xs, ys, attrs in BROADCASTS:
    for op in ("elementwise_max", "elementwise_min"):
        x, y = untied(xs, ys, attrs)
        CASES.append(
            OpCase(op, {"X": x, "Y": y}, reference(op), attrs, grad=("X", "Y"), id=f"{op}-{name}")
        )
    # pow: X > 0 so that dY = ln(X) * X^Y exists
    x, y = rng.uniform(0.3, 2.5, xs), rng.uniform(-2, 2, ys)
    CASES.append(
        OpCase(
            "elementwise_pow",
            {"X": x, "Y": y},
            reference("elementwise_pow"),
            attrs,
            grad=("X", "Y"),
            id=f"elementwise_pow-{name}",
        )
    )

CASES += [
    OpCase(
        op,
        {
            "X": rng.standard_normal((4, 5)).astype("float32"),
            "Y": rng.standard_normal(5).astype("float32"),
        },
        reference(op),
        id=f"{op}-float32",
    )
    for op in ("elementwise_max", "elementwise_min")
] + [
    OpCase(
        "elementwise_max",
        {"X": np.array([[1, -5, 3]], "int64"), "Y": np.array([2, -7, 3], "int64")},
        lambda X, Y: {"Out": np.array([[2, -5, 3]], "int64")},
        id="elementwise_max-int64",
    ),
    OpCase(
        "elementwise_min",
        {"X": np.array([1.0, np.nan, 3.0]), "Y": np.array([2.0, 0.0, np.nan])},
        lambda X, Y: {"Out": np.array([1.0, np.nan, np.nan])},
        id="elementwise_min-nan_wins",
    ),
    OpCase(
        "elementwise_pow",
        {"X": np.array([-2.0, -0.5, 3.0]), "Y": np.array([3.0, 2.0, -1.0])},
        lambda X, Y: {"Out": np.array([-8.0, 0.25, 1 / 3])},
        grad=("X",),  # dY needs ln(X): NaN for X < 0, as Fluid's
        id="elementwise_pow-negative_base_integer_exponent",
    ),
    OpCase(
        "elementwise_pow",
        {"X": np.array([[2, 3], [4, 5]], "int64"), "Y": np.array([3, 0], "int64")},
        lambda X, Y: {"Out": np.array([[8, 1], [64, 1]], "int64")},
        id="elementwise_pow-int64",
    ),
]


def test_ties_send_the_whole_gradient_to_y():
    """Fluid's kernels: dX = dOut where X > Y (max) / X < Y (min), dY = dOut elsewhere, so a
    tie gives it all to Y (PyTorch splits it in halves)."""
    for op in ("elementwise_max", "elementwise_min"):
        x = np.array([1.0, 2.0, 3.0])
        y = np.array([1.0, 5.0, -1.0])
        up = np.array([10.0, 20.0, 30.0])
        _, (dx, dy) = nf_value_and_grads(op, {"X": x, "Y": y}, {"axis": -1}, ["X", "Y"], up)
        wins_x = [False, False, True] if op == "elementwise_max" else [False, True, False]
        np.testing.assert_array_equal(dx, np.where(wins_x, up, 0))
        np.testing.assert_array_equal(dy, np.where(wins_x, 0, up))


@pytest.mark.parametrize("op", ["elementwise_max", "elementwise_min", "elementwise_pow"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5))])
def test_binary_ops_equal_pytorch_in_float64(op, shapes):
    torch = pytest.importorskip("torch")
    xs, ys = shapes
    if op == "elementwise_pow":
        x, y = rng.uniform(0.3, 2.5, xs), rng.uniform(-2, 2, ys)
    else:
        x, y = untied(xs, ys, {})
    fn = {"elementwise_max": torch.maximum, "elementwise_min": torch.minimum}.get(op, torch.pow)
    upstream = rng.standard_normal(np.broadcast_shapes(xs, ys))
    got, grads = nf_value_and_grads(op, {"X": x, "Y": y}, {"axis": -1}, ["X", "Y"], upstream)
    want, want_grads = torch_value_and_grads(
        lambda X, Y: fn(X, Y), {"X": x, "Y": y}, ["X", "Y"], upstream
    )
    np.testing.assert_allclose(got, want, rtol=1e-13)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_layers_take_scalars_and_act():
    x = nf.data("x", [2, 3], "float64")
    out = nf.layers.elementwise_max(x, 0.5, act="tanh")
    low = nf.layers.elementwise_min(x, 0.5)
    power = nf.layers.elementwise_pow(nf.layers.abs(x), 2.0)
    xs = rng.standard_normal((2, 3))
    got = nf.Executor().run(feed={"x": xs}, fetch_list=[out, low, power], scope=nf.Scope())
    np.testing.assert_allclose(got[0], np.tanh(np.maximum(xs, 0.5)))
    np.testing.assert_allclose(got[1], np.minimum(xs, 0.5))
    np.testing.assert_allclose(got[2], xs**2)


def test_binary_dtype_clash_and_bool_pow_fail_when_built():
    x = nf.data("x", [3], "float32")
    with pytest.raises(DTypeError, match="X is float32 but Y is float64"):
        nf.layers.elementwise_max(x, nf.data("y", [3], "float64"))
    b = nf.data("b", [3], "bool")
    with pytest.raises(DTypeError, match="bool"):
        nf.layers.elementwise_pow(b, b)
    with pytest.raises(ShapeError, match="do not broadcast"):
        nf.layers.elementwise_min(x, nf.data("z", [2], "float32"))


# ---- matmul: Fluid's rule for 1-D operands ----

M, N, K, B = 3, 4, 5, 2


def fluid_matmul_ref(X, Y, transpose_X=False, transpose_Y=False, alpha=1.0):
    """Fluid 1.8's matmul: a 1-D X is the row [1, K] and a 1-D Y the column [K, 1] before the
    transposes (so transposed, a column and a row); Out then loses the row dim of a 1-D X and
    the column dim of a 1-D Y where that dim is 1, and nothing left is [1]."""
    x = X.reshape(1, -1) if X.ndim == 1 else X
    y = Y.reshape(-1, 1) if Y.ndim == 1 else Y
    x = np.swapaxes(x, -1, -2) if transpose_X else x
    y = np.swapaxes(y, -1, -2) if transpose_Y else y
    out = np.matmul(x, y) * alpha
    shape = list(out.shape)
    if X.ndim == 1 and shape[-2] == 1:
        del shape[-2]
    if Y.ndim == 1 and shape[-1] == 1:
        del shape[-1]
    return {"Out": out.reshape(shape or [1])}


def compatible_shapes(x_rank, y_rank, transpose_X, transpose_Y):
    """X and Y shapes for the combination (Fluid's test_matmul_op.py scheme: a transposed
    vector has K = 1 on its other side)."""
    k = 1 if (x_rank == 1 and transpose_X) or (y_rank == 1 and transpose_Y) else K
    if x_rank == 1:
        xs = (M,) if transpose_X else (k,)
    else:
        xs = (B,) * (x_rank - 2) + ((k, M) if transpose_X else (M, k))
    if y_rank == 1:
        ys = (N,) if transpose_Y else (k,)
    else:
        ys = (B,) * (y_rank - 2) + ((N, k) if transpose_Y else (k, N))
    return xs, ys


COMBINATIONS = [
    (xr, yr, tx, ty)
    for xr, yr in itertools.product((1, 2, 3), repeat=2)
    if 1 in (xr, yr)
    for tx, ty in itertools.product((False, True), repeat=2)
]

MATMUL_CASES = []
for xr, yr, tx, ty in COMBINATIONS:
    xs, ys = compatible_shapes(xr, yr, tx, ty)
    attrs = {"transpose_X": tx, "transpose_Y": ty, "alpha": 1.5}
    MATMUL_CASES.append(
        OpCase(
            "matmul",
            {"X": rng.standard_normal(xs), "Y": rng.standard_normal(ys)},
            fluid_matmul_ref,
            attrs,
            grad=("X", "Y"),
            id=f"matmul-{xr}d{'T' if tx else ''}-{yr}d{'T' if ty else ''}",
        )
    )

# Out shapes spelled out: Fluid's documented examples and the squeezing corner cases.
EXPECTED_SHAPES = [
    ((K,), (K,), False, False, (1,)),
    ((K,), (K, N), False, False, (N,)),
    ((B, M, K), (K,), False, False, (B, M)),
    ((M, K), (B, K, N), False, False, (B, M, N)),
    ((M,), (1, N), True, False, (M, N)),  # a transposed vector is a column
    ((1, M), (N,), True, True, (M, N)),  # ... and a transposed Y vector a row (K = 1)
    ((M,), (N,), True, True, (M, N)),  # column times row: the outer product
    ((1,), (1, N), True, False, (N,)),  # a row dim of 1 from a 1-D X is dropped
    ((M,), (1,), True, False, (M,)),  # a column dim of 1 from a 1-D Y is dropped
    ((1,), (1,), True, False, (1,)),
    ((1, K), (K, 1), False, False, (1, 1)),  # 2-D operands never lose a dim
    ((B, 1, K), (K,), False, False, (B, 1)),
]

MATMUL_CASES += [
    OpCase(
        "matmul",
        {"X": rng.standard_normal(xs), "Y": rng.standard_normal(ys)},
        lambda X, Y, transpose_X, transpose_Y, alpha=1.0, want=want: {
            "Out": fluid_matmul_ref(X, Y, transpose_X, transpose_Y, alpha)["Out"].reshape(want)
        },
        {"transpose_X": tx, "transpose_Y": ty},
        grad=("X", "Y"),
        id=f"matmul-shape-{xs}x{ys}{'-tX' if tx else ''}{'-tY' if ty else ''}",
    )
    for xs, ys, tx, ty, want in EXPECTED_SHAPES
]


@pytest.mark.parametrize("case", CASES + MATMUL_CASES, ids=case_id)
def test_op(case):
    case.check()


@pytest.mark.parametrize("xs,ys,tx,ty,want", EXPECTED_SHAPES)
def test_matmul_out_shapes_follow_fluid(xs, ys, tx, ty, want):
    x = nf.data("x", list(xs), "float64")
    y = nf.data("y", list(ys), "float64")
    out = nf.layers.matmul(x, y, transpose_x=tx, transpose_y=ty)
    assert out.shape == want
    got = nf.Executor().run(
        feed={"x": rng.standard_normal(xs), "y": rng.standard_normal(ys)},
        fetch_list=[out],
        scope=nf.Scope(),
    )[0]
    assert got.shape == want


def test_matmul_transposed_vector_inner_dims_must_agree():
    """[4] transposed is a column [4, 1]: against [5, 4] transposed ([4, 5]) the inner dims
    1 and 4 differ."""
    x = nf.data("x", [4], "float32")
    y = nf.data("y", [5, 4], "float32")
    with pytest.raises(ShapeError, match=r"inner dims differ: X \[4\] \(k=1\) and Y \[5, 4\]"):
        nf.layers.matmul(x, y, transpose_x=True, transpose_y=True)


@pytest.mark.parametrize("tx,ty", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_gradients_are_laid_out_as_their_operands(tx, ty):
    """A transposed operand's gradient is computed in its own layout, not left as a transposed
    view (which the optimizer would then read across its rows beside the parameter)."""
    from nestflow.ops.registry import get_op_def

    op = get_op_def("matmul")
    x = rng.standard_normal((6, 4) if tx else (4, 6))
    y = rng.standard_normal((5, 6) if ty else (6, 5))
    g = rng.standard_normal((4, 5))
    dx, dy = op.backward(x, y, None, g, tx, ty, 1.0, xp=np)
    xt, yt = (x.T if tx else x), (y.T if ty else y)
    assert dx.flags.c_contiguous and dy.flags.c_contiguous
    np.testing.assert_allclose(dx, (g @ yt.T).T if tx else g @ yt.T, rtol=1e-12)
    np.testing.assert_allclose(dy, (xt.T @ g).T if ty else xt.T @ g, rtol=1e-12)
