"""Normalisation ops: batch_norm, layer_norm."""

from __future__ import annotations

__all__: list[str] = []
