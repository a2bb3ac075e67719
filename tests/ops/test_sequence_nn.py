"""sequence_conv, sequence_softmax and sequence_expand over padded batches against row-by-row
NumPy loops over each row's valid steps (as Fluid's LoD kernels see one sequence at a time):
values, float64 central-difference gradients, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, ShapeError
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(17)


def normal(*shape, dtype="float64"):
    return R.standard_normal(shape).astype(dtype)


def lengths(*values, dtype="int64"):
    return np.array(values, dtype=dtype)


def _lens(X, Length):
    return [X.shape[1]] * X.shape[0] if Length is None else list(Length)


def conv_ref(X, Filter, Length=None, contextLength=3, contextStart=-1, **_):
    n, t, d = X.shape
    out = np.zeros((n, t, Filter.shape[1]), X.dtype)
    for row, length in enumerate(_lens(X, Length)):
        for step in range(length):
            window = []
            for k in range(contextLength):
                src = step + contextStart + k
                window.append(X[row, src] if 0 <= src < length else np.zeros(d, X.dtype))
            out[row, step] = np.concatenate(window) @ Filter
    return {"Out": out}


def conv_case(n, t, d, f, length, context, start, dtype="float64", id=""):
    inputs = {"X": normal(n, t, d, dtype=dtype), "Filter": normal(context * d, f, dtype=dtype)}
    if length is not None:
        inputs["Length"] = lengths(*length)
    return OpCase(
        "sequence_conv",
        inputs,
        conv_ref,
        attrs={"contextLength": context, "contextStart": start},
        grad=("X", "Filter") if dtype == "float64" else (),
        atol=1e-5 if dtype == "float32" else 1e-9,
        id=f"sequence_conv-{id}",
    )


def softmax_ref(X, Length=None):
    out = np.zeros_like(X)
    for row, length in enumerate(_lens(X, Length)):
        if length:
            seq = X[row, :length]
            e = np.exp(seq - seq.max(axis=0))
            out[row, :length] = e / e.sum(axis=0)
    return {"Out": out}


def expand_ref(X, Y, Length=None, ref_level=-1):
    out = np.zeros((X.shape[0], Y.shape[1], *X.shape[1:]), X.dtype)
    for row, length in enumerate(_lens(Y, Length)):
        out[row, :length] = X[row]
    return {"Out": out}


CASES = [
    conv_case(3, 5, 2, 4, (5, 2, 0), 3, -1, id="centered"),
    conv_case(2, 4, 3, 2, None, 2, 0, id="forward_window_no_length"),
    conv_case(2, 6, 1, 3, (6, 4), 4, -3, id="backward_window"),
    conv_case(2, 3, 2, 2, (3, 1), 5, -2, id="window_wider_than_rows"),
    conv_case(1, 1, 1, 1, (1,), 1, 0, id="size1"),
    conv_case(0, 4, 2, 3, (), 3, -1, id="empty_batch"),
    conv_case(3, 5, 3, 2, (5, 3, 1), 3, -1, dtype="float32", id="float32"),
    OpCase("sequence_softmax", {"X": normal(4, 5), "Length": lengths(5, 1, 0, 3)}, softmax_ref,
           grad=("X",), id="sequence_softmax-2d"),
    OpCase("sequence_softmax", {"X": normal(3, 4, 1), "Length": lengths(2, 4, 3)}, softmax_ref,
           grad=("X",), id="sequence_softmax-3d"),
    OpCase("sequence_softmax", {"X": normal(2, 3, 2)}, softmax_ref, grad=("X",),
           id="sequence_softmax-no_length"),
    OpCase("sequence_softmax", {"X": normal(0, 3), "Length": lengths()}, softmax_ref,
           grad=("X",), id="sequence_softmax-empty_batch"),
    OpCase("sequence_softmax", {"X": normal(1, 1), "Length": lengths(1)}, softmax_ref,
           grad=("X",), id="sequence_softmax-size1"),
    OpCase("sequence_expand", {"X": normal(3, 2), "Y": normal(3, 4, 5),
                               "Length": lengths(4, 0, 2)},
           expand_ref, grad=("X",), id="sequence_expand-2d"),
    OpCase("sequence_expand", {"X": normal(2, 2, 3), "Y": normal(2, 3)}, expand_ref,
           grad=("X",), id="sequence_expand-3d_no_length"),
    OpCase("sequence_expand", {"X": normal(0, 3), "Y": normal(0, 2), "Length": lengths()},
           expand_ref, grad=("X",), id="sequence_expand-empty_batch"),
    OpCase("sequence_expand", {"X": normal(1, 1), "Y": normal(1, 1, 1), "Length": lengths(1)},
           expand_ref, grad=("X",), id="sequence_expand-size1"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


def _append(op_type, feeds, attrs=None):
    block = nf.Program().global_block()
    inputs = {s: [block.create_var(f"in_{s}", shape, dtype)] for s, (shape, dtype) in feeds.items()}
    block.append_op(op_type, inputs, {"Out": [block.create_var("out")]}, attrs or {})


def test_build_time_errors():
    feeds = {"X": ([-1, 5, 2], "float32"), "Filter": ([6, 4], "float32")}
    _append("sequence_conv", feeds, {"contextLength": 3})
    with pytest.raises(ShapeError, match=r"Filter \[6, 4\] must be \[contextLength \* features"):
        _append("sequence_conv", feeds, {"contextLength": 2})
    with pytest.raises(AttrError, match="contextStride must be 1"):
        _append("sequence_conv", feeds, {"contextLength": 3, "contextStride": 2})
    with pytest.raises(AttrError, match="trainable padding"):
        _append("sequence_conv", feeds, {"contextLength": 3, "paddingTrainable": True})
    with pytest.raises(ShapeError, match="one row per sequence of Y"):
        _append("sequence_expand", {"X": ([3, 2], "float32"), "Y": ([4, 5], "float32")})
    with pytest.raises(AttrError, match="ref_level must be -1 or 0"):
        _append("sequence_expand", {"X": ([3, 2], "float32"), "Y": ([3, 5], "float32")},
                {"ref_level": 1})  # fmt: skip
