"""Elementwise math and activation layers."""

from __future__ import annotations

__all__: list[str] = []
