"""The elementwise math and activation ops of issue 10 (exp, log, sqrt, rsqrt, abs, pow, clip,
leaky_relu, elu, gelu, softplus, softsign, swish, hard_sigmoid): NumPy references over edge
shapes, float64 central-difference gradients (inputs kept away from kinks), PyTorch's forward
and gradient in float64, and build-time DTypeErrors for non-float inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nestflow as nf
from nestflow.core import standin
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.layers.helper import append_op
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(1010)

SHAPES = {"2d": (3, 4), "size1": (2, 1, 3), "odd": (5, 7), "empty": (0, 3), "0d": ()}


def normal(*shape):
    return rng.standard_normal(shape)


def positive(*shape):
    return rng.uniform(0.3, 3.0, shape)


def away_from(points, *shape, gap=0.1, scale=2.0):
    """Values spread over [-scale * 1.5, scale * 1.5] at least `gap` from every kink point."""
    x = rng.uniform(-1.5 * scale, 1.5 * scale, shape)
    for p in points:
        near = np.abs(x - p) < gap
        x = np.where(near, p + np.where(x >= p, gap, -gap) * 2, x)
    return x


def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


# NumPy references, written from the textbook formulas in float64 and cast back.
REFS = {
    "exp": lambda X: np.exp(X),
    "log": lambda X: np.log(X),
    "sqrt": lambda X: np.sqrt(X),
    "rsqrt": lambda X: 1.0 / np.sqrt(X),
    "abs": lambda X: np.abs(X),
    "pow": lambda X, factor=1.0: X**factor,
    "clip": lambda X, min, max: np.clip(X, min, max),
    "leaky_relu": lambda X, alpha=0.02: (
        np.where(X > 0, X, alpha * X) if alpha <= 1 else np.where(X > 0, alpha * X, X)
    ),
    "elu": lambda X, alpha=1.0: np.maximum(X, 0) + np.minimum(alpha * (np.exp(X) - 1), 0),
    "gelu": lambda X, approximate=False: (
        0.5 * X * (1 + erf(X / math.sqrt(2)))
        if not approximate
        else 0.5 * X * (1 + np.tanh(math.sqrt(2 / math.pi) * (X + 0.044715 * X**3)))
    ),
    "softplus": lambda X: np.log1p(np.exp(X)),
    "softsign": lambda X: X / (1 + np.abs(X)),
    "swish": lambda X, beta=1.0: X * sigmoid64(beta * X),
    "hard_sigmoid": lambda X, slope=0.2, offset=0.5: np.clip(slope * X + offset, 0, 1),
}


def reference(op):
    def ref(X, **attrs):
        return {"Out": np.asarray(REFS[op](X.astype(np.float64), **attrs), X.dtype)}

    return ref


# (op, attrs, input maker); every maker keeps inputs away from the op's kinks.
SETTINGS = [
    ("exp", {}, normal),
    ("log", {}, positive),
    ("sqrt", {}, positive),
    ("rsqrt", {}, positive),
    ("abs", {}, lambda *s: away_from([0.0], *s)),
    ("pow", {"factor": 2.5}, positive),
    ("pow", {"factor": 3.0}, normal),
    ("pow", {}, normal),
    ("clip", {"min": -0.5, "max": 0.7}, lambda *s: away_from([-0.5, 0.7], *s, scale=1.0)),
    ("leaky_relu", {}, lambda *s: away_from([0.0], *s)),
    ("leaky_relu", {"alpha": 0.3}, lambda *s: away_from([0.0], *s)),
    ("leaky_relu", {"alpha": 1.5}, lambda *s: away_from([0.0], *s)),
    ("elu", {}, lambda *s: away_from([0.0], *s)),
    ("elu", {"alpha": 0.5}, lambda *s: away_from([0.0], *s)),
    ("elu", {"alpha": -0.5}, lambda *s: away_from([0.0], *s)),
    ("gelu", {}, lambda *s: 2 * normal(*s)),
    ("gelu", {"approximate": True}, lambda *s: 2 * normal(*s)),
    ("softplus", {}, lambda *s: 3 * normal(*s)),
    ("softsign", {}, lambda *s: away_from([0.0], *s)),
    ("swish", {}, lambda *s: 2 * normal(*s)),
    ("swish", {"beta": 2.0}, lambda *s: 2 * normal(*s)),
    ("hard_sigmoid", {}, lambda *s: away_from([-2.5, 2.5], *s, scale=3.0)),
    ("hard_sigmoid", {"slope": 0.5, "offset": 0.2}, lambda *s: away_from([-0.4, 1.6], *s)),
]


def _tag(op, attrs):
    return op + "".join(f"-{k}={v}" for k, v in attrs.items())


CASES = []
for op, attrs, make in SETTINGS:
    for shape_id, shape in SHAPES.items():
        x = np.asarray(make(*shape))
        CASES.append(
            OpCase(
                op,
                {"X": x},
                reference(op),
                dict(attrs),
                grad=("X",),
                id=f"{_tag(op, attrs)}-{shape_id}",
            )
        )
    CASES.append(
        OpCase(
            op,
            {"X": np.asarray(make(4, 6)).astype("float32")},
            reference(op),
            dict(attrs),
            id=f"{_tag(op, attrs)}-float32",
        )
    )

CASES += [
    OpCase(
        "pow",
        {"X": positive(3, 4), "FactorTensor": np.array([1.7])},
        lambda X, FactorTensor, factor: {"Out": X ** FactorTensor[0]},
        {"factor": 5.0},  # the tensor wins over the attribute
        grad=("X",),
        id="pow-factor_tensor",
    ),
    OpCase(
        "softplus",
        {"X": np.array([-800.0, -40.0, 0.0, 40.0, 800.0])},
        lambda X: {"Out": np.array([0.0, math.log1p(math.exp(-40.0)), math.log(2.0), 40.0, 800.0])},
        id="softplus-no_overflow",
    ),
    OpCase(
        "abs",
        {"X": np.array([[-3, 0, 2]], dtype="int64")},
        lambda X: {"Out": np.array([[3, 0, 2]], dtype="int64")},
        id="abs-int64_keeps_dtype",
    ),
    OpCase(
        "clip",
        {"X": np.array([-2.0, -0.5, 0.1, 0.7, 3.0])},
        lambda X, min, max: {"Out": np.array([-0.5, -0.5, 0.1, 0.7, 0.7])},
        {"min": -0.5, "max": 0.7},
        id="clip-at_and_past_bounds",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


# ---- gradients at the kinks: the side each op takes there ----


def _grad_at(op, x, attrs=None):
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        xv = nf.data("x", list(x.shape), "float64")
        out = append_op(op, {"X": xv}, attrs or {})
        (gx,) = nf.gradients([out], [xv])
    (got,) = nf.Executor().run(main, feed={"x": x}, fetch_list=[gx], scope=nf.Scope())
    return got


def test_gradients_at_the_kinks_follow_fluid():
    """abs: sign(0) = 0; clip: 0 at both bounds (strict inequalities); leaky_relu: alpha at 0;
    elu: alpha at 0; hard_sigmoid: 0 where Out reaches 0 or 1."""
    np.testing.assert_array_equal(_grad_at("abs", np.array([-1.0, 0.0, 2.0])), [-1, 0, 1])
    np.testing.assert_array_equal(
        _grad_at("clip", np.array([-0.5, 0.0, 0.7]), {"min": -0.5, "max": 0.7}), [0, 1, 0]
    )
    np.testing.assert_allclose(
        _grad_at("leaky_relu", np.array([-1.0, 0.0, 1.0]), {"alpha": 0.1}), [0.1, 0.1, 1.0]
    )
    np.testing.assert_allclose(_grad_at("elu", np.array([0.0, 1.0]), {"alpha": 0.7}), [0.7, 1.0])
    np.testing.assert_allclose(
        _grad_at("hard_sigmoid", np.array([-2.5, 0.0, 2.5])), [0.0, 0.2, 0.0]
    )


# ---- PyTorch: forward and gradient in float64 ----


def nf_value_and_grads(op, inputs, attrs, grad_slots, upstream, outputs=("Out",)):
    """The op's first output and d(sum(out * upstream)) / d(input) for each of `grad_slots`,
    built with layers' append_op and nf.gradients and run once."""
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        feeds = {
            slot: nf.data(f"in_{slot}", list(a.shape), str(a.dtype)) for slot, a in inputs.items()
        }
        outs = append_op(op, feeds, attrs, outputs=outputs)
        out = outs[0] if isinstance(outs, tuple) else outs
        up = nf.data("upstream", list(upstream.shape), str(upstream.dtype))
        grads = nf.gradients([out], [feeds[s] for s in grad_slots], [up])
    feed = {f"in_{slot}": a for slot, a in inputs.items()}
    feed["upstream"] = upstream
    got = nf.Executor().run(main, feed=feed, fetch_list=[out, *grads], scope=nf.Scope())
    return got[0], got[1:]


