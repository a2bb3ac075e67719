"""Losses and metrics against row-by-row NumPy references: cross_entropy (hard, soft,
ignore_index), softmax_with_cross_entropy (any axis, stable on huge logits), accuracy (top-k);
numeric gradients w.r.t. the scores, never the labels."""

from __future__ import annotations

import re

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.place import StandInPlace
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(5)


def probs(*shape, dtype="float64"):
    """Rows of class probabilities, none tiny (central differences of log stay accurate)."""
    p = rng.uniform(0.2, 1.0, shape)
    return (p / p.sum(axis=-1, keepdims=True)).astype(dtype)


def labels(*shape, classes):
    return rng.integers(0, classes, shape).astype("int64")


def soft(*shape, dtype="float64"):
    return probs(*shape, dtype=dtype)


def ce_ref(X, Label, soft_label=False, ignore_index=-100):
    if soft_label:
        return {"Y": -(Label * np.log(X)).sum(axis=-1, keepdims=True)}
    rows = X.reshape(-1, X.shape[-1])
    ids = Label.reshape(-1)
    loss = [0.0 if i == ignore_index else -np.log(row[i]) for row, i in zip(rows, ids)]
    return {"Y": np.array(loss, X.dtype).reshape(X.shape[:-1] + (1,))}


def swce_ref(Logits, Label, soft_label=False, axis=-1, ignore_index=-100):
    z = np.moveaxis(Logits.astype("float64"), axis, -1)
    shifted = z - z.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    if soft_label:
        loss = -(np.moveaxis(Label, axis, -1) * log_p).sum(axis=-1, keepdims=True)
    else:
        ids = Label if Label.ndim == Logits.ndim else np.expand_dims(Label, axis)
        ids = np.moveaxis(ids, axis, -1)[..., 0]
        loss = np.zeros(ids.shape + (1,))
        for at in np.ndindex(ids.shape):
            if ids[at] != ignore_index:
                loss[at] = -log_p[at][ids[at]]
    back = lambda a: np.moveaxis(a, -1, axis).astype(Logits.dtype)  # noqa: E731
    return {"Softmax": back(np.exp(log_p)), "Loss": back(loss)}


def accuracy_ref(X, Label, k=1):
    hits = [
        int(label) in sorted(range(len(row)), key=lambda c: (-row[c], c))[:k]
        for row, label in zip(X, Label.reshape(-1))
    ]
    with np.errstate(invalid="ignore"):
        return {"Accuracy": np.asarray(np.float32(sum(hits)) / np.float32(len(hits)))}


with_ignored = labels(6, 1, classes=4)
with_ignored[[1, 4]] = 3  # ignore_index=3 below: rows 1 and 4 contribute nothing
with_default_ignored = labels(5, 1, classes=4)
with_default_ignored[2] = -100

LOSS_CASES = [
    OpCase(
        "cross_entropy",
        {"X": probs(5, 4), "Label": labels(5, 1, classes=4)},
        ce_ref,
        grad=("X",),
        id="ce-hard",
    ),
    OpCase(
        "cross_entropy",
        {"X": probs(5, 4), "Label": labels(5, classes=4)},
        ce_ref,
        grad=("X",),
        id="ce-label_without_class_dim",
    ),
    OpCase(
        "cross_entropy",
        {"X": probs(6, 4), "Label": with_ignored},
        ce_ref,
        {"ignore_index": 3},
        grad=("X",),
        id="ce-ignore_index",
    ),
    OpCase(
        "cross_entropy",
        {"X": probs(5, 4), "Label": with_default_ignored},
        ce_ref,
        grad=("X",),
        id="ce-default_ignore_index",
    ),
    OpCase(
        "cross_entropy",
        {"X": probs(4, 3), "Label": soft(4, 3)},
        ce_ref,
        {"soft_label": True},
        grad=("X",),
        id="ce-soft",
    ),
    OpCase(
        "cross_entropy",
        {"X": probs(2, 3, 4), "Label": labels(2, 3, 1, classes=4)},
        ce_ref,
        grad=("X",),
        id="ce-3d",
    ),
    OpCase(
        "cross_entropy",
        {"X": probs(0, 4), "Label": labels(0, 1, classes=4)},
        ce_ref,
        grad=("X",),
        id="ce-empty_batch",
    ),
    OpCase(
        "cross_entropy",
        {"X": np.ones((3, 1)), "Label": np.zeros((3, 1), "int64")},
        ce_ref,
        grad=("X",),
        id="ce-one_class",
    ),
    OpCase(
        "cross_entropy",
        {"X": probs(4, 5, dtype="float32"), "Label": labels(4, 1, classes=5)},
        ce_ref,
        id="ce-float32",
    ),
    OpCase(
        "cross_entropy",
        {"X": probs(4, 5, dtype="float32"), "Label": soft(4, 5, dtype="float32")},
        ce_ref,
        {"soft_label": True},
        id="ce-soft_float32",
    ),
]


