"""The high-level API (Paddle 2.0's paddle.Model / Keras): `nf.Model`, `nf.InputSpec` and the
callbacks of `nf.callbacks`, a thin layer over Program, Executor, nf.io and nf.metric.

Imported on first use of `nf.Model`, `nf.InputSpec` or `nf.callbacks`.
"""

from nestflow.hapi import callbacks
from nestflow.hapi.model import InputSpec, Model

__all__ = ["InputSpec", "Model", "callbacks"]
