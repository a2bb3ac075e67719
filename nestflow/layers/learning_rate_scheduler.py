"""Learning-rate schedules as ops in the program."""

from __future__ import annotations

__all__: list[str] = []
