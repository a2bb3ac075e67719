"""Automatic mixed precision (Fluid 1.8's fluid.contrib.mixed_precision): `decorate` an
optimizer so that its `minimize` trains with float16 or bfloat16 ops on float32 master
weights, with loss scaling. See docs/amp.md (and what it costs on the CPU)."""

import nestflow.ops.amp  # noqa: F401  (registers check_finite_and_unscale, update_loss_scaling)
from nestflow.amp.decorator import OptimizerWithMixedPrecision, decorate, rewrite_program
from nestflow.amp.fp16_lists import AutoMixedPrecisionLists

__all__ = [
    "AutoMixedPrecisionLists",
    "OptimizerWithMixedPrecision",
    "decorate",
    "rewrite_program",
]