def logits(*shape, dtype="float64"):
    return (rng.standard_normal(shape) * 2).astype(dtype)


LOSS_CASES += [
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(5, 4), "Label": labels(5, 1, classes=4)},
        swce_ref,
        grad=("Logits",),
        id="swce-hard",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(5, 4), "Label": labels(5, 1, classes=4)},
        swce_ref,
        grad=("Logits",),
        grad_outputs=("Loss",),
        id="swce-loss_gradient_only",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(5, 4), "Label": labels(5, 1, classes=4)},
        swce_ref,
        grad=("Logits",),
        grad_outputs=("Softmax",),
        id="swce-softmax_gradient_only",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(5, 3), "Label": labels(5, classes=3)},
        swce_ref,
        grad=("Logits",),
        id="swce-label_without_class_dim",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(6, 4), "Label": with_ignored},
        swce_ref,
        {"ignore_index": 3},
        grad=("Logits",),
        id="swce-ignore_index",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(4, 3), "Label": soft(4, 3)},
        swce_ref,
        {"soft_label": True},
        grad=("Logits",),
        id="swce-soft",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(4, 3), "Label": rng.uniform(0, 2, (4, 3))},
        swce_ref,
        {"soft_label": True},
        grad=("Logits",),
        id="swce-soft_not_normalised",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(3, 4, 2), "Label": labels(3, 1, 2, classes=4)},
        swce_ref,
        {"axis": 1},
        grad=("Logits",),
        id="swce-axis1",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(4, 3), "Label": labels(1, 3, classes=4)},
        swce_ref,
        {"axis": 0},
        grad=("Logits",),
        id="swce-axis0",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(0, 4), "Label": labels(0, 1, classes=4)},
        swce_ref,
        grad=("Logits",),
        id="swce-empty_batch",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(3, 1), "Label": np.zeros((3, 1), "int64")},
        swce_ref,
        grad=("Logits",),
        id="swce-one_class",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {
            "Logits": np.array([[1000.0, 0.0, -1000.0], [-5000.0, 5000.0, 4999.0]]),
            "Label": np.array([[2], [2]], "int64"),
        },
        swce_ref,
        id="swce-huge_logits_stay_finite",
    ),
    OpCase(
        "softmax_with_cross_entropy",
        {"Logits": logits(4, 5, dtype="float32"), "Label": labels(4, 1, classes=5)},
        swce_ref,
        id="swce-float32",
    ),
]

scores = rng.standard_normal((8, 5))
scores[0] = [1.0, 1.0, 0.0, 0.0, 0.0]  # a tie: class 0 ranks first, class 1 second
acc_labels = labels(8, 1, classes=5)
acc_labels[0] = 1
LOSS_CASES += [
    OpCase("accuracy", {"X": scores, "Label": acc_labels}, accuracy_ref, id="accuracy-top1"),
    OpCase(
        "accuracy", {"X": scores, "Label": acc_labels}, accuracy_ref, {"k": 2}, id="accuracy-top2"
    ),
    OpCase(
        "accuracy",
        {"X": scores.astype("float32"), "Label": acc_labels.reshape(-1)},
        accuracy_ref,
        {"k": 3},
        id="accuracy-label_without_class_dim",
    ),
    OpCase(
        "accuracy", {"X": scores, "Label": acc_labels}, accuracy_ref, {"k": 9}, id="accuracy-k>C"
    ),
    OpCase(
        "accuracy",
        {"X": np.zeros((0, 5)), "Label": np.zeros((0, 1), "int64")},
        accuracy_ref,
        id="accuracy-empty_batch_is_nan",
    ),
]


