"""Learning-rate schedule ops driven by a persistable global step."""

from __future__ import annotations

__all__: list[str] = []
