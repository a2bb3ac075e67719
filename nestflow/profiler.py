"""The profiler: per-op table and Chrome trace."""

from __future__ import annotations

__all__: list[str] = []
