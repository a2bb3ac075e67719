"""Gradient clipping: GradientClipByValue, GradientClipByNorm, GradientClipByGlobalNorm."""

from __future__ import annotations

__all__: list[str] = []
