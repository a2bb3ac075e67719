"""The losses of issue 10 (sigmoid_cross_entropy_with_logits, huber_loss, smooth_l1_loss,
log_loss, kldiv_loss; square_error_cost is a layer) against element-by-element NumPy
references, float64 central differences for the inputs Fluid differentiates, PyTorch, and
build-time errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ShapeError
from tests.ops.harness import OpCase, case_id
from tests.ops.test_activation_ext import nf_value_and_grads, torch_value_and_grads

rng = np.random.default_rng(77)

SHAPES = {"2d": (3, 4), "size1": (2, 1, 3), "odd": (5, 7), "empty": (0, 3)}


def elementwise(fn, *arrays):
    """fn applied to each tuple of elements with Python floats (the references' style)."""
    out = np.empty(arrays[0].shape)
    for at in np.ndindex(out.shape):
        out[at] = fn(*(float(a[at]) for a in arrays))
    return out


# ---- sigmoid_cross_entropy_with_logits ----


def sce_ref(X, Label, ignore_index=-100, normalize=False):
    def one(x, label):
        if int(label) == ignore_index:
            return 0.0
        p = 1 / (1 + math.exp(-x))
        return -(label * math.log(p) + (1 - label) * math.log(1 - p))

    out = elementwise(one, X, Label)
    if normalize:
        out /= max(int(np.sum(np.trunc(Label) != ignore_index)), 1)
    return {"Out": out.astype(X.dtype)}


def soft_labels(shape, ignore_index=None, share=0.3):
    label = rng.uniform(0, 1, shape)
    if ignore_index is not None and label.size:
        label = np.where(rng.uniform(0, 1, shape) < share, float(ignore_index), label)
    return label


SCE = []
for shape_id, shape in SHAPES.items():
    SCE.append(
        OpCase(
            "sigmoid_cross_entropy_with_logits",
            {"X": 3 * rng.standard_normal(shape), "Label": soft_labels(shape)},
            sce_ref,
            grad=("X",),
            id=f"sce-{shape_id}",
        )
    )
SCE += [
    OpCase(
        "sigmoid_cross_entropy_with_logits",
        {"X": rng.standard_normal((4, 5)), "Label": soft_labels((4, 5), -1)},
        sce_ref,
        {"ignore_index": -1},
        grad=("X",),
        id="sce-ignore_index",
    ),
    OpCase(
        "sigmoid_cross_entropy_with_logits",
        {"X": rng.standard_normal((4, 5)), "Label": soft_labels((4, 5), -100)},
        sce_ref,
        {"normalize": True},
        grad=("X",),
        id="sce-normalize",
    ),
    OpCase(
        "sigmoid_cross_entropy_with_logits",
        {"X": rng.standard_normal((2, 3)), "Label": np.full((2, 3), -100.0)},
        sce_ref,
        {"normalize": True},
        grad=("X",),
        id="sce-normalize_all_ignored",
    ),
    OpCase(
        "sigmoid_cross_entropy_with_logits",
        {"X": np.array([[-800.0, 800.0, 40.0]]), "Label": np.array([[0.0, 1.0, 0.0]])},
        lambda X, Label, **_: {"Out": np.array([[0.0, 0.0, 40.0]])},
        id="sce-huge_logits_stable",
    ),
    OpCase(
        "sigmoid_cross_entropy_with_logits",
        {
            "X": rng.standard_normal((3, 2)).astype("float32"),
            "Label": soft_labels((3, 2)).astype("float32"),
        },
        sce_ref,
        id="sce-float32",
    ),
]


# ---- huber_loss ----


def huber_ref(X, Y, delta):
    r = Y - X
    out = elementwise(lambda v: 0.5 * v * v if abs(v) <= delta else delta * (abs(v) - delta / 2), r)
    return {"Residual": r, "Out": out.astype(X.dtype)}


def away_from_kink(shape, delta):
    """(X, Y) with ||Y - X| - delta| >= 0.05: the loss's two pieces meet at |r| = delta."""
    x = rng.standard_normal(shape)
    r = rng.uniform(0.05, 2.5 * delta, shape)
    r = np.where(np.abs(r - delta) < 0.05, r + 0.1, r) * rng.choice([-1.0, 1.0], shape)
    return x, x + r


HUBER = []
for delta in (1.0, 0.3):
    for shape_id, shape in {**SHAPES, "column": (6, 1)}.items():
        x, y = away_from_kink(shape, delta)
        HUBER.append(
            OpCase(
                "huber_loss",
                {"X": x, "Y": y},
                huber_ref,
                {"delta": delta},
                grad=("X", "Y"),
                id=f"huber-{shape_id}-delta{delta}",
            )
        )


# ---- smooth_l1_loss ----


def smooth_l1_ref(X, Y, InsideWeight=None, OutsideWeight=None, sigma=1.0):
    inside = np.ones_like(X) if InsideWeight is None else InsideWeight
    outside = np.ones_like(X) if OutsideWeight is None else OutsideWeight
    diff = (X - Y) * inside
    s2 = sigma * sigma

    def one(d, w):
        return w * (0.5 * s2 * d * d if abs(d) < 1 / s2 else abs(d) - 0.5 / s2)

    errors = elementwise(one, diff, outside)
    rows = errors.reshape(X.shape[0], -1) if errors.size else np.zeros((X.shape[0], 0))
    return {"Diff": diff, "Out": rows.sum(axis=1, keepdims=True).astype(X.dtype)}


def smooth_l1_inputs(shape, sigma, weighted):
    """X, Y (and weights) with |diff| kept 0.05 away from the kink at 1 / sigma^2."""
    kink = 1 / (sigma * sigma)
    inside = rng.uniform(0.5, 2.0, shape) if weighted else np.ones(shape)
    d = rng.uniform(0.05, 3 * kink, shape)
    d = np.where(np.abs(d - kink) < 0.05, d + 0.1, d) * rng.choice([-1.0, 1.0], shape)
    x = rng.standard_normal(shape)
    inputs = {"X": x, "Y": x - d / inside}
    if weighted:
        inputs.update(InsideWeight=inside, OutsideWeight=rng.uniform(0.5, 2.0, shape))
    return inputs


SMOOTH_L1 = [
    OpCase(
        "smooth_l1_loss",
        smooth_l1_inputs(shape, sigma, weighted),
        smooth_l1_ref,
        {"sigma": sigma},
        grad=("X", "Y"),
        id=f"smooth_l1-{shape_id}-sigma{sigma}{'-weighted' if weighted else ''}",
    )
    for shape_id, shape in {
        "2d": (3, 4),
        "4d": (2, 3, 1, 2),
        "odd": (5, 7),
        "empty": (0, 3),
    }.items()
    for sigma in (1.0, 3.0)
    for weighted in (False, True)
]


# ---- log_loss ----


def log_loss_ref(Predicted, Labels, epsilon=1e-4):
    def one(p, y):
        return -y * math.log(p + epsilon) - (1 - y) * math.log(1 - p + epsilon)

    return {"Loss": elementwise(one, Predicted, Labels).astype(Predicted.dtype)}


LOG_LOSS = [
    OpCase(
        "log_loss",
        {"Predicted": rng.uniform(0.05, 0.95, shape), "Labels": rng.integers(0, 2, shape) * 1.0},
        log_loss_ref,
        attrs,
        grad=("Predicted",),
        id=f"log_loss-{shape_id}{'-eps' if attrs else ''}",
    )
    for shape_id, shape in {"column": (6, 1), **SHAPES}.items()
    for attrs in ({}, {"epsilon": 0.01})
]


# ---- kldiv_loss ----


def kldiv_ref(X, Target, reduction="mean"):
    pointwise = elementwise(lambda x, t: t * (math.log(t) - x) if t > 0 else 0.0, X, Target)
    with np.errstate(invalid="ignore"):
        reduced = {
            "none": pointwise,
            "sum": pointwise.sum(),
            "mean": pointwise.sum() / pointwise.size if pointwise.size else np.nan,
            "batchmean": pointwise.sum() / X.shape[0] if X.shape[0] else np.nan,
        }[reduction]
    return {"Loss": np.asarray(reduced, X.dtype)}


def targets(shape, with_zeros=True):
    t = rng.uniform(0.05, 1.0, shape)
    if with_zeros and t.size:
        t = np.where(rng.uniform(0, 1, shape) < 0.25, 0.0, t)
        t.flat[0] = -0.5  # a negative target also counts 0, as Fluid's
    return t


KLDIV = [
    OpCase(
        "kldiv_loss",
        {"X": rng.standard_normal(shape), "Target": targets(shape)},
        kldiv_ref,
        {"reduction": reduction},
        grad=("X",),
        id=f"kldiv-{reduction}-{shape_id}",
    )
    for reduction in ("none", "sum", "mean", "batchmean")
    for shape_id, shape in {"2d": (3, 4), "size1": (2, 1, 3), "odd": (5, 7)}.items()
] + [
    OpCase(
        "kldiv_loss",
        {"X": rng.standard_normal((0, 3)), "Target": targets((0, 3))},
        kldiv_ref,
        {"reduction": reduction},
        id=f"kldiv-{reduction}-empty",
    )
    for reduction in ("none", "sum", "mean", "batchmean")
]


@pytest.mark.parametrize("case", SCE + HUBER + SMOOTH_L1 + LOG_LOSS + KLDIV, ids=case_id)
def test_op(case):
    case.check()


# ---- PyTorch, float64: forward and gradients ----


def test_sigmoid_cross_entropy_with_logits_equals_pytorch():
    torch = pytest.importorskip("torch")
    x, label, up = (
        4 * rng.standard_normal((5, 6)),
        rng.uniform(0, 1, (5, 6)),
        rng.standard_normal((5, 6)),
    )
    got, (dx,) = nf_value_and_grads(
        "sigmoid_cross_entropy_with_logits", {"X": x, "Label": label}, {}, ["X"], up
    )

    def fn(X, Label):
        return torch.nn.functional.binary_cross_entropy_with_logits(X, Label, reduction="none")

    want, (want_dx,) = torch_value_and_grads(fn, {"X": x, "Label": label}, ["X"], up)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("delta", [1.0, 0.4])
def test_huber_loss_equals_pytorch(delta):
    torch = pytest.importorskip("torch")
    x, y = away_from_kink((6, 1), delta)
    up = rng.standard_normal((6, 1))
    got, grads = nf_value_and_grads(
        "huber_loss",
        {"X": x, "Y": y},
        {"delta": delta},
        ["X", "Y"],
        up,
        outputs=("Out", "Residual"),
    )
    fn = lambda X, Y: torch.nn.functional.huber_loss(X, Y, reduction="none", delta=delta)  # noqa: E731
    want, want_grads = torch_value_and_grads(fn, {"X": x, "Y": y}, ["X", "Y"], up)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-13)


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_smooth_l1_equals_pytorch_summed_per_row(sigma):
    torch = pytest.importorskip("torch")
    inputs = smooth_l1_inputs((4, 5), sigma, weighted=False)
    up = rng.standard_normal((4, 1))
    got, grads = nf_value_and_grads(
        "smooth_l1_loss", inputs, {"sigma": sigma}, ["X", "Y"], up, outputs=("Out", "Diff")
    )

    def fn(X, Y):
        loss = torch.nn.functional.smooth_l1_loss(X, Y, reduction="none", beta=1 / sigma**2)
        return loss.sum(dim=1, keepdim=True)

    want, want_grads = torch_value_and_grads(fn, inputs, ["X", "Y"], up)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides:UserWarning")
