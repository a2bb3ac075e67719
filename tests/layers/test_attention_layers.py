"""multi_head_attention and the Transformer layers against PyTorch (issue 30 acceptance):
nn.MultiheadAttention, nn.TransformerEncoderLayer / DecoderLayer / TransformerEncoder with
weights copied in, float64 to 1e-10, forward and every gradient (inputs and parameters),
key-padding, causal and additive masks, pre- and post-norm, relu and gelu; a query whose keys
are all masked gives zeros; errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ShapeError

torch = pytest.importorskip("torch")

B, T, S, E, H, F = 3, 5, 4, 8, 2, 12
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _torch_param(sd: dict, rel: str) -> np.ndarray:
    """The PyTorch value behind the nestflow parameter `rel` (its name after the prefix)."""
    *path, part, kind = rel.split(".")
    base = ".".join(path)
    dot = base + "." if base else ""
    if part in ("q_proj", "k_proj", "v_proj"):
        i = ("q_proj", "k_proj", "v_proj").index(part)
        full = sd[f"{dot}in_proj_{'weight' if kind == 'w' else 'bias'}"]
        rows = full.shape[0] // 3
        value = full[i * rows : (i + 1) * rows]
    elif part == "in_proj":
        value = sd[f"{dot}in_proj_{'weight' if kind == 'w' else 'bias'}"]
    else:
        value = sd[f"{dot}{part}.{'weight' if kind == 'w' else 'bias'}"]
    value = value.detach().numpy() if hasattr(value, "detach") else value
    return value.T if kind == "w" and value.ndim == 2 else value


def compare(module, build, inputs: dict, torch_call, prefix: str, skip_rows=None):
    """Run `build(**vars)` in nestflow with `module`'s weights and torch_call(module, **tensors);
    compare the outputs and the gradients of sum(out * G) for every input and parameter."""
    module = module.double()
    rng = np.random.default_rng(5)
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        vars_ = {}
        for name, value in inputs.items():
            vars_[name] = nf.data(name, list(value.shape), str(value.dtype))
            vars_[name].stop_gradient = value.dtype != np.float64
        out = build(**vars_)
        g = nf.data("g", list(out.shape), "float64")
        params = main.all_parameters()
        assert params
        floats = [v for v in vars_.values() if not v.stop_gradient]
        grads = nf.gradients(nf.layers.reduce_sum(out * g), floats + params)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    sd = dict(module.named_parameters())
    for p in params:
        value = _torch_param(sd, p.name[len(prefix) + 1 :])
        assert value.shape == tuple(p.shape), p.name
        scope.find_var(p.name).get(nf.Tensor).set(np.ascontiguousarray(value))
    tensors = {
        k: torch.from_numpy(v).requires_grad_(v.dtype == np.float64) for k, v in inputs.items()
    }
    want = torch_call(module, **tensors)
    upstream = rng.standard_normal(tuple(want.shape))
    if skip_rows is not None:
        upstream[skip_rows] = 0.0
    feed = dict(inputs, g=upstream)
    got, *got_grads = exe.run(main, feed=feed, fetch_list=[out, *grads], scope=scope)
    want_np = want.detach().numpy()
    if skip_rows is not None:
        want_np = want_np.copy()
        want_np[skip_rows] = got[skip_rows]
    np.testing.assert_allclose(got, want_np, **TOL, err_msg="forward")
    (want * torch.from_numpy(upstream)).nan_to_num().sum().backward()
    for var, grad in zip(floats + params, got_grads):
        if var in floats:
            expected = tensors[var.name].grad.numpy()
        else:
            expected = _torch_param(
                {k: p.grad for k, p in module.named_parameters()}, var.name[len(prefix) + 1 :]
            )
        np.testing.assert_allclose(grad, expected, **TOL, err_msg=f"d/d{var.name}")


R = np.random.default_rng(30)
X = R.standard_normal((B, T, E))
MEM = R.standard_normal((B, S, E))
LENGTHS = np.array([5, 2, 3], np.int64)
MEM_LENGTHS = np.array([4, 1, 3], np.int64)


def _pad(lengths, steps):
    return torch.from_numpy(np.arange(steps)[None, :] >= lengths[:, None])


CAUSAL = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)


@pytest.mark.parametrize("masks", ["none", "padding+causal", "float"])
def test_self_attention_equals_torch_multihead_attention(masks):
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True)
    float_mask = R.standard_normal((T, T))
    inputs = {"x": X}
    if masks != "none":
        inputs["lengths"] = LENGTHS

    def build(x, lengths=None):
        return nf.layers.multi_head_attention(
            x, x, x, H, attn_mask=_float_var() if masks == "float" else None,
            key_padding_lengths=lengths, causal=masks == "padding+causal", name="mha",
        )  # fmt: skip

    def _float_var():
        return nf.layers.assign(float_mask)

    def call(m, x, lengths=None):
        kwargs = {}
        if masks == "padding+causal":
            kwargs = {"key_padding_mask": _pad(LENGTHS, T), "attn_mask": CAUSAL}
        elif masks == "float":
            padding = torch.where(_pad(LENGTHS, T), -torch.inf, 0.0).double()
            kwargs = {"key_padding_mask": padding, "attn_mask": torch.from_numpy(float_mask)}
        return m(x, x, x, need_weights=False, **kwargs)[0]

    compare(mha, build, inputs, call, "mha")


def test_cross_attention_equals_torch_with_memory_padding():
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True)

    def build(x, mem, lengths):
        return nf.layers.multi_head_attention(x, mem, mem, H, key_padding_lengths=lengths,
                                              name="cross")  # fmt: skip

    def call(m, x, mem, lengths):
        return m(x, mem, mem, key_padding_mask=_pad(MEM_LENGTHS, S), need_weights=False)[0]

    compare(mha, build, {"x": X, "mem": MEM, "lengths": MEM_LENGTHS}, call, "cross")


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_encoder_layer_equals_torch(norm_first, activation):
    layer = torch.nn.TransformerEncoderLayer(
        E, H, F, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )

    def build(x, lengths):
        return nf.nets.transformer_encoder_layer(
            x, H, F, dropout=0.0, activation=activation, normalize_before=norm_first,
            src_key_padding_lengths=lengths, name="enc",
        )  # fmt: skip

    def call(m, x, lengths):
        return m(x, src_key_padding_mask=_pad(LENGTHS, T))

    compare(layer, build, {"x": X, "lengths": LENGTHS}, call, "enc")


@pytest.mark.parametrize("norm_first, activation", [(False, "gelu"), (True, "relu")])
def test_decoder_layer_equals_torch(norm_first, activation):
    layer = torch.nn.TransformerDecoderLayer(
        E, H, F, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )

    def build(x, mem, lengths):
        return nf.nets.transformer_decoder_layer(
            x, mem, H, F, dropout=0.0, activation=activation, normalize_before=norm_first,
            memory_key_padding_lengths=lengths, tgt_causal=True, name="dec",
        )  # fmt: skip

    def call(m, x, mem, lengths):
        return m(x, mem, tgt_mask=CAUSAL, memory_key_padding_mask=_pad(MEM_LENGTHS, S))

    compare(layer, build, {"x": X, "mem": MEM, "lengths": MEM_LENGTHS}, call, "dec")


def test_stacked_encoder_equals_torch_transformer_encoder():
    one = torch.nn.TransformerEncoderLayer(
        E, H, F, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    stack = torch.nn.TransformerEncoder(
        one, 2, norm=torch.nn.LayerNorm(E), enable_nested_tensor=False
    )
    with torch.no_grad():  # the clones start equal: make the layers differ
        for p in stack.layers[1].parameters():
            p.add_(0.1 * torch.randn_like(p))

    def build(x, lengths):
        return nf.nets.transformer_encoder(
            x, 2, H, F, dropout=0.0, activation="gelu", normalize_before=True,
            src_key_padding_lengths=lengths, final_norm=True, name="stack",
        )  # fmt: skip

    def call(m, x, lengths):
        return m(x, src_key_padding_mask=_pad(LENGTHS, T))

    compare(stack, build, {"x": X, "lengths": LENGTHS}, call, "stack")


def test_a_query_with_every_key_masked_gets_zeros_and_finite_gradients():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, T, E], "float64")
        x.stop_gradient = False
        mask = nf.data("mask", [T, T], "bool")
        out = nf.layers.multi_head_attention(x, x, x, H, attn_mask=mask, bias_attr=False)
        (dx,) = nf.gradients(nf.layers.reduce_sum(out), [x])
    exe = nf.Executor()
    exe.run(startup)
    masked = np.zeros((T, T), bool)
    masked[2] = True  # query 2 may look at nothing
    got, grad = exe.run(main, feed={"x": X, "mask": masked}, fetch_list=[out, dx])
    np.testing.assert_array_equal(got[:, 2], 0.0)  # no bias: zeros through the out-projection
    assert np.isfinite(got).all() and np.isfinite(grad).all()


def test_unknown_key_length_reads_tk_when_it_runs():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, -1, E], "float64")
        lengths = nf.data("lengths", [-1], "int64")
        out = nf.layers.multi_head_attention(x, x, x, H, key_padding_lengths=lengths)
    exe = nf.Executor()
    exe.run(startup)
    (got,) = exe.run(main, feed={"x": X, "lengths": LENGTHS}, fetch_list=[out])
    assert got.shape == (B, T, E) and np.isfinite(got).all()


def test_dropout_is_on_in_training_and_off_in_a_test_clone():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, T, E], "float64")
        out = nf.nets.transformer_encoder_layer(x, H, F, dropout=0.5)
    test_program = main.clone(for_test=True)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    a, b = (exe.run(main, feed={"x": X}, fetch_list=[out], scope=scope)[0] for _ in range(2))
    c, d = (exe.run(test_program, feed={"x": X}, fetch_list=[out.name], scope=scope)[0]
            for _ in range(2))  # fmt: skip
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(c, d)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"num_heads": 3}, ShapeError, "do not split into num_heads=3"),
        ({"num_heads": 0}, AttrError, "num_heads must be >= 1"),
        ({"num_heads": 2, "dropout_rate": 1.0}, AttrError, "dropout_rate"),
        ({"num_heads": 2, "attn_mask": "int_mask"}, DTypeError, "attn_mask"),
        ({"num_heads": 2, "key_padding_lengths": "float_lengths"}, DTypeError, "int32 or int64"),
    ],
)
def test_multi_head_attention_errors(kwargs, error, words):
    with nf.program_guard(nf.Program(), nf.Program()):
        x = nf.data("x", [-1, T, E])
        extra = {"int_mask": nf.data("m", [T, T], "int64"),
                 "float_lengths": nf.data("n", [-1], "float32")}  # fmt: skip
        kwargs = {k: extra.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
        with pytest.raises(error, match="multi_head_attention") as raised:
            nf.layers.multi_head_attention(x, x, x, **kwargs)
        assert words in str(raised.value)


def test_transformer_layer_errors():
    with nf.program_guard(nf.Program(), nf.Program()):
        x = nf.data("x", [-1, T, E])
        with pytest.raises(AttrError, match="activation must be 'relu' or 'gelu'"):
            nf.nets.transformer_encoder_layer(x, H, activation="tanh")
        with pytest.raises(ShapeError, match=r"\[batch, time, d_model\]"):
            nf.nets.transformer_encoder_layer(nf.data("flat", [-1, E]), H)
        with pytest.raises(AttrError, match="num_layers"):
            nf.nets.transformer_encoder(x, 0, H)
