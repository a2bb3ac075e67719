"""LSTMCell, GRUCell and nf.layers.rnn (Fluid 1.7's cell API): one step and whole sequences
against torch.nn.LSTMCell/GRUCell and nn.LSTM/nn.GRU with the same weights (float64, values and
every gradient), numeric gradients, cells inside and outside nf.rnn(), hoisting, errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, ControlFlowError, DTypeError, ShapeError
from tests.gradcheck import assert_gradients_match

L = nf.layers
N, T, D, H = 3, 5, 4, 6
PARAMS = ("w_ih", "w_hh", "b_ih", "b_hh")


def _rng(seed=0):
    return np.random.default_rng(seed)


def _torch():
    torch = pytest.importorskip("torch")
    return torch


def _run(main, startup, feed, fetch, weights=None, seed=1):
    """Run with the cells' parameters set from `weights` (name -> array) or random."""
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(startup, scope=scope)
    rng = _rng(seed)
    for param in main.all_parameters():
        value = (weights or {}).get(param.name)
        if value is None:
            value = rng.uniform(-0.6, 0.6, param.shape)
        scope.find_var(param.name).get(nf.Tensor).set(np.asarray(value, param.dtype))
    return exe, scope, exe.run(main, feed=feed, fetch_list=fetch, scope=scope)


def _cell_weights(scope, cell):
    return {k: scope.find_var(getattr(cell, k).name).get(nf.Tensor).numpy() for k in PARAMS}


def _copy_into(torch_module, weights, suffix=""):
    torch = _torch()
    with torch.no_grad():
        for key in PARAMS:
            name = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}
            getattr(torch_module, name[key] + suffix).copy_(torch.from_numpy(weights[key]))


def _torch_grads(torch_module, suffix=""):
    names = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}
    return {k: getattr(torch_module, names[k] + suffix).grad.numpy() for k in PARAMS}


# ---- one step, outside any loop ----


@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_lstm_cell_step_equals_torch_lstm_cell(forget_bias):
    torch = _torch()
    rng = _rng(1)
    x, h0, c0 = (
        rng.standard_normal((N, D)),
        rng.standard_normal((N, H)),
        rng.standard_normal((N, H)),
    )
    up_h, up_c = rng.standard_normal((N, H)), rng.standard_normal((N, H))
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        xv = L.data("x", [-1, D], "float64", stop_gradient=False)
        hv = L.data("h", [-1, H], "float64", stop_gradient=False)
        cv = L.data("c", [-1, H], "float64", stop_gradient=False)
        cell = L.LSTMCell(H, forget_bias=forget_bias, dtype="float64")
        out, (h1, c1) = cell(xv, [hv, cv])
        assert out is h1
        loss = L.reduce_sum(h1 * L.assign(up_h)) + L.reduce_sum(c1 * L.assign(up_c))
        nf.append_backward(loss)
    grads = [f"{cell.name}.{k}@GRAD" for k in PARAMS]
    exe, scope, got = _run(
        main, startup, {"x": x, "h": h0, "c": c0},
        [h1, c1, "x@GRAD", "h@GRAD", "c@GRAD", *grads],
    )  # fmt: skip
    weights = _cell_weights(scope, cell)
    ref = torch.nn.LSTMCell(D, H).double()
    shifted = dict(weights, b_ih=weights["b_ih"].copy())
    shifted["b_ih"][H : 2 * H] += forget_bias  # torch has no forget_bias: fold it in
    _copy_into(ref, shifted)
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x, h0, c0))
    rh, rc = ref(tx, (th, tc))
    ((rh * torch.from_numpy(up_h)).sum() + (rc * torch.from_numpy(up_c)).sum()).backward()
    want = [rh.detach(), rc.detach(), tx.grad, th.grad, tc.grad]
    want += list(_torch_grads(ref).values())
    for name, g, w in zip(["h1", "c1", "dx", "dh", "dc", *PARAMS], got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-10, atol=1e-10, err_msg=name)