@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "batchmean"])
def test_kldiv_loss_equals_pytorch(reduction):
    torch = pytest.importorskip("torch")
    x, target = rng.standard_normal((4, 5)), targets((4, 5), with_zeros=False)
    target[0, :2] = 0.0  # torch's xlogy makes 0 * log(0) = 0 too
    up = rng.standard_normal((4, 5)) if reduction == "none" else np.asarray(rng.standard_normal())
    got, (dx,) = nf_value_and_grads(
        "kldiv_loss",
        {"X": x, "Target": target},
        {"reduction": reduction},
        ["X"],
        up,
        outputs=("Loss",),
    )
    fn = lambda X, Target: torch.nn.functional.kl_div(X, Target, reduction=reduction)  # noqa: E731
    want, (want_dx,) = torch_value_and_grads(fn, {"X": x, "Target": target}, ["X"], up)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-13)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-13)


def test_log_loss_equals_its_pytorch_expression():
    """torch has no log loss with an epsilon: its autograd of the same expression."""
    torch = pytest.importorskip("torch")
    eps = 1e-3
    p, y, up = (
        rng.uniform(0.05, 0.95, (6, 1)),
        rng.integers(0, 2, (6, 1)) * 1.0,
        rng.standard_normal((6, 1)),
    )
    got, (dp,) = nf_value_and_grads(
        "log_loss",
        {"Predicted": p, "Labels": y},
        {"epsilon": eps},
        ["Predicted"],
        up,
        outputs=("Loss",),
    )

    def fn(Predicted, Labels):
        return -Labels * torch.log(Predicted + eps) - (1 - Labels) * torch.log(1 - Predicted + eps)

    want, (want_dp,) = torch_value_and_grads(fn, {"Predicted": p, "Labels": y}, ["Predicted"], up)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    np.testing.assert_allclose(dp, want_dp, rtol=1e-12)


