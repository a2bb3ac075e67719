"""Arithmetic ops against NumPy: elementwise_* (broadcasting, Paddle axis), scale, square,
matmul, mul, sum; float64 numeric gradients for every differentiable input."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import DTypeError, ShapeError
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(2024)


def normal(*shape, dtype="float64"):
    return rng.standard_normal(shape).astype(dtype)


def away_from_zero(*shape, dtype="float64"):
    """Divisors: |y| in [0.5, 2], random sign."""
    size = rng.uniform(0.5, 2.0, shape)
    return (size * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def paddle_align(X, Y, axis):
    """Paddle's axis rule: Y's dims sit at X's dims axis .. axis + Y.ndim - 1."""
    if axis < 0 or Y.ndim >= X.ndim:
        return Y
    return Y.reshape((1,) * axis + Y.shape + (1,) * (X.ndim - axis - Y.ndim))


BINARY = {
    "elementwise_add": np.add,
    "elementwise_sub": np.subtract,
    "elementwise_mul": np.multiply,
    "elementwise_div": np.divide,
}

# (id, X shape, Y shape, attrs)
BROADCASTS = [
    ("same", (3, 4), (3, 4), {}),
    ("col_vs_row", (3, 1), (1, 4), {}),
    ("trailing", (2, 3, 4), (4,), {}),
    ("axis1", (2, 3, 4), (3,), {"axis": 1}),
    ("axis0", (2, 3, 4), (2, 3), {"axis": 0}),
    ("axis1_2d", (2, 3, 4), (3, 4), {"axis": 1}),
    ("scalar_like", (3, 4), (1,), {}),
    ("y_wider", (4,), (3, 4), {}),
    ("size1", (1, 1), (1,), {}),
    ("zero_d", (), (), {}),
    ("empty_batch", (0, 4), (4,), {}),
    ("empty_axis0", (0, 3), (0, 1), {"axis": 0}),
]


def binary_cases():
    cases = []
    for op, fn in BINARY.items():

        def reference(X, Y, axis=-1, fn=fn):
            return {"Out": fn(X, paddle_align(X, Y, axis))}

        make_y = away_from_zero if op == "elementwise_div" else normal
        for name, xs, ys, attrs in BROADCASTS:
            cases.append(
                OpCase(
                    op,
                    {"X": normal(*xs), "Y": make_y(*ys)},
                    reference,
                    attrs,
                    grad=("X", "Y"),
                    id=f"{op}-{name}",
                )
            )
        cases.append(
            OpCase(
                op,
                {"X": normal(3, 4, dtype="float32"), "Y": make_y(4, dtype="float32")},
                reference,
                id=f"{op}-float32",
            )
        )
        cases.append(
            OpCase(
                op,
                {"X": normal(2, 3), "Y": make_y(2, 1)},
                reference,
                grad=("Y",),
                id=f"{op}-only_y_grad",
            )
        )
    ints = {"X": rng.integers(-5, 5, (2, 3)), "Y": rng.integers(1, 5, (3,))}
    cases.append(OpCase("elementwise_add", ints, lambda X, Y: {"Out": X + Y}, id="add-int64"))
    # Integers keep their dtype (as inferred): the integer kernel divides truncating toward
    # zero, like Paddle's C++ kernel and `x / 2` on an int variable (scale, then cast back).
    signed = {"X": np.array([[7, -7, 6], [-1, 0, 9]]), "Y": np.array([2, 2, -4])}
    cases.append(
        OpCase(
            "elementwise_div",
            signed,
            lambda X, Y: {"Out": np.trunc(X / Y).astype(X.dtype)},
            id="div-int64-truncates",
        )
    )
    cases.append(
        OpCase(
            "elementwise_div",
            {"X": np.array([5, -5, 4], np.int32), "Y": np.array([3], np.int32)},
            lambda X, Y: {"Out": np.array([1, -1, 1], np.int32)},
            id="div-int32-broadcast",
        )
    )
    return cases


def matmul_ref(X, Y, transpose_X=False, transpose_Y=False, alpha=1.0):
    x = np.swapaxes(X, -1, -2) if transpose_X and X.ndim > 1 else X
    y = np.swapaxes(Y, -1, -2) if transpose_Y and Y.ndim > 1 else Y
    return {"Out": np.matmul(x, y) * np.asarray(alpha, X.dtype)}


# (id, X shape, Y shape, attrs)
MATMULS = [
    ("2d", (3, 4), (4, 5), {}),
    ("transpose_x", (4, 3), (4, 5), {"transpose_X": True}),
    ("transpose_both", (4, 3), (5, 4), {"transpose_X": True, "transpose_Y": True}),
    ("alpha", (3, 4), (4, 2), {"alpha": 2.5}),
    ("batched", (2, 3, 4), (2, 4, 5), {}),
    ("batch_broadcast", (2, 1, 3, 4), (5, 4, 2), {}),
    ("batch_vs_2d", (2, 3, 4), (4, 5), {}),
    ("vec_mat", (4,), (4, 5), {}),
    ("mat_vec", (3, 4), (4,), {}),
    # Other 1-D operands (vec @ vec -> [1], transposed vectors) follow Fluid's rule, which
    # np.matmul does not: tests/ops/test_math_ext.py.
    ("size1", (1, 1), (1, 1), {}),
    ("empty_batch", (0, 3), (3, 2), {}),
]

