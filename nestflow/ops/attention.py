"""Attention: scaled_dot_product_attention, one fused op for forward and backward.

Out = dropout(softmax(Q K^T * scale + Mask [+ causal])) V over the last two dims of
Q [..., Tq, d], K [..., Tk, d], V [..., Tk, dv] (the leading dims, typically [B, H], equal).
The forward keeps the softmax probabilities (Softmax) and, when dropout drops anything, the
uint8 keep-mask (DropoutMask): that is all the backward reads besides Q, K, V and Out. The
scores, their exponentials and the dropped probabilities are temporaries of one kernel.
"""

from __future__ import annotations

import math

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.ops.random_state import generator
from nestflow.ops.registry import VarInfo, register_op

_OP = "scaled_dot_product_attention"


def _dims_agree(a: int, b: int) -> bool:
    return a == b or a < 0 or b < 0


def _check_mask(Mask: VarInfo, scores: tuple[int, ...]) -> None:
    shapes = f"Mask {list(Mask.shape)} against the scores [..., Tq, Tk] = {list(scores)}"
    if Mask.ndim > len(scores):
        raise ShapeError(f"{_OP}: {shapes}: Mask has more dims than the scores")
    for m, s in zip(reversed(Mask.shape), reversed(scores)):
        if m != 1 and not _dims_agree(m, s):
            raise ShapeError(f"{_OP}: {shapes} do not broadcast")


def _sum_to(grad, shape: tuple[int, ...]):
    """`grad` summed over the dims broadcasting stretched, back to `shape`."""
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        i + extra for i, d in enumerate(shape) if d == 1 and grad.shape[i + extra] != 1
    )
    return (grad.sum(axis=axes, keepdims=True) if axes else grad).reshape(shape)


def _scale_of(Q, scale: float) -> float:
    return scale if scale else 1.0 / math.sqrt(Q.shape[-1]) if Q.shape[-1] else 1.0


def _swap(x, xp):
    return xp.swapaxes(x, -1, -2)


