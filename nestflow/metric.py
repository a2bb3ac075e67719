"""Metrics on NumPy values: Accuracy (top-k), Precision, Recall, Auc.

Each metric keeps running counts: `update(...)` adds a batch (and returns that batch's value where
one exists), `accumulate()` gives the value over every batch since the last `reset()`, and
`name()` the label to log it under. The API is Paddle 2.0's `paddle.metric`: a metric may split
its work into `compute(outputs..., labels...)` (what could run as ops) and `update(states...)`
(NumPy counting); `Accuracy.update(pred, label)` also does both at once.

Departures from Paddle 2.0: Precision and Recall both predict positive for p >= 0.5 (Paddle's
Recall rounds half to even, so 0.5 is negative there); labels other than 0/1 and Auc predictions
outside [0, 1] are errors (Paddle counts or asserts silently); Auc(curve="PR") computes the
precision-recall area (Paddle returns the ROC area for it); Accuracy counts every position of
[N, ..., maxk] masks as a sample.

>>> m = Accuracy()
>>> m.update(np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([[1], [1]]))
0.5
>>> m.accumulate()
0.5
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nestflow.errors import AttrError, ShapeError

__all__ = ["Accuracy", "Auc", "Metric", "Precision", "Recall"]


def _as_array(value: Any) -> np.ndarray:
    """`value` as a NumPy array (a nestflow Tensor gives its array)."""
    array = getattr(value, "_array", None) if type(value).__name__ == "Tensor" else None
    return np.asarray(value if array is None else array)


class Metric:
    """Base of the metrics: `reset`, `update`, `accumulate` and `name` are each metric's own;
    `compute` passes its arguments through unless a metric has work to do before `update`.

    >>> class MeanError(nf.metric.Metric):
    ...     def __init__(self):
    ...         self.reset()
    ...     def reset(self):
    ...         self.total, self.count = 0.0, 0
    ...     def update(self, preds, labels):
    ...         self.total += float(np.abs(preds - labels).sum())
    ...         self.count += len(labels)
    ...     def accumulate(self):
    ...         return self.total / self.count
    ...     def name(self):
    ...         return "mean_error"
    >>> m = MeanError()
    >>> m.update(np.array([1.0, 2.0]), np.array([1.5, 2.0]))
    >>> m.accumulate()
    0.25
    """

    def reset(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not define reset()")

    def update(self, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define update()")

    def accumulate(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define accumulate()")

    def name(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define name()")

    def compute(self, *args: Any) -> Any:
        """What `update` takes, computed from model outputs and labels (default: the same)."""
        return args


class Accuracy(Metric):
    """Top-k classification accuracy, one value per k in `topk`.

    `compute(pred, label)`: `pred` float [N, ..., C] class scores; `label` int [N, ..., 1] (or
    [N, ...]) class indices, or one-hot [N, ..., C]; returns the float32 mask [N, ..., maxk]
    whose column j is 1 where the label is the (j+1)-th highest score (ties: lower class first,
    as argmax). `update(correct)` counts a mask; `update(pred, label)` computes it first. Both
    return the batch's accuracy: a float for one k, else a list. `accumulate()` is the same over
    every batch since `reset()` (0.0 before any sample). `name()`: `[name]` for topk=(1,), else
    `[f"{name}_top{k}" ...]` (name defaults to "acc").

    Errors: topk not positive ints -> AttrError; pred and label of different leading shapes, a
    label neither [.., 1] nor one-hot, or maxk above the class count -> ShapeError.

    >>> m = Accuracy(topk=(1, 2))
    >>> m.update(np.array([[0.1, 0.3, 0.6], [0.5, 0.4, 0.1]]), np.array([[1], [1]]))
    [0.0, 1.0]
    >>> m.name()
    ['acc_top1', 'acc_top2']
    """

    def __init__(self, topk: int | Sequence[int] = (1,), name: str | None = None):
        topk = (topk,) if isinstance(topk, (int, np.integer)) else tuple(topk)
        if not topk or not all(isinstance(k, (int, np.integer)) and k >= 1 for k in topk):
            raise AttrError(f"Accuracy: topk must be positive ints, got {topk!r}")
        self.topk = tuple(int(k) for k in topk)
        self.maxk = max(self.topk)
        name = name or "acc"
        self._name = [name] if self.maxk == 1 else [f"{name}_top{k}" for k in self.topk]
        self.reset()

    def compute(self, pred: Any, label: Any) -> np.ndarray:
        pred, label = _as_array(pred), _as_array(label)
        if pred.ndim < 1:
            raise ShapeError(f"Accuracy: pred must be [N, ..., classes], got shape {pred.shape}")
        classes = pred.shape[-1]
        if label.shape == pred.shape and classes > 1:
            label = label.argmax(axis=-1)[..., None]  # one-hot
        elif label.shape == pred.shape[:-1]:
            label = label[..., None]
        elif label.shape != pred.shape[:-1] + (1,):
            raise ShapeError(
                f"Accuracy: label shape {list(label.shape)} does not fit pred shape "
                f"{list(pred.shape)}: expected {list(pred.shape[:-1]) + [1]}, "
                f"{list(pred.shape[:-1])} or one-hot {list(pred.shape)}"
            )
        if self.maxk > classes:
            raise ShapeError(
                f"Accuracy: topk {self.maxk} exceeds the {classes} classes of pred "
                f"(shape {list(pred.shape)})"
            )
        # A stable sort of the negated scores puts tied classes in index order, as argmax does.
        order = np.argsort(-pred, axis=-1, kind="stable")[..., : self.maxk]
        return (order == label).astype(np.float32)

    def update(self, *args: Any) -> float | list[float]:
        if len(args) == 2:
            correct = self.compute(*args)
        elif len(args) == 1:
            correct = _as_array(args[0])
        else:
            raise AttrError(
                f"Accuracy.update takes (correct) or (pred, label), got {len(args)} arguments"
            )
        if correct.ndim < 1 or correct.shape[-1] < self.maxk:
            raise ShapeError(
                f"Accuracy.update: the correct mask must be [N, ..., >= {self.maxk}] for topk "
                f"{self.topk}, got shape {list(correct.shape)}"
            )
        samples = int(np.prod(correct.shape[:-1]))
        accuracies = []
        for i, k in enumerate(self.topk):
            hits = float(correct[..., :k].sum())
            self.total[i] += hits
            self.count[i] += samples
            accuracies.append(hits / samples if samples else 0.0)
        return accuracies[0] if len(self.topk) == 1 else accuracies

    def reset(self) -> None:
        self.total = [0.0] * len(self.topk)
        self.count = [0] * len(self.topk)

    def accumulate(self) -> float | list[float]:
        values = [t / c if c else 0.0 for t, c in zip(self.total, self.count)]
        return values[0] if len(self.topk) == 1 else values

    def name(self) -> list[str]:
        return list(self._name)


def _binary_inputs(metric: str, preds: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Predicted probabilities and 0/1 labels of a binary metric as two flat arrays of one
    length: each may be [N] or [N, 1]."""
    preds, labels = _as_array(preds), _as_array(labels)
    if not (_is_column(preds) and _is_column(labels) and len(preds) == len(labels)):
        raise ShapeError(
            f"{metric}.update: preds {list(preds.shape)} and labels {list(labels.shape)} must "
            "both be [N] or [N, 1] with the same N"
        )
    return preds.reshape(-1), _binary_labels(metric, labels.reshape(-1))