# ---- build-time errors ----


@pytest.mark.parametrize(
    "layer,args",
    [
        ("sigmoid_cross_entropy_with_logits", {}),
        ("huber_loss", {"delta": 1.0}),
        ("smooth_l1", {}),
        ("log_loss", {}),
        ("kldiv_loss", {}),
    ],
)
def test_losses_check_label_shape_and_dtype_when_built(layer, args):
    fn = getattr(nf.layers, layer)
    x = nf.data("x", [-1, 3], "float32")
    with pytest.raises(ShapeError, match=r"must be shaped like .* \[-1, 3\]") as info:
        fn(x, nf.data("wide", [-1, 4], "float32"), **args)  # marker: loss-shape
    assert "test_loss_ext.py" in str(info.value)
    with pytest.raises(DTypeError, match="float64 but .* is float32"):
        fn(x, nf.data("f64", [-1, 3], "float64"), **args)
    ints = nf.data("ints", [-1, 3], "int64")
    with pytest.raises(DTypeError, match="must be floating point, got int64"):
        fn(ints, ints, **args)


def test_loss_attr_errors():
    x = nf.data("x", [4, 3], "float32")
    y = nf.data("y", [4, 3], "float32")
    with pytest.raises(AttrError, match=r"reduction must be one of .* got 'avg'"):
        nf.layers.kldiv_loss(x, y, reduction="avg")
    with pytest.raises(AttrError, match="given together"):
        nf.layers.smooth_l1(x, y, inside_weight=y)
    with pytest.raises(AttrError, match="delta must be >= 0"):
        nf.layers.huber_loss(x, y, delta=-1.0)
    with pytest.raises(ShapeError, match="rank >= 2"):
        nf.layers.smooth_l1(nf.data("v", [4], "float32"), nf.data("w", [4], "float32"))


