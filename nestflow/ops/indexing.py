"""Indexing and shape ops: argmax/argmin, topk, where, gather, gather_nd, scatter, one_hot, pad, expand, squeeze/unsqueeze, stack/unstack, cumsum, range, shape."""

from __future__ import annotations

__all__: list[str] = []