def test_gru_cell_step_equals_torch_gru_cell():
    torch = _torch()
    rng = _rng(2)
    x, h0, up = (
        rng.standard_normal((N, D)),
        rng.standard_normal((N, H)),
        rng.standard_normal((N, H)),
    )
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        xv = L.data("x", [-1, D], "float64", stop_gradient=False)
        hv = L.data("h", [-1, H], "float64", stop_gradient=False)
        cell = L.GRUCell(H, dtype="float64", name="enc")
        out, h1 = cell(xv, hv)
        assert out is h1 and cell.w_ih.name == "enc_0.w_ih"
        nf.append_backward(L.reduce_sum(h1 * L.assign(up)))
    grads = [f"enc_0.{k}@GRAD" for k in PARAMS]
    exe, scope, got = _run(main, startup, {"x": x, "h": h0}, [h1, "x@GRAD", "h@GRAD", *grads])
    ref = torch.nn.GRUCell(D, H).double()
    _copy_into(ref, _cell_weights(scope, cell))
    tx, th = (torch.tensor(a, requires_grad=True) for a in (x, h0))
    rh = ref(tx, th)
    (rh * torch.from_numpy(up)).sum().backward()
    want = [rh.detach(), tx.grad, th.grad, *_torch_grads(ref).values()]
    for name, g, w in zip(["h1", "dx", "dh", *PARAMS], got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-10, atol=1e-10, err_msg=name)


# ---- whole sequences: nf.layers.rnn against nn.LSTM / nn.GRU on packed sequences ----


def _sequence_program(kind, reverse=False, time_major=False, with_init=False):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        shape = [T, -1, D] if time_major else [-1, T, D]
        x = L.data("x", shape, "float64", stop_gradient=False)
        n = L.data("n", [-1], "int64")
        cell = (L.LSTMCell(H, forget_bias=0.0, dtype="float64") if kind == "lstm"
                else L.GRUCell(H, dtype="float64"))  # fmt: skip
        init = None
        if with_init:
            h0 = L.data("h0", [-1, H], "float64", stop_gradient=False)
            c0 = L.data("c0", [-1, H], "float64", stop_gradient=False)
            init = [h0, c0] if kind == "lstm" else h0
        out, final = nf.layers.rnn(
            cell, x, init, sequence_length=n, time_major=time_major, is_reverse=reverse
        )
        h = final[0] if kind == "lstm" else final
        up = L.data("up", [-1, T, H] if not time_major else [T, -1, H], "float64")
        up_h = L.data("up_h", [-1, H], "float64")
        loss = L.reduce_sum(out * up) + L.reduce_sum(h * up_h)
        if kind == "lstm":
            up_c = L.data("up_c", [-1, H], "float64")
            loss = loss + L.reduce_sum(final[1] * up_c)
        nf.append_backward(loss)
    return main, startup, cell, out, final, loss


