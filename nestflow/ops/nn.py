"""Vision ops (NCHW): conv2d, conv2d_transpose, pool2d, lrn, flatten."""

from __future__ import annotations

__all__: list[str] = []
