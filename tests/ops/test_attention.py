"""scaled_dot_product_attention: NumPy reference, float64 central differences (on CPUPlace and
the stand-in, through the harness), PyTorch's F.scaled_dot_product_attention, masks, fully
masked rows, dropout, and build-time errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.layers.helper import append_op
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(30)
OP = "scaled_dot_product_attention"


def rand(*shape, dtype="float64"):
    return R.standard_normal(shape).astype(dtype)


def sdpa_ref(Q, K, V, Mask=None, scale=0.0, causal=False, dropout_rate=0.0, is_test=False,
             seed=0):  # fmt: skip
    scores = Q @ np.swapaxes(K, -1, -2) * (scale or 1.0 / np.sqrt(Q.shape[-1]))
    if Mask is not None:
        scores = scores + Mask
    tq, tk = scores.shape[-2:]
    if causal:
        scores = np.where(np.triu(np.ones((tq, tk), bool), 1), -np.inf, scores)
    probs = np.zeros_like(scores)
    alive = np.isfinite(scores).any(axis=-1, keepdims=True) if tk else np.zeros(1, bool)
    if scores.size and tk:
        top = np.where(alive, scores.max(axis=-1, keepdims=True), 0.0)
        e = np.exp(scores - top)
        probs = e / np.where(alive, e.sum(axis=-1, keepdims=True), 1.0)
    used = probs
    if dropout_rate and not is_test:
        keep = np.random.default_rng(seed).random(probs.shape) >= dropout_rate
        used = probs * keep / (1.0 - dropout_rate)
    return {"Out": (used @ V).astype(Q.dtype), "Softmax": probs.astype(Q.dtype)}


def case(q, k, v, mask=None, grad=("Q", "K", "V"), id="", **attrs):
    inputs = {"Q": q, "K": k, "V": v}
    if mask is not None:
        inputs["Mask"] = mask
    return OpCase(OP, inputs, sdpa_ref, attrs=attrs, grad=grad, grad_outputs=("Out",), id=id)


PAD = np.zeros((2, 1, 1, 4))
PAD[0, ..., 3:] = -np.inf
PAD[1, ..., 1:] = -np.inf
ROW_MASKED = rand(3, 4)
ROW_MASKED[1] = -np.inf  # query 1 sees no key: zeros, no gradient

CASES = [
    case(rand(2, 2, 3, 4), rand(2, 2, 4, 4), rand(2, 2, 4, 5), id="sdpa-basic"),
    case(
        rand(2, 3, 5, 4),
        rand(2, 3, 5, 4),
        rand(2, 3, 5, 4),
        rand(5, 5),
        grad=("Q", "K", "V", "Mask"),
        id="sdpa-mask-broadcast-TqTk",
    ),  # fmt: skip
    case(
        rand(2, 2, 3, 2),
        rand(2, 2, 4, 2),
        rand(2, 2, 4, 3),
        rand(2, 1, 3, 1),
        grad=("Mask",),
        id="sdpa-mask-broadcast-rows",
    ),  # fmt: skip
    case(rand(2, 2, 3, 4), rand(2, 2, 4, 4), rand(2, 2, 4, 3), PAD, id="sdpa-key-padding"),
    case(rand(1, 3, 2), rand(1, 4, 2), rand(1, 4, 2), ROW_MASKED, id="sdpa-fully-masked-row"),
    case(rand(2, 1, 5, 3), rand(2, 1, 5, 3), rand(2, 1, 5, 3), causal=True, id="sdpa-causal"),
    case(
        rand(1, 2, 3, 3),
        rand(1, 2, 5, 3),
        rand(1, 2, 5, 2),
        causal=True,
        scale=0.7,
        id="sdpa-causal-tq-lt-tk-scale",
    ),  # fmt: skip
    case(rand(3, 5, 7), rand(3, 6, 7), rand(3, 6, 1), id="sdpa-rank3-odd"),
    case(rand(1, 1, 1, 1), rand(1, 1, 1, 1), rand(1, 1, 1, 1), id="sdpa-size1"),
    case(rand(0, 2, 3, 4), rand(0, 2, 3, 4), rand(0, 2, 3, 4), id="sdpa-empty-batch"),
    case(
        rand(2, 2, 3, 4),
        rand(2, 2, 4, 4),
        rand(2, 2, 4, 5),
        dropout_rate=0.4,
        seed=5,
        id="sdpa-dropout-seeded",
    ),  # fmt: skip
    case(
        rand(2, 2, 3, 4),
        rand(2, 2, 4, 4),
        rand(2, 2, 4, 5),
        dropout_rate=0.4,
        is_test=True,
        grad=(),
        id="sdpa-dropout-is-test",
    ),  # fmt: skip
    case(
        rand(2, 4, 6, 8, dtype="float32"),
        rand(2, 4, 6, 8, dtype="float32"),
        rand(2, 4, 6, 8, dtype="float32"),
        grad=(),
        id="sdpa-float32",
    ),  # fmt: skip
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


def _run(q, k, v, mask=None, want_grads=False, **attrs):
    """Out (and dQ, dK, dV of sum(Out * G)) through a program holding the op."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        feeds = {"q": q, "k": k, "v": v}
        qv, kv, vv = (nf.data(n, list(a.shape), str(a.dtype)) for n, a in feeds.items())
        inputs = {"Q": qv, "K": kv, "V": vv}
        if mask is not None:
            feeds["m"] = mask
            inputs["Mask"] = nf.data("m", list(mask.shape), str(mask.dtype))
        for var in (qv, kv, vv):
            var.stop_gradient = False
        out, _ = append_op(OP, inputs, attrs, outputs=("Out", "Softmax"))
        fetch = [out]
        if want_grads:
            g = nf.data("g", list(out.shape), str(q.dtype))
            feeds["g"] = np.ones(out.shape, q.dtype)
            loss = nf.layers.reduce_sum(out * g)
            fetch += nf.gradients(loss, [qv, kv, vv])
    return nf.Executor().run(main, feed=feeds, fetch_list=fetch)