def _is_column(array: np.ndarray) -> bool:
    return array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)


def _binary_labels(metric: str, labels: np.ndarray) -> np.ndarray:
    positive = labels == 1
    if not np.all(positive | (labels == 0)):
        raise AttrError(
            f"{metric}.update: labels must be 0 or 1, got values {np.unique(labels)[:5].tolist()}"
        )
    return positive


def _trapezoid(y: np.ndarray, x: np.ndarray) -> float:
    """The trapezoidal area under the points (x, y), x non-decreasing."""
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1])) / 2.0)


class Precision(Metric):
    """Binary precision tp / (tp + fp) over every batch since `reset()` (0.0 when nothing was
    predicted positive).

    `update(preds, labels)`: `preds` float [N] or [N, 1] probabilities of the positive class
    (>= 0.5 predicts positive), `labels` [N] or [N, 1] of 0/1. Mismatched shapes -> ShapeError;
    labels other than 0/1 -> AttrError.

    >>> m = Precision()
    >>> m.update(np.array([0.1, 0.5, 0.6, 0.7]), np.array([0, 1, 1, 0]))
    >>> m.accumulate()
    0.6666666666666666
    """

    def __init__(self, name: str = "precision"):
        self._name = name
        self.reset()

    def update(self, preds: Any, labels: Any) -> None:
        preds, positive = _binary_inputs("Precision", preds, labels)
        predicted = preds >= 0.5
        self.tp += int(np.count_nonzero(predicted & positive))
        self.fp += int(np.count_nonzero(predicted & ~positive))

    def reset(self) -> None:
        self.tp = 0
        self.fp = 0

    def accumulate(self) -> float:
        predicted = self.tp + self.fp
        return self.tp / predicted if predicted else 0.0

    def name(self) -> str:
        return self._name


