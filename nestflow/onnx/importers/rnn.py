"""Mappers of ONNX's recurrent layers (LSTM, GRU, RNN) onto nf.layers.rnn.

Each direction runs a cell (holding that direction's imported weights, already sliced,
gate-reordered and transposed outside the loop) over the batch-major sequence with
nf.layers.rnn: sequence_lens become the rows' lengths (outputs past a row's length are zero,
its final state the one after its last valid step, as ONNX specifies) and the reverse
direction runs each row's valid steps last to first. With the default activations and no
clip or peepholes an LSTM step is nestflow's fused lstm_unit and a GRU step (with
linear_before_reset, PyTorch's GRU) gru_cell; otherwise the gates are composed of
elementwise ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nestflow.layers.rnn_cells import RNNCell, rnn
from nestflow.onnx.importers.registry import Node, mapper


def _activation(node: Node, name: str, alpha: float | None, beta: float | None) -> Callable:
    """ONNX's recurrent activation `name` (with activation_alpha/beta) on a variable name."""

    def unary(op_type: str, **attrs: Any) -> Callable:
        return lambda x: node.op(op_type, {"X": x}, attrs)

    a = alpha
    key = name.lower()
    table = {
        "sigmoid": lambda: unary("sigmoid"),
        "tanh": lambda: unary("tanh"),
        "relu": lambda: unary("relu"),
        "softsign": lambda: unary("softsign"),
        "softplus": lambda: unary("softplus"),
        "hardsigmoid": lambda: unary(
            "hard_sigmoid", slope=0.2 if a is None else a, offset=0.5 if beta is None else beta
        ),
        "leakyrelu": lambda: unary("leaky_relu", alpha=0.01 if a is None else a),
        "elu": lambda: unary("elu", alpha=1.0 if a is None else a),
        "affine": lambda: unary("scale", scale=1.0 if a is None else a, bias=beta or 0.0),
        "scaledtanh": lambda: (
            lambda x: unary("scale", scale=1.0 if a is None else a)(
                unary("tanh")(unary("scale", scale=1.0 if beta is None else beta)(x))
            )
        ),
    }
    if key not in table:
        raise node.unsupported(f"recurrent activation '{name}'")
    return table[key]()


def _activations(node: Node, defaults: list[str], directions: int) -> tuple[list, bool]:
    """Per direction the activation functions, and whether they are the defaults."""
    names = node.attr("activations", defaults * directions)
    if len(names) != len(defaults) * directions:
        raise node.unsupported(f"activations {names} for {directions} direction(s)")
    alphas, betas = node.attr("activation_alpha", []), node.attr("activation_beta", [])
    funcs = [
        _activation(
            node, n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None
        )
        for i, n in enumerate(names)
    ]
    k = len(defaults)
    default = [n.lower() for n in names] == [n.lower() for n in defaults] * directions
    return [funcs[d * k : (d + 1) * k] for d in range(directions)], default


class _Cell(RNNCell):
    """One direction of an ONNX recurrent node: `step(x, states)` on variable names."""

    def __init__(self, node: Node, hidden: int, states: int, step: Callable):
        self.node, self.hidden, self.states, self.step = node, hidden, states, step
        self.dtype = node.dtype(0)

    @property
    def state_shape(self) -> Any:
        return [[self.hidden]] * self.states if self.states > 1 else [self.hidden]

    @property
    def state_dtype(self) -> Any:
        return [self.dtype] * self.states if self.states > 1 else self.dtype

    def call(self, inputs, states):
        names = [s.name for s in states] if self.states > 1 else [states.name]
        new = self.step(inputs.name, names)
        find = self.node.graph.block.find_var
        new_vars = [find(n) for n in new]
        return new_vars[0], new_vars if self.states > 1 else new_vars[0]


# ---- the weights of one direction ----


def _sliced(node: Node, i: int, d: int) -> str:
    """Input `i` ([num_directions, ...]) at direction `d`."""
    attrs = {"axes": [0], "starts": [d], "ends": [d + 1], "decrease_axis": [0]}
    return node.op("slice", {"Input": node.input(i)}, attrs)


def _parts(node: Node, x: str, count: int, axis: int = 0) -> list[str]:
    return node.op("split", {"X": x}, {"num": count, "axis": axis}, outputs=[("Out", count)])


def _reordered(node: Node, x: str, order: list[int]) -> str:
    """The gate blocks (dim 0) of `x` in `order`."""
    if order == sorted(order):
        return x
    parts = _parts(node, x, len(order))
    return node.op("concat", {"X": [parts[k] for k in order]}, {"axis": 0})