def _torch_sequence(kind, weights, xs, lens, ups, reverse, init):
    """torch's nn.LSTM/GRU on the packed sequences (each row's valid steps reversed for
    `reverse`, which is how a bidirectional torch RNN runs its backward direction)."""
    torch = _torch()
    module = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(D, H, batch_first=True)
    module = module.double()
    _copy_into(module, weights, "_l0")
    tx = torch.tensor(xs, requires_grad=True)
    seq = tx
    if reverse:
        index = [list(range(n - 1, -1, -1)) + list(range(n, T)) for n in lens]
        seq = torch.stack([tx[i, idx] for i, idx in enumerate(index)])
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        seq, torch.from_numpy(lens), batch_first=True, enforce_sorted=False
    )
    h0 = None
    if init is not None:
        init = [torch.tensor(a[None], requires_grad=True) for a in init]
        h0 = tuple(init) if kind == "lstm" else init[0]
    out, final = module(packed, h0)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
    if reverse:
        out = torch.stack([out[i, idx] for i, idx in enumerate(index)])
    finals = list(final) if kind == "lstm" else [final]
    loss = (out * torch.from_numpy(ups[0])).sum()
    for f, u in zip(finals, ups[1:]):
        loss = loss + (f[0] * torch.from_numpy(u)).sum()
    loss.backward()
    result = [out.detach().numpy(), *[f[0].detach().numpy() for f in finals], tx.grad.numpy()]
    result += [g for g in _torch_grads(module, "_l0").values()]
    if init is not None:
        result += [a.grad.numpy()[0] for a in init]
    return result


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_init", [False, True], ids=["zero_init", "given_init"])
def test_rnn_of_a_cell_equals_torch_on_packed_sequences(kind, reverse, with_init):
    rng = _rng(3)
    xs = rng.standard_normal((N, T, D))
    lens = np.array([T, 2, 4])
    states = 2 if kind == "lstm" else 1
    ups = [rng.standard_normal((N, T, H))] + [rng.standard_normal((N, H)) for _ in range(states)]
    init = [rng.standard_normal((N, H)) for _ in range(states)] if with_init else None
    main, startup, cell, out, final, _ = _sequence_program(kind, reverse, with_init=with_init)
    feed = {"x": xs, "n": lens, "up": ups[0], "up_h": ups[1]}
    if kind == "lstm":
        feed["up_c"] = ups[2]
    if with_init:
        feed["h0"] = init[0]
        if kind == "lstm":
            feed["c0"] = init[1]
    finals = final if kind == "lstm" else [final]
    grads = ["x@GRAD"] + [f"{getattr(cell, k).name}@GRAD" for k in PARAMS]
    grads += ["h0@GRAD", "c0@GRAD"][:states] if with_init else []
    exe, scope, got = _run(main, startup, feed, [out, *finals, *grads])
    want = _torch_sequence(kind, _cell_weights(scope, cell), xs, lens, ups, reverse, init)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-8, err_msg=f"fetch {i}")
    assert np.all(got[0][1, 2:] == 0) and np.all(got[0][2, 4:] == 0)  # padding: zeros


def test_time_major_inputs_give_time_major_outputs():
    rng = _rng(4)
    xs = rng.standard_normal((N, T, D))
    lens = np.array([T, 3, 1])
    ups = [rng.standard_normal((N, T, H)), rng.standard_normal((N, H)), rng.standard_normal((N, H))]
    feed = {"x": xs, "n": lens, "up": ups[0], "up_h": ups[1], "up_c": ups[2]}
    results = []
    for time_major in (False, True):
        main, startup, cell, out, final, _ = _sequence_program("lstm", time_major=time_major)
        tm_feed = dict(feed)
        if time_major:
            tm_feed["x"], tm_feed["up"] = xs.transpose(1, 0, 2), ups[0].transpose(1, 0, 2)
        fetch = [out, *final, "x@GRAD", f"{cell.w_hh.name}@GRAD"]
        _, _, got = _run(main, startup, tm_feed, fetch, seed=9)
        if time_major:
            got[0], got[3] = got[0].transpose(1, 0, 2), got[3].transpose(1, 0, 2)
        results.append(got)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_rnn_of_a_cell_gradients_are_central_differences(kind):
    rng = _rng(5)
    main, startup, cell, out, final, loss = _sequence_program(kind, reverse=True)
    feed = {"x": rng.standard_normal((2, T, D)), "n": np.array([4, 2]),
            "up": rng.standard_normal((2, T, H)), "up_h": rng.standard_normal((2, H)),
            "up_c": rng.standard_normal((2, H))}  # fmt: skip
    if kind == "gru":
        del feed["up_c"]
    exe, scope, _ = _run(main, startup, feed, [loss])
    names = ["x"] + [getattr(cell, k).name for k in PARAMS]
    assert_gradients_match(exe, main, scope, feed, loss, names, rtol=1e-6, atol=1e-8)


# ---- structure: hoisting, use inside nf.rnn() and While, custom activations ----


def _step_ops(main):
    (op,) = [op for op in main.global_block().ops if op.type == "recurrent"]
    return [o.type for o in op.attr("sub_block").ops]


def test_a_step_holds_one_product_and_the_fused_op_the_rest_runs_once():
    for kind, step in (("lstm", ["matmul", "elementwise_add", "lstm_unit"]),
                       ("gru", ["matmul", "gru_cell"])):  # fmt: skip
        main, *_ = _sequence_program(kind)
        assert _step_ops(main) == step
        outer = [op.type for op in main.global_block().ops]
        assert outer.count("mul") == 1  # the input projection of every step: one GEMM