def torch_value_and_grads(fn, inputs, grad_slots, upstream):
    torch = pytest.importorskip("torch")
    tensors = {
        slot: torch.tensor(a, dtype=torch.float64, requires_grad=slot in grad_slots)
        for slot, a in inputs.items()
    }
    out = fn(**tensors)
    out.backward(torch.tensor(upstream, dtype=torch.float64))
    return out.detach().numpy(), [tensors[s].grad.numpy() for s in grad_slots]


def _torch_fns():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    return [
        ("exp", {}, normal, lambda X: torch.exp(X)),
        ("log", {}, positive, lambda X: torch.log(X)),
        ("sqrt", {}, positive, lambda X: torch.sqrt(X)),
        ("rsqrt", {}, positive, lambda X: torch.rsqrt(X)),
        ("abs", {}, lambda *s: away_from([0.0], *s), lambda X: torch.abs(X)),
        ("pow", {"factor": 2.5}, positive, lambda X: torch.pow(X, 2.5)),
        (
            "clip",
            {"min": -0.5, "max": 0.7},
            lambda *s: away_from([-0.5, 0.7], *s, scale=1.0),
            lambda X: torch.clamp(X, -0.5, 0.7),
        ),
        (
            "leaky_relu",
            {"alpha": 0.1},
            lambda *s: away_from([0.0], *s),
            lambda X: F.leaky_relu(X, 0.1),
        ),
        ("elu", {"alpha": 0.8}, lambda *s: away_from([0.0], *s), lambda X: F.elu(X, 0.8)),
        ("softplus", {}, lambda *s: 5 * normal(*s), lambda X: F.softplus(X)),
        ("softsign", {}, normal, lambda X: F.softsign(X)),
        ("swish", {}, normal, lambda X: F.silu(X)),
        ("swish", {"beta": 1.7}, normal, lambda X: X * torch.sigmoid(1.7 * X)),
        (
            "hard_sigmoid",
            {"slope": 1 / 6, "offset": 0.5},
            lambda *s: away_from([-3.0, 3.0], *s, scale=4.0),
            # not F.hardsigmoid: its gradient uses 1/6 rounded to float32
            lambda X: torch.clamp(X / 6 + 0.5, 0, 1),
        ),
    ]


