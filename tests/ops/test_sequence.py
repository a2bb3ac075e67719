"""Sequence ops over padded batches (sequence_pool, sequence_mask, sequence_reverse) against
NumPy loops over each row's valid steps: values, inferred shapes, float64 central-difference
gradients, and the errors for bad lengths at build and run time."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(11)


def normal(*shape, dtype="float64"):
    return R.standard_normal(shape).astype(dtype)


def lengths(*values, dtype="int64"):
    return np.array(values, dtype=dtype)


# ---- sequence_pool ----


def pool_ref(X, Length=None, pooltype="AVERAGE", is_test=False, pad_value=0.0):
    """Row by row over the valid steps, as Fluid's LoD kernels pool each sequence."""
    n = X.shape[0]
    lens = np.full(n, X.shape[1]) if Length is None else Length
    out = np.empty((n, *X.shape[2:]), X.dtype)
    index = np.zeros((n, *X.shape[2:]), np.int32)
    for row in range(n):
        seq = X[row, : lens[row]]
        if len(seq) == 0:
            out[row] = pad_value
            index[row] = -1
            continue
        if pooltype == "SUM":
            out[row] = seq.sum(axis=0)
        elif pooltype == "AVERAGE":
            out[row] = seq.sum(axis=0) / len(seq)
        elif pooltype == "SQRT":
            out[row] = seq.sum(axis=0) / np.sqrt(len(seq))
        elif pooltype == "MAX":
            out[row] = seq.max(axis=0)
            index[row] = seq.argmax(axis=0)
        elif pooltype == "FIRST":
            out[row] = seq[0]
        else:
            out[row] = seq[-1]
    result = {"Out": out}
    if pooltype == "MAX":
        result["MaxIndex"] = index
    return result


POOL_CASES = [
    OpCase("sequence_pool", {"X": normal(4, 6, 3), "Length": lengths(6, 1, 3, 4)}, pool_ref,
           attrs={"pooltype": kind}, grad=("X",), id=f"sequence_pool-{kind.lower()}")
    for kind in ("SUM", "AVERAGE", "SQRT", "MAX", "FIRST", "LAST")
] + [
    OpCase("sequence_pool", {"X": normal(3, 5, 2, 2), "Length": lengths(0, 5, 2)}, pool_ref,
           attrs={"pooltype": kind, "pad_value": -1.5}, grad=("X",),
           id=f"sequence_pool-{kind.lower()}-empty_row_4d")
    for kind in ("SUM", "AVERAGE", "SQRT", "MAX", "FIRST", "LAST")
] + [
    OpCase("sequence_pool", {"X": normal(3, 4)}, pool_ref, attrs={"pooltype": "SQRT"},
           grad=("X",), id="sequence_pool-no_length_2d"),
    OpCase("sequence_pool", {"X": normal(2, 7, 3), "Length": lengths(7, 2, dtype="int32")},
           pool_ref, attrs={"pooltype": "MAX"}, grad=("X",), id="sequence_pool-max-int32_length"),
    OpCase("sequence_pool", {"X": normal(1, 1, 1), "Length": lengths(1)}, pool_ref,
           attrs={"pooltype": "LAST"}, grad=("X",), id="sequence_pool-size1"),
    OpCase("sequence_pool", {"X": normal(0, 3, 2), "Length": lengths()}, pool_ref,
           attrs={"pooltype": "MAX"}, grad=("X",), id="sequence_pool-empty_batch"),
    OpCase("sequence_pool", {"X": normal(2, 0, 2), "Length": lengths(0, 0)}, pool_ref,
           attrs={"pooltype": "MAX", "pad_value": 3.0}, grad=("X",), id="sequence_pool-no_steps"),
    OpCase("sequence_pool", {"X": normal(3, 4, 5, dtype="float32"), "Length": lengths(1, 4, 2)},
           pool_ref, attrs={"pooltype": "AVERAGE"}, id="sequence_pool-float32"),
]  # fmt: skip


def test_sequence_pool_max_takes_the_first_of_equal_maxima_and_gives_it_the_gradient():
    x = np.array([[[1.0], [3.0], [3.0], [9.0]]])
    case = OpCase("sequence_pool", {"X": x, "Length": lengths(3)}, pool_ref,
                  attrs={"pooltype": "MAX"})  # fmt: skip
    assert pool_ref(x, lengths(3), "MAX")["MaxIndex"].tolist() == [[1]]
    case.check()
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        xv = nf.data("x", [-1, 4, 1], "float64", stop_gradient=False)
        n = nf.data("n", [-1], "int64")
        nf.append_backward(nf.layers.reduce_sum(nf.layers.sequence_pool(xv, "max", n)))
    (grad,) = nf.Executor().run(main, feed={"x": x, "n": lengths(3)}, fetch_list=["x@GRAD"])
    assert grad.ravel().tolist() == [0.0, 1.0, 0.0, 0.0]


