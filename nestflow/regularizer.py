"""Weight regularizers: L2Decay, L1Decay."""

from __future__ import annotations

__all__: list[str] = []