def _weight(node: Node, i: int, d: int, order: list[int]) -> str:
    """W or R of direction `d`, gate rows in `order`, transposed for `x @ W`."""
    rows = _reordered(node, _sliced(node, i, d), order)
    return node.op("transpose", {"X": rows}, {"axis": [1, 0]})


def _biases(node: Node, d: int, order: list[int]) -> tuple[str | None, str | None]:
    """(Wb, Rb) of direction `d`, gate blocks in `order` (None without B)."""
    if not node.has_input(3):
        return None, None
    wb, rb = _parts(node, _sliced(node, 3, d), 2)
    return _reordered(node, wb, order), _reordered(node, rb, order)


# ---- arithmetic on variable names ----


def _add(node: Node, a: str, b: str | None) -> str:
    return a if b is None else node.op("elementwise_add", {"X": a, "Y": b})


def _mul(node: Node, a: str, b: str) -> str:
    return node.op("elementwise_mul", {"X": a, "Y": b})


def _mm(node: Node, a: str, b: str) -> str:
    return node.op("matmul", {"X": a, "Y": b})


def _clip(node: Node, x: str, clip: float | None) -> str:
    return x if clip is None else node.op("clip", {"X": x}, {"min": -clip, "max": clip})


# ---- the node ----


def _import(node: Node, states: int, make_step: Callable[[int, int], Callable]) -> None:
    """Run each direction's cell; bind Y and Y_h (and Y_c)."""
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise node.unsupported(f"direction '{direction}'")
    directions = 2 if direction == "bidirectional" else 1
    hidden = node.attr("hidden_size", node.shape(2)[-1])
    layout = node.attr("layout", 0)
    block = node.graph.block
    x = node.input(0)
    batch_major = x if layout else node.op("transpose", {"X": x}, {"axis": [1, 0, 2]})
    lengths = block.find_var(node.input(4)) if node.has_input(4) else None
    ys, finals = [], [[] for _ in range(states)]
    for d in range(directions):
        initial = None
        if any(node.has_input(5 + s) for s in range(states)):
            initial = []
            for s in range(states):
                if node.has_input(5 + s):
                    state = (
                        node.op("transpose", {"X": node.input(5 + s)}, {"axis": [1, 0, 2]})
                        if layout
                        else node.input(5 + s)
                    )
                    initial.append(
                        node.op(
                            "slice",
                            {"Input": state},
                            {"axes": [0], "starts": [d], "ends": [d + 1], "decrease_axis": [0]},
                        )
                    )
                else:
                    attrs = {"shape": [-1, hidden], "dtype": node.dtype(0), "value": 0.0}
                    initial.append(
                        node.op("fill_constant_batch_size_like", {"Input": batch_major}, attrs)
                    )
            # Initial states PyTorch exports as zeros fold to constants: read them as variables.
            initial = [block.find_var(node.graph.var(n)) for n in initial]
            initial = initial if states > 1 else initial[0]
        cell = _Cell(node, hidden, states, make_step(d, hidden))
        reverse = direction == "reverse" or d == 1
        y, final = rnn(cell, block.find_var(batch_major), initial, lengths, is_reverse=reverse)
        ys.append(y.name)
        for s, var in enumerate(final if states > 1 else [final]):
            finals[s].append(var.name)
    if node.wants_output(0):  # Y [seq, dirs, batch, hidden], layout 1: [batch, seq, dirs, hidden]
        axis = 2 if layout else 1
        parts = []
        for y in ys:
            y = y if layout else node.op("transpose", {"X": y}, {"axis": [1, 0, 2]})
            parts.append(node.op("unsqueeze", {"X": y}, {"axes": [axis]}))
        node.op("concat", {"X": parts}, {"axis": axis}, out=0)
    for s in range(states):  # Y_h, Y_c [dirs, batch, hidden], layout 1: [batch, dirs, hidden]
        if node.wants_output(1 + s):
            attrs = {"axis": 1 if layout else 0}
            node.op("stack", {"X": finals[s]}, attrs, outputs=("Y",), out=1 + s)


