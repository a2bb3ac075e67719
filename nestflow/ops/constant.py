"""assign_value: a tensor given literally in the program (the seeds' minibatch/var/sequence)."""

from __future__ import annotations

from nestflow.ops.registry import Required, VarInfo, register_op


@register_op
class assign_value:
    """Out = `values` (flat, row-major) reshaped to `shape`, of `dtype`."""

    inputs, outputs = (), ("Out",)
    attrs = {"shape": Required(list), "dtype": "float32", "values": Required(list)}

    def infer(shape, dtype, values):
        return VarInfo(tuple(shape), dtype)

    def forward(shape, dtype, values, xp):
        return xp.asarray(values, dtype=dtype).reshape(shape)
