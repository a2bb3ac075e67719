"""Tensor creation and layout ops: fill_constant, random fills, assign, cast, reshape, ..."""

from __future__ import annotations

import numpy as np

from nestflow.ops.registry import Required, VarInfo, fail, register_op


def _static_shape(shape: list[int]) -> tuple[int, ...]:
    if any(d < 0 for d in shape):
        fail(f"shape {shape} must be fully known to create a tensor")
    return tuple(shape)


def _rng(seed: int) -> np.random.Generator:
    from nestflow.ops.random_state import generator

    return generator(seed)


@register_op
class fill_constant:
    """Out = a tensor of `shape` filled with `value`."""

    inputs, outputs = (), ("Out",)
    attrs = {"shape": Required(list), "dtype": "float32", "value": 0.0}

    def infer(shape, dtype, value):
        return VarInfo(_static_shape(shape), dtype)

    def forward(shape, dtype, value):
        return np.full(shape, value, dtype=dtype)


@register_op
class uniform_random:
    """Out ~ U(min, max) of `shape`; seed 0 draws from the global generator (nf.seed)."""

    inputs, outputs = (), ("Out",)
    attrs = {"shape": Required(list), "dtype": "float32", "min": -1.0, "max": 1.0, "seed": 0}

    def infer(shape, dtype, min, max, seed):
        return VarInfo(_static_shape(shape), dtype)

    def forward(shape, dtype, min, max, seed):
        return _rng(seed).uniform(min, max, size=shape).astype(dtype)


@register_op
class gaussian_random:
    """Out ~ N(mean, std^2) of `shape`."""

    inputs, outputs = (), ("Out",)
    attrs = {"shape": Required(list), "dtype": "float32", "mean": 0.0, "std": 1.0, "seed": 0}

    def infer(shape, dtype, mean, std, seed):
        return VarInfo(_static_shape(shape), dtype)

    def forward(shape, dtype, mean, std, seed):
        return _rng(seed).normal(mean, std, size=shape).astype(dtype)