class Recall(Metric):
    """Binary recall tp / (tp + fn) over every batch since `reset()` (0.0 when no label was
    positive). `update(preds, labels)` as Precision's.

    >>> m = Recall()
    >>> m.update(np.array([0.1, 0.5, 0.6, 0.7]), np.array([1, 0, 1, 1]))
    >>> m.accumulate()
    0.6666666666666666
    """

    def __init__(self, name: str = "recall"):
        self._name = name
        self.reset()

    def update(self, preds: Any, labels: Any) -> None:
        preds, positive = _binary_inputs("Recall", preds, labels)
        predicted = preds >= 0.5
        self.tp += int(np.count_nonzero(predicted & positive))
        self.fn += int(np.count_nonzero(~predicted & positive))

    def reset(self) -> None:
        self.tp = 0
        self.fn = 0

    def accumulate(self) -> float:
        positives = self.tp + self.fn
        return self.tp / positives if positives else 0.0

    def name(self) -> str:
        return self._name


class Auc(Metric):
    """Area under the ROC (or precision-recall) curve of a binary classifier, from predictions
    counted into `num_thresholds + 1` equal buckets of [0, 1].

    `update(preds, labels)`: `preds` [N, 2] class probabilities (column 1 is the positive
    class), or [N] / [N, 1] positive-class probabilities, all in [0, 1]; `labels` [N] or [N, 1]
    of 0/1. A prediction p falls in bucket floor(p * num_thresholds); predictions sharing a
    bucket count as tied. So `accumulate()` equals scikit-learn's `roc_auc_score(labels,
    buckets)` for curve="ROC", and for curve="PR" the trapezoidal area under the
    precision-recall points of every bucket threshold, starting at (recall 0, precision 1)
    (`sklearn.metrics.auc` of `precision_recall_curve(labels, buckets)`). 0.0 until both
    classes were seen. Errors: bad curve/num_thresholds -> AttrError, mismatched shapes ->
    ShapeError, preds outside [0, 1] or labels other than 0/1 -> AttrError.

    >>> m = Auc()
    >>> m.update(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
    >>> m.accumulate()
    0.75
    """

    def __init__(self, curve: str = "ROC", num_thresholds: int = 4095, name: str = "auc"):
        if curve not in ("ROC", "PR"):
            raise AttrError(f"Auc: curve must be 'ROC' or 'PR', got {curve!r}")
        if not isinstance(num_thresholds, (int, np.integer)) or num_thresholds < 1:
            raise AttrError(f"Auc: num_thresholds must be a positive int, got {num_thresholds!r}")
        self._curve = curve
        self._num_thresholds = int(num_thresholds)
        self._name = name
        self.reset()

    def update(self, preds: Any, labels: Any) -> None:
        preds = _as_array(preds)
        if preds.ndim == 2 and preds.shape[1] == 2:
            preds = preds[:, 1]
        preds, positive = _binary_inputs("Auc", preds, labels)
        if preds.size and not (preds.min() >= 0.0 and preds.max() <= 1.0):
            raise AttrError(
                f"Auc.update: preds must be probabilities in [0, 1], got values in "
                f"[{preds.min()}, {preds.max()}]"
            )
        buckets = np.floor(preds * self._num_thresholds).astype(np.int64)
        size = self._num_thresholds + 1
        self._stat_pos += np.bincount(buckets[positive], minlength=size)
        self._stat_neg += np.bincount(buckets[~positive], minlength=size)

    def reset(self) -> None:
        self._stat_pos = np.zeros(self._num_thresholds + 1, dtype=np.int64)
        self._stat_neg = np.zeros(self._num_thresholds + 1, dtype=np.int64)

    def accumulate(self) -> float:
        # Cumulative counts from the highest bucket down: each bucket is one threshold.
        tp = np.concatenate([[0], np.cumsum(self._stat_pos[::-1])]).astype(np.float64)
        fp = np.concatenate([[0], np.cumsum(self._stat_neg[::-1])]).astype(np.float64)
        positives, negatives = tp[-1], fp[-1]
        if positives == 0 or negatives == 0:
            return 0.0
        if self._curve == "ROC":
            return _trapezoid(tp, fp) / float(positives * negatives)
        # PR: one point per bucket holding a prediction (a threshold that changes something).
        seen = np.concatenate([[True], (self._stat_pos + self._stat_neg)[::-1] > 0])
        tp, fp = tp[seen], fp[seen]
        predicted = tp + fp
        precision = np.divide(tp, predicted, out=np.ones_like(tp), where=predicted > 0)
        return _trapezoid(precision, tp / positives)

    def name(self) -> str:
        return self._name
