"""Metrics on NumPy values: Accuracy, Precision, Recall, Auc."""

from __future__ import annotations

__all__: list[str] = []