def test_ops_equal_pytorch_in_float64():
    for op, attrs, make, fn in _torch_fns():
        x = np.asarray(make(6, 5))
        upstream = normal(6, 5)
        got, (dx,) = nf_value_and_grads(op, {"X": x}, attrs, ["X"], upstream)
        want, (want_dx,) = torch_value_and_grads(fn, {"X": x}, ["X"], upstream)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=op)
        np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-12, err_msg=f"d{op}")


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_equals_pytorch_to_1e8(approximate):
    """The issue's acceptance: gelu's forward and gradient equal torch's in float64 to 1e-8,
    over a grid reaching far into both tails."""
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-12, 12, 961), 4 * normal(200)])
    upstream = normal(x.size)
    got, (dx,) = nf_value_and_grads("gelu", {"X": x}, {"approximate": approximate}, ["X"], upstream)
    mode = "tanh" if approximate else "none"
    want, (want_dx,) = torch_value_and_grads(
        lambda X: torch.nn.functional.gelu(X, approximate=mode), {"X": x}, ["X"], upstream
    )
    assert np.max(np.abs(got - want)) <= 1e-8
    assert np.max(np.abs(dx - want_dx)) <= 1e-8
    # far tighter in fact: the exact erf of libm against torch's
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-13)


# ---- build-time errors ----

