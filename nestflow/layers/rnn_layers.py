"""Multi-layer, optionally bidirectional LSTM and GRU over padded sequences, with PyTorch's
nn.LSTM/nn.GRU weights: `nf.layers.lstm` and `nf.layers.gru`.

Each layer and direction is one `nf.layers.rnn` of an LSTMCell/GRUCell, so the machinery is the
cells' (one GEMM for every step's input projection, one fused op and one product per step, the
recurrent weight's gradient one product over all steps). Parameters carry PyTorch's names under
the layer's: `<name>.w_ih_l{k}`, `<name>.w_hh_l{k}`, `<name>.b_ih_l{k}`, `<name>.b_hh_l{k}` and
`..._reverse` for the backward direction, so `module.weight_ih_l0` etc. copy across as they are.
The backward direction reads each row's valid steps last to first (as PyTorch does on packed
sequences), so a row's padding never reaches its state.
"""

from __future__ import annotations

from typing import Any

from nestflow.errors import AttrError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers import nn
from nestflow.layers.helper import as_float, as_int, layer_error, require_float_input
from nestflow.layers.rnn_cells import GRUCell, LSTMCell, rnn
from nestflow.layers.sequence import check_lengths
from nestflow.layers.tensor import stack, unstack


def _initial_states(layer: str, state: Any, what: str, count: int, hidden: int) -> list:
    """`state` [layers * directions, N, H] as one [N, H] variable per layer and direction."""
    if state is None:
        return [None] * count
    if not isinstance(state, VarDesc) or len(state.shape) != 3:
        raise layer_error(
            ShapeError,
            layer,
            f"{what} must be a [num_layers * directions, batch, hidden_size] variable, got "
            f"{getattr(state, 'name', type(state).__name__)} {list(getattr(state, 'shape', []))}",
        )
    if state.shape[0] not in (-1, count) or state.shape[2] not in (-1, hidden):
        raise layer_error(
            ShapeError,
            layer,
            f"{what} '{state.name}' {list(state.shape)} must be [{count}, batch, {hidden}] "
            "(num_layers * directions, batch, hidden_size)",
        )
    return unstack(state, axis=0, num=count)


def _stacked_rnn(
    kind: str,
    input: VarDesc,
    hidden_size: int,
    lengths: VarDesc | None,
    num_layers: int,
    is_bidirec: bool,
    dropout_prob: float,
    inits: list[Any],
    name: str | None,
) -> tuple[VarDesc, list[VarDesc]]:
    """The output of the last layer and each state's [layers * directions, N, H] stack."""
    hidden_size = as_int(hidden_size, f"{kind}: hidden_size")
    num_layers = as_int(num_layers, f"{kind}: num_layers")
    dropout_prob = as_float(dropout_prob, f"{kind}: dropout_prob")
    if hidden_size < 1 or num_layers < 1 or not 0.0 <= dropout_prob <= 1.0:
        raise layer_error(
            AttrError,
            kind,
            f"hidden_size ({hidden_size}) and num_layers ({num_layers}) must be >= 1 and "
            f"dropout_prob ({dropout_prob}) in [0, 1]",
        )
    if not isinstance(input, VarDesc) or len(input.shape) != 3 or input.shape[2] < 0:
        raise layer_error(
            ShapeError,
            kind,
            f"input must be a padded [batch, time, features] variable with known features, got "
            f"{getattr(input, 'name', type(input).__name__)} {list(getattr(input, 'shape', []))}",
        )
    require_float_input(input, kind)
    check_lengths(kind, input, lengths)
    prefix = name or unique_name.generate(kind)
    directions = 2 if is_bidirec else 1
    count = num_layers * directions
    starts = [_initial_states(kind, s, w, count, hidden_size) for s, w in inits]
    finals: list[list[VarDesc]] = [[] for _ in inits]
    x = input
    for layer in range(num_layers):
        if layer and dropout_prob > 0.0:
            x = nn.dropout(x, dropout_prob, dropout_implementation="upscale_in_train")
        outs = []
        for direction in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            cell = (
                LSTMCell(hidden_size, forget_bias=0.0, dtype=input.dtype)
                if kind == "lstm"
                else GRUCell(hidden_size, dtype=input.dtype)
            )
            cell._names = {p: f"{prefix}.{p}{suffix}" for p in ("w_ih", "w_hh", "b_ih", "b_hh")}
            index = layer * directions + direction
            given = [s[index] for s in starts]
            init = None
            if any(g is not None for g in given):
                zeros = cell.get_initial_states(x)
                zeros = zeros if kind == "lstm" else [zeros]
                init = [g if g is not None else z for g, z in zip(given, zeros)]
                init = init if kind == "lstm" else init[0]
            out, state = rnn(cell, x, init, sequence_length=lengths, is_reverse=bool(direction))
            for final, value in zip(finals, state if kind == "lstm" else [state]):
                final.append(value)
            outs.append(out)
        x = outs[0] if directions == 1 else nn.concat(outs, axis=2)
    return x, [stack(final, axis=0) for final in finals]