MATH_CASES = binary_cases() + [
    OpCase(
        "matmul",
        {"X": normal(*xs), "Y": normal(*ys)},
        matmul_ref,
        attrs,
        grad=("X", "Y"),
        id=f"matmul-{name}",
    )
    for name, xs, ys, attrs in MATMULS
]

MATH_CASES += [
    OpCase(
        "matmul",
        {"X": normal(2, 3, 4), "Y": normal(4, 2)},
        matmul_ref,
        grad=("Y",),
        id="matmul-only_y_grad",
    ),
    OpCase(
        "matmul",
        {"X": normal(3, 4, dtype="float32"), "Y": normal(4, 2, dtype="float32")},
        matmul_ref,
        {"alpha": 0.5},
        id="matmul-float32",
    ),
]


def mul_ref(X, Y, x_num_col_dims=1, y_num_col_dims=1):
    rows = int(np.prod(X.shape[:x_num_col_dims]))
    inner = int(np.prod(Y.shape[:y_num_col_dims]))
    out = X.reshape(rows, inner) @ Y.reshape(inner, -1)
    return {"Out": out.reshape(X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:])}


MULS = [
    ("2d", (3, 4), (4, 5), {}),
    ("flatten_x", (2, 3, 4), (12, 5), {}),
    ("x_col_dims2", (2, 3, 4), (4, 5), {"x_num_col_dims": 2}),
    ("y_col_dims2", (3, 6), (2, 3, 5), {"y_num_col_dims": 2}),
    ("2d_x_col_dims2", (3, 4), (1, 2), {"x_num_col_dims": 2}),
    ("empty_batch", (0, 4), (4, 3), {}),
]
MATH_CASES += [
    OpCase(
        "mul",
        {"X": normal(*xs), "Y": normal(*ys)},
        mul_ref,
        attrs,
        grad=("X", "Y"),
        id=f"mul-{name}",
    )
    for name, xs, ys, attrs in MULS
]
MATH_CASES.append(
    OpCase(
        "mul",
        {"X": normal(2, 3, dtype="float32"), "Y": normal(3, 4, dtype="float32")},
        mul_ref,
        id="mul-float32",
    )
)


def scale_ref(X, scale=1.0, bias=0.0, bias_after_scale=True):
    out = X * scale + bias if bias_after_scale else (X + bias) * scale
    return {"Out": out.astype(X.dtype)}


MATH_CASES += [
    OpCase("scale", {"X": normal(3, 4)}, scale_ref, {"scale": 2.5, "bias": 0.5}, grad=("X",)),
    OpCase(
        "scale",
        {"X": normal(3, 4)},
        scale_ref,
        {"scale": -1.5, "bias": 2.0, "bias_after_scale": False},
        grad=("X",),
        id="scale-bias_first",
    ),
    OpCase("scale", {"X": normal(0, 4)}, scale_ref, {"scale": 3.0}, grad=("X",), id="scale-empty"),
    OpCase("scale", {"X": normal()}, scale_ref, {"scale": 3.0}, grad=("X",), id="scale-0d"),
    OpCase(
        "scale",
        {"X": normal(2, 3, dtype="float32")},
        scale_ref,
        {"scale": 0.1, "bias": 1.0},
        id="scale-float32",
    ),
    OpCase(
        "scale",
        {"X": rng.integers(-9, 9, (4,))},
        scale_ref,
        {"scale": 2.0, "bias": 1.0},
        id="scale-int64",
    ),
    OpCase("square", {"X": normal(3, 4)}, lambda X: {"Out": X * X}, grad=("X",)),
    OpCase("square", {"X": normal(0, 2)}, lambda X: {"Out": X * X}, grad=("X",), id="square-empty"),
    OpCase("square", {"X": normal(1)}, lambda X: {"Out": X * X}, grad=("X",), id="square-size1"),
    OpCase(
        "square",
        {"X": normal(2, 5, dtype="float32")},
        lambda X: {"Out": X * X},
        id="square-float32",
    ),
    OpCase(
        "sum",
        {"X": [normal(3, 4), normal(3, 4), normal(3, 4)]},
        lambda X: {"Out": X[0] + X[1] + X[2]},
        grad=("X",),
        id="sum-three",
    ),
    OpCase("sum", {"X": [normal(2, 3)]}, lambda X: {"Out": X[0]}, grad=("X",), id="sum-one"),
    OpCase(
        "sum",
        {"X": [normal(2, 3), normal(1, 3), normal(3)]},
        lambda X: {"Out": X[0] + X[1] + X[2]},
        grad=("X",),
        id="sum-broadcast",
    ),
    OpCase(
        "sum",
        {"X": [normal(0, 3), normal(0, 3)]},
        lambda X: {"Out": X[0] + X[1]},
        grad=("X",),
        id="sum-empty",
    ),
    OpCase(
        "sum",
        {"X": [normal(4, dtype="float32"), normal(4, dtype="float32")]},
        lambda X: {"Out": X[0] + X[1]},
        id="sum-float32",
    ),
]


