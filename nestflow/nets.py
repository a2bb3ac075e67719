"""Composite networks (Fluid's nets): simple_img_conv_pool."""

from __future__ import annotations

__all__: list[str] = []