@register_op
class scaled_dot_product_attention:
    """Out = dropout(softmax(Q K^T * scale + Mask)) V along the last two dims.

    Q [..., Tq, d], K [..., Tk, d], V [..., Tk, dv] with equal leading dims (say [B, H]);
    Out [..., Tq, dv]. Mask (optional, Q's dtype) is added to the scores and broadcasts to
    [..., Tq, Tk]: -inf masks a key. `causal` masks every key after the query's own index
    (key j > query i, counted from the start of both). `scale` 0 means 1/sqrt(d). A query
    whose keys are all masked gets zeros in Out (not NaN) and passes no gradient.
    Softmax [..., Tq, Tk] holds the probabilities (before dropout); DropoutMask (uint8, only
    while dropout drops: dropout_rate > 0 and not is_test) the kept entries, the kept ones
    scaled by 1/(1 - dropout_rate) as upscale_in_train dropout. `seed` 0 draws from the
    run's generator (nf.seed), another value gives the same mask every run.

    Gradients flow to Q, K, V and Mask. Raises DTypeError for non-float or mixed dtypes,
    ShapeError for dims that do not line up, AttrError for dropout_rate outside [0, 1).
    """

    inputs = ("Q", "K", "V", "Mask?")
    outputs = ("Out", "Softmax", "DropoutMask?")
    attrs = {"scale": 0.0, "causal": False, "dropout_rate": 0.0, "is_test": False, "seed": 0}
    grad_no_need_buffer = ("Mask",)

    def infer(Q, K, V, Mask, scale, causal, dropout_rate, is_test, seed):
        for slot, info in (("Q", Q), ("K", K), ("V", V), ("Mask", Mask)):
            if info is None:
                continue
            if not is_floating(info.dtype):
                raise DTypeError(f"{_OP}: {slot} must be floating point, got {info.dtype}")
            if info.dtype != Q.dtype:
                raise DTypeError(f"{_OP}: {slot} is {info.dtype} but Q is {Q.dtype}")
        shapes = f"Q {list(Q.shape)}, K {list(K.shape)}, V {list(V.shape)}"
        if Q.ndim < 2 or not Q.ndim == K.ndim == V.ndim:
            raise ShapeError(f"{_OP}: {shapes} must share one rank of at least 2 ([..., T, d])")
        for i, (q, k, v) in enumerate(zip(Q.shape[:-2], K.shape[:-2], V.shape[:-2])):
            if not (_dims_agree(q, k) and _dims_agree(q, v) and _dims_agree(k, v)):
                raise ShapeError(f"{_OP}: {shapes} differ in leading dim {i}")
        if not _dims_agree(Q.shape[-1], K.shape[-1]):
            raise ShapeError(f"{_OP}: {shapes}: Q and K need one feature size d (the last dim)")
        if not _dims_agree(K.shape[-2], V.shape[-2]):
            raise ShapeError(f"{_OP}: {shapes}: K and V need one number of keys Tk (dim -2)")
        if not 0.0 <= dropout_rate < 1.0:
            raise AttrError(f"{_OP}: dropout_rate must be in [0, 1), got {dropout_rate}")
        lead = tuple(max(a, b, c) for a, b, c in zip(Q.shape[:-2], K.shape[:-2], V.shape[:-2]))
        scores = (*lead, Q.shape[-2], K.shape[-2])
        if Mask is not None:
            _check_mask(Mask, scores)
        return (
            VarInfo((*lead, Q.shape[-2], V.shape[-1]), Q.dtype),
            VarInfo(scores, Q.dtype),
            VarInfo(scores, "uint8"),
        )

    def forward(Q, K, V, Mask, scale, causal, dropout_rate, is_test, seed, xp, device):
        scores = xp.matmul(Q, _swap(K, xp))
        scores *= _scale_of(Q, scale)
        if Mask is not None:
            scores += Mask
        tq, tk = scores.shape[-2:]
        if causal:
            scores += xp.triu(xp.full((tq, tk), -np.inf, scores.dtype), 1)
        if scores.size == 0 or tk == 0:
            probs = xp.zeros(scores.shape, Q.dtype)
        else:
            # A row whose keys are all masked has max -inf; shifting it by 0 instead leaves
            # exp(-inf) = 0 everywhere, and dividing by 1 keeps it 0 (not 0/0 = NaN).
            top = scores.max(axis=-1, keepdims=True)
            scores -= xp.where(xp.isfinite(top), top, 0.0).astype(scores.dtype)
            probs = xp.exp(scores, out=scores)
            total = probs.sum(axis=-1, keepdims=True)
            probs /= xp.where(total > 0, total, 1.0).astype(probs.dtype)
        if is_test or dropout_rate == 0.0:
            return xp.matmul(probs, V), probs, None
        keep = (device.random(generator(seed)).random(probs.shape) >= dropout_rate).astype(np.uint8)
        dropped = probs * keep
        dropped *= 1.0 / (1.0 - dropout_rate)
        return xp.matmul(dropped, V), probs, keep

    # Softmax_grad, DropoutMask_grad: the probabilities and the mask are kept for this
    # kernel, not used downstream; a gradient reaching them is not propagated.
    def backward(
        Q, K, V, Mask, Out, Softmax, DropoutMask, Out_grad, Softmax_grad, DropoutMask_grad,
        scale, causal, dropout_rate, is_test, seed, xp, needs=(True, True, True, True),
    ):  # fmt: skip
        probs, keep = Softmax, DropoutMask
        if keep is not None and not is_test:
            upscale = 1.0 / (1.0 - dropout_rate)
            used = probs * keep
            used *= upscale
        else:
            keep, used = None, probs
        dV = xp.matmul(_swap(used, xp), Out_grad) if needs[2] else None
        del used
        if not (needs[0] or needs[1] or needs[3]):
            return None, None, dV, None
        d_probs = xp.matmul(Out_grad, _swap(V, xp))
        if keep is not None:
            d_probs *= keep
            d_probs *= upscale
        # sum_j dP_ij P_ij = dOut_i . Out_i (with or without dropout): a [.., Tq, 1] product
        # instead of another pass over the [.., Tq, Tk] scores.
        d_probs -= (Out_grad * Out).sum(axis=-1, keepdims=True)
        d_probs *= probs  # now the scores' gradient
        s = _scale_of(Q, scale)
        dQ = xp.matmul(d_probs, K) * s if needs[0] else None
        dK = xp.matmul(_swap(d_probs, xp), Q) * s if needs[1] else None
        dMask = _sum_to(d_probs, Mask.shape) if needs[3] and Mask is not None else None
        return dQ, dK, dV, dMask


__all__ = ["scaled_dot_product_attention"]