# ---- sequence_mask ----


def mask_ref(X, MaxLenTensor=None, maxlen=-1, out_dtype="int64"):
    width = int(MaxLenTensor.reshape(-1)[0]) if MaxLenTensor is not None else maxlen
    width = int(X.max()) if width < 0 else width
    out = np.zeros((*X.shape, width), out_dtype)
    for index in np.ndindex(X.shape):
        out[index][: X[index]] = 1
    return {"Y": out}


MASK_CASES = [
    OpCase("sequence_mask", {"X": lengths(3, 0, 5)}, mask_ref, id="sequence_mask-maxlen_from_x"),
    OpCase("sequence_mask", {"X": lengths(3, 0, 5)}, mask_ref,
           attrs={"maxlen": 7, "out_dtype": "float32"}, id="sequence_mask-maxlen_float32"),
    OpCase("sequence_mask", {"X": lengths(3, 6, 1)}, mask_ref, attrs={"maxlen": 4},
           id="sequence_mask-lengths_past_maxlen"),
    OpCase("sequence_mask", {"X": lengths(2, 1, dtype="int32"), "MaxLenTensor": lengths(3)},
           mask_ref, attrs={"out_dtype": "bool"}, id="sequence_mask-maxlen_tensor_bool"),
    OpCase("sequence_mask", {"X": np.array([[1, 2], [0, 3]])}, mask_ref,
           attrs={"out_dtype": "float64"}, id="sequence_mask-2d"),
    OpCase("sequence_mask", {"X": lengths()}, mask_ref, attrs={"maxlen": 2},
           id="sequence_mask-empty"),
]  # fmt: skip


# ---- sequence_reverse ----


def reverse_ref(X, Length=None):
    out = X.copy()
    for row in range(X.shape[0]):
        n = X.shape[1] if Length is None else Length[row]
        out[row, :n] = X[row, :n][::-1]
    return {"Y": out}


REVERSE_CASES = [
    OpCase("sequence_reverse", {"X": normal(4, 5, 3), "Length": lengths(5, 0, 2, 1)},
           reverse_ref, grad=("X",), id="sequence_reverse-3d"),
    OpCase("sequence_reverse", {"X": normal(2, 4), "Length": lengths(3, 4, dtype="int32")},
           reverse_ref, grad=("X",), id="sequence_reverse-2d-int32_length"),
    OpCase("sequence_reverse", {"X": normal(2, 3, 2, 2)}, reverse_ref, grad=("X",),
           id="sequence_reverse-no_length_4d"),
    OpCase("sequence_reverse", {"X": normal(0, 3, 2), "Length": lengths()}, reverse_ref,
           grad=("X",), id="sequence_reverse-empty_batch"),
    OpCase("sequence_reverse", {"X": R.integers(0, 9, (2, 3)), "Length": lengths(2, 3)},
           reverse_ref, id="sequence_reverse-int64_values"),
]  # fmt: skip


@pytest.mark.parametrize("case", POOL_CASES + MASK_CASES + REVERSE_CASES, ids=case_id)
def test_op(case):
    case.check()


# ---- errors ----


def _one_op(op_type, feeds: dict, attrs=None, outputs=("Out",)):
    program = nf.Program()
    block = program.global_block()
    inputs = {}
    for slot, (shape, dtype) in feeds.items():
        inputs[slot] = [block.create_var(f"in_{slot}", shape, dtype)]
    outs = {slot: [block.create_var(f"out_{slot}")] for slot in outputs}
    block.append_op(op_type, inputs, outs, attrs or {})
    return program


@pytest.mark.parametrize("op_type", ["sequence_pool", "sequence_reverse"])
def test_lengths_of_the_wrong_kind_fail_at_build_time(op_type):
    outputs = ("Out",) if op_type == "sequence_pool" else ("Y",)
    with pytest.raises(DTypeError, match="Length must be int32 or int64, got float32"):
        _one_op(op_type, {"X": ([3, 4, 2], "float64"), "Length": ([3], "float32")}, None, outputs)
    with pytest.raises(ShapeError, match=r"has 2 lengths but X \[3, 4, 2\] has 3 rows"):
        _one_op(op_type, {"X": ([3, 4, 2], "float64"), "Length": ([2], "int64")}, None, outputs)
    with pytest.raises(ShapeError, match=r"must be \[batch\]"):
        _one_op(op_type, {"X": ([3, 4], "float64"), "Length": ([3, 1], "int64")}, None, outputs)
    with pytest.raises(ShapeError, match=r"padded \[batch, time, ...\]"):
        _one_op(op_type, {"X": ([3], "float64")}, None, outputs)


