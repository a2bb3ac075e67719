"""One recurrent step as one op: lstm_unit (Fluid 1.8's slots, attrs and gate order) and
gru_cell (PyTorch's GRU step).

The recurrent layers (nf.layers.lstm/gru, LSTMCell/GRUCell) compute the gate pre-activations of
a step with one product and run the rest of the step here: one op, and one gradient op, per
step instead of a dozen elementwise ones. Transcendental functions dominate these kernels, so
each forward keeps its activated gates for its gradient (`_GATES`) rather than have the
gradient compute them again. The kernels and their helpers are written against the place's
`xp`.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import DTypeError
from nestflow.ops.registry import VarInfo, cuda_elementwise, fail, fused_kernel, register_op


class _GateMemo:
    """Activated gates of recent forwards, keyed by the forward's output array (held weakly:
    the entry dies with it) and checked against its input. Sub-blocks never write into a value
    they keep for the backward pass, so an entry stays valid while both arrays live; at most
    `limit` bytes are kept, oldest entries dropped first (their gradients recompute)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[int, tuple] = {}
        self._bytes = 0
        self._lock = threading.Lock()  # weakref callbacks may run in any thread

    def _drop(self, ident: int) -> None:
        entry = self._entries.pop(ident, None)
        if entry is not None:
            self._bytes -= entry[3]

    def put(self, out: np.ndarray, x: np.ndarray, gates: tuple[np.ndarray, ...]) -> None:
        ident, size = id(out), sum(g.nbytes for g in gates)

        def forget(_ref, ident=ident):
            with self._lock:
                self._drop(ident)

        with self._lock:
            self._drop(ident)
            while self._entries and self._bytes + size > self.limit:
                self._drop(next(iter(self._entries)))
            if size <= self.limit:
                self._entries[ident] = (weakref.ref(out, forget), weakref.ref(x), gates, size)
                self._bytes += size

    def take(self, out: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, ...] | None:
        with self._lock:
            entry = self._entries.get(id(out))
            if entry is None or entry[0]() is not out or entry[1]() is not x:
                return None
            self._drop(id(out))
            return entry[2]


_GATES = _GateMemo(limit=256 << 20)


# exp is about twice as fast as tanh in NumPy, so the activations go through it:
# sigmoid(v) = 1 / (1 + exp(-v)), tanh(v) = 2 * sigmoid(2v) - 1. exp(-v) overflows to inf for
# very negative v, which gives the right limits (0 and -1): the warning is silenced.


def _sigmoid_of_scaled(xp, a: np.ndarray) -> np.ndarray:
    """sigmoid(-a), computed in place in `a` (which the caller owns)."""
    with np.errstate(over="ignore"):
        xp.exp(a, out=a)
    a += 1
    xp.reciprocal(a, out=a)
    return a


def _tanh(xp, x: np.ndarray) -> np.ndarray:
    out = _sigmoid_of_scaled(xp, xp.multiply(x, x.dtype.type(-2.0)))
    out *= 2
    out -= 1
    return out


_SCALES: dict[tuple[int, str, str | None], np.ndarray] = {}


def _lstm_gates(xp, X: np.ndarray, forget_bias: float) -> np.ndarray:
    """[sigmoid(i), sigmoid(f + forget_bias), sigmoid(o), tanh(g)] from X = [i, f, o, g], with
    one exp over all four."""
    d = X.shape[-1] // 4
    key = (d, X.dtype.str, None if xp is np else str(X.device))  # a device's own copy
    scales = _SCALES.get(key)
    if scales is None:  # -1 for the sigmoid gates, -2 for tanh(g) = 2 * sigmoid(2g) - 1
        scales = _SCALES[key] = xp.repeat(xp.asarray([-1, -1, -1, -2], X.dtype), d)
    act = xp.multiply(X, scales)
    if forget_bias:
        act[..., d : 2 * d] -= X.dtype.type(forget_bias)
    _sigmoid_of_scaled(xp, act)
    g = act[..., 3 * d :]
    g *= 2
    g -= 1
    return act