FLOAT_ONLY = [op for op in REFS if op != "abs"]
ATTRS_FOR = {"clip": {"min": 0.0, "max": 1.0}}


@pytest.mark.parametrize("op", FLOAT_ONLY)
@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_float_only_ops_refuse_other_dtypes_when_built(op, dtype):
    x = nf.data("x", [-1, 3], dtype)
    with pytest.raises(DTypeError, match=f"{op} needs a floating-point X, got {dtype}") as info:
        getattr(nf.layers, op)(x, **ATTRS_FOR.get(op, {}))  # marker: int-input
    assert info.value.location.op_type == op
    assert "test_activation_ext.py" in str(info.value)
    assert nf.default_main_program().global_block().ops == []


def test_abs_refuses_bool():
    x = nf.data("x", [3], "bool")
    with pytest.raises(DTypeError, match="bool"):
        nf.layers.abs(x)


def test_clip_with_min_above_max_fails_when_built():
    x = nf.data("x", [3], "float32")
    with pytest.raises(AttrError, match=r"min <= max, got min=2.0 and max=1.0"):
        nf.layers.clip(x, min=2.0, max=1.0)


def test_clip_needs_both_bounds():
    x = nf.data("x", [3], "float32")
    block = nf.default_main_program().global_block()
    out = block.create_var("out")
    with pytest.raises(AttrError, match="'max' is required"):
        block.append_op("clip", {"X": x}, {"Out": out}, {"min": 0.0})


def test_pow_factor_tensor_must_hold_one_float():
    x = nf.data("x", [3], "float32")
    with pytest.raises(ShapeError, match=r"one element, got shape \[2\]"):
        nf.layers.pow(x, nf.data("f", [2], "float32"))
    with pytest.raises(DTypeError, match="FactorTensor must be floating point"):
        nf.layers.pow(x, nf.data("g", [1], "int64"))


def test_pow_factor_tensor_is_read_at_run_time():
    x = nf.data("x", [3], "float64")
    f = nf.data("f", [1], "float64")
    out = nf.layers.pow(x, f)
    exe, scope = nf.Executor(), nf.Scope()
    xs = np.array([1.0, 2.0, 3.0])
    for factor in (2.0, 0.5):
        (got,) = exe.run(feed={"x": xs, "f": np.array([factor])}, fetch_list=[out], scope=scope)
        np.testing.assert_allclose(got, xs**factor)


# ---- the specialised kernels: same values, in place when the executor owns the buffer ----


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("relu", {}),
        ("tanh", {}),
        ("exp", {}),
        ("clip", {"min": -0.2, "max": 0.3}),
        ("leaky_relu", {}),
        ("pow", {"factor": 2.0}),
        ("rsqrt", {}),
    ],
)
def test_specialised_kernels_in_a_chain_match_numpy(op, attrs):
    """A chain big enough for the executor to release and reuse buffers in place: the fast
    kernels (bare ufuncs, out= variants) give the forward kernels' values."""
    xs = np.abs(normal(64, 80)) + 0.5
    x = nf.data("x", [64, 80], "float64")
    h = x
    for _ in range(3):
        h = nf.layers.scale(append_op(op, {"X": h}, attrs), scale=0.05, bias=0.6)
    (got,) = nf.Executor().run(feed={"x": xs}, fetch_list=[h], scope=nf.Scope())
    want = xs
    ref = REFS.get(op) or {"relu": lambda X: np.maximum(X, 0), "tanh": np.tanh}[op]
    for _ in range(3):
        want = ref(want, **attrs) * 0.05 + 0.6
    np.testing.assert_allclose(got, want, rtol=1e-13)
    np.testing.assert_array_equal(xs, np.abs(xs))  # the feed itself was not written into


