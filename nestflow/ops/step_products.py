"""Parameter products summed over the steps of a loop in one BLAS call (recurrent_grad,
while_grad).

A step's product X @ W by a parameter W (matmul, or the mul of an fc) has the gradient
dW = X^T @ dOut at each step; summed over the steps that is one product of all steps' rows,
[steps*rows, k]^T @ [steps*rows, n]. When the step's gradient ops are built, each product whose
`Y@GRAD` is the parameter's whole step gradient, with X a value of the step, loses that output
(`defer_parameter_products`); the loop's gradient op collects every step's X (from the kept
step scope) and dOut, and multiplies them once after the loop (`DeferredProduct`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from nestflow.core.device_context import device_context
from nestflow.core.place import place_of
from nestflow.framework.program import GRAD_SUFFIX, OpDesc
from nestflow.ops.gemm import matmul_tn_blocks
from nestflow.ops.ifelse import scope_array
from nestflow.ops.registry import get_op_def, place_args

_PARAMETER_PRODUCTS = ("matmul_grad", "mul_grad")
_PER_PRODUCT = ("deferred_grads", "deferred_types", "deferred_xs", "deferred_douts")
# The loop gradient op's attrs that list the deferred products (defaults: none).
DEFERRED_ATTRS: dict[str, list] = {key: [] for key in _PER_PRODUCT + ("deferred_col_dims",)}


def defer_parameter_products(
    grad_block, step_values: set[str], param_grads: list[str]
) -> dict[str, list]:
    """Take out of `grad_block` the parameter gradients (of `param_grads`) that one product op
    alone gives, where its X is one of `step_values`. Returns the `deferred_*` attrs: per
    product, the gradient it gave, the product's type, X, dOut and (mul) y_num_col_dims."""
    wanted = {name for name in param_grads if name}
    writers: dict[str, int] = {}
    for op in grad_block.ops:
        for name in op.output_names():
            writers[name] = writers.get(name, 0) + 1
    readers = {name for op in grad_block.ops for name in op.input_names()}
    deferred: dict[str, list] = {key: [] for key in DEFERRED_ATTRS}
    for op in grad_block.ops:
        if op.type not in _PARAMETER_PRODUCTS:
            continue
        grad = (op.output("Y" + GRAD_SUFFIX) or [""])[0]
        x = (op.input("X") or [""])[0]
        if (
            grad in wanted
            and writers[grad] == 1
            and grad not in readers
            and x in step_values
            and _product_is_plain(op)
        ):
            op.outputs["Y" + GRAD_SUFFIX] = [""]
            row = (grad, op.type[: -len("_grad")], x, op.input("Out" + GRAD_SUFFIX)[0])
            for key, value in zip(_PER_PRODUCT, row):
                deferred[key].append(value)
            deferred["deferred_col_dims"].append(int(op.attrs.get("y_num_col_dims", 1)))
    return deferred


def deferred_products(attrs: Mapping[str, Any]) -> dict[str, DeferredProduct]:
    """A DeferredProduct per product the `deferred_*` attrs list, by the parameter gradient
    it gives."""
    columns = [attrs[key] for key in _PER_PRODUCT] + [attrs["deferred_col_dims"]]
    return {grad: DeferredProduct(*rest) for grad, *rest in zip(*columns)}


def _product_is_plain(op: OpDesc) -> bool:
    """matmul without transposes or scaling (mul always is: flattened X @ flattened Y)."""
    attrs = op.attrs
    if op.type == "mul_grad":
        return True
    plain = not attrs.get("transpose_X") and not attrs.get("transpose_Y")
    return plain and attrs.get("alpha", 1.0) == 1.0


class DeferredProduct:
    """One deferred parameter product: the steps' X and dOut, multiplied once at the end."""

    __slots__ = ("kind", "x_name", "g_name", "col_dims", "xs", "gs")

    def __init__(self, kind: str, x_name: str, g_name: str, col_dims: int):
        self.kind, self.x_name, self.g_name, self.col_dims = kind, x_name, g_name, col_dims
        self.xs: list[Any] = []
        self.gs: list[Any] = []

    def collect(self, scope, plan, env: list, values: dict[str, Any]) -> None:
        """Keep step X and dOut: each from the step's gradient env (of `plan`; X is one of
        its inputs, read from the kept step scope), else X from the step scope and dOut bound
        as a seed."""
        x_slot, g_slot = self.slots_in(plan)
        grad = env[g_slot] if g_slot is not None else None
        if grad is None:
            grad = values.get(self.g_name) if self.g_name else None
            if grad is None:  # no gradient reached the product this step
                return
        x = env[x_slot] if x_slot is not None else None
        self.xs.append(scope_array(scope, self.x_name) if x is None else x)
        self.gs.append(grad)

    def slots_in(self, plan) -> tuple[int | None, int | None]:
        """(X's slot, dOut's slot) in the env of `plan`'s steps (None: not a variable of the
        step's gradient block, so not in a step's env)."""
        slot_of = plan.slot_of
        return slot_of.get(self.x_name), slot_of.get(self.g_name)

    def finish(self, y: np.ndarray) -> np.ndarray | None:
        """dY summed over the collected steps (None if no gradient reached the product)."""
        xs, gs = self.xs, self.gs
        if not xs:
            return None
        if self.kind == "mul":
            k = math.prod(y.shape[: self.col_dims])
        elif y.ndim == 2 and all(getattr(x, "ndim", 0) == 2 for x in xs):
            k = y.shape[0]
        else:  # batched or vector matmuls: each step's own gradient, summed
            kernel = get_op_def("matmul").backward
            on_place = place_args(kernel, device_context(place_of(y)))
            dys = [
                kernel(x, y, None, g, False, False, 1.0, needs=(False, True), **on_place)[1]
                for x, g in zip(xs, gs)
            ]
            return sum(dys[1:], dys[0])
        n = y.size // k
        blocks = [x.reshape(-1, k) for x in xs], [g.reshape(-1, n) for g in gs]
        return matmul_tn_blocks(*blocks).reshape(y.shape)
