"""nf.layers.lstm / nf.layers.gru against torch.nn.LSTM / nn.GRU with the same weights copied
across by name, on unequal lengths (PyTorch via pack_padded_sequence): outputs, last states and
every gradient (inputs, initial states, all parameters) in float64 to 1e-8; numeric gradients,
dropout between layers, rows of length 0, errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, NestflowError, ShapeError
from tests.gradcheck import assert_gradients_match

L = nf.layers
N, T, D, H = 4, 6, 3, 5
TORCH_NAMES = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}


def _build(kind, layers, bidirec, with_init, dropout=0.0, name="net"):
    main, startup = nf.Program(), nf.Program()
    dirs = 2 if bidirec else 1
    with nf.program_guard(main, startup):
        x = L.data("x", [-1, T, D], "float64", stop_gradient=False)
        n = L.data("n", [-1], "int64")
        h0 = c0 = None
        if with_init:
            h0 = L.data("h0", [layers * dirs, -1, H], "float64", stop_gradient=False)
            c0 = L.data("c0", [layers * dirs, -1, H], "float64", stop_gradient=False)
        if kind == "lstm":
            out, h, c = L.lstm(x, H, n, layers, bidirec, dropout, h0, c0, name=name)
            finals = [h, c]
        else:
            out, h = L.gru(x, H, n, layers, bidirec, dropout, h0, name=name)
            finals = [h]
        ups = [L.data("up", [-1, T, H * dirs], "float64")]
        ups += [L.data(f"up{i}", [layers * dirs, -1, H], "float64") for i in range(len(finals))]
        loss = L.reduce_sum(out * ups[0])
        for f, u in zip(finals, ups[1:]):
            loss = loss + L.reduce_sum(f * u)
        nf.append_backward(loss)
    return main, startup, out, finals, loss


def _feed(kind, layers, bidirec, with_init, rng, lens):
    dirs = 2 if bidirec else 1
    states = 2 if kind == "lstm" else 1
    feed = {"x": rng.standard_normal((len(lens), T, D)), "n": np.asarray(lens),
            "up": rng.standard_normal((len(lens), T, H * dirs))}  # fmt: skip
    for i in range(states):
        feed[f"up{i}"] = rng.standard_normal((layers * dirs, len(lens), H))
    if with_init:
        feed["h0"] = rng.standard_normal((layers * dirs, len(lens), H))
        if kind == "lstm":
            feed["c0"] = rng.standard_normal((layers * dirs, len(lens), H))
    return feed


def _params(main, name="net"):
    return sorted(p.name for p in main.all_parameters() if p.name.startswith(name + "."))


def _setup(main, startup, seed=0):
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(seed)
    for p in main.all_parameters():  # wider than PyTorch's init: saturating gates get tested
        scope.find_var(p.name).get(nf.Tensor).set(rng.uniform(-0.8, 0.8, p.shape))
    return scope, exe


def _torch_run(kind, layers, bidirec, weights, feed, with_init):
    torch = pytest.importorskip("torch")
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    module = cls(D, H, num_layers=layers, bidirectional=bidirec, batch_first=True).double()
    with torch.no_grad():
        for name, value in weights.items():
            key = name.split(".", 1)[1]  # "net.w_ih_l1_reverse" -> weight_ih_l1_reverse
            getattr(module, TORCH_NAMES[key[:4]] + key[4:]).copy_(torch.from_numpy(value))
    x = torch.tensor(feed["x"], requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        x, torch.from_numpy(feed["n"]), batch_first=True, enforce_sorted=False
    )
    init = None
    leaves = []
    if with_init:
        leaves = [torch.tensor(feed["h0"], requires_grad=True)]
        if kind == "lstm":
            leaves.append(torch.tensor(feed["c0"], requires_grad=True))
        init = tuple(leaves) if kind == "lstm" else leaves[0]
    out, final = module(packed, init)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
    finals = list(final) if kind == "lstm" else [final]
    loss = (out * torch.from_numpy(feed["up"])).sum()
    for i, f in enumerate(finals):
        loss = loss + (f * torch.from_numpy(feed[f"up{i}"])).sum()
    loss.backward()
    grads = {}
    for name in weights:
        key = name.split(".", 1)[1]
        grads[name] = getattr(module, TORCH_NAMES[key[:4]] + key[4:]).grad.numpy()
    result = {"out": out.detach().numpy(), "x": x.grad.numpy()}
    result.update({f"final{i}": f.detach().numpy() for i, f in enumerate(finals)})
    result.update({f"init{i}": leaf.grad.numpy() for i, leaf in enumerate(leaves)})
    return result, grads


CONFIGS = [  # (layers, bidirectional, initial states)
    (1, False, False),
    (1, True, False),
    (2, False, True),
    (2, True, True),
]


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers,bidirec,with_init", CONFIGS,
                         ids=["1layer", "1layer-bidirec", "2layers-init", "2layers-bidirec-init"])  # fmt: skip
def test_equals_torch_on_packed_sequences(kind, layers, bidirec, with_init):
    main, startup, out, finals, _ = _build(kind, layers, bidirec, with_init)
    params = _params(main)
    dirs = 2 if bidirec else 1
    assert len(params) == 4 * layers * dirs
    scope, exe = _setup(main, startup)
    feed = _feed(kind, layers, bidirec, with_init, np.random.default_rng(1), [T, 2, 5, 1])
    inits = ["h0@GRAD", "c0@GRAD"][: len(finals)] if with_init else []
    fetch = [out, *finals, "x@GRAD", *inits, *[p + "@GRAD" for p in params]]
    got = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
    weights = {p: scope.find_var(p).get(nf.Tensor).numpy() for p in params}
    want, want_grads = _torch_run(kind, layers, bidirec, weights, feed, with_init)
    expected = [want["out"], *[want[f"final{i}"] for i in range(len(finals))], want["x"]]
    expected += [want[f"init{i}"] for i in range(len(inits))]
    expected += [want_grads[p] for p in params]
    names = ["out", *[f"final{i}" for i in range(len(finals))], "dx", *inits, *params]
    for name, g, w in zip(names, got, expected):
        assert np.shape(g) == np.shape(w), name
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-8, err_msg=name)
    assert np.all(got[0][1, 2:] == 0) and np.all(got[0][3, 1:] == 0)  # padding: zero output


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_are_central_differences(kind):
    main, startup, out, finals, loss = _build(kind, 2, True, True)
    scope, exe = _setup(main, startup, seed=3)
    feed = _feed(kind, 2, True, True, np.random.default_rng(4), [3, 6])
    names = ["x", "h0"] + (["c0"] if kind == "lstm" else []) + _params(main)
    assert_gradients_match(exe, main, scope, feed, loss, names, rtol=1e-6, atol=1e-8)


def test_rows_of_length_zero_keep_their_initial_states_and_output_zeros():
    main, startup, out, finals, _ = _build("lstm", 2, True, True)
    scope, exe = _setup(main, startup)
    feed = _feed("lstm", 2, True, True, np.random.default_rng(5), [0, 4])
    got_out, h, c = exe.run(main, feed=feed, fetch_list=[out, *finals], scope=scope)
    assert np.all(got_out[0] == 0)
    np.testing.assert_array_equal(h[:, 0], feed["h0"][:, 0])
    np.testing.assert_array_equal(c[:, 0], feed["c0"][:, 0])


def test_dropout_between_layers_only_in_training():
    rng = np.random.default_rng(6)
    feed = _feed("gru", 2, False, False, rng, [6, 3, 2, 5])
    main, startup, out, finals, _ = _build("gru", 2, False, False, dropout=0.5)
    plain, plain_startup, plain_out, _, _ = _build("gru", 2, False, False, dropout=0.0)
    assert [op.type for op in main.global_block().ops].count("dropout") == 1  # between layers
    scope, exe = _setup(main, startup)
    test_program = main.clone(for_test=True)
    nf.seed(0)
    (train,) = exe.run(main, feed=feed, fetch_list=[out], scope=scope)
    (infer,) = exe.run(test_program, feed=feed, fetch_list=[out.name], scope=scope)
    plain_scope, _ = _setup(plain, plain_startup)
    (want,) = exe.run(plain, feed=feed, fetch_list=[plain_out], scope=plain_scope)
    np.testing.assert_allclose(infer, want, rtol=1e-12)
    assert not np.allclose(train, want)


def test_float32_and_unknown_lengths_batch():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = L.data("x", [-1, -1, D], "float32")
        out, h, c = L.lstm(x, H, num_layers=2, is_bidirec=True)
        assert (out.dtype, h.shape, c.shape) == ("float32", (4, -1, H), (4, -1, H))
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    got, hv = exe.run(
        main, feed={"x": np.ones((2, 7, D), "float32")}, fetch_list=[out, h], scope=scope
    )
    assert got.shape == (2, 7, 2 * H) and got.dtype == np.float32 and hv.shape == (4, 2, H)
    # PyTorch's init: every weight uniform in [-1/sqrt(H), 1/sqrt(H)]
    w = scope.find_var("lstm_0.w_hh_l1_reverse").get(nf.Tensor).numpy()
    assert w.shape == (4 * H, H) and np.abs(w).max() <= 1 / np.sqrt(H)


def test_errors_name_the_layer_and_the_variable():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = L.data("x", [4, T, D], "float64")
        with pytest.raises(ShapeError, match=r"lengths 'n3' \[3\] has 3 lengths but 'x'"):
            L.lstm(x, H, L.data("n3", [3], "int64"))
        with pytest.raises(DTypeError, match=r"lengths 'nf' is float32\[-1\]"):
            L.gru(x, H, L.data("nf", [-1], "float32"))
        with pytest.raises(ShapeError, match=r"init_h 'h0' \[1, -1, 5\] must be \[2, batch, 5\]"):
            L.gru(x, H, is_bidirec=True, init_h=L.data("h0", [1, -1, H], "float64"))
        with pytest.raises(ShapeError, match=r"known features"):
            L.lstm(L.data("y", [-1, T], "float64"), H)
        with pytest.raises(DTypeError, match="needs a floating-point input"):
            L.lstm(L.data("ids", [-1, T, D], "int64"), H)
        with pytest.raises(AttrError, match="num_layers \\(0\\) must be >= 1"):
            L.gru(x, H, num_layers=0)


def test_bad_lengths_at_run_time_name_the_op():
    main, startup, out, _, _ = _build("lstm", 1, True, False)
    scope, exe = _setup(main, startup)
    feed = _feed("lstm", 1, True, False, np.random.default_rng(7), [2, 3, 4, 9])
    with pytest.raises(NestflowError, match=r"lengths 'n' must lie in \[0, 6\]") as info:
        exe.run(main, feed=feed, fetch_list=[out], scope=scope)
    assert "recurrent" in str(info.value) and "test_lstm_gru.py" in str(info.value)
    feed["n"] = np.array([2, 3])
    with pytest.raises(NestflowError, match=r"lengths 'n' must be an integer \[batch=4\]"):
        exe.run(main, feed=feed, fetch_list=[out], scope=scope)