@pytest.mark.parametrize("case", MATH_CASES, ids=case_id)
def test_op(case):
    case.check()


def test_sum_of_one_input_does_not_alias_it():
    x = np.ones((2, 2))
    out = nf.ops.get_op_def("sum").forward([x], xp=np)
    out += 1
    np.testing.assert_array_equal(x, np.ones((2, 2)))


# ---- build-time errors ----

L = nf.layers


def test_elementwise_shape_mismatch_names_both_shapes_and_the_op():
    x = L.data("x", [-1, 3], "float32")
    y = L.data("y", [4], "float32")
    with pytest.raises(ShapeError) as err:
        L.elementwise_add(x, y)
    text = str(err.value)
    assert "elementwise_add" in text and "[-1, 3]" in text and "[4]" in text
    assert "test_math.py" in text


def test_elementwise_axis_past_the_end_of_x():
    x = L.data("x", [2, 3, 4], "float32")
    y = L.data("y", [3, 4], "float32")
    with pytest.raises(ShapeError, match=r"axis=2 puts Y \[3, 4\] past the end of X \[2, 3, 4\]"):
        L.elementwise_add(x, y, axis=2)


def test_elementwise_dtype_mismatch_is_a_dtype_error():
    x = L.data("x", [2], "float32")
    y = L.data("y", [2], "float64")
    with pytest.raises(DTypeError, match="X is float32 but Y is float64"):
        L.elementwise_mul(x, y)


def test_matmul_inner_dims_mismatch():
    x = L.data("x", [3, 4], "float32")
    y = L.data("y", [5, 2], "float32")
    with pytest.raises(ShapeError, match=r"X \[3, 4\] \(k=4\) and Y \[5, 2\] \(k=5\)"):
        L.matmul(x, y)


def test_mul_columns_must_match_rows():
    block = nf.default_main_program().global_block()
    block.create_var("x", shape=(2, 3, 4), dtype="float32")
    block.create_var("y", shape=(5, 2), dtype="float32")
    with pytest.raises(ShapeError, match=r"X \[2, 3, 4\] flattened at dim 1 has 12 columns"):
        block.append_op("mul", {"X": "x", "Y": "y"}, {"Out": "out"})


def test_sum_inputs_must_share_a_dtype():
    block = nf.default_main_program().global_block()
    block.create_var("a", shape=(2,), dtype="float32")
    block.create_var("b", shape=(2,), dtype="float64")
    with pytest.raises(DTypeError, match="float32 and float64"):
        block.append_op("sum", {"X": ["a", "b"]}, {"Out": "out"})


@pytest.mark.parametrize(
    "x_shape,y_shape,axis",
    [
        ((4, 3, 5, 6), (3,), 1),  # a conv bias
        ((4, 3, 5, 6), (3, 5), 1),
        ((2, 4, 3, 5, 6), (4, 3), 1),
        ((4, 3, 2, 2), (3,), 1),  # 4 trailing elements: left as it is
        ((0, 3, 5, 6), (3,), 1),  # empty batch
        ((4, 3, 5, 6), (4, 3), 0),  # no leading axes: left as it is
        ((4, 3, 5, 6), (1,), 1),  # Y broadcasts itself: left as it is
    ],
)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "max", "min", "pow"])
def test_spread_operands_and_bias_sums_equal_plain_broadcasting(x_shape, y_shape, axis, op):
    """spread_y changes the loops of a Fluid-axis broadcast, not its values; unbroadcast's
    dot-product sums over leading and trailing axes match NumPy's sum to rounding."""
    from nestflow.ops import math as math_ops
    from nestflow.ops.registry import get_op_def

    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 2.0, x_shape).astype("float64")
    y = rng.uniform(0.5, 2.0, y_shape).astype("float64")
    aligned = math_ops.align_y(x.ndim, y, axis)
    ufunc = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}.get(
        op, {"max": np.maximum, "min": np.minimum, "pow": np.power}.get(op)
    )
    out = get_op_def(f"elementwise_{op}").forward(x, y, axis, np)
    np.testing.assert_array_equal(out, ufunc(x, aligned))
    grad = rng.standard_normal(out.shape)
    full = (1,) * (x.ndim - aligned.ndim) + aligned.shape
    summed = tuple(i for i, d in enumerate(full) if d == 1 and x.shape[i] != 1)
    want = grad.sum(axis=summed, keepdims=True)
    got = math_ops.unbroadcast(grad, aligned.shape)
    assert got.shape == aligned.shape
    np.testing.assert_allclose(got, want.reshape(aligned.shape), rtol=1e-12, atol=1e-12)
