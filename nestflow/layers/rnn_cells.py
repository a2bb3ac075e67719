"""Recurrent cells and the loop that runs one over a sequence (Fluid 1.7's `layers.rnn` API).

A cell is a small object: `cell(inputs, states) -> (outputs, new_states)` appends the ops of
one time step to the current block, wherever that is (the global block, an `nf.rnn()` step, a
While block), so the same cell serves a whole-sequence loop and a step-by-step decoder.
`nf.layers.rnn(cell, inputs, ...)` runs a cell over `[batch, time, ...]` inputs on `nf.rnn()`:
lengths, step scopes, backward through time and hoisting are that machinery's, not repeated
per cell type.

Gates and weights are PyTorch's, so weights copy across from torch.nn.LSTMCell/GRUCell:
`<name>.w_ih` [G*H, D], `<name>.w_hh` [G*H, H], `<name>.b_ih` and `<name>.b_hh` [G*H], gates
(i, f, g, o) for the LSTM (G = 4) and (r, z, n) for the GRU (G = 3). Departures from Fluid 1.7
(whose BasicLSTMUnit/BasicGRUUnit keep one [D+H, G*H] weight over concat(x, h)):
- LSTMCell adds `forget_bias` (default 1.0, as Fluid) to the forget gate's pre-activation on top
  of the biases; with forget_bias=0 it is exactly torch.nn.LSTMCell.
- GRUCell applies the reset gate after the hidden product, n = tanh(W_in x + b_in +
  r * (W_hn h + b_hn)), h' = (1 - z) * n + z * h (PyTorch's and cuDNN's GRU); Fluid's
  BasicGRUUnit resets h before the product.
- Every weight and bias starts uniform in [-1/sqrt(H), 1/sqrt(H)] (PyTorch's default).

Inside a step the cell's work is one product by the hidden state and one fused op (lstm_unit,
gru_cell); the weights' transposes and gate reordering are time-invariant, and in an
`nf.rnn()` step they and the input's product move out of the step (hoisting), so the input
projection of all steps is one GEMM and the recurrent weight's gradient one product.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from nestflow.core.dtype import dtype_name, is_floating
from nestflow.errors import AttrError, ControlFlowError, DTypeError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc
from nestflow.layers import nn
from nestflow.layers.helper import (
    append_op,
    as_float,
    as_int,
    current_block,
    layer_error,
    parameter_from_attr,
)
from nestflow.layers.initializer import ParamAttr, Uniform
from nestflow.layers.rnn import RNN
from nestflow.layers.sequence import check_lengths, sequence_reverse

# ---- nested structures of variables (Fluid's map_structure, for lists, tuples and dicts) ----


def flatten(structure: Any) -> list[Any]:
    """The leaves of a nested list/tuple/dict structure, depth first (dict keys sorted)."""
    if isinstance(structure, dict):
        return [leaf for key in sorted(structure) for leaf in flatten(structure[key])]
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in flatten(item)]
    return [structure]


def pack_as(structure: Any, leaves: Sequence[Any]) -> Any:
    """`leaves` arranged as `structure` is (the inverse of `flatten`)."""
    items = iter(leaves)

    def build(node):
        if isinstance(node, dict):
            return {key: build(node[key]) for key in sorted(node)}
        if isinstance(node, (list, tuple)):
            return type(node)(build(item) for item in node)
        return next(items)

    return build(structure)


def _is_shape(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(d, int) for d in value)


def _map_shapes(function: Callable, shapes: Any, dtypes: Any) -> Any:
    """`function(shape, dtype)` over a nested structure whose leaves are shapes (int lists);
    `dtypes` is one dtype or the same structure of dtypes."""
    if _is_shape(shapes):
        return function(list(shapes), dtypes)
    if not isinstance(shapes, (list, tuple)):
        raise AttrError(f"a state shape must be a list of ints or a list of them, got {shapes!r}")
    each = dtypes if isinstance(dtypes, (list, tuple)) else [dtypes] * len(shapes)
    if len(each) != len(shapes):
        raise AttrError(f"state dtypes {dtypes!r} do not match the state shapes {shapes!r}")
    return type(shapes)(_map_shapes(function, s, d) for s, d in zip(shapes, each))


# ---- cells ----


class RNNCell:
    """The cell interface (Fluid 1.7 `layers.RNNCell`): `call(inputs, states, **kwargs)`
    returns `(outputs, new_states)` for one time step, states being one variable or a nested
    list of them; `state_shape` gives their shapes without the batch dim.

    >>> class Accumulate(nf.layers.RNNCell):  # h_t = h_{t-1} + x_t
    ...     def call(self, inputs, states):
    ...         h = nf.layers.elementwise_add(states, inputs)
    ...         return h, h
    ...     @property
    ...     def state_shape(self):
    ...         return [1]
    >>> x = nf.data("x", [-1, 3, 1])
    >>> out, last = nf.layers.rnn(Accumulate(), x)
    >>> got = nf.Executor().run(feed={"x": np.array([[[1], [2], [3]]], "float32")},
    ...                         fetch_list=[out, last])
    >>> got[0].ravel().tolist(), got[1].ravel().tolist()
    ([1.0, 3.0, 6.0], [6.0])
    """

    def call(self, inputs: Any, states: Any, **kwargs: Any) -> tuple[Any, Any]:
        raise NotImplementedError(f"{type(self).__name__} must define call(inputs, states)")

    def __call__(self, inputs: Any, states: Any, **kwargs: Any) -> tuple[Any, Any]:
        return self.call(inputs, states, **kwargs)

    @property
    def state_shape(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define state_shape")

    @property
    def state_dtype(self) -> Any:
        return "float32"

    def get_initial_states(
        self,
        batch_ref: Any,
        shape: Any = None,
        dtype: Any = None,
        init_value: float = 0,
        batch_dim_idx: int = 0,
    ) -> Any:
        """States filled with `init_value`, each `[batch, *shape]` with batch the size of dim
        `batch_dim_idx` of `batch_ref` (its first leaf, if a structure); shape and dtype default
        to the cell's `state_shape` and `state_dtype`."""
        ref = flatten(batch_ref)[0]
        if not isinstance(ref, VarDesc):
            raise AttrError(
                f"{type(self).__name__}.get_initial_states: batch_ref must be a variable, got "
                f"{type(ref).__name__}"
            )
        shapes = self.state_shape if shape is None else shape
        dtypes = self.state_dtype if dtype is None else dtype
        return _map_shapes(
            lambda s, d: append_op(
                "fill_constant_batch_size_like",
                {"Input": ref},
                {
                    "shape": [-1, *s],
                    "dtype": dtype_name(d),
                    "value": float(init_value),
                    "input_dim_idx": as_int(batch_dim_idx, "get_initial_states: batch_dim_idx"),
                    "output_dim_idx": 0,
                },
                name=f"{type(self).__name__}.init",
                stop_gradient=True,
            ),
            shapes,
            dtypes,
        )