def test_cells_inside_an_nf_rnn_step_without_hoisting_give_the_same_values():
    rng = _rng(6)
    xs, lens = rng.standard_normal((N, T, D)), np.array([5, 1, 3])
    results = []
    for hoist in (True, False):
        main, startup = nf.Program(), nf.Program()
        with nf.program_guard(main, startup), nf.unique_name.guard():
            x = L.data("x", [-1, T, D], "float64")
            n = L.data("n", [-1], "int64")
            lstm, gru = L.LSTMCell(H, dtype="float64"), L.GRUCell(H, dtype="float64")
            rnn = nf.rnn(hoist=hoist)
            with rnn.step():
                x_t = rnn.step_input(x, lengths=n)
                h = rnn.memory(shape=[H], batch_ref=x, dtype="float64")
                c = rnn.memory(shape=[H], batch_ref=x, dtype="float64")
                g = rnn.memory(shape=[H], batch_ref=x, dtype="float64")
                out, (h1, c1) = lstm(x_t, [h, c])
                g1, _ = gru(out, g)  # a second cell stacked on the first, same step
                rnn.update_memory(h, h1)
                rnn.update_memory(c, c1)
                rnn.update_memory(g, g1)
                rnn.output(g1)
            stacked = rnn()
            loss = L.mean(stacked)
            nf.append_backward(loss)
            grads = [f"{p.name}@GRAD" for p in sorted(main.all_parameters(), key=lambda p: p.name)]
        _, _, got = _run(main, startup, {"x": xs, "n": lens}, [stacked, *grads], seed=2)
        results.append(got)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_custom_activations_compose_ops_and_match_numpy():
    rng = _rng(7)
    x, h0, c0 = (
        rng.standard_normal((N, D)),
        rng.standard_normal((N, H)),
        rng.standard_normal((N, H)),
    )
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        xv = L.data("x", [-1, D], "float64")
        hv = L.data("h", [-1, H], "float64")
        cv = L.data("c", [-1, H], "float64")
        lstm = L.LSTMCell(H, gate_activation=L.hard_sigmoid, activation=L.relu, dtype="float64")
        gru = L.GRUCell(H, activation="softsign", dtype="float64")
        _, (h1, c1) = lstm(xv, [hv, cv])
        g1, _ = gru(xv, hv)
    types = [op.type for op in main.global_block().ops]
    assert "lstm_unit" not in types and "gru_cell" not in types
    _, scope, (h1v, c1v, g1v) = _run(main, startup, {"x": x, "h": h0, "c": c0}, [h1, c1, g1])
    w = _cell_weights(scope, lstm)
    hard = lambda v: np.clip(0.2 * v + 0.5, 0, 1)  # noqa: E731
    gates = x @ w["w_ih"].T + w["b_ih"] + h0 @ w["w_hh"].T + w["b_hh"]
    i, f, g, o = np.split(gates, 4, axis=1)
    c_want = hard(f + 1.0) * c0 + hard(i) * np.maximum(g, 0)
    np.testing.assert_allclose(c1v, c_want, rtol=1e-12)
    np.testing.assert_allclose(h1v, hard(o) * np.maximum(c_want, 0), rtol=1e-12)
    w = _cell_weights(scope, gru)
    xr, xz, xn = np.split(x @ w["w_ih"].T + w["b_ih"], 3, axis=1)
    hr, hz, hn = np.split(h0 @ w["w_hh"].T + w["b_hh"], 3, axis=1)
    r, z = 1 / (1 + np.exp(-(xr + hr))), 1 / (1 + np.exp(-(xz + hz)))
    pre = xn + r * hn
    n = pre / (1 + np.abs(pre))
    np.testing.assert_allclose(g1v, (1 - z) * n + z * h0, rtol=1e-12)