# The fused CUDA kernels (`forward_cuda`, `backward_cuda`, defined by
# registry.cuda_elementwise): each runs over the [..., D] state, one thread per (row, column), and reads that
# column of every gate in the row of X (`raw`, indexed by hand). They compute the activations
# again rather than keep them, as a fused launch costs less than the memory `_GATES` holds.


def _fusable(*arrays) -> bool:
    """Whether the fused kernels take these inputs: non-empty float32/float64 arrays of one
    dtype."""
    dtype = arrays[0].dtype
    return (
        dtype.name in ("float32", "float64")
        and arrays[0].size > 0
        and all(a.dtype == dtype for a in arrays)
    )


# The gates of the element at (row, col) of C: X's row holds [i, f, o, g], `width` (D) each.
_LSTM_GATES = """
ptrdiff_t col = i % width;
ptrdiff_t at = (i - col) * 4 + col;
T gi = 1 / (1 + exp(-x[at]));
T gf = 1 / (1 + exp(-(x[at + width] + (T)forget_bias)));
T go = 1 / (1 + exp(-x[at + 2 * width]));
T gg = tanh(x[at + 3 * width]);
"""
_LSTM = cuda_elementwise(
    "nestflow_lstm_unit",
    "raw T x, T c_prev, int64 width, float64 forget_bias",
    "T c, T h",
    _LSTM_GATES
    + """
T cell = c_prev * gf + gi * gg;
c = cell;
h = tanh(cell) * go;
""",
)


def _lstm_grad_kernel(c_grad: bool, h_grad: bool) -> str:
    """The gradient kernel for the upstream gradients present (C's, H's or both)."""
    grads = ", T c_grad" * c_grad + ", T h_grad" * h_grad
    dc = " + ".join(["h_grad * go * (1 - tc * tc)"] * h_grad + ["c_grad"] * c_grad)
    return cuda_elementwise(
        "nestflow_lstm_unit_grad" + "_c" * c_grad + "_h" * h_grad,
        "raw T x, T c_prev, T c" + grads + ", int64 width, float64 forget_bias",
        "raw T dx, T dc_prev",
        _LSTM_GATES
        + f"""
T tc = tanh(c);
T dc = {dc};
dx[at] = dc * gg * (gi * (1 - gi));
dx[at + width] = dc * c_prev * (gf * (1 - gf));
dx[at + 2 * width] = {"h_grad * tc * (go * (1 - go))" if h_grad else "0"};
dx[at + 3 * width] = dc * gi * (1 - gg * gg);
dc_prev = dc * gf;
""",
    )


_LSTM_GRADS = {
    (c, h): _lstm_grad_kernel(c, h) for c, h in ((True, True), (True, False), (False, True))
}