_SIGMOID_NAMES = {None, "sigmoid", nn.sigmoid}
_TANH_NAMES = {None, "tanh", nn.tanh}


def _activation(act: Any, what: str) -> Callable[[VarDesc], VarDesc]:
    if act is None or callable(act):
        return act
    if isinstance(act, str):
        return lambda x: nn.activation(x, act)
    raise AttrError(f"{what} must be a callable (e.g. nf.layers.relu) or a name, got {act!r}")


class _GatedCell(RNNCell):
    """What LSTMCell and GRUCell share: PyTorch-layout parameters made at the first call (when
    the input size is known), and the weights in the form a step multiplies by."""

    gates = 0  # G: gate blocks in w_ih / w_hh

    def __init__(
        self,
        hidden_size: int,
        param_attr: Any,
        bias_attr: Any,
        gate_activation: Any,
        activation: Any,
        dtype: Any,
        name: str,
    ):
        kind = type(self).__name__
        self.hidden_size = as_int(hidden_size, f"{kind}: hidden_size")
        if self.hidden_size < 1:
            raise AttrError(f"{kind}: hidden_size must be >= 1, got {hidden_size}")
        self.dtype = dtype_name(dtype)
        if not is_floating(self.dtype):
            raise DTypeError(f"{kind}: dtype must be floating point, got {self.dtype}")
        self.gate_activation = _activation(gate_activation, f"{kind}: gate_activation")
        self.activation = _activation(activation, f"{kind}: activation")
        self._fused = gate_activation in _SIGMOID_NAMES and activation in _TANH_NAMES
        self._param_attr, self._bias_attr = param_attr, bias_attr
        self.name = unique_name.generate(name) if isinstance(name, str) else kind
        self._names: dict[str, str] | None = None  # set by nf.layers.lstm/gru
        self.input_size: int | None = None
        self.w_ih = self.w_hh = self.b_ih = self.b_hh = None
        self._prepared: dict[tuple[int, int], tuple[str, ...]] = {}

    @property
    def state_dtype(self) -> str:
        return self.dtype

    def _parameter_names(self) -> dict[str, str]:
        if self._names is not None:
            return self._names
        names = {}
        for key, attr, kind in (("w", self._param_attr, "w"), ("b", self._bias_attr, "b")):
            spec = ParamAttr.of(attr)
            stem = spec.name if spec is not None and spec.name else f"{self.name}.{kind}"
            names[f"{key}_ih"], names[f"{key}_hh"] = f"{stem}_ih", f"{stem}_hh"
        return names

    def _make_parameters(self, input_size: int) -> None:
        names = self._parameter_names()
        rows, bound = self.gates * self.hidden_size, 1.0 / math.sqrt(self.hidden_size)
        init = Uniform(-bound, bound)

        def make(key: str, attr: Any, shape: list[int]) -> VarDesc | None:
            spec = ParamAttr.of(attr)
            if spec is None:  # bias_attr=False: no biases
                return None
            # One attr serves two parameters: each gets its own name.
            spec = dataclasses.replace(spec, name=names[key])
            return parameter_from_attr(spec, shape, self.dtype, names[key], init)

        self.w_ih = make("w_ih", self._param_attr, [rows, input_size])
        self.w_hh = make("w_hh", self._param_attr, [rows, self.hidden_size])
        self.b_ih = make("b_ih", self._bias_attr, [rows])
        self.b_hh = make("b_hh", self._bias_attr, [rows])
        self.input_size = input_size

    def _check_input(self, x: Any, what: str) -> VarDesc:
        kind = type(self).__name__
        if not isinstance(x, VarDesc):
            raise layer_error(AttrError, kind, f"{what} must be a variable, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise layer_error(
                DTypeError,
                kind,
                f"{what} '{x.name}' is {x.dtype}{list(x.shape)} but the cell is {self.dtype}",
            )
        return x

    def _weights(self, x: VarDesc) -> tuple[VarDesc, ...]:
        """(W_x [D, G*H], W_h [H, G*H], biases...) in the step's gate order, made once per
        block (and visible to the blocks nested in it)."""
        size = x.shape[-1] if x.shape else -1
        if size < 0:
            raise layer_error(
                ShapeError,
                type(self).__name__,
                f"input '{x.name}' {list(x.shape)} needs a known last (feature) dim",
            )
        block = current_block()
        if self.input_size is None or (
            block.program.global_block().find_var(self._parameter_names()["w_ih"]) is None
        ):
            self._make_parameters(size)  # the first call, or the first in this program
        if size != self.input_size:
            raise layer_error(
                ShapeError,
                type(self).__name__,
                f"input '{x.name}' {list(x.shape)} has {size} features but the cell was built "
                f"for {self.input_size}",
            )
        key = (id(block.program), block.idx)
        names = self._prepared.get(key)
        if names is None or any(block.find_var(n) is None for n in names if n):
            made = self._prepare()
            self._prepared[key] = tuple(v.name if v is not None else "" for v in made)
            return made
        return tuple(block.find_var(n) if n else None for n in names)

    def _prepare(self) -> tuple[VarDesc, ...]:
        raise NotImplementedError

    def _hidden_state(self, state: Any, what: str) -> VarDesc:
        state = self._check_input(state, what)
        if state.shape and state.shape[-1] not in (-1, self.hidden_size):
            raise layer_error(
                ShapeError,
                type(self).__name__,
                f"{what} '{state.name}' {list(state.shape)} must have {self.hidden_size} "
                "(hidden_size) columns",
            )
        return state