def test_get_initial_states_shapes_values_and_batch_dim():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = L.data("x", [T, -1, D], "float32")
        lstm, gru = L.LSTMCell(H), L.GRUCell(H, dtype="float64")
        assert lstm.state_shape == [[H], [H]] and gru.state_shape == [H]
        h, c = lstm.get_initial_states(x, init_value=0.5, batch_dim_idx=1)
        g = gru.get_initial_states([x], shape=[2, 3], init_value=-1)
        z = lstm.get_initial_states(x, shape=[[1], [2]], dtype=["float64", "int64"])
    assert (h.dtype, g.dtype, z[1].dtype) == ("float32", "float64", "int64")
    got = nf.Executor().run(
        main, feed={"x": np.zeros((T, 7, D), "float32")}, fetch_list=[h, c, g, *z]
    )
    assert [a.shape for a in got] == [(7, H), (7, H), (T, 2, 3), (T, 1), (T, 2)]
    assert np.all(got[0] == 0.5) and np.all(got[2] == -1) and np.all(got[4] == 0)


def test_parameter_names_attrs_and_sharing():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = L.data("x", [-1, D], "float32")
        cell = L.LSTMCell(H, param_attr=nf.ParamAttr(name="enc.w"), bias_attr=False)
        h, c = cell.get_initial_states(x)
        out, states = cell(x, [h, c])
        cell(x, states)  # a second call shares the parameters
        other = L.GRUCell(H)
        other(x, h)
    names = sorted(p.name for p in main.all_parameters())
    assert names == ["GRUCell_0.b_hh", "GRUCell_0.b_ih", "GRUCell_0.w_hh", "GRUCell_0.w_ih",
                     "enc.w_hh", "enc.w_ih"]  # fmt: skip
    assert [op.type for op in main.global_block().ops].count("transpose") == 4  # made once


# ---- errors ----


def test_errors_name_the_cell_and_the_variable():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = L.data("x", [-1, D], "float32")
        x64 = L.data("x64", [-1, D], "float64")
        seq = L.data("seq", [-1, T, D], "float32")
        cell = L.LSTMCell(H)
        h, c = cell.get_initial_states(x)
        with pytest.raises(
            DTypeError, match=r"inputs 'x64' is float64\[-1, 4\] but the cell is float32"
        ):
            cell(x64, [h, c])
        with pytest.raises(AttrError, match=r"states must be \[h, c\]"):
            cell(x, h)
        cell(x, [h, c])
        with pytest.raises(ShapeError, match="has 6 features but the cell was built for 4"):
            cell(L.data("y", [-1, 6], "float32"), [h, c])
        with pytest.raises(ShapeError, match="must have 6 \\(hidden_size\\) columns"):
            L.GRUCell(H)(x, L.data("g", [-1, 5], "float32"))
        with pytest.raises(AttrError, match="hidden_size must be >= 1"):
            L.GRUCell(0)
        with pytest.raises(AttrError, match="cell must be an RNNCell"):
            L.rnn(object(), seq)
        with pytest.raises(ShapeError, match=r"inputs must be \[batch, time, ...\]"):
            L.rnn(L.GRUCell(H), L.data("v", [-1], "float32"))
        with pytest.raises(DTypeError, match="lengths 'bad' is float32"):
            L.rnn(L.GRUCell(H), seq, sequence_length=L.data("bad", [-1], "float32"))

        class Wrong(L.RNNCell):
            state_shape = [H]

            def call(self, inputs, states):
                return inputs, [states, states]

        with pytest.raises(ControlFlowError, match="returned 2 new state"):
            L.rnn(Wrong(), seq)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_lengths_longer_than_the_sequence_fail_at_run_time(reverse):
    main, startup, *_ = _sequence_program("gru", reverse=reverse)
    rng = _rng(8)
    feed = {"x": rng.standard_normal((2, T, D)), "n": np.array([T + 1, 2]),
            "up": np.zeros((2, T, H)), "up_h": np.zeros((2, H))}  # fmt: skip
    too_long = (
        r"Length\[0\] = 6 is outside \[0, 5\]" if reverse else r"lengths 'n' must lie in \[0, 5\]"
    )
    with pytest.raises(nf.errors.NestflowError, match=too_long) as info:
        _run(main, startup, feed, ["x@GRAD"])
    assert "test_rnn_cells.py" in str(info.value)
    feed["n"] = np.array([2, 2, 2])
    wrong_batch = (
        r"Length has shape \[3\] but X"
        if reverse
        else r"lengths 'n' must be an integer \[batch=2\]"
    )
    with pytest.raises(nf.errors.NestflowError, match=wrong_batch):
        _run(main, startup, feed, ["x@GRAD"])