def test_sequence_pool_bad_attrs_and_dtypes():
    feeds = {"X": ([3, 4], "float64")}
    with pytest.raises(AttrError, match="pooltype must be one of"):
        _one_op("sequence_pool", feeds, {"pooltype": "MEDIAN"})
    with pytest.raises(DTypeError, match="floating-point X, got int64"):
        _one_op("sequence_pool", {"X": ([3, 4], "int64")})
    with pytest.raises(DTypeError, match="lengths\\) must be int32 or int64, got float32"):
        _one_op("sequence_mask", {"X": ([3], "float32")}, outputs=("Y",))


def _run(op_type, x, length, outputs=("Out",)):
    program = _one_op(
        op_type, {"X": ([-1, *x.shape[1:]], str(x.dtype)), "Length": ([-1], "int64")}, None,
        outputs,
    )  # fmt: skip
    feed = {"in_X": x, "in_Length": length}
    return nf.Executor().run(program, feed=feed, fetch_list=[f"out_{outputs[0]}"])


@pytest.mark.parametrize("op_type", ["sequence_pool", "sequence_reverse"])
def test_bad_lengths_at_run_time_name_the_op_row_and_value(op_type):
    outputs = ("Out",) if op_type == "sequence_pool" else ("Y",)
    x = normal(3, 4, 2)
    with pytest.raises(ExecutionError, match=r"Length\[1\] = 5 is outside \[0, 4\]") as info:
        _run(op_type, x, lengths(2, 5, 1), outputs)
    assert op_type in str(info.value) and "test_sequence.py" in str(info.value)
    with pytest.raises(ExecutionError, match=r"Length\[0\] = -1 is outside"):
        _run(op_type, x, lengths(-1, 2, 1), outputs)
    with pytest.raises(ExecutionError, match=r"Length has shape \[2\] but X \[3, 4, 2\] has 3"):
        _run(op_type, x, lengths(2, 2), outputs)


def test_sequence_mask_bad_max_len_tensor_is_an_execution_error():
    program = _one_op(
        "sequence_mask", {"X": ([3], "int64"), "MaxLenTensor": ([-1], "int64")}, outputs=("Y",)
    )
    exe = nf.Executor()
    with pytest.raises(ExecutionError, match="MaxLenTensor must hold one value, got \\[2\\]"):
        exe.run(program, feed={"in_X": lengths(1, 2, 3), "in_MaxLenTensor": lengths(2, 3)},
                fetch_list=["out_Y"])  # fmt: skip
    with pytest.raises(ExecutionError, match="MaxLenTensor is -2, below 0"):
        exe.run(program, feed={"in_X": lengths(1, 2, 3), "in_MaxLenTensor": lengths(-2)},
                fetch_list=["out_Y"])  # fmt: skip


def test_match_torch_flip_and_masked_max():
    torch = pytest.importorskip("torch")
    x = normal(4, 6, 3)
    n = lengths(6, 2, 4, 1)
    got_rev = reverse_ref(x, n)["Y"]
    (rev,) = _run("sequence_reverse", x, n, outputs=("Y",))
    np.testing.assert_array_equal(rev, got_rev)
    for row in range(4):  # torch.flip of each row's valid part
        want = torch.flip(torch.from_numpy(x[row, : n[row]]), dims=[0]).numpy()
        np.testing.assert_array_equal(rev[row, : n[row]], want)
    program = _one_op(
        "sequence_pool", {"X": ([-1, 6, 3], "float64"), "Length": ([-1], "int64")},
        {"pooltype": "MAX"},
    )  # fmt: skip
    (pooled,) = nf.Executor().run(program, feed={"in_X": x, "in_Length": n}, fetch_list=["out_Out"])
    mask = torch.arange(6)[None, :, None] < torch.from_numpy(n)[:, None, None]
    want = torch.from_numpy(x).masked_fill(~mask, float("-inf")).amax(dim=1).numpy()
    np.testing.assert_array_equal(pooled, want)