def _reorder_rows(w: VarDesc, order: Sequence[int], parts: int) -> VarDesc:
    blocks = nn.split(w, parts, dim=0)
    return nn.concat([blocks[i] for i in order], axis=0)


class LSTMCell(_GatedCell):
    """An LSTM step (Fluid 1.7 `layers.LSTMCell` arguments; PyTorch's gates and weights):
    i, f, g, o = split(x @ w_ih^T + b_ih + h @ w_hh^T + b_hh);
    c' = sigmoid(f + forget_bias) * c + sigmoid(i) * tanh(g); h' = sigmoid(o) * tanh(c').
    `cell(inputs [N, D], [h, c]) -> (h', [h', c'])`; states [N, hidden_size].
    gate_activation / activation (callables, default sigmoid / tanh) replace sigmoid / tanh.

    >>> cell = nf.layers.LSTMCell(8)
    >>> x = nf.data("x", [-1, 4]); h, c = cell.get_initial_states(x)
    >>> out, (h1, c1) = cell(x, [h, c])
    """

    gates = 4

    def __init__(
        self,
        hidden_size: int,
        param_attr: Any = None,
        bias_attr: Any = None,
        gate_activation: Any = None,
        activation: Any = None,
        forget_bias: float = 1.0,
        dtype: Any = "float32",
        name: str = "LSTMCell",
    ):
        super().__init__(
            hidden_size, param_attr, bias_attr, gate_activation, activation, dtype, name
        )
        self.forget_bias = as_float(forget_bias, "LSTMCell: forget_bias")

    @property
    def state_shape(self) -> list[list[int]]:
        return [[self.hidden_size], [self.hidden_size]]

    def _prepare(self) -> tuple[VarDesc, ...]:
        # lstm_unit reads gates (i, f, o, g): PyTorch's rows (i, f, g, o) reordered, transposed.
        order = (0, 1, 3, 2)
        w_x = nn.transpose(_reorder_rows(self.w_ih, order, 4), [1, 0])
        w_h = nn.transpose(_reorder_rows(self.w_hh, order, 4), [1, 0])
        biases = [b for b in (self.b_ih, self.b_hh) if b is not None]
        bias = None
        if biases:
            total = biases[0] if len(biases) == 1 else biases[0] + biases[1]
            bias = _reorder_rows(total, order, 4)
        return w_x, w_h, bias

    def call(self, inputs: Any, states: Any) -> tuple[VarDesc, list[VarDesc]]:
        x = self._check_input(inputs, "inputs")
        if not isinstance(states, (list, tuple)) or len(states) != 2:
            raise layer_error(
                AttrError, "LSTMCell", f"states must be [h, c] (two variables), got {states!r}"
            )
        h = self._hidden_state(states[0], "state h")
        c = self._hidden_state(states[1], "state c")
        w_x, w_h, bias = self._weights(x)
        projected = nn.matmul(x, w_x)
        if bias is not None:
            projected = projected + bias
        gates = projected + nn.matmul(h, w_h)
        if self._fused:
            attrs = {"forget_bias": self.forget_bias}
            c_new, h_new = append_op(
                "lstm_unit", {"X": gates, "C_prev": c}, attrs, outputs=("C", "H"), name=self.name
            )
            return h_new, [h_new, c_new]
        gate_act = self.gate_activation or nn.sigmoid
        act = self.activation or nn.tanh
        i, f, o, g = nn.split(gates, 4, dim=-1)
        if self.forget_bias:
            f = nn.scale(f, bias=self.forget_bias)
        c_new = gate_act(f) * c + gate_act(i) * act(g)
        h_new = gate_act(o) * act(c_new)
        return h_new, [h_new, c_new]


