"""Whole-sequence recurrent ops over padded batches: `lstm` and `gru`, the ops behind Fluid 1.8's
dynamic_lstm and dynamic_gru (their fused-projection forms: the input is already projected to
4 * D or 3 * D per step), with Fluid's slots, attrs, weight layouts and gate orders.

Sequences are padded [N, T, ...] with an int [N] Length (row n holds steps [0, Length[n])), as
nestflow's other sequence ops. One op runs every step in a Python loop over time (each step is
a batched product and elementwise work); the gradient runs the loop backwards from the
activated gates the forward kept (BatchGate), so no gate is computed twice. Outputs are zero
at padding steps; is_reverse runs each row from its last valid step back to its first, by
reversing the valid part of every row on the way in and out.
"""

from __future__ import annotations

from nestflow.core.device_context import array_module
from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.ops.registry import VarInfo, register_op
from nestflow.ops.sequence import _check_length_info, valid_lengths

__all__: list[str] = []

# activation, and its derivative from its output
_ACTS = {
    "sigmoid": (lambda xp, v: 1.0 / (1.0 + xp.exp(-v)), lambda xp, y: y * (1.0 - y)),
    "tanh": (lambda xp, v: xp.tanh(v), lambda xp, y: 1.0 - y * y),
    "relu": (lambda xp, v: xp.maximum(v, 0.0), lambda xp, y: (y > 0).astype(y.dtype)),
    "identity": (lambda xp, v: v, lambda xp, y: xp.ones_like(y)),
}


def _check_act(op: str, name: str, value: str) -> None:
    if value not in _ACTS:
        raise AttrError(f"{op}: {name} must be one of {sorted(_ACTS)}, got '{value}'")


def _reversal(lengths, steps: int, xp):
    """[N, T] step indices that reverse each row's valid steps and keep its padding: an
    involution, so it also undoes itself."""
    t = xp.arange(steps)[None, :]
    return xp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)


def _reordered(x, index):
    if x is None or index is None:
        return x
    xp = array_module(x)
    return xp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _check_common(op: str, Input: VarInfo, Length, H0, width: int, hidden: int) -> None:
    _check_length_info(Input, Length, op)
    if not is_floating(Input.dtype):
        raise DTypeError(f"{op}: Input must be floating point, got {Input.dtype}")
    if Input.ndim != 3:
        raise ShapeError(f"{op}: Input {list(Input.shape)} must be padded [batch, time, {width}]")
    if Input.shape[2] >= 0 and Input.shape[2] != width:
        raise ShapeError(
            f"{op}: Input {list(Input.shape)} must have {width} features per step (the "
            f"projected gates of hidden size {hidden}), got {Input.shape[2]}"
        )
    if H0 is not None and (len(H0.shape) != 2 or H0.shape[1] != hidden):
        raise ShapeError(f"{op}: H0 {list(H0.shape)} must be [batch, {hidden}]")


def _weight_hidden(op: str, Weight: VarInfo, gates: int, Input: VarInfo) -> int:
    if Weight.ndim != 2 or Weight.shape[1] != gates * Weight.shape[0]:
        raise ShapeError(f"{op}: Weight {list(Weight.shape)} must be [D, {gates} * D]")
    if Weight.dtype != Input.dtype:
        raise DTypeError(f"{op}: Weight is {Weight.dtype} but Input is {Input.dtype}")
    return Weight.shape[0]