def lstm(
    input: VarDesc,
    hidden_size: int,
    lengths: VarDesc | None = None,
    num_layers: int = 1,
    is_bidirec: bool = False,
    dropout_prob: float = 0.0,
    init_h: VarDesc | None = None,
    init_c: VarDesc | None = None,
    name: str | None = None,
) -> tuple[VarDesc, VarDesc, VarDesc]:
    """A stacked LSTM over the padded `input` [N, T, D] (PyTorch's nn.LSTM, batch_first):
    returns (out [N, T, H * directions], last_h, last_c), the last states
    [num_layers * directions, N, H] ordered as PyTorch's h_n (layer 0 forward, layer 0
    backward, layer 1 ...). `lengths` (int [N]): past a row's length its states stop changing
    and its outputs are zero; last states are those after each row's last valid step.
    `dropout_prob` drops the outputs of every layer but the last in training. `init_h`,
    `init_c`: initial states shaped like the last ones (default zeros). Parameters
    `<name>.w_ih_l{k}` [4H, D or H * directions] etc., PyTorch's names, layout and gate order
    (i, f, g, o), initialised uniform in [-1/sqrt(H), 1/sqrt(H)] as PyTorch does.

    >>> x = nf.data("x", [-1, 7, 5]); n = nf.data("n", [-1], "int64")
    >>> out, h, c = nf.layers.lstm(x, 8, n, num_layers=2, is_bidirec=True)
    >>> out.shape, h.shape
    ((-1, 7, 16), (4, -1, 8))
    """
    inits = [(init_h, "init_h"), (init_c, "init_c")]
    out, (last_h, last_c) = _stacked_rnn(
        "lstm", input, hidden_size, lengths, num_layers, is_bidirec, dropout_prob, inits, name
    )
    return out, last_h, last_c


def gru(
    input: VarDesc,
    hidden_size: int,
    lengths: VarDesc | None = None,
    num_layers: int = 1,
    is_bidirec: bool = False,
    dropout_prob: float = 0.0,
    init_h: VarDesc | None = None,
    name: str | None = None,
) -> tuple[VarDesc, VarDesc]:
    """A stacked GRU over the padded `input` [N, T, D] (PyTorch's nn.GRU, batch_first):
    returns (out [N, T, H * directions], last_h [num_layers * directions, N, H]); lengths,
    directions, dropout, initial state and parameter names as `lstm`'s, gates (r, z, n) with
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn)).

    >>> x = nf.data("x", [-1, 7, 5])
    >>> out, h = nf.layers.gru(x, 8)
    >>> out.shape, h.shape
    ((-1, 7, 8), (1, -1, 8))
    """
    inits = [(init_h, "init_h")]
    out, (last_h,) = _stacked_rnn(
        "gru", input, hidden_size, lengths, num_layers, is_bidirec, dropout_prob, inits, name
    )
    return out, last_h


__all__ = ["gru", "lstm"]