def _grads_of_intermediate(build, slot, feed):
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", [3, 2], "float64")
        y = nf.data("y", [3, 2], "float64")
        w = nf.data("w", [3, 2], "float64")
        build(x, y, w)
        block = main.global_block()
        grads = nf.gradients([block.var(block.ops[-1].output(slot)[0])], [x, y])
    return nf.Executor().run(main, feed=feed, fetch_list=grads, scope=nf.Scope())


def test_huber_residual_and_smooth_l1_diff_pass_gradients_on():
    """The intermediate outputs (Residual = Y - X, Diff = (X - Y) * InsideWeight) are ordinary
    outputs: a loss built on them gets its gradient through."""
    xs, ys, ws = rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.uniform(1, 2, (3, 2))
    feed = {"x": xs, "y": ys, "w": ws}
    dx, dy = _grads_of_intermediate(
        lambda x, y, w: nf.layers.huber_loss(x, y, 1.0), "Residual", feed
    )
    np.testing.assert_array_equal(dx, -np.ones((3, 2)))
    np.testing.assert_array_equal(dy, np.ones((3, 2)))

    def smooth_l1(x, y, w):
        nf.layers.smooth_l1(x, y, inside_weight=w, outside_weight=w)

    dx, dy = _grads_of_intermediate(smooth_l1, "Diff", feed)
    np.testing.assert_array_equal(dx, ws)
    np.testing.assert_array_equal(dy, -ws)