@register_op
class lstm_unit:
    """C = C_prev * sigmoid(f + forget_bias) + sigmoid(i) * tanh(g); H = tanh(C) * sigmoid(o),
    where X [..., 4D] holds the gate pre-activations [i, f, o, g] (in this order, Fluid's) and
    C_prev [..., D] the cell state before the step."""

    inputs, outputs = ("X", "C_prev"), ("C", "H")
    grad_no_need_buffer = ("H",)
    attrs = {"forget_bias": 0.0}

    def infer(X, C_prev, forget_bias):
        if not is_floating(X.dtype) or X.dtype != C_prev.dtype:
            raise DTypeError(
                f"X ({X.dtype}) and C_prev ({C_prev.dtype}) must be one floating-point dtype"
            )
        if X.ndim < 1 or X.ndim != C_prev.ndim:
            fail(f"X {list(X.shape)} and C_prev {list(C_prev.shape)} must have one rank >= 1")
        d, width = C_prev.shape[-1], X.shape[-1]
        if width >= 0 and width % 4:
            fail(f"X {list(X.shape)}: its last dim holds 4 gates, so it must divide by 4")
        if d >= 0 and width >= 0 and width != 4 * d:
            fail(
                f"X {list(X.shape)} must have 4 * {d} columns (4 gates of C_prev "
                f"{list(C_prev.shape)}), got {width}"
            )
        lead = [a if a >= 0 else b for a, b in zip(X.shape[:-1], C_prev.shape[:-1])]
        if any(a >= 0 and b >= 0 and a != b for a, b in zip(X.shape[:-1], C_prev.shape[:-1])):
            fail(f"X {list(X.shape)} and C_prev {list(C_prev.shape)} differ in leading dims")
        d = d if d >= 0 else (width // 4 if width >= 0 else -1)
        info = VarInfo((*lead, d), C_prev.dtype)
        return info, info

    def forward(X, C_prev, forget_bias, xp):
        act = _lstm_gates(xp, X, forget_bias)
        d = act.shape[-1] // 4
        c = C_prev * act[..., d : 2 * d]
        c += act[..., :d] * act[..., 3 * d :]
        tanh_c = _tanh(xp, c)
        h = tanh_c * act[..., 2 * d : 3 * d]
        _GATES.put(c, X, (act, tanh_c))
        return c, h

    def forward_cuda(X, C_prev, forget_bias, device):
        if not (_fusable(C_prev, X) and X.shape == (*C_prev.shape[:-1], 4 * C_prev.shape[-1])):
            return NotImplemented
        width = np.int64(C_prev.shape[-1])
        return fused_kernel(device, _LSTM)(X, C_prev, width, np.float64(forget_bias))

    def backward(X, C_prev, C, H, C_grad, H_grad, forget_bias, needs=(True, True), *, xp):
        kept = _GATES.take(C, X)
        if kept is None:
            act = _lstm_gates(xp, X, forget_bias)
            tanh_c = _tanh(xp, C)
        else:
            act, tanh_c = kept
        d = C.shape[-1]
        i, f, o, g = (act[..., k * d : (k + 1) * d] for k in range(4))
        # The gradient reaching C: its own, plus H's through tanh(C) * o.
        if H_grad is not None:
            dc = H_grad * o
            dc *= 1 - tanh_c * tanh_c
            if C_grad is not None:
                dc += C_grad
        else:
            dc = C_grad.copy() if C_grad is not None else xp.zeros_like(C)
        dx = dprev = None
        if needs[0]:
            dx = xp.empty_like(X)
            xp.multiply(dc * g, i * (1 - i), out=dx[..., :d])
            xp.multiply(dc * C_prev, f * (1 - f), out=dx[..., d : 2 * d])
            if H_grad is not None:
                xp.multiply(H_grad * tanh_c, o * (1 - o), out=dx[..., 2 * d : 3 * d])
            else:
                dx[..., 2 * d : 3 * d] = 0
            xp.multiply(dc * i, 1 - g * g, out=dx[..., 3 * d :])
        if needs[1]:
            dc *= f
            dprev = dc
        return dx, dprev

    def backward_cuda(X, C_prev, C, H, C_grad, H_grad, forget_bias, needs=(True, True), *, device):
        grads = [g for g in (C_grad, H_grad) if g is not None]
        if not (
            grads
            and _fusable(C, C_prev, X, *grads)
            and C_prev.shape == C.shape
            and X.shape == (*C.shape[:-1], 4 * C.shape[-1])
            and all(g.shape == C.shape for g in grads)
        ):
            return NotImplemented
        xp = device.xp
        kernel = fused_kernel(device, _LSTM_GRADS[C_grad is not None, H_grad is not None])
        dx, dprev = xp.empty(X.shape, X.dtype), xp.empty(C.shape, C.dtype)
        width = np.int64(C.shape[-1])
        kernel(X, C_prev, C, *grads, width, np.float64(forget_bias), dx, dprev)
        return (dx if needs[0] else None), (dprev if needs[1] else None)


def _gru_gates(xp, X, HiddenProj, Bias):
    """r, z, the candidate n and the hidden part of its pre-activation (W_hn h + b_hn)."""
    d = X.shape[-1] // 3
    hidden = HiddenProj if Bias is None else HiddenProj + Bias
    rz = xp.add(X[..., : 2 * d], hidden[..., : 2 * d])
    rz = _sigmoid_of_scaled(xp, xp.negative(rz, out=rz))
    r, z = rz[..., :d], rz[..., d:]
    hn = hidden[..., 2 * d :]
    n = _tanh(xp, X[..., 2 * d :] + r * hn)
    return r, z, n, hn


# r, z, n and the hidden part of n's pre-activation at (row, col) of HiddenPrev: the rows of X
# and HiddenProj hold [r, z, n], `width` (D) each; `{bias}` is the term Bias adds (or none).
_GRU_GATES = """
ptrdiff_t col = i % width;
ptrdiff_t at = (i - col) * 3 + col;
T pr = proj[at]{bias_r};
T pz = proj[at + width]{bias_z};
T pn = proj[at + 2 * width]{bias_n};
T r = 1 / (1 + exp(-(x[at] + pr)));
T z = 1 / (1 + exp(-(x[at + width] + pz)));
T n = tanh(x[at + 2 * width] + r * pn);
"""


def _gru_kernel(name: str, in_params: str, out_params: str, body: str, bias: bool) -> str:
    terms = dict(bias_r="", bias_z="", bias_n="")
    if bias:
        in_params += ", raw T bias"
        terms = dict(
            bias_r=" + bias[col]", bias_z=" + bias[col + width]", bias_n=" + bias[col + 2 * width]"
        )
    return cuda_elementwise(
        name + "_bias" * bias, in_params, out_params, _GRU_GATES.format(**terms) + body
    )


_GRU = {
    bias: _gru_kernel(
        "nestflow_gru_cell",
        "raw T x, raw T proj, T h_prev, int64 width",
        "T hidden",
        "hidden = (h_prev - n) * z + n;",
        bias,
    )
    for bias in (False, True)
}
_GRU_GRAD = {
    bias: _gru_kernel(
        "nestflow_gru_cell_grad",
        "raw T x, raw T proj, T h_prev, T h_grad, int64 width",
        "raw T dx, raw T dproj, T dh_prev",
        """
T dn = h_grad * (1 - z) * (1 - n * n);
T dz = h_grad * (h_prev - n) * (z * (1 - z));
T dr = dn * pn * (r * (1 - r));
dx[at] = dr;
dx[at + width] = dz;
dx[at + 2 * width] = dn;
dproj[at] = dr;
dproj[at + width] = dz;
dproj[at + 2 * width] = dn * r;
dh_prev = h_grad * z;
""",
        bias,
    )
    for bias in (False, True)
}


def _gru_fusable(X, HiddenProj, HiddenPrev, Bias, *more) -> bool:
    d = HiddenPrev.shape[-1] if HiddenPrev.ndim else -1
    return (
        _fusable(HiddenPrev, X, HiddenProj, *more, *([Bias] if Bias is not None else []))
        and X.shape == HiddenProj.shape == (*HiddenPrev.shape[:-1], 3 * d)
        and (Bias is None or Bias.shape == (3 * d,))
        and all(a.shape == HiddenPrev.shape for a in more)
    )


@register_op
class gru_cell:
    """Hidden = (1 - z) * n + z * HiddenPrev: one GRU step as PyTorch's nn.GRU/GRUCell compute
    it (the reset gate applied after the hidden product, unlike Fluid's gru_unit), with
    r = sigmoid(X_r + P_r), z = sigmoid(X_z + P_z), n = tanh(X_n + r * P_n), where X [..., 3D]
    holds the input's projections [r, z, n] (with their bias) and P = HiddenProj + Bias the
    hidden state's (HiddenProj = HiddenPrev @ W_hh^T, Bias [3D] = b_hh, optional)."""

    inputs, outputs = ("X", "HiddenProj", "HiddenPrev", "Bias?"), ("Hidden",)

    def infer(X, HiddenProj, HiddenPrev, Bias):
        infos = [X, HiddenProj, HiddenPrev] + ([Bias] if Bias is not None else [])
        if not is_floating(X.dtype) or any(i.dtype != X.dtype for i in infos):
            raise DTypeError(
                f"X, HiddenProj, HiddenPrev and Bias must be one floating-point dtype, got "
                f"{[i.dtype for i in infos]}"
            )
        d = HiddenPrev.shape[-1] if HiddenPrev.ndim else -1
        for slot, info in (("X", X), ("HiddenProj", HiddenProj)):
            if info.ndim != HiddenPrev.ndim or info.ndim < 1:
                fail(
                    f"{slot} {list(info.shape)} and HiddenPrev {list(HiddenPrev.shape)} differ in rank"
                )
            if d >= 0 and info.shape[-1] >= 0 and info.shape[-1] != 3 * d:
                fail(
                    f"{slot} {list(info.shape)} must have 3 * {d} columns (3 gates of "
                    f"HiddenPrev {list(HiddenPrev.shape)})"
                )
        if Bias is not None and Bias.shape not in ((3 * d,), (-1,)) and d >= 0:
            fail(f"Bias {list(Bias.shape)} must be [{3 * d}]")
        return HiddenPrev

    def forward(X, HiddenProj, HiddenPrev, Bias, xp):
        gates = _gru_gates(xp, X, HiddenProj, Bias)
        _r, z, n, _hn = gates
        out = HiddenPrev - n
        out *= z
        out += n
        _GATES.put(out, X, gates)
        return out

    def forward_cuda(X, HiddenProj, HiddenPrev, Bias, device):
        if not _gru_fusable(X, HiddenProj, HiddenPrev, Bias):
            return NotImplemented
        kernel = fused_kernel(device, _GRU[Bias is not None])
        bias = () if Bias is None else (Bias,)
        return kernel(X, HiddenProj, HiddenPrev, np.int64(HiddenPrev.shape[-1]), *bias)

    def backward(X, HiddenProj, HiddenPrev, Bias, Hidden, Hidden_grad, needs=(True,) * 4, *, xp):
        kept = _GATES.take(Hidden, X)
        r, z, n, hn = kept if kept is not None else _gru_gates(xp, X, HiddenProj, Bias)
        d = n.shape[-1]
        dx = xp.empty_like(X)
        dn = dx[..., 2 * d :]  # d(pre-activation of n) = dX_n
        xp.multiply(Hidden_grad * (1 - z), 1 - n * n, out=dn)
        xp.multiply(Hidden_grad * (HiddenPrev - n), z * (1 - z), out=dx[..., d : 2 * d])
        xp.multiply(dn * hn, r * (1 - r), out=dx[..., :d])
        dproj = None
        if needs[1] or needs[3]:
            dproj = dx.copy()
            dproj[..., 2 * d :] *= r
        dprev = Hidden_grad * z if needs[2] else None
        dbias = None
        if needs[3] and Bias is not None:
            dbias = dproj.reshape(-1, 3 * d).sum(axis=0).reshape(Bias.shape)
        return (dx if needs[0] else None), (dproj if needs[1] else None), dprev, dbias

    def backward_cuda(
        X, HiddenProj, HiddenPrev, Bias, Hidden, Hidden_grad, needs=(True,) * 4, *, device
    ):
        if Hidden_grad is None or not _gru_fusable(X, HiddenProj, HiddenPrev, Bias, Hidden_grad):
            return NotImplemented
        xp = device.xp
        kernel = fused_kernel(device, _GRU_GRAD[Bias is not None])
        dx, dproj = xp.empty(X.shape, X.dtype), xp.empty(X.shape, X.dtype)
        dprev = xp.empty(HiddenPrev.shape, HiddenPrev.dtype)
        bias = () if Bias is None else (Bias,)
        width = np.int64(HiddenPrev.shape[-1])
        kernel(X, HiddenProj, HiddenPrev, Hidden_grad, width, *bias, dx, dproj, dprev)
        dbias = None
        if needs[3] and Bias is not None:
            dbias = dproj.reshape(-1, X.shape[-1]).sum(axis=0).reshape(Bias.shape)
        return (
            (dx if needs[0] else None),
            (dproj if needs[1] else None),
            (dprev if needs[2] else None),
            dbias,
        )