@pytest.mark.parametrize("case", LOSS_CASES, ids=case_id)
def test_op(case):
    case.check()


def test_huge_logits_give_the_exact_loss():
    (case,) = [c for c in LOSS_CASES if c.id == "swce-huge_logits_stay_finite"]
    expected = case.expected()["Loss"]
    np.testing.assert_allclose(expected[:, 0], [2000.0, 1.0 + np.log1p(np.exp(-1.0))])


def test_accuracy_has_no_gradient():
    assert not nf.ops.get_op_def("accuracy").has_gradient


# ---- errors ----

L = nf.layers


def test_label_rows_must_match_x_rows_and_both_shapes_are_named():
    p = L.data("p", [4, 10], "float32")
    y = L.data("y", [3, 1], "int64")
    with pytest.raises(ShapeError) as err:
        L.cross_entropy(p, y)
    text = str(err.value)
    assert "cross_entropy" in text and "[3, 1]" in text and "[4, 10]" in text
    assert "test_loss.py" in text


def test_label_must_be_int64():
    p = L.data("p", [-1, 10], "float32")
    y = L.data("y", [-1, 1], "float32")
    with pytest.raises(DTypeError, match="Label holds class ids and must be int64, got float32"):
        L.cross_entropy(p, y)


def test_soft_label_must_be_shaped_like_logits():
    z = L.data("z", [-1, 10], "float32")
    y = L.data("y", [-1, 9], "float32")
    with pytest.raises(ShapeError, match=r"Label \[-1, 9\] vs Logits \[-1, 10\]"):
        L.softmax_with_cross_entropy(z, y, soft_label=True)


def test_soft_label_must_share_the_dtype():
    z = L.data("z", [-1, 10], "float32")
    y = L.data("y", [-1, 10], "float64")
    with pytest.raises(DTypeError, match="soft Label must have Logits's dtype float32"):
        L.softmax_with_cross_entropy(z, y, soft_label=True)


def test_unknown_batch_dims_are_accepted_and_loss_shape_inferred():
    z = L.data("z", [-1, 10], "float32")
    y = L.data("y", [-1, 1], "int64")
    loss, sm = L.softmax_with_cross_entropy(z, y, return_softmax=True)
    assert loss.shape == (-1, 1) and sm.shape == (-1, 10)
    assert L.accuracy(sm, y).shape == ()


@pytest.mark.parametrize("place", [nf.CPUPlace(), StandInPlace(0)], ids=str)
@pytest.mark.parametrize("bad", [3, -1])
def test_label_outside_the_classes_fails_at_run_time_naming_it(place, bad):
    # A device wraps out-of-range ids (CuPy does): the kernels check them themselves.
    p = L.data("p", [-1, 3], "float64")
    y = L.data("y", [-1, 1], "int64")
    loss = L.cross_entropy(p, y)
    (grad,) = nf.gradients(L.mean(loss), [p])
    feed = {"p": probs(2, 3), "y": np.array([[0], [bad]])}
    message = re.escape(f"Label holds {bad} at [1, 0], outside the 3 classes")
    for fetch in ([loss], [grad]):
        with pytest.raises(ExecutionError, match=message):
            nf.Executor(place).run(feed=feed, fetch_list=fetch)


def test_accuracy_k_must_be_positive():
    x = L.data("x", [-1, 3], "float32")
    y = L.data("y", [-1, 1], "int64")
    with pytest.raises(AttrError, match="k must be at least 1, got 0"):
        L.accuracy(x, y, k=0)