class GRUCell(_GatedCell):
    """A GRU step as PyTorch's GRUCell (Fluid 1.7 `layers.GRUCell` arguments):
    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr), z = sigmoid(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) * n + z * h.
    `cell(inputs [N, D], h) -> (h', h')`; the state is [N, hidden_size].

    >>> cell = nf.layers.GRUCell(8)
    >>> x = nf.data("x", [-1, 4]); h = cell.get_initial_states(x)
    >>> out, h1 = cell(x, h)
    """

    gates = 3

    def __init__(
        self,
        hidden_size: int,
        param_attr: Any = None,
        bias_attr: Any = None,
        gate_activation: Any = None,
        activation: Any = None,
        dtype: Any = "float32",
        name: str = "GRUCell",
    ):
        super().__init__(
            hidden_size, param_attr, bias_attr, gate_activation, activation, dtype, name
        )

    @property
    def state_shape(self) -> list[int]:
        return [self.hidden_size]

    def _prepare(self) -> tuple[VarDesc, ...]:
        return nn.transpose(self.w_ih, [1, 0]), nn.transpose(self.w_hh, [1, 0])

    def call(self, inputs: Any, states: Any) -> tuple[VarDesc, VarDesc]:
        x = self._check_input(inputs, "inputs")
        if isinstance(states, (list, tuple)) and len(states) == 1:
            states = states[0]
        h = self._hidden_state(states, "state")
        w_x, w_h = self._weights(x)
        projected = nn.matmul(x, w_x)
        if self.b_ih is not None:
            projected = projected + self.b_ih
        hidden = nn.matmul(h, w_h)
        if self._fused:
            inputs = {"X": projected, "HiddenProj": hidden, "HiddenPrev": h}
            if self.b_hh is not None:
                inputs["Bias"] = self.b_hh
            h_new = append_op("gru_cell", inputs, outputs=("Hidden",), name=self.name)
            return h_new, h_new
        if self.b_hh is not None:
            hidden = hidden + self.b_hh
        gate_act = self.gate_activation or nn.sigmoid
        act = self.activation or nn.tanh
        x_r, x_z, x_n = nn.split(projected, 3, dim=-1)
        h_r, h_z, h_n = nn.split(hidden, 3, dim=-1)
        r = gate_act(x_r + h_r)
        z = gate_act(x_z + h_z)
        n = act(x_n + r * h_n)
        h_new = n + z * (h - n)
        return h_new, h_new


