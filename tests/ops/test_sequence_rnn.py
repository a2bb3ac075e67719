"""The lstm and gru ops (Fluid's dynamic_lstm / dynamic_gru): OpCases against step-by-step
NumPy references over padded rows with lengths (reverse, peepholes, initial states, a row of
length 0, a batch of one, an empty batch), float64 central-difference gradients."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(11)


def _r(*shape, scale=0.5):
    return rng.standard_normal(shape) * scale


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


_ACT = {
    "sigmoid": _sig,
    "tanh": np.tanh,
    "relu": lambda v: np.maximum(v, 0),
    "identity": lambda v: v,
}


def _rows(x, lengths, is_reverse):
    """Per row, its valid steps in processing order (with their time indices)."""
    for n, length in enumerate(lengths):
        steps = list(range(length))
        yield n, (steps[::-1] if is_reverse else steps)


def ref_lstm(
    Input,
    Weight,
    Bias,
    H0=None,
    C0=None,
    Length=None,
    use_peepholes=True,
    is_reverse=False,
    gate_activation="sigmoid",
    cell_activation="tanh",
    candidate_activation="tanh",
    **_,
):
    n, steps, _ = Input.shape
    d = Weight.shape[0]
    lengths = Length if Length is not None else [steps] * n
    hidden, cell = np.zeros((n, steps, d)), np.zeros((n, steps, d))
    b = Bias[0]
    g_act, c_act, h_act = (
        _ACT[a] for a in (gate_activation, candidate_activation, cell_activation)
    )
    for row, order in _rows(Input, lengths, is_reverse):
        h = H0[row] if H0 is not None else np.zeros(d)
        c = C0[row] if C0 is not None else np.zeros(d)
        for t in order:
            g = Input[row, t] + h @ Weight + b[: 4 * d]
            gc, gi, gf, go = g[:d], g[d : 2 * d], g[2 * d : 3 * d], g[3 * d :]
            if use_peepholes:
                gi, gf = gi + c * b[4 * d : 5 * d], gf + c * b[5 * d : 6 * d]
            i, f = g_act(gi), g_act(gf)
            c = f * c + i * c_act(gc)
            o = g_act(go + (c * b[6 * d :] if use_peepholes else 0))
            h = o * h_act(c)
            hidden[row, t], cell[row, t] = h, c
    return {"Hidden": hidden.astype(Input.dtype), "Cell": cell.astype(Input.dtype)}


def ref_gru(
    Input,
    Weight,
    H0=None,
    Bias=None,
    Length=None,
    activation="tanh",
    gate_activation="sigmoid",
    is_reverse=False,
    origin_mode=False,
    **_,
):
    n, steps, _ = Input.shape
    d = Weight.shape[0]
    lengths = Length if Length is not None else [steps] * n
    flat = Weight.reshape(-1)
    w_g, w_c = flat[: 2 * d * d].reshape(d, 2 * d), flat[2 * d * d :].reshape(d, d)
    b = Bias[0] if Bias is not None else np.zeros(3 * d)
    hidden = np.zeros((n, steps, d))
    for row, order in _rows(Input, lengths, is_reverse):
        h = H0[row] if H0 is not None else np.zeros(d)
        for t in order:
            x = Input[row, t] + b
            ur = _ACT[gate_activation](x[: 2 * d] + h @ w_g)
            u, r = ur[:d], ur[d:]
            c = _ACT[activation](x[2 * d :] + (r * h) @ w_c)
            h = u * h + (1 - u) * c if origin_mode else (1 - u) * h + u * c
            hidden[row, t] = h
    return {"Hidden": hidden.astype(Input.dtype)}


D = 3
LEN = np.array([4, 2, 0], np.int64)

CASES = [
    OpCase(
        "lstm",
        {"Input": _r(3, 4, 4 * D), "Weight": _r(D, 4 * D), "Bias": _r(1, 7 * D), "Length": LEN},
        ref_lstm,
        grad=("Input", "Weight", "Bias"),
        grad_outputs=("Hidden", "Cell"),
        id="lstm_peepholes",
    ),
    OpCase(
        "lstm",
        {
            "Input": _r(3, 4, 4 * D),
            "Weight": _r(D, 4 * D),
            "Bias": _r(1, 4 * D),
            "H0": _r(3, D),
            "C0": _r(3, D),
            "Length": LEN,
        },
        ref_lstm,
        attrs={"use_peepholes": False, "is_reverse": True},
        grad=("Input", "Weight", "Bias", "H0", "C0"),
        grad_outputs=("Hidden", "Cell"),
        id="lstm_reverse_initial_states",
    ),
    OpCase(
        "lstm",
        {"Input": _r(1, 3, 4 * D), "Weight": _r(D, 4 * D), "Bias": _r(1, 7 * D)},
        ref_lstm,
        attrs={"is_reverse": True, "cell_activation": "identity", "candidate_activation": "relu"},
        grad=("Input", "Weight", "Bias"),
        grad_outputs=("Hidden",),
        id="lstm_batch1_no_length_other_activations",
    ),
    OpCase(
        "lstm",
        {"Input": _r(0, 2, 4 * D), "Weight": _r(D, 4 * D), "Bias": _r(1, 7 * D)},
        ref_lstm,
        id="lstm_empty_batch",
    ),
    OpCase(
        "lstm",
        {
            "Input": _r(2, 3, 4 * D).astype("float32"),
            "Weight": _r(D, 4 * D).astype("float32"),
            "Bias": _r(1, 7 * D).astype("float32"),
            "Length": np.array([3, 1], np.int32),
        },
        ref_lstm,
        id="lstm_float32",
    ),
    OpCase(
        "gru",
        {"Input": _r(3, 4, 3 * D), "Weight": _r(D, 3 * D), "Bias": _r(1, 3 * D), "Length": LEN},
        ref_gru,
        grad=("Input", "Weight", "Bias"),
        grad_outputs=("Hidden",),
        outputs=("Hidden",),
        id="gru",
    ),
    OpCase(
        "gru",
        {"Input": _r(3, 4, 3 * D), "Weight": _r(D, 3 * D), "H0": _r(3, D), "Length": LEN},
        ref_gru,
        attrs={"is_reverse": True, "origin_mode": True},
        grad=("Input", "Weight", "H0"),
        grad_outputs=("Hidden",),
        outputs=("Hidden",),
        id="gru_reverse_origin_mode_h0",
    ),
    OpCase(
        "gru",
        {"Input": _r(1, 2, 3 * D), "Weight": _r(D, 3 * D), "Bias": _r(1, 3 * D)},
        ref_gru,
        attrs={"activation": "relu"},
        grad=("Input", "Weight", "Bias"),
        grad_outputs=("Hidden",),
        outputs=("Hidden",),
        id="gru_batch1_relu",
    ),
    OpCase(
        "gru",
        {"Input": _r(0, 3, 3 * D), "Weight": _r(D, 3 * D)},
        ref_gru,
        outputs=("Hidden",),
        id="gru_empty_batch",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case):
    case.check()


def test_bad_shapes_are_nf_errors():
    import nestflow as nf
    from nestflow.layers.helper import append_op

    with nf.program_guard(nf.Program(), nf.Program()):
        x = nf.data("x", [-1, 5, 12], "float32")
        w = nf.layers.create_parameter([3, 12], "float32")
        b = nf.layers.create_parameter([1, 12], "float32")
        with pytest.raises(nf.errors.ShapeError, match="Bias"):
            append_op("lstm", {"Input": x, "Weight": w, "Bias": b}, {}, ("Hidden", "Cell"))
        w3 = nf.layers.create_parameter([3, 12], "float32")
        with pytest.raises(nf.errors.ShapeError, match="Weight"):
            append_op("gru", {"Input": x, "Weight": w3}, {}, ("Hidden",))
        with pytest.raises(nf.errors.AttrError, match="gate_activation"):
            append_op(
                "gru",
                {"Input": x, "Weight": nf.layers.create_parameter([4, 12], "float32")},
                {"gate_activation": "softmax"},
                ("Hidden",),
            )