@mapper("LSTM")
def lstm(node: Node) -> None:
    directions = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    acts, default_acts = _activations(node, ["Sigmoid", "Tanh", "Tanh"], directions)
    clip, input_forget = node.attr("clip"), node.attr("input_forget", 0)
    peepholes = node.has_input(7)
    fused = default_acts and clip is None and not input_forget and not peepholes
    order = [0, 2, 1, 3] if fused else [0, 1, 2, 3]  # ONNX (i, o, f, c); lstm_unit (i, f, o, g)

    def make_step(d: int, hidden: int) -> Callable:
        w, r = _weight(node, 1, d, order), _weight(node, 2, d, order)
        wb, rb = _biases(node, d, order)
        bias = None if wb is None else _add(node, wb, rb)
        peep = _parts(node, _sliced(node, 7, d), 3) if peepholes else None  # (i, o, f)
        f_act, g_act, h_act = acts[d]

        def step(x: str, states: list[str]) -> list[str]:
            h, c = states
            gates = _add(node, _add(node, _mm(node, x, w), bias), _mm(node, h, r))
            if fused:
                c_new, h_new = node.op("lstm_unit", {"X": gates, "C_prev": c}, outputs=("C", "H"))
                return [h_new, c_new]
            i, o, f, g = _parts(node, gates, 4, axis=-1)
            if peep is not None:
                i, f = _add(node, i, _mul(node, c, peep[0])), _add(node, f, _mul(node, c, peep[2]))
            i = f_act(_clip(node, i, clip))
            f = (
                node.op("scale", {"X": i}, {"scale": -1.0, "bias": 1.0})
                if input_forget
                else f_act(_clip(node, f, clip))
            )
            c_new = _add(node, _mul(node, f, c), _mul(node, i, g_act(_clip(node, g, clip))))
            if peep is not None:
                o = _add(node, o, _mul(node, c_new, peep[1]))
            h_new = _mul(node, f_act(_clip(node, o, clip)), h_act(c_new))
            return [h_new, c_new]

        return step

    _import(node, 2, make_step)


@mapper("GRU")
def gru(node: Node) -> None:
    directions = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    acts, default_acts = _activations(node, ["Sigmoid", "Tanh"], directions)
    clip = node.attr("clip")
    before_reset = node.attr("linear_before_reset", 0)
    fused = default_acts and clip is None and before_reset
    order = [1, 0, 2] if fused else [0, 1, 2]  # ONNX (z, r, h); gru_cell (r, z, n)

    def make_step(d: int, hidden: int) -> Callable:
        w, r = _weight(node, 1, d, order), _weight(node, 2, d, order)
        wb, rb = _biases(node, d, order)
        r_zr = r_h = None  # without linear_before_reset, R's h block multiplies (r * h)
        if not fused and not before_reset:
            r_z, r_r, r_h = _parts(node, r, 3, axis=1)
            r_zr = node.op("concat", {"X": [r_z, r_r]}, {"axis": 1})
        f_act, g_act = acts[d]

        def step(x: str, states: list[str]) -> list[str]:
            (h,) = states
            projected = _add(node, _mm(node, x, w), wb)
            if fused:
                inputs = {
                    "X": projected,
                    "HiddenProj": _mm(node, h, r),
                    "HiddenPrev": h,
                    "Bias": rb,
                }
                return [node.op("gru_cell", inputs, outputs=("Hidden",))]
            x_z, x_r, x_h = _parts(node, projected, 3, axis=-1)
            b_z, b_r, b_h = _parts(node, rb, 3) if rb is not None else (None, None, None)
            if before_reset:
                h_z, h_r, h_h = _parts(node, _mm(node, h, r), 3, axis=-1)
            else:
                h_z, h_r = _parts(node, _mm(node, h, r_zr), 2, axis=-1)
            z = f_act(_clip(node, _add(node, _add(node, x_z, h_z), b_z), clip))
            reset = f_act(_clip(node, _add(node, _add(node, x_r, h_r), b_r), clip))
            if before_reset:
                hidden_part = _mul(node, reset, _add(node, h_h, b_h))
            else:
                hidden_part = _add(node, _mm(node, _mul(node, reset, h), r_h), b_h)
            candidate = g_act(_clip(node, _add(node, x_h, hidden_part), clip))
            delta = node.op("elementwise_sub", {"X": h, "Y": candidate})
            return [_add(node, candidate, _mul(node, z, delta))]  # (1 - z) n + z h

        return step

    _import(node, 1, make_step)


@mapper("RNN")
def simple_rnn(node: Node) -> None:
    directions = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    acts, _ = _activations(node, ["Tanh"], directions)
    clip = node.attr("clip")

    def make_step(d: int, hidden: int) -> Callable:
        w, r = _weight(node, 1, d, [0]), _weight(node, 2, d, [0])
        wb, rb = _biases(node, d, [0])
        bias = None if wb is None else _add(node, wb, rb)
        (act,) = acts[d]

        def step(x: str, states: list[str]) -> list[str]:
            (h,) = states
            total = _add(node, _add(node, _mm(node, x, w), bias), _mm(node, h, r))
            return [act(_clip(node, total, clip))]

        return step

    _import(node, 1, make_step)