@register_op
class lstm:
    """Fluid's lstm op (dynamic_lstm): Input [N, T, 4D] holds each step's projected gates in
    Fluid's order (candidate, input, forget, output), Weight [D, 4D] the recurrent weights,
    Bias [1, 4D] (or [1, 7D] with use_peepholes: then the peephole weights W_ic, W_fc, W_oc
    follow). Per valid step: i = act_g(x_i + h W_i + b_i + W_ic * c_prev), f likewise with
    W_fc, c~ = act_cand(x_c + h W_c + b_c), c = f * c_prev + i * c~, o = act_g(x_o + h W_o +
    b_o + W_oc * c), h = o * act_cell(c). H0/C0 [N, D] start each row (zeros when absent).
    Hidden and Cell [N, T, D] are zero at padding steps; BatchGate [N, T, 4D] holds the
    activated gates and BatchCellPreAct the cells (kept for the gradient)."""

    inputs = ("Input", "Weight", "Bias", "H0?", "C0?", "Length?")
    outputs = ("Hidden", "Cell", "BatchGate?", "BatchCellPreAct?")
    attrs = {
        "use_peepholes": True,
        "is_reverse": False,
        "is_test": False,
        "gate_activation": "sigmoid",
        "cell_activation": "tanh",
        "candidate_activation": "tanh",
    }
    no_grad_inputs = ("Length",)

    def infer(
        Input,
        Weight,
        Bias,
        H0,
        C0,
        Length,
        use_peepholes,
        is_reverse,
        is_test,
        gate_activation,
        cell_activation,
        candidate_activation,
    ):
        _check_act("lstm", "gate_activation", gate_activation)
        _check_act("lstm", "cell_activation", cell_activation)
        _check_act("lstm", "candidate_activation", candidate_activation)
        d = _weight_hidden("lstm", Weight, 4, Input)
        _check_common("lstm", Input, Length, H0, 4 * d, d)
        if C0 is not None and (len(C0.shape) != 2 or C0.shape[1] != d):
            raise ShapeError(f"lstm: C0 {list(C0.shape)} must be [batch, {d}]")
        width = 7 * d if use_peepholes else 4 * d
        if tuple(Bias.shape) != (1, width):
            raise ShapeError(
                f"lstm: Bias {list(Bias.shape)} must be [1, {width}] "
                f"({'with' if use_peepholes else 'without'} peepholes, D = {d})"
            )
        n, t = Input.shape[:2]
        state = VarInfo((n, t, d), Input.dtype)
        return state, state, VarInfo((n, t, 4 * d), Input.dtype), state

    def forward(
        Input,
        Weight,
        Bias,
        H0,
        C0,
        Length,
        use_peepholes,
        is_reverse,
        is_test,
        gate_activation,
        cell_activation,
        candidate_activation,
        xp,
    ):
        n, steps, _ = Input.shape
        d = Weight.shape[0]
        lengths = valid_lengths(Length, Input, "lstm")
        order = _reversal(lengths, steps, xp) if is_reverse else None
        x = _reordered(Input, order)
        act_g, act_c, act_h = (
            _ACTS[a][0] for a in (gate_activation, candidate_activation, cell_activation)
        )
        b = Bias.reshape(-1)
        w_ic, w_fc, w_oc = (
            (b[4 * d : 5 * d], b[5 * d : 6 * d], b[6 * d :])
            if use_peepholes
            else (None, None, None)
        )
        h = H0 if H0 is not None else xp.zeros((n, d), Input.dtype)
        c = C0 if C0 is not None else xp.zeros((n, d), Input.dtype)
        hidden = xp.zeros((n, steps, d), Input.dtype)
        cell = xp.zeros((n, steps, d), Input.dtype)
        gates = xp.zeros((n, steps, 4 * d), Input.dtype)
        for t in range(steps):
            live = (t < lengths)[:, None]
            g = x[:, t] + h @ Weight + b[: 4 * d]
            pre_i, pre_f = g[:, d : 2 * d], g[:, 2 * d : 3 * d]
            if use_peepholes:
                pre_i, pre_f = pre_i + c * w_ic, pre_f + c * w_fc
            cand, i, f = act_c(xp, g[:, :d]), act_g(xp, pre_i), act_g(xp, pre_f)
            c_new = f * c + i * cand
            pre_o = g[:, 3 * d :] + (c_new * w_oc if use_peepholes else 0.0)
            o = act_g(xp, pre_o)
            h_new = o * act_h(xp, c_new)
            gates[:, t] = xp.concatenate([cand, i, f, o], axis=1) * live
            hidden[:, t], cell[:, t] = h_new * live, c_new * live
            h, c = xp.where(live, h_new, h), xp.where(live, c_new, c)
        return (
            _reordered(hidden, order),
            _reordered(cell, order),
            _reordered(gates, order),
            _reordered(cell, order),
        )

    def backward(
        Input,
        Weight,
        Bias,
        H0,
        C0,
        Length,
        Hidden,
        Cell,
        BatchGate,
        BatchCellPreAct,
        Hidden_grad,
        Cell_grad,
        BatchGate_grad,
        BatchCellPreAct_grad,
        use_peepholes,
        is_reverse,
        is_test,
        gate_activation,
        cell_activation,
        candidate_activation,
        needs=(True,) * 6,
        *,
        xp,
    ):
        n, steps, _ = Input.shape
        d = Weight.shape[0]
        lengths = valid_lengths(Length, Input, "lstm")
        order = _reversal(lengths, steps, xp) if is_reverse else None
        hidden, cell, gates = (_reordered(a, order) for a in (Hidden, Cell, BatchGate))
        dh_out = _reordered(Hidden_grad, order) if Hidden_grad is not None else None
        dc_out = _reordered(Cell_grad, order) if Cell_grad is not None else None
        d_g, d_c, d_h = (
            _ACTS[a][1] for a in (gate_activation, candidate_activation, cell_activation)
        )
        act_h = _ACTS[cell_activation][0]
        b = Bias.reshape(-1)
        w_ic, w_fc, w_oc = (
            (b[4 * d : 5 * d], b[5 * d : 6 * d], b[6 * d :])
            if use_peepholes
            else (None, None, None)
        )
        h0 = H0 if H0 is not None else xp.zeros((n, d), Input.dtype)
        c0 = C0 if C0 is not None else xp.zeros((n, d), Input.dtype)
        dx = xp.zeros(Input.shape, Input.dtype)
        dw = xp.zeros(Weight.shape, Input.dtype)
        db = xp.zeros(b.shape, Input.dtype)
        dh = xp.zeros((n, d), Input.dtype)
        dc = xp.zeros((n, d), Input.dtype)
        for t in range(steps - 1, -1, -1):
            live = (t < lengths)[:, None]
            h_prev = hidden[:, t - 1] if t else h0
            c_prev = cell[:, t - 1] if t else c0
            cand, i, f, o = (gates[:, t, k * d : (k + 1) * d] for k in range(4))
            c_t = cell[:, t]
            # padding steps output zeros: their gradients stop there
            if dh_out is not None:
                dh = dh + dh_out[:, t] * live
            if dc_out is not None:
                dc = dc + dc_out[:, t] * live
            tc = act_h(xp, c_t)
            dg_o = dh * tc * d_g(xp, o)
            dc_tot = dc + dh * o * d_h(xp, tc)
            if use_peepholes:
                dc_tot = dc_tot + dg_o * w_oc
            dg_c = dc_tot * i * d_c(xp, cand)
            dg_i = dc_tot * cand * d_g(xp, i)
            dg_f = dc_tot * c_prev * d_g(xp, f)
            dg = xp.concatenate([dg_c, dg_i, dg_f, dg_o], axis=1) * live
            dx[:, t] = dg
            dw += h_prev.T @ dg
            db[: 4 * d] += dg.sum(axis=0)
            dc_prev = dc_tot * f
            if use_peepholes:
                dg_i, dg_f, dg_o = dg[:, d : 2 * d], dg[:, 2 * d : 3 * d], dg[:, 3 * d :]
                db[4 * d : 5 * d] += (dg_i * c_prev).sum(axis=0)
                db[5 * d : 6 * d] += (dg_f * c_prev).sum(axis=0)
                db[6 * d :] += (dg_o * c_t).sum(axis=0)
                dc_prev = dc_prev + dg_i * w_ic + dg_f * w_fc
            dh = xp.where(live, dg @ Weight.T, dh)
            dc = xp.where(live, dc_prev, dc)
        return (
            _reordered(dx, order),
            dw,
            db.reshape(Bias.shape),
            dh if H0 is not None else None,
            dc if C0 is not None else None,
            None,
        )