def test_equals_torch_sdpa_with_masks_and_causal():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    q, k, v = rand(2, 3, 5, 4), rand(2, 3, 5, 4), rand(2, 3, 5, 6)
    mask = rand(2, 1, 5, 5)
    for kwargs, torch_kwargs in (
        ({}, {}),
        ({"mask": mask}, {"attn_mask": torch.from_numpy(mask)}),
        ({"causal": True}, {"is_causal": True}),
        ({"scale": 0.3}, {"scale": 0.3}),
    ):
        tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
        want = F.scaled_dot_product_attention(tq, tk, tv, **torch_kwargs)
        want.sum().backward()
        got = _run(q, k, v, want_grads=True, **kwargs)
        for g, w in zip(got, [want, tq.grad, tk.grad, tv.grad]):
            np.testing.assert_allclose(g, w.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_a_fully_masked_row_gives_zeros_and_zero_gradients():
    q, k, v = rand(1, 2, 3, 4), rand(1, 2, 3, 4), rand(1, 2, 3, 4)
    mask = np.zeros((3, 3))
    mask[2] = -np.inf
    out, dq, dk, dv = _run(q, k, v, mask, want_grads=True)
    assert np.isfinite(out).all() and np.isfinite(dq).all() and np.isfinite(dk).all()
    np.testing.assert_array_equal(out[..., 2, :], 0.0)
    np.testing.assert_array_equal(dq[..., 2, :], 0.0)


def test_dropout_draws_a_new_mask_each_step_and_scales_what_it_keeps():
    q, k = np.zeros((1, 1, 4, 8), "float32"), np.zeros((1, 1, 8, 8), "float32")
    v = np.ones((1, 1, 8, 1), "float32")
    nf.seed(1)
    first = _run(q, k, v, dropout_rate=0.5)[0]
    second = _run(q, k, v, dropout_rate=0.5)[0]
    # each probability is 1/8, kept ones count 2/8: Out = 0.25 * (number kept)
    for out in (first, second):
        kept = out.ravel() / 0.25
        np.testing.assert_allclose(kept, np.round(kept), atol=1e-6)
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(_run(q, k, v, dropout_rate=0.5, is_test=True)[0], 1.0)


def test_the_backward_reads_no_scores_copy_beyond_softmax_and_dropout_mask():
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        q = nf.data("q", [-1, 2, 8, 4])
        q.stop_gradient = False
        out, probs, keep = append_op(
            OP, {"Q": q, "K": q, "V": q}, {"dropout_rate": 0.1},
            outputs=("Out", "Softmax", "DropoutMask"),
        )  # fmt: skip
        nf.gradients(nf.layers.reduce_sum(out), [q])
    assert probs.shape == (-1, 2, 8, 8) and keep.dtype == "uint8"
    (grad_op,) = [op for op in main.global_block().ops if op.type == OP + "_grad"]
    tensors = {s: n for s, n in grad_op.inputs.items() if n}
    assert set(tensors) == {"Q", "K", "V", "Out", "Softmax", "DropoutMask", "Out@GRAD"}


@pytest.mark.parametrize(
    "shapes, dtypes, attrs, error, words",
    [
        (([2, 3, 4], [2, 5, 4], [2, 5, 6]), None, {}, None, None),
        (([2, 3, 4], [2, 5, 3], [2, 5, 6]), None, {}, ShapeError, "feature size"),
        (([2, 3, 4], [2, 5, 4], [2, 4, 6]), None, {}, ShapeError, "number of keys"),
        (([2, 3, 4], [3, 5, 4], [3, 5, 6]), None, {}, ShapeError, "leading dim 0"),
        (([4], [4], [4]), None, {}, ShapeError, "rank of at least 2"),
        (([2, 3, 4], [2, 5, 4], [2, 5, 6]), ("float32", "float64"), {}, DTypeError, "K is"),
        (([2, 3, 4], [2, 5, 4], [2, 5, 6]), ("int64", "int64"), {}, DTypeError, "floating"),
        (([2, 3, 4], [2, 5, 4], [2, 5, 6]), None, {"dropout_rate": 1.0}, AttrError, "[0, 1)"),
    ],
)
def test_bad_inputs_are_errors_naming_the_op_and_shapes(shapes, dtypes, attrs, error, words):
    q_dtype, k_dtype = dtypes or ("float32", "float32")
    with nf.program_guard(nf.Program(), nf.Program()):
        q = nf.data("q", shapes[0], q_dtype)
        k = nf.data("k", shapes[1], k_dtype)
        v = nf.data("v", shapes[2], k_dtype)
        if error is None:
            out, _ = append_op(OP, {"Q": q, "K": k, "V": v}, attrs, outputs=("Out", "Softmax"))
            assert out.shape == (2, 3, 6)
            return
        with pytest.raises(error, match=OP) as raised:
            append_op(OP, {"Q": q, "K": k, "V": v}, attrs, outputs=("Out", "Softmax"))
        assert words in str(raised.value)


def test_a_mask_that_does_not_broadcast_is_a_shape_error():
    with nf.program_guard(nf.Program(), nf.Program()):
        q = nf.data("q", [2, 3, 4])
        m = nf.data("m", [3, 4])
        with pytest.raises(ShapeError, match=r"Mask \[3, 4\].*do not broadcast"):
            append_op(OP, {"Q": q, "K": q, "V": q, "Mask": m}, outputs=("Out", "Softmax"))