def test_in_place_kernels_never_write_an_array_a_live_view_shares():
    """reshape (and slice) give views of their input. An in-place kernel may take a buffer
    only when nothing else holds its memory: not while a view of it is alive, and not the
    view while its base is alive; once both are dead it may, and values stay right."""
    xs = normal(64, 80)
    x = nf.data("x", [64, 80], "float64")
    t = nf.layers.scale(x, scale=2.0)  # a temporary big enough to be released
    view = nf.layers.reshape(t, [80, 64])
    r = nf.layers.relu(t)  # t's last use, but `view` still shares its memory
    u = nf.layers.tanh(nf.layers.reshape(view, [64, 80]))  # a view of a view: last use
    s = nf.layers.scale(x, scale=3.0)
    w = nf.layers.exp(nf.layers.reshape(s, [80, 64]))  # s dead after the reshape: may go in place
    q = nf.layers.scale(x, scale=4.0)
    a = nf.layers.relu(nf.layers.reshape(q, [64, 80]))  # a reshape to q's shape is q itself
    b = nf.layers.tanh(q)  # ... and q is read after that relu
    fetch = [view, r, u, w, a, b]
    got = nf.Executor().run(feed={"x": xs}, fetch_list=fetch, scope=nf.Scope())
    np.testing.assert_array_equal(got[0], (2 * xs).reshape(80, 64))
    np.testing.assert_array_equal(got[1], np.maximum(2 * xs, 0))
    np.testing.assert_array_equal(got[2], np.tanh(2 * xs))
    np.testing.assert_array_equal(got[3], np.exp(3 * xs).reshape(80, 64))
    np.testing.assert_array_equal(got[4], np.maximum(4 * xs, 0))
    np.testing.assert_array_equal(got[5], np.tanh(4 * xs))


def test_slices_are_views_that_in_place_kernels_respect():
    """slice gives a view (a whole-range slice gives its input itself), under the same rules
    as reshape's: values stay right whether or not a buffer may be lent."""
    xs = normal(64, 80)
    x = nf.data("x", [64, 80], "float64")
    t = nf.layers.scale(x, scale=2.0)
    part = nf.layers.slice(t, axes=[0], starts=[10], ends=[40])
    whole = nf.layers.slice(t, axes=[0, 1], starts=[0, -80], ends=[64, 10**9])
    r = nf.layers.relu(t)  # t's last use, while both slices of it are fetched
    s = nf.layers.scale(x, scale=3.0)
    e = nf.layers.exp(nf.layers.slice(s, axes=[1], starts=[5], ends=[-5]))  # s dead: may lend
    fetch = [part, whole, r, e]
    got = nf.Executor().run(feed={"x": xs}, fetch_list=fetch, scope=nf.Scope())
    np.testing.assert_array_equal(got[0], 2 * xs[10:40])
    np.testing.assert_array_equal(got[1], 2 * xs)
    np.testing.assert_array_equal(got[2], np.maximum(2 * xs, 0))
    np.testing.assert_array_equal(got[3], np.exp(3 * xs[:, 5:-5]))


def test_gelus_erf_is_libms_for_every_element():
    """gelu's erf is math.erf element by element (NumPy has none): equal bit for bit, infinities,
    NaN, -0.0, 0-d and empty arrays included."""
    from nestflow.ops.activation import erf as _erf

    x = np.concatenate([np.linspace(-7, 7, 2001), [np.inf, -np.inf, np.nan, -0.0]])
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_array_equal(_erf(x, np), want)
    np.testing.assert_array_equal(_erf(x.reshape(5, -1), np), want.reshape(5, -1))
    assert _erf(np.asarray(0.5), np).shape == () and _erf(np.asarray(0.5), np) == math.erf(0.5)
    assert _erf(np.zeros((0, 3)), np).shape == (0, 3)
    # a device computes a rational erf on the device, within 5e-16 of math.erf
    on_device = _erf(standin.xp.asarray(x), standin.xp)
    np.testing.assert_allclose(standin.asnumpy(on_device), want, rtol=0, atol=5e-16)