@register_op
class gru:
    """Fluid's gru op (dynamic_gru): Input [N, T, 3D] holds each step's projected update,
    reset and candidate inputs (that order); Weight [D, 3D] is laid out as Fluid's: its first
    D * 2D elements are the [D, 2D] update/reset weights, the last D * D the [D, D] candidate
    weights; Bias [1, 3D]. Per valid step: u = act_g(x_u + h W_u + b_u), r = act_g(x_r + h W_r
    + b_r), c = act(x_c + (r * h) W_c + b_c), h' = (1 - u) * h + u * c (origin_mode: u * h +
    (1 - u) * c). H0 [N, D] starts each row (zeros when absent). Hidden [N, T, D] is zero at
    padding steps; BatchGate (activated u, r, c), BatchResetHiddenPrev (r * h) and BatchHidden
    are kept for the gradient."""

    inputs = ("Input", "H0?", "Weight", "Bias?", "Length?")
    outputs = ("BatchGate?", "BatchResetHiddenPrev?", "BatchHidden?", "Hidden")
    attrs = {
        "activation": "tanh",
        "gate_activation": "sigmoid",
        "is_reverse": False,
        "origin_mode": False,
        "is_test": False,
    }
    no_grad_inputs = ("Length",)

    def infer(
        Input,
        H0,
        Weight,
        Bias,
        Length,
        activation,
        gate_activation,
        is_reverse,
        origin_mode,
        is_test,
    ):
        _check_act("gru", "activation", activation)
        _check_act("gru", "gate_activation", gate_activation)
        d = _weight_hidden("gru", Weight, 3, Input)
        _check_common("gru", Input, Length, H0, 3 * d, d)
        if Bias is not None and tuple(Bias.shape) != (1, 3 * d):
            raise ShapeError(f"gru: Bias {list(Bias.shape)} must be [1, {3 * d}]")
        n, t = Input.shape[:2]
        state = VarInfo((n, t, d), Input.dtype)
        return VarInfo((n, t, 3 * d), Input.dtype), state, state, state

    def forward(
        Input,
        H0,
        Weight,
        Bias,
        Length,
        activation,
        gate_activation,
        is_reverse,
        origin_mode,
        is_test,
        xp,
    ):
        n, steps, _ = Input.shape
        d = Weight.shape[0]
        lengths = valid_lengths(Length, Input, "gru")
        order = _reversal(lengths, steps, xp) if is_reverse else None
        x = _reordered(Input, order)
        if Bias is not None:
            x = x + Bias.reshape(1, 1, 3 * d)
        flat = Weight.reshape(-1)
        w_g, w_c = flat[: 2 * d * d].reshape(d, 2 * d), flat[2 * d * d :].reshape(d, d)
        act, act_g = _ACTS[activation][0], _ACTS[gate_activation][0]
        h = H0 if H0 is not None else xp.zeros((n, d), Input.dtype)
        hidden = xp.zeros((n, steps, d), Input.dtype)
        gates = xp.zeros((n, steps, 3 * d), Input.dtype)
        reset_h = xp.zeros((n, steps, d), Input.dtype)
        for t in range(steps):
            live = (t < lengths)[:, None]
            ur = act_g(xp, x[:, t, : 2 * d] + h @ w_g)
            u, r = ur[:, :d], ur[:, d:]
            rh = r * h
            c = act(xp, x[:, t, 2 * d :] + rh @ w_c)
            h_new = u * h + (1.0 - u) * c if origin_mode else (1.0 - u) * h + u * c
            gates[:, t] = xp.concatenate([u, r, c], axis=1) * live
            reset_h[:, t] = rh * live
            hidden[:, t] = h_new * live
            h = xp.where(live, h_new, h)
        hidden = _reordered(hidden, order)
        return _reordered(gates, order), _reordered(reset_h, order), hidden, hidden

    def backward(
        Input,
        H0,
        Weight,
        Bias,
        Length,
        BatchGate,
        BatchResetHiddenPrev,
        BatchHidden,
        Hidden,
        BatchGate_grad,
        BatchResetHiddenPrev_grad,
        BatchHidden_grad,
        Hidden_grad,
        activation,
        gate_activation,
        is_reverse,
        origin_mode,
        is_test,
        needs=(True,) * 5,
        *,
        xp,
    ):
        n, steps, _ = Input.shape
        d = Weight.shape[0]
        lengths = valid_lengths(Length, Input, "gru")
        order = _reversal(lengths, steps, xp) if is_reverse else None
        hidden, gates = _reordered(Hidden, order), _reordered(BatchGate, order)
        dh_out = _reordered(Hidden_grad, order) if Hidden_grad is not None else None
        flat = Weight.reshape(-1)
        w_g, w_c = flat[: 2 * d * d].reshape(d, 2 * d), flat[2 * d * d :].reshape(d, d)
        d_act, d_g = _ACTS[activation][1], _ACTS[gate_activation][1]
        h0 = H0 if H0 is not None else xp.zeros((n, d), Input.dtype)
        dx = xp.zeros(Input.shape, Input.dtype)
        dw_g = xp.zeros(w_g.shape, Input.dtype)
        dw_c = xp.zeros(w_c.shape, Input.dtype)
        dh = xp.zeros((n, d), Input.dtype)
        for t in range(steps - 1, -1, -1):
            live = (t < lengths)[:, None]
            h_prev = hidden[:, t - 1] if t else h0
            u, r, c = (gates[:, t, k * d : (k + 1) * d] for k in range(3))
            if dh_out is not None:
                dh = dh + dh_out[:, t] * live
            if origin_mode:
                du, dc, dh_prev = dh * (h_prev - c), dh * (1.0 - u), dh * u
            else:
                du, dc, dh_prev = dh * (c - h_prev), dh * u, dh * (1.0 - u)
            dg_c = dc * d_act(xp, c) * live
            drh = dg_c @ w_c.T
            dw_c += (r * h_prev).T @ dg_c
            dg_ur = xp.concatenate([du * d_g(xp, u), drh * h_prev * d_g(xp, r)], axis=1) * live
            dw_g += h_prev.T @ dg_ur
            dh_prev = dh_prev + drh * r + dg_ur @ w_g.T
            dx[:, t] = xp.concatenate([dg_ur, dg_c], axis=1)
            dh = xp.where(live, dh_prev, dh)
        dw = xp.concatenate([dw_g.reshape(-1), dw_c.reshape(-1)]).reshape(Weight.shape)
        db = dx.sum(axis=(0, 1)).reshape(1, 3 * d) if Bias is not None else None
        return (_reordered(dx, order), dh if H0 is not None else None, dw, db, None)
