"""conv3d, pool3d, group_norm, instance_norm, bilinear_interp, nearest_interp, pixel_shuffle:
OpCases against loop-by-loop NumPy references (float64 central-difference gradients), and the
same ops against PyTorch's F.conv3d, F.max_pool3d / F.avg_pool3d, F.group_norm,
F.instance_norm, F.interpolate and F.pixel_shuffle."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import nestflow as nf
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(3)


def _r(*shape):
    return rng.standard_normal(shape)


# ---- loop references ----


def _pads3(paddings):
    if len(paddings) == 3:
        return [(p, p) for p in paddings]
    return [(paddings[2 * d], paddings[2 * d + 1]) for d in range(3)]


def ref_conv3d(
    Input, Filter, strides=(1, 1, 1), paddings=(0, 0, 0), dilations=(1, 1, 1), groups=1, **_
):
    x = np.pad(Input, [(0, 0), (0, 0)] + _pads3(list(paddings)))
    n, c = x.shape[:2]
    m, cg, *k = Filter.shape
    out = [(x.shape[2 + d] - dilations[d] * (k[d] - 1) - 1) // strides[d] + 1 for d in range(3)]
    y = np.zeros((n, m, *out))
    for b, o in itertools.product(range(n), range(m)):
        g = o // (m // groups)
        for p in itertools.product(*(range(s) for s in out)):
            acc = 0.0
            for ci in range(cg):
                for q in itertools.product(*(range(s) for s in k)):
                    idx = [p[d] * strides[d] + q[d] * dilations[d] for d in range(3)]
                    acc += x[b, g * cg + ci, idx[0], idx[1], idx[2]] * Filter[(o, ci) + q]
            y[(b, o) + p] = acc
    return {"Output": y.astype(Input.dtype)}


def ref_pool3d(
    X,
    pooling_type,
    ksize,
    strides=(1, 1, 1),
    paddings=(0, 0, 0),
    exclusive=True,
    ceil_mode=False,
    global_pooling=False,
    **_,
):
    if global_pooling:
        ksize, paddings = X.shape[2:], (0, 0, 0)
    pads = _pads3(list(paddings))
    n, c = X.shape[:2]
    out = []
    for d in range(3):
        span = X.shape[2 + d] + sum(pads[d]) - ksize[d] + (strides[d] - 1 if ceil_mode else 0)
        out.append(span // strides[d] + 1)
    y = np.zeros((n, c, *out))
    for p in itertools.product(*(range(s) for s in out)):
        lo = [p[d] * strides[d] - pads[d][0] for d in range(3)]
        hi = [lo[d] + ksize[d] for d in range(3)]
        clo = [max(v, 0) for v in lo]
        chi = [min(hi[d], X.shape[2 + d]) for d in range(3)]
        box = X[:, :, clo[0] : chi[0], clo[1] : chi[1], clo[2] : chi[2]]
        if pooling_type == "max":
            y[(slice(None), slice(None)) + p] = box.max(axis=(2, 3, 4))
        else:
            count = box[0, 0].size if exclusive else int(np.prod(ksize))
            y[(slice(None), slice(None)) + p] = box.sum(axis=(2, 3, 4)) / count
    return {"Out": y.astype(X.dtype)}


def ref_group_norm(X, Scale=None, Bias=None, epsilon=1e-5, groups=1, **_):
    n, c = X.shape[:2]
    g = X.reshape(n, groups, X[0].size // groups if n else 0)
    mean, var = g.mean(axis=2), g.var(axis=2)
    y = ((g - mean[..., None]) / np.sqrt(var[..., None] + epsilon)).reshape(X.shape)
    shape = (1, c) + (1,) * (X.ndim - 2)
    if Scale is not None:
        y = y * Scale.reshape(shape)
    if Bias is not None:
        y = y + Bias.reshape(shape)
    return {"Y": y, "Mean": mean, "Variance": var}


def ref_instance_norm(X, Scale=None, Bias=None, epsilon=1e-5, **_):
    n, c = X.shape[:2]
    out = ref_group_norm(X, Scale, Bias, epsilon, groups=c)
    return {
        "Y": out["Y"],
        "SavedMean": out["Mean"].reshape(-1),
        "SavedVariance": 1.0 / np.sqrt(out["Variance"].reshape(-1) + epsilon),
    }


def _source(k, n_in, n_out, method, align_corners, align_mode):
    """Fluid's per-axis source rule, one output position at a time."""
    if align_corners:
        ratio = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        ratio = n_in / n_out
    if method == "nearest":
        return min(int(ratio * k + 0.5) if align_corners else int(ratio * k), n_in - 1)
    if align_mode == 0 and not align_corners:
        src = max(ratio * (k + 0.5) - 0.5, 0.0)
    else:
        src = ratio * k
    low = min(int(src), n_in - 1)
    return low, min(low + 1, n_in - 1), src - low