# ---- the loop ----


def _time_swapped(x: VarDesc) -> VarDesc:
    return nn.transpose(x, [1, 0, *range(2, len(x.shape))])


def rnn(
    cell: Any,
    inputs: Any,
    initial_states: Any = None,
    sequence_length: VarDesc | None = None,
    time_major: bool = False,
    is_reverse: bool = False,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """Run `cell` over the time steps of `inputs` (Fluid 1.7 `layers.rnn`): a variable or a
    nested structure of them, each [batch, time, ...] ([time, batch, ...] when `time_major`).
    `initial_states` default to `cell.get_initial_states(inputs)`; `sequence_length` (int
    [batch]): past its length a row's states stop changing and its outputs are zero.
    `is_reverse` runs each row's valid steps last to first (outputs stay aligned with their
    inputs). `kwargs` go to `cell.call`. Returns (outputs stacked over time like `inputs`,
    final states: each row's states after its last valid step).

    Built on `nf.rnn()`: the cell's time-invariant ops and its input products move out of the
    step (one GEMM over all steps). Departure from Fluid 1.7: outputs past a row's length are
    zero (Fluid leaves whatever the cell computed on the padding there).

    >>> x = nf.data("x", [-1, 5, 4]); n = nf.data("n", [-1], "int64")
    >>> out, (h, c) = nf.layers.rnn(nf.layers.LSTMCell(8), x, sequence_length=n)
    >>> out.shape, h.shape
    ((-1, 5, 8), (-1, 8))
    """
    if not callable(getattr(cell, "call", None)):
        raise layer_error(
            AttrError, "rnn", f"cell must be an RNNCell (with call()), got {type(cell).__name__}"
        )
    flat_inputs = flatten(inputs)
    for x in flat_inputs:
        if not isinstance(x, VarDesc) or len(x.shape) < 2:
            raise layer_error(
                ShapeError,
                "rnn",
                f"inputs must be [batch, time, ...] variables, got "
                f"{getattr(x, 'name', type(x).__name__)} {list(getattr(x, 'shape', []))}",
            )
    if initial_states is None:
        initial_states = cell.get_initial_states(
            batch_ref=inputs, batch_dim_idx=1 if time_major else 0
        )
    if time_major:
        flat_inputs = [_time_swapped(x) for x in flat_inputs]
    if sequence_length is not None:
        check_lengths("rnn", flat_inputs[0], sequence_length)
    if is_reverse:
        flat_inputs = [sequence_reverse(x, sequence_length) for x in flat_inputs]
    flat_states = flatten(initial_states)
    loop = RNN()
    with loop.step():
        steps = [loop.step_input(x, lengths=sequence_length) for x in flat_inputs]
        memories = [loop.memory(init=s) for s in flat_states]
        outputs, new_states = cell(
            pack_as(inputs, steps), pack_as(initial_states, memories), **kwargs
        )
        flat_new = flatten(new_states)
        if len(flat_new) != len(memories):
            raise ControlFlowError(
                f"rnn: the cell returned {len(flat_new)} new state(s) for {len(memories)} "
                f"state(s); new_states must have the structure of the states"
            )
        for memory, new in zip(memories, flat_new):
            loop.update_memory(memory, new)
        flat_outputs = flatten(outputs)
        loop.output(*flat_outputs)
    stacked = loop()
    stacked = [stacked] if isinstance(stacked, VarDesc) else list(stacked)
    finals = [loop.final_memory(m) for m in memories]
    if is_reverse:
        stacked = [sequence_reverse(x, sequence_length) for x in stacked]
    if time_major:
        stacked = [_time_swapped(x) for x in stacked]
    return pack_as(outputs, stacked), pack_as(new_states, finals)


__all__ = ["GRUCell", "LSTMCell", "RNNCell", "rnn"]
