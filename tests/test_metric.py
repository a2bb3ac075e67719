"""nf.metric against scikit-learn on random data: Accuracy (top-k), Precision, Recall, Auc, each
fed in several batches, reset, and fed mismatched shapes."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, ShapeError

sk = pytest.importorskip("sklearn.metrics")


def _batches(n: int, size: int):
    return [slice(start, start + size) for start in range(0, n, size)]


@pytest.mark.parametrize("batch", [7, 64, 200])
def test_accuracy_top1_equals_accuracy_score_over_batches(rng, batch):
    pred = rng.random((200, 5))
    label = rng.integers(0, 5, size=(200, 1))
    metric = nf.metric.Accuracy()
    for rows in _batches(200, batch):
        got = metric.update(metric.compute(pred[rows], label[rows]))
        assert got == pytest.approx(sk.accuracy_score(label[rows], pred[rows].argmax(1)))
    assert metric.accumulate() == pytest.approx(sk.accuracy_score(label, pred.argmax(1)))
    assert metric.name() == ["acc"]


def test_accuracy_topk_equals_top_k_accuracy_score(rng):
    pred = rng.random((150, 6))
    label = rng.integers(0, 6, size=150)
    metric = nf.metric.Accuracy(topk=(1, 3, 5), name="a")
    for rows in _batches(150, 40):
        metric.update(pred[rows], label[rows, None])  # update(pred, label): compute, then count
    want = [sk.top_k_accuracy_score(label, pred, k=k, labels=range(6)) for k in (1, 3, 5)]
    np.testing.assert_allclose(metric.accumulate(), want, rtol=1e-12)
    assert metric.name() == ["a_top1", "a_top3", "a_top5"]


def test_accuracy_ties_go_to_the_lower_class_as_argmax(rng):
    pred = rng.integers(0, 3, size=(300, 4)).astype("float64")  # many ties
    label = rng.integers(0, 4, size=(300, 1))
    metric = nf.metric.Accuracy()
    metric.update(pred, label)
    assert metric.accumulate() == pytest.approx(sk.accuracy_score(label, pred.argmax(1)))


def test_accuracy_one_hot_and_flat_labels_and_extra_dims(rng):
    pred = rng.random((4, 6, 3))  # [N, T, C]
    label = rng.integers(0, 3, size=(4, 6))
    want = sk.accuracy_score(label.ravel(), pred.reshape(-1, 3).argmax(1))
    for given in (label, label[..., None], np.eye(3)[label]):
        metric = nf.metric.Accuracy()
        assert metric.update(pred, given) == pytest.approx(want)
        assert metric.count == [24]


def test_accuracy_reset_and_empty_state():
    metric = nf.metric.Accuracy(topk=(1, 2))
    assert metric.accumulate() == [0.0, 0.0]
    metric.update(np.array([[0.9, 0.1, 0.0]]), np.array([[1]]))
    assert metric.accumulate() == [0.0, 1.0]
    metric.reset()
    assert metric.accumulate() == [0.0, 0.0]
    metric.update(np.array([[0.9, 0.1, 0.0]]), np.array([[0]]))
    assert metric.accumulate() == [1.0, 1.0]


def test_accuracy_bad_input_is_an_nf_error():
    metric = nf.metric.Accuracy(topk=(1, 5))
    with pytest.raises(ShapeError, match=r"label shape \[3, 1\] does not fit pred shape \[4, 6\]"):
        metric.update(np.zeros((4, 6)), np.zeros((3, 1), "int64"))
    with pytest.raises(ShapeError, match="topk 5 exceeds the 3 classes"):
        metric.update(np.zeros((4, 3)), np.zeros((4, 1), "int64"))
    with pytest.raises(ShapeError, match=r"must be \[N, ..., >= 5\]"):
        metric.update(np.zeros((4, 2)))
    with pytest.raises(AttrError, match="takes"):
        metric.update(np.zeros((4, 6)), np.zeros((4, 1)), np.zeros(4))
    with pytest.raises(AttrError, match="topk"):
        nf.metric.Accuracy(topk=(0,))
    assert metric.count == [0, 0]  # nothing was counted by the failed updates


@pytest.mark.parametrize("column", [False, True])
def test_precision_and_recall_equal_sklearn_over_batches(rng, column):
    preds = rng.random(250)
    labels = rng.integers(0, 2, size=250)
    shape = (-1, 1) if column else (-1,)
    precision, recall = nf.metric.Precision(), nf.metric.Recall()
    for rows in _batches(250, 33):
        precision.update(preds[rows].reshape(shape), labels[rows].reshape(shape))
        recall.update(preds[rows].reshape(shape), labels[rows].reshape(shape))
    predicted = (preds >= 0.5).astype(int)
    assert precision.accumulate() == pytest.approx(sk.precision_score(labels, predicted))
    assert recall.accumulate() == pytest.approx(sk.recall_score(labels, predicted))
    assert (precision.name(), recall.name()) == ("precision", "recall")
    precision.reset()
    recall.reset()
    assert precision.accumulate() == recall.accumulate() == 0.0
    precision.update(preds[:10], labels[:10])
    assert precision.accumulate() == pytest.approx(
        sk.precision_score(labels[:10], predicted[:10], zero_division=0.0)
    )


def test_precision_recall_degenerate_cases_are_zero():
    precision, recall = nf.metric.Precision(), nf.metric.Recall()
    precision.update(np.array([0.1, 0.2]), np.array([1, 1]))  # nothing predicted positive
    recall.update(np.array([0.9, 0.2]), np.array([0, 0]))  # no positive label
    assert precision.accumulate() == 0.0 and recall.accumulate() == 0.0


@pytest.mark.parametrize("cls", [nf.metric.Precision, nf.metric.Recall, nf.metric.Auc])
def test_binary_metrics_reject_mismatched_shapes_and_bad_labels(cls):
    metric = cls()
    with pytest.raises(ShapeError, match=r"preds \[4\] and labels \[3\]"):
        metric.update(np.full(4, 0.5), np.zeros(3))
    with pytest.raises(ShapeError, match=r"\[4, 3\]"):
        metric.update(np.full((4, 3), 0.5), np.zeros(4))
    with pytest.raises(AttrError, match="labels must be 0 or 1"):
        metric.update(np.full(4, 0.5), np.array([0, 1, 2, 1]))


def _buckets(preds: np.ndarray, num_thresholds: int) -> np.ndarray:
    return np.floor(preds * num_thresholds)


@pytest.mark.parametrize("num_thresholds", [4095, 200, 7])
def test_auc_equals_roc_auc_score_of_the_bucketed_predictions(rng, num_thresholds):
    preds = rng.random(500)
    labels = rng.integers(0, 2, size=500)
    metric = nf.metric.Auc(num_thresholds=num_thresholds)
    for rows in _batches(500, 64):
        two_class = np.stack([1 - preds[rows], preds[rows]], axis=1)  # Paddle's [N, 2] form
        metric.update(two_class, labels[rows, None])
    want = sk.roc_auc_score(labels, _buckets(preds, num_thresholds))
    assert metric.accumulate() == pytest.approx(want, rel=1e-12)
    if num_thresholds == 4095:  # fine buckets: close to the exact AUC too
        assert metric.accumulate() == pytest.approx(sk.roc_auc_score(labels, preds), abs=2e-3)
    metric.reset()
    assert metric.accumulate() == 0.0
    metric.update(preds[:100], labels[:100])
    want = sk.roc_auc_score(labels[:100], _buckets(preds[:100], num_thresholds))
    assert metric.accumulate() == pytest.approx(want, rel=1e-12)


def test_auc_equals_roc_auc_score_exactly_on_distinct_buckets(rng):
    labels = rng.integers(0, 2, size=300)
    preds = (rng.permutation(4096)[:300] + 0.5) / 4096  # one prediction per bucket
    metric = nf.metric.Auc(num_thresholds=4096)
    metric.update(preds, labels)
    assert metric.accumulate() == pytest.approx(sk.roc_auc_score(labels, preds), rel=1e-12)


def test_auc_pr_curve_equals_sklearn_trapezoid_of_precision_recall_curve(rng):
    preds = rng.random(400)
    labels = rng.integers(0, 2, size=400)
    metric = nf.metric.Auc(curve="PR", num_thresholds=50)
    for rows in _batches(400, 100):
        metric.update(preds[rows, None], labels[rows])
    precision, recall, _ = sk.precision_recall_curve(labels, _buckets(preds, 50))
    assert metric.accumulate() == pytest.approx(sk.auc(recall, precision), rel=1e-12)


def test_auc_bad_arguments():
    with pytest.raises(AttrError, match="curve"):
        nf.metric.Auc(curve="XY")
    with pytest.raises(AttrError, match="num_thresholds"):
        nf.metric.Auc(num_thresholds=0)
    metric = nf.metric.Auc()
    with pytest.raises(AttrError, match=r"in \[0, 1\]"):
        metric.update(np.array([0.2, 1.5]), np.array([0, 1]))
    metric.update(np.array([0.2]), np.array([1]))
    assert metric.accumulate() == 0.0  # one class only: no curve yet