def ref_interp(method):
    def reference(X, out_h=-1, out_w=-1, scale=0.0, align_corners=True, align_mode=1, **_):
        h, w = X.shape[2:]
        if out_h <= 0:
            out_h, out_w = int(h * scale), int(w * scale)
        y = np.zeros(X.shape[:2] + (out_h, out_w))
        for i, j in itertools.product(range(out_h), range(out_w)):
            si = _source(i, h, out_h, method, align_corners, align_mode)
            sj = _source(j, w, out_w, method, align_corners, align_mode)
            if method == "nearest":
                y[:, :, i, j] = X[:, :, si, sj]
                continue
            (i0, i1, a), (j0, j1, b) = si, sj
            y[:, :, i, j] = (
                (1 - a) * (1 - b) * X[:, :, i0, j0]
                + (1 - a) * b * X[:, :, i0, j1]
                + a * (1 - b) * X[:, :, i1, j0]
                + a * b * X[:, :, i1, j1]
            )
        return {"Out": y.astype(X.dtype)}

    return reference


def ref_pixel_shuffle(X, upscale_factor, data_format="NCHW"):
    r = upscale_factor
    n, c, h, w = X.shape
    y = np.zeros((n, c // (r * r), h * r, w * r), X.dtype)
    for ch, i, j in itertools.product(range(c // (r * r)), range(r), range(r)):
        y[:, ch, i::r, j::r] = X[:, ch * r * r + i * r + j]
    return {"Out": y}


def _distinct(*shape):
    """Values with no ties (max pooling's gradient is then unambiguous)."""
    return rng.permutation(np.prod(shape)).reshape(shape) / 7.0 - 1.0


CASES = [
    OpCase(
        "conv3d",
        {"Input": _r(2, 2, 4, 3, 5), "Filter": _r(3, 2, 2, 2, 3)},
        ref_conv3d,
        grad=("Input", "Filter"),
        id="conv3d",
    ),
    OpCase(
        "conv3d",
        {"Input": _r(1, 4, 5, 4, 4), "Filter": _r(4, 2, 3, 1, 2)},
        ref_conv3d,
        attrs={"strides": [2, 1, 2], "paddings": [1, 0, 1], "groups": 2, "dilations": [1, 2, 1]},
        grad=("Input", "Filter"),
        id="conv3d_grouped",
    ),
    OpCase(
        "conv3d",
        {"Input": _r(2, 1, 3, 3, 3), "Filter": _r(1, 1, 1, 1, 1)},
        ref_conv3d,
        attrs={"paddings": [0, 1, 0, 1, 1, 0]},
        grad=("Input", "Filter"),
        id="conv3d_size1_filter_six_paddings",
    ),
    OpCase(
        "conv3d",
        {"Input": _r(0, 2, 3, 3, 3), "Filter": _r(2, 2, 2, 2, 2)},
        ref_conv3d,
        id="conv3d_empty_batch",
    ),
    OpCase(
        "conv3d",
        {
            "Input": _r(2, 2, 3, 3, 3).astype("float32"),
            "Filter": _r(2, 2, 2, 2, 2).astype("float32"),
        },
        ref_conv3d,
        id="conv3d_float32",
    ),
    OpCase(
        "pool3d",
        {"X": _distinct(2, 2, 4, 5, 3)},
        ref_pool3d,
        attrs={"pooling_type": "max", "ksize": [2, 2, 2], "strides": [2, 2, 1]},
        grad=("X",),
        id="pool3d_max",
    ),
    OpCase(
        "pool3d",
        {"X": _distinct(1, 2, 5, 5, 3)},
        ref_pool3d,
        attrs={
            "pooling_type": "max",
            "ksize": [3, 2, 2],
            "strides": [2, 2, 2],
            "paddings": [1, 0, 0],
            "ceil_mode": True,
        },
        grad=("X",),
        id="pool3d_max_padded_ceil",
    ),
    OpCase(
        "pool3d",
        {"X": _r(2, 3, 3, 4, 5)},
        ref_pool3d,
        attrs={"pooling_type": "avg", "ksize": [2, 3, 2], "paddings": [1, 1, 1]},
        grad=("X",),
        id="pool3d_avg_exclusive",
    ),
    OpCase(
        "pool3d",
        {"X": _r(1, 1, 3, 3, 3)},
        ref_pool3d,
        attrs={
            "pooling_type": "avg",
            "ksize": [2, 2, 2],
            "paddings": [1, 0, 1],
            "exclusive": False,
            "strides": [2, 2, 2],
        },
        grad=("X",),
        id="pool3d_avg_inclusive",
    ),
    OpCase(
        "pool3d",
        {"X": _r(2, 3, 2, 3, 1)},
        ref_pool3d,
        attrs={"pooling_type": "avg", "ksize": [1, 1, 1], "global_pooling": True},
        grad=("X",),
        id="pool3d_global",
    ),
    OpCase(
        "pool3d",
        {"X": _r(0, 2, 3, 3, 3)},
        ref_pool3d,
        attrs={"pooling_type": "max", "ksize": [2, 2, 2]},
        id="pool3d_empty_batch",
    ),
    OpCase(
        "group_norm",
        {"X": _r(2, 6, 3, 5), "Scale": _r(6), "Bias": _r(6)},
        ref_group_norm,
        attrs={"groups": 3},
        grad=("X", "Scale", "Bias"),
        grad_outputs=("Y",),
        id="group_norm",
    ),
    OpCase(
        "group_norm",
        {"X": _r(3, 4, 7)},
        ref_group_norm,
        attrs={"groups": 1},
        grad=("X",),
        grad_outputs=("Y",),
        id="group_norm_one_group_1d",
    ),
    OpCase(
        "group_norm",
        {"X": _r(1, 3, 2, 2, 2), "Scale": _r(3)},
        ref_group_norm,
        attrs={"groups": 3, "epsilon": 1e-4},
        grad=("X", "Scale"),
        grad_outputs=("Y",),
        id="group_norm_3d_groups_eq_channels",
    ),
    OpCase(
        "group_norm",
        {"X": _r(0, 4, 3, 3)},
        ref_group_norm,
        attrs={"groups": 2},
        id="group_norm_empty_batch",
    ),
    OpCase(
        "instance_norm",
        {"X": _r(2, 3, 4, 5), "Scale": _r(3), "Bias": _r(3)},
        ref_instance_norm,
        grad=("X", "Scale", "Bias"),
        grad_outputs=("Y",),
        id="instance_norm",
    ),
    OpCase(
        "instance_norm",
        {"X": _r(1, 1, 3)},
        ref_instance_norm,
        grad=("X",),
        grad_outputs=("Y",),
        id="instance_norm_size1",
    ),
    OpCase(
        "bilinear_interp",
        {"X": _r(2, 3, 4, 5)},
        ref_interp("bilinear"),
        attrs={"out_h": 7, "out_w": 3},
        grad=("X",),
        id="bilinear_align_corners",
    ),
    OpCase(
        "bilinear_interp",
        {"X": _r(1, 2, 3, 4)},
        ref_interp("bilinear"),
        attrs={"out_h": 5, "out_w": 9, "align_corners": False, "align_mode": 0},
        grad=("X",),
        id="bilinear_half_pixel",
    ),
    OpCase(
        "bilinear_interp",
        {"X": _r(1, 2, 5, 3)},
        ref_interp("bilinear"),
        attrs={"scale": 1.5, "align_corners": False, "align_mode": 1},
        grad=("X",),
        id="bilinear_scale_align_mode1",
    ),
    OpCase(
        "bilinear_interp",
        {"X": _r(2, 1, 1, 1)},
        ref_interp("bilinear"),
        attrs={"out_h": 3, "out_w": 2},
        grad=("X",),
        id="bilinear_from_one_pixel",
    ),
    OpCase(
        "nearest_interp",
        {"X": _r(2, 3, 4, 5)},
        ref_interp("nearest"),
        attrs={"out_h": 8, "out_w": 3},
        grad=("X",),
        id="nearest_align_corners",
    ),
    OpCase(
        "nearest_interp",
        {"X": _r(1, 2, 3, 3)},
        ref_interp("nearest"),
        attrs={"out_h": 7, "out_w": 5, "align_corners": False},
        grad=("X",),
        id="nearest",
    ),
    OpCase(
        "nearest_interp",
        {"X": _r(0, 2, 3, 3)},
        ref_interp("nearest"),
        attrs={"scale": 2.0, "align_corners": False},
        id="nearest_empty_batch",
    ),
    OpCase(
        "pixel_shuffle",
        {"X": _r(2, 8, 3, 1)},
        ref_pixel_shuffle,
        attrs={"upscale_factor": 2},
        grad=("X",),
        id="pixel_shuffle",
    ),
    OpCase(
        "pixel_shuffle",
        {"X": _r(1, 9, 1, 2)},
        ref_pixel_shuffle,
        attrs={"upscale_factor": 3},
        grad=("X",),
        id="pixel_shuffle_r3",
    ),
    OpCase(
        "pixel_shuffle",
        {"X": _r(0, 4, 2, 2)},
        ref_pixel_shuffle,
        attrs={"upscale_factor": 2},
        id="pixel_shuffle_empty_batch",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


# ---- channel-last layouts equal the channel-first results ----


def _run(op_type, inputs, attrs, out_slot):
    from tests.ops.harness import _OneOp

    case = OpCase(op_type, inputs, lambda **_: {out_slot: None}, attrs=attrs)
    return _OneOp(case, inputs, {}).run(inputs, [out_slot])[out_slot]


def test_channel_last_layouts():
    x, w = _r(2, 3, 4, 3, 5), _r(4, 3, 2, 2, 2)
    first = _run("conv3d", {"Input": x, "Filter": w}, {"paddings": [1, 0, 1]}, "Output")
    last = _run(
        "conv3d",
        {"Input": x.transpose(0, 2, 3, 4, 1), "Filter": w},
        {"paddings": [1, 0, 1], "data_format": "NDHWC"},
        "Output",
    )
    np.testing.assert_allclose(last, first.transpose(0, 2, 3, 4, 1), rtol=1e-12)
    attrs = {"pooling_type": "avg", "ksize": [2, 2, 2]}
    first = _run("pool3d", {"X": x}, attrs, "Out")
    last = _run(
        "pool3d", {"X": x.transpose(0, 2, 3, 4, 1)}, {**attrs, "data_format": "NDHWC"}, "Out"
    )
    np.testing.assert_allclose(last, first.transpose(0, 2, 3, 4, 1), rtol=1e-12)
    img = _r(2, 4, 3, 5)
    for op, attrs, layout in [
        ("bilinear_interp", {"out_h": 5, "out_w": 4}, "data_layout"),
        ("nearest_interp", {"out_h": 5, "out_w": 4}, "data_layout"),
        ("pixel_shuffle", {"upscale_factor": 2}, "data_format"),
        ("group_norm", {"groups": 2}, "data_layout"),
    ]:
        slot = "Y" if op == "group_norm" else "Out"
        first = _run(op, {"X": img}, attrs, slot)
        last = _run(op, {"X": img.transpose(0, 2, 3, 1)}, {**attrs, layout: "NHWC"}, slot)
        np.testing.assert_allclose(last, first.transpose(0, 2, 3, 1), rtol=1e-12, err_msg=op)


# ---- against PyTorch ----

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _grads(op_type, inputs, attrs, out_slot, upstream):
    """(output, {slot: gradient}) of sum(output * upstream), through nf.gradients."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        vars_ = {}
        for slot, value in inputs.items():
            v = nf.data(f"in_{slot}", list(value.shape), "float64")
            v.stop_gradient = False
            vars_[slot] = v
        from nestflow.layers.helper import append_op

        slots = {
            "conv3d": ("Output",),
            "group_norm": ("Y", "Mean", "Variance"),
            "instance_norm": ("Y", "SavedMean", "SavedVariance"),
        }.get(op_type, ("Out",))
        outs = append_op(op_type, vars_, attrs, slots)
        out = outs[0] if isinstance(outs, tuple) else outs
        u = nf.data("upstream", list(upstream.shape), "float64")
        loss = nf.layers.reduce_sum(nf.layers.elementwise_mul(out, u))
        grads = nf.gradients(loss, list(vars_.values()))
    feed = {f"in_{s}": v for s, v in inputs.items()}
    feed["upstream"] = upstream
    got = nf.Executor().run(main, feed=feed, fetch_list=[out, *grads])
    return got[0], dict(zip(inputs, got[1:]))


def _torch(fn, inputs, upstream):
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in inputs.items()}
    out = fn(**tensors)
    (out * torch.tensor(upstream)).sum().backward()
    return out.detach().numpy(), {k: t.grad.numpy() for k, t in tensors.items()}


def _compare(op_type, inputs, attrs, fn, out_shape):
    upstream = _r(*out_shape)
    got, got_grads = _grads(op_type, inputs, attrs, None, upstream)
    want, want_grads = _torch(fn, inputs, upstream)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    for slot in inputs:
        np.testing.assert_allclose(
            got_grads[slot], want_grads[slot], rtol=1e-10, atol=1e-10, err_msg=f"{op_type} d{slot}"
        )


def test_conv3d_equals_torch():
    x, w = _r(2, 4, 5, 6, 4), _r(6, 2, 3, 2, 3)
    attrs = {"strides": [1, 2, 1], "paddings": [1, 1, 2], "dilations": [2, 1, 1], "groups": 2}

    def fn(Input, Filter):
        return F.conv3d(
            Input, Filter, stride=(1, 2, 1), padding=(1, 1, 2), dilation=(2, 1, 1), groups=2
        )

    out_shape = F.conv3d(
        torch.tensor(x),
        torch.tensor(w),
        stride=(1, 2, 1),
        padding=(1, 1, 2),
        dilation=(2, 1, 1),
        groups=2,
    ).shape
    _compare("conv3d", {"Input": x, "Filter": w}, attrs, fn, out_shape)


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool3d_equals_torch(kind):
    x = _distinct(2, 3, 5, 6, 4)
    attrs = {
        "pooling_type": kind,
        "ksize": [3, 2, 2],
        "strides": [2, 2, 1],
        "paddings": [1, 1, 0],
        "exclusive": False,
        "ceil_mode": True,
    }
    pool = F.max_pool3d if kind == "max" else F.avg_pool3d
    kwargs = {
        "kernel_size": (3, 2, 2),
        "stride": (2, 2, 1),
        "padding": (1, 1, 0),
        "ceil_mode": True,
    }
    if kind == "avg":
        kwargs["count_include_pad"] = True
    fn = lambda X: pool(X, **kwargs)  # noqa: E731
    _compare("pool3d", {"X": x}, attrs, fn, fn(torch.tensor(x)).shape)


def test_group_and_instance_norm_equal_torch():
    x, s, b = _r(3, 6, 4, 5), _r(6), _r(6)
    fn = lambda X, Scale, Bias: F.group_norm(X, 3, Scale, Bias, eps=1e-5)  # noqa: E731
    _compare("group_norm", {"X": x, "Scale": s, "Bias": b}, {"groups": 3}, fn, x.shape)
    fn = lambda X, Scale, Bias: F.instance_norm(X, weight=Scale, bias=Bias, eps=1e-5)  # noqa: E731
    _compare("instance_norm", {"X": x, "Scale": s, "Bias": b}, {}, fn, x.shape)


@pytest.mark.parametrize(
    "op_type,attrs,kwargs",
    [
        (
            "bilinear_interp",
            {"out_h": 9, "out_w": 4},
            {"size": (9, 4), "mode": "bilinear", "align_corners": True},
        ),
        (
            "bilinear_interp",
            {"out_h": 9, "out_w": 4, "align_corners": False, "align_mode": 0},
            {"size": (9, 4), "mode": "bilinear", "align_corners": False},
        ),
        (
            "bilinear_interp",
            {"out_h": 3, "out_w": 2, "align_corners": False, "align_mode": 0},
            {"size": (3, 2), "mode": "bilinear", "align_corners": False},
        ),
        (
            "nearest_interp",
            {"out_h": 10, "out_w": 3, "align_corners": False},
            {"size": (10, 3), "mode": "nearest"},
        ),
        (
            "nearest_interp",
            {"scale": 2.0, "align_corners": False},
            {"scale_factor": 2.0, "mode": "nearest"},
        ),
    ],
    ids=["bilinear_corners", "bilinear_half_pixel", "bilinear_down", "nearest", "nearest_x2"],
)
def test_interp_equals_torch(op_type, attrs, kwargs):
    x = _r(2, 3, 5, 6)
    fn = lambda X: F.interpolate(X, **kwargs)  # noqa: E731
    _compare(op_type, {"X": x}, attrs, fn, fn(torch.tensor(x)).shape)


def test_pixel_shuffle_equals_torch():
    x = _r(2, 12, 3, 4)
    fn = lambda X: F.pixel_shuffle(X, 2)  # noqa: E731
    _compare("pixel_shuffle", {"X": x}, {"upscale_factor": 2}, fn, (2, 3, 6, 8))


# ---- errors ----


@pytest.mark.parametrize(
    "op_type,shape,attrs,error",
    [
        ("pool3d", [2, 3, 4, 4], {"pooling_type": "max", "ksize": [2, 2, 2]}, nf.errors.ShapeError),
        (
            "pool3d",
            [2, 3, 4, 4, 4],
            {"pooling_type": "max", "ksize": [5, 2, 2]},
            nf.errors.ShapeError,
        ),
        (
            "pool3d",
            [2, 3, 4, 4, 4],
            {"pooling_type": "sum", "ksize": [2, 2, 2]},
            nf.errors.AttrError,
        ),
        ("group_norm", [2, 5, 4], {"groups": 2}, nf.errors.ShapeError),
        ("pixel_shuffle", [2, 5, 4, 4], {"upscale_factor": 2}, nf.errors.ShapeError),
        ("bilinear_interp", [2, 3, 4, 4], {}, nf.errors.AttrError),
        (
            "bilinear_interp",
            [2, 3, 4, 4],
            {"out_h": 2, "out_w": 2, "align_mode": 3},
            nf.errors.AttrError,
        ),
    ],
)
def test_bad_input_is_an_nf_error(op_type, shape, attrs, error):
    from nestflow.layers.helper import append_op

    with nf.program_guard(nf.Program(), nf.Program()):
        x = nf.data("x", shape, "float32")
        with pytest.raises(error):
            append_op(op_type, {"X": x}, attrs, ("Y",) if op_type == "group_norm" else ("Out",))


def test_conv3d_channel_mismatch_is_a_shape_error():
    from nestflow.layers.helper import append_op

    with nf.program_guard(nf.Program(), nf.Program()):
        x = nf.data("x", [2, 3, 4, 4, 4], "float32")
        w = nf.data("w", [4, 2, 2, 2, 2], "float32")
        with pytest.raises(nf.errors.ShapeError, match="channels"):
            append_op("conv3d", {"Input": x, "Filter": w}, {}, ("Output",))
