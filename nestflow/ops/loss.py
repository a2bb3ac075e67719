"""Losses and metrics: cross_entropy, softmax_with_cross_entropy, accuracy.

Labels are class ids (int64, shaped like the scores with the class dim 1 or dropped) or, with
`soft_label`, distributions shaped like the scores. A hard label equal to `ignore_index` gives
that row zero loss and zero gradient; any other label outside [0, C) is an ExecutionError.
"""

from __future__ import annotations

import numpy as np

from nestflow.core.device_context import ROW_CHUNK_ELEMENTS, thread_grain
from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError, ShapeError
from nestflow.ops.activation import rows_apart
from nestflow.ops.registry import (
    Required,
    VarInfo,
    cuda_elementwise,
    fail,
    fused_kernel,
    register_op,
)


def _fits(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


def _infer_loss_shape(
    X: VarInfo, Label: VarInfo, soft_label: bool, axis: int, x_slot: str
) -> tuple[int, ...]:
    """The loss shape (X's with the class dim 1); ShapeError/DTypeError if Label does not fit."""
    if X.ndim == 0:  # rank 0: a Net's variable whose shape is not known yet
        return X.shape
    if not -X.ndim <= axis < X.ndim:
        fail(f"{x_slot} {list(X.shape)} has no class axis {axis}")
    axis %= X.ndim
    loss_shape = X.shape[:axis] + (1,) + X.shape[axis + 1 :]
    if soft_label:
        if Label.dtype != X.dtype:
            raise DTypeError(
                f"a soft Label must have {x_slot}'s dtype {X.dtype}, got {Label.dtype}"
            )
        if not _fits(Label.shape, X.shape):
            fail(
                f"a soft Label must be shaped like {x_slot}: Label {list(Label.shape)} vs "
                f"{x_slot} {list(X.shape)}"
            )
        return loss_shape
    if Label.dtype != "int64":
        raise DTypeError(
            f"Label holds class ids and must be int64, got {Label.dtype} "
            f"(soft labels need soft_label=True)"
        )
    dropped = X.shape[:axis] + X.shape[axis + 1 :]
    if not (_fits(Label.shape, loss_shape) or _fits(Label.shape, dropped)):
        fail(
            f"Label {list(Label.shape)} does not fit {x_slot} {list(X.shape)}: class ids are "
            f"shaped {list(loss_shape)} (or {list(dropped)})"
        )
    return loss_shape


def _label_rows(label, x, axis: int, xp):
    """label with the class axis kept as size 1; ShapeError if it is not one id per row."""
    if label.ndim < x.ndim:
        label = xp.expand_dims(label, axis)
    if label.shape != x.shape[:axis] + (1,) + x.shape[axis + 1 :]:
        # Known dims are checked when the op is appended; -1 ones (a batch) only here.
        raise ShapeError(
            f"Label {list(label.shape)} does not fit the scores {list(x.shape)}: one class id "
            f"per row (the class dim {axis} of size 1, or dropped)"
        )
    return label


def _class_ids(label, x, axis: int, ignore_index: int, device):
    """(ids, ignored): label with the class axis kept as size 1 and ignored rows set to 0, and
    the mask of ignored rows (None when no row is ignored). Ids outside [0, C) are an
    ExecutionError: at once on the host; on a device (which would index them without failing:
    CuPy wraps them) after the run (DeviceContext.check), read as class 0 until then."""
    xp = device.xp
    label = _label_rows(label, x, axis, xp)
    classes = x.shape[axis]
    if label.size and not device.defers_checks:
        low, high = int(label.min()), int(label.max())
        if 0 <= low and high < classes and not low <= ignore_index <= high:
            return label, None  # the common case, checked with two reductions
    ignored = label == ignore_index
    bad = ~ignored & ((label < 0) | (label >= classes))
    device.check(bad.any(), lambda: _bad_ids(label, classes, ignore_index, xp))
    return xp.where(ignored | bad, 0, label), ignored


def _bad_ids(label, classes: int, ignore_index: int, xp) -> str:
    """The error for class ids outside [0, classes): the first one. (It looks at the label
    again, as the run's temporaries may be gone, or rewritten by a CUDA graph's replay.)"""
    bad = (label != ignore_index) & ((label < 0) | (label >= classes))
    at = tuple(xp.argwhere(bad)[0].tolist())
    return (
        f"Label holds {int(label[at])} at {list(at)}, outside the {classes} classes "
        f"[0, {classes}) (ignore_index={ignore_index})"
    )


def _pick(x, ids, axis: int, xp):
    """x's entries at class `ids` along `axis` (ids shaped like x with that axis 1)."""
    if x.ndim == 2 and axis == 1:
        return x[xp.arange(x.shape[0]), ids[:, 0]].reshape(-1, 1)
    return xp.take_along_axis(x, ids, axis=axis)


def _unless_ignored(values, ignored, xp):
    return values if ignored is None else xp.where(ignored, values.dtype.type(0), values)


@register_op
class cross_entropy:
    """Y = -log(X[label]) per row for probabilities X [..., C] and int64 labels [..., 1]
    (or [...]); with soft_label, Y = -sum(Label * log(X)) over the last axis. Y is [..., 1]."""

    inputs, outputs = ("X", "Label"), ("Y",)
    attrs = {"soft_label": False, "ignore_index": -100}
    no_grad_inputs = ("Label",)

    def infer(X, Label, soft_label, ignore_index):
        return VarInfo(_infer_loss_shape(X, Label, soft_label, -1, "X"), X.dtype)

    def forward(X, Label, soft_label, ignore_index, device):
        xp = device.xp
        with np.errstate(divide="ignore", invalid="ignore"):
            if soft_label:
                return -(Label * xp.log(X)).sum(axis=-1, keepdims=True)
            ids, ignored = _class_ids(Label, X, X.ndim - 1, ignore_index, device)
            return _unless_ignored(-xp.log(_pick(X, ids, X.ndim - 1, xp)), ignored, xp)

    def backward(X, Label, Y, Y_grad, soft_label, ignore_index, device):
        xp = device.xp
        if soft_label:
            return (-Y_grad * Label / X,)
        ids, ignored = _class_ids(Label, X, X.ndim - 1, ignore_index, device)
        picked = _pick(X, ids, X.ndim - 1, xp)
        dx = xp.zeros_like(X)
        with np.errstate(divide="ignore", invalid="ignore"):
            grad = _unless_ignored(-Y_grad / picked, ignored, xp)
            xp.put_along_axis(dx, ids, grad, axis=-1)
        return (dx,)

    double_grad = ("X", "Y@GRAD")

    def double_backward(X, Label, Y, Y_grad, dX, ddX, soft_label, ignore_index, device):
        # dX = Y_grad * q with q = d loss / dX (-1/X at the label, -Label/X when soft).
        xp = device.xp
        ones = xp.ones_like(Y_grad)
        q = cross_entropy.backward(X, Label, Y, ones, soft_label, ignore_index, device)[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            return -ddX * Y_grad * q / X, (ddX * q).sum(axis=-1, keepdims=True)


def _plus_softmax_grad(grad, softmax, softmax_grad, axis: int):
    """grad plus what flows back through the Softmax output (when something reads it)."""
    if softmax_grad is not None:
        inner = (softmax_grad * softmax).sum(axis=axis, keepdims=True)
        grad += softmax * (softmax_grad - inner)
    return grad


def _fused_rows(logits, label, soft_label: bool, axis: int) -> int | None:
    """The rows the fused CUDA kernels take (hard labels over the last axis of float32/64
    scores, one id per row, at least one class); None where the xp body runs instead (which
    also raises the shape errors)."""
    if soft_label or axis % logits.ndim != logits.ndim - 1 or logits.dtype.name not in FUSED:
        return None
    rows = logits.size // logits.shape[-1] if logits.shape[-1] else 0
    fits = label.shape in (logits.shape[:-1], logits.shape[:-1] + (1,))
    return rows if rows and fits and label.dtype.kind in "iu" else None


def _check_fused_ids(device, label, logits, bad, ignore_index: int) -> None:
    """The fused kernels' flag of ids outside [0, C), checked after the run."""
    classes, xp = logits.shape[-1], device.xp

    def message() -> str:
        return _bad_ids(_label_rows(label, logits, logits.ndim - 1, xp), classes, ignore_index, xp)

    device.check(bad, message)


# the dtypes the fused CUDA kernels are built for (others run the xp body)
FUSED = ("float32", "float64")

# softmax_with_cross_entropy's forward on the GPU: one block per row of C scores. A row's max
# and sum are tree reductions in shared memory; the loss is log(sum) - (x[id] - max), as the
# xp body computes it. A NaN score makes the row NaN (as NumPy's max does); an id outside
# [0, C) (and not ignore_index) sets *bad and gives loss 0.
_SWCE_FORWARD = r"""
extern "C" __global__ void swce_forward(
    const T* logits, const long long* label, T* softmax, T* loss, bool* bad,
    long long classes, long long ignore_index) {
  __shared__ T partial[256];
  const long long row = blockIdx.x;
  const T* x = logits + row * classes;
  T* s = softmax + row * classes;
  T top = x[0];  // any of the row's scores starts the max (NVRTC has no INFINITY)
  for (long long c = threadIdx.x; c < classes; c += blockDim.x) {
    T v = x[c];
    top = (v > top || isnan(v)) ? v : top;
  }
  partial[threadIdx.x] = top;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) {
      T other = partial[threadIdx.x + k];
      if (other > partial[threadIdx.x] || isnan(other)) partial[threadIdx.x] = other;
    }
    __syncthreads();
  }
  top = partial[0];
  __syncthreads();
  T total = 0;
  for (long long c = threadIdx.x; c < classes; c += blockDim.x) {
    T e = exp(x[c] - top);
    s[c] = e;
    total += e;
  }
  partial[threadIdx.x] = total;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) partial[threadIdx.x] += partial[threadIdx.x + k];
    __syncthreads();
  }
  total = partial[0];
  for (long long c = threadIdx.x; c < classes; c += blockDim.x) s[c] = s[c] / total;
  if (threadIdx.x == 0) {
    long long id = label[row];
    if (id == ignore_index) {
      loss[row] = 0;
    } else if (id < 0 || id >= classes) {
      loss[row] = 0;
      *bad = true;
    } else {
      loss[row] = log(total) - (x[id] - top);
    }
  }
}
"""


def _row_grain(logits) -> int:
    return thread_grain(len(logits), logits[:1].size, ROW_CHUNK_ELEMENTS)


def _rows_of(a, n: int, ndim: int, part: slice):
    """a's rows `part` where a has the logits' rows (its rank and leading size), else a whole
    (None, or broadcast along them)."""
    return a[part] if getattr(a, "ndim", 0) == ndim and a.shape[0] == n else a


def _softmax_cross_entropy(logits, label, soft_label, axis, ignore_index, device, out=None):
    """(softmax, loss) of softmax_with_cross_entropy, the softmax written into `out` if
    given; each row on its own (a slice of the rows gives those rows' bits)."""
    xp = device.xp
    shifted = logits - logits.max(axis=axis, keepdims=True)
    exp = xp.exp(shifted, out=out)
    total = exp.sum(axis=axis, keepdims=True)
    softmax = xp.divide(exp, total, out=exp)
    log_total = xp.log(total)
    if soft_label:
        loss = -(label * (shifted - log_total)).sum(axis=axis, keepdims=True)
    else:
        ids, ignored = _class_ids(label, logits, axis, ignore_index, device)
        loss = _unless_ignored(log_total - _pick(shifted, ids, axis, xp), ignored, xp)
    return softmax, loss


def _softmax_cross_entropy_grad(
    logits,
    label,
    softmax,
    softmax_grad,
    loss_grad,
    soft_label,
    axis,
    ignore_index,
    device,
    out=None,
):
    """The gradient of softmax_with_cross_entropy by its logits, written into `out` if given;
    each row on its own."""
    xp = device.xp
    if loss_grad is None:
        grad = xp.zeros_like(logits) if out is None else _filled(out, 0)
    elif soft_label:
        # Exact for any Label, not only distributions summing to 1.
        total = label.sum(axis=axis, keepdims=True)
        grad = xp.multiply(softmax, total, out=out)
        grad -= label
        grad *= loss_grad
    else:
        # (softmax - one_hot(label)) * dLoss, ignored rows zero.
        ids, ignored = _class_ids(label, logits, axis, ignore_index, device)
        grad = softmax.copy() if out is None else _filled(out, softmax)
        xp.put_along_axis(grad, ids, _pick(grad, ids, axis, xp) - 1, axis=axis)
        grad *= _unless_ignored(xp.broadcast_to(loss_grad, ids.shape), ignored, xp)
    return _plus_softmax_grad(grad, softmax, softmax_grad, axis)


def _filled(out, value):
    out[...] = value
    return out


# its gradient: (softmax - one_hot(label)) * dLoss per element, the ids checked on the way
_SWCE_GRAD = cuda_elementwise(
    "nestflow_swce_grad",
    "T softmax, raw int64 label, raw T loss_grad, int64 classes, int64 ignore_index",
    "T grad, raw bool bad",
    """
    long long row = i / classes;
    long long id = label[row];
    bool out_of_range = id != ignore_index && (id < 0 || id >= classes);
    if (out_of_range) bad[0] = true;
    T scale = (id == ignore_index || out_of_range) ? (T)0 : loss_grad[row];
    grad = (softmax - (i % classes == id ? (T)1 : (T)0)) * scale;
    """,
)


@register_op
class softmax_with_cross_entropy:
    """Softmax = softmax(Logits, axis); Loss = cross entropy of Softmax against Label, computed
    from log-softmax so large logits neither overflow nor lose precision. Loss is Logits' shape
    with the class axis 1. Gradients flow to Logits from both outputs; Label gets none."""

    inputs, outputs = ("Logits", "Label"), ("Softmax", "Loss")
    grad_no_need_buffer = ("Loss",)
    attrs = {"soft_label": False, "axis": -1, "ignore_index": -100}
    no_grad_inputs = ("Label",)

    def infer(Logits, Label, soft_label, axis, ignore_index):
        loss_shape = _infer_loss_shape(Logits, Label, soft_label, axis, "Logits")
        return VarInfo(Logits.shape, Logits.dtype), VarInfo(loss_shape, Logits.dtype)

    def forward(Logits, Label, soft_label, axis, ignore_index, device):
        axis %= Logits.ndim
        if not (device.xp is np and rows_apart(Logits, axis)):
            return _softmax_cross_entropy(Logits, Label, soft_label, axis, ignore_index, device)
        if not soft_label:  # a bad id is reported at its place in the whole Label
            _class_ids(Label, Logits, axis, ignore_index, device)
        softmax = np.empty_like(Logits)
        loss = np.empty(Logits.shape[:axis] + (1,) + Logits.shape[axis + 1 :], Logits.dtype)

        def rows(start: int, stop: int) -> None:
            part = slice(start, stop)
            loss[part] = _softmax_cross_entropy(
                Logits[part], Label[part], soft_label, axis, ignore_index, device, softmax[part]
            )[1]

        device.parallel_for(len(Logits), rows, _row_grain(Logits))
        return softmax, loss

    def forward_cuda(Logits, Label, soft_label, axis, ignore_index, device):
        # one block per row: max, exp, sum, softmax and the loss in one launch
        rows = _fused_rows(Logits, Label, soft_label, axis)
        if rows is None:
            return NotImplemented
        xp, classes = device.xp, Logits.shape[-1]
        logits = xp.ascontiguousarray(Logits)
        label = xp.ascontiguousarray(Label, dtype=xp.int64)
        softmax = xp.empty_like(logits)
        loss = xp.empty(Logits.shape[:-1] + (1,), Logits.dtype)
        bad = xp.zeros((), xp.bool_)
        threads = min(256, max(32, 1 << (classes - 1).bit_length()))
        kernel = device.raw_kernel(_SWCE_FORWARD, "swce_forward", Logits.dtype)
        args = (logits, label, softmax, loss, bad, np.int64(classes), np.int64(ignore_index))
        kernel((rows,), (threads,), args)
        _check_fused_ids(device, Label, Logits, bad, ignore_index)
        return softmax, loss

    def backward(
        Logits,
        Label,
        Softmax,
        Loss,
        Softmax_grad,
        Loss_grad,
        soft_label,
        axis,
        ignore_index,
        device,
    ):
        axis %= Logits.ndim
        args = (soft_label, axis, ignore_index, device)
        if not (device.xp is np and rows_apart(Logits, axis)):
            return (
                _softmax_cross_entropy_grad(Logits, Label, Softmax, Softmax_grad, Loss_grad, *args),
            )
        if not soft_label and Loss_grad is not None:
            _class_ids(Label, Logits, axis, ignore_index, device)
        grad, n = np.empty_like(Softmax), len(Logits)

        def rows(start: int, stop: int) -> None:
            part = slice(start, stop)
            sliced = [_rows_of(a, n, Logits.ndim, part) for a in (Softmax_grad, Loss_grad)]
            _softmax_cross_entropy_grad(
                Logits[part], Label[part], Softmax[part], *sliced, *args, out=grad[part]
            )

        device.parallel_for(n, rows, _row_grain(Logits))
        return (grad,)

    def backward_cuda(
        Logits,
        Label,
        Softmax,
        Loss,
        Softmax_grad,
        Loss_grad,
        soft_label,
        axis,
        ignore_index,
        device,
    ):
        # (softmax - one_hot(label)) * dLoss in one elementwise launch, ids checked in it
        if Loss_grad is None or _fused_rows(Logits, Label, soft_label, axis) is None:
            return NotImplemented
        xp, classes = device.xp, Logits.shape[-1]
        grad = xp.empty_like(Softmax)
        bad = xp.zeros((), xp.bool_)
        kernel = fused_kernel(device, _SWCE_GRAD)
        label = xp.ascontiguousarray(Label, dtype=xp.int64)
        loss_grad = xp.ascontiguousarray(xp.broadcast_to(Loss_grad, Logits.shape[:-1] + (1,)))
        kernel(Softmax, label, loss_grad, np.int64(classes), np.int64(ignore_index), grad, bad)
        _check_fused_ids(device, Label, Logits, bad, ignore_index)
        return (_plus_softmax_grad(grad, Softmax, Softmax_grad, -1),)

    double_grad = ("Softmax", "Softmax@GRAD", "Loss@GRAD")

    def double_backward(
        Logits,
        Label,
        Softmax,
        Loss,
        Softmax_grad,
        Loss_grad,
        dLogits,
        ddLogits,
        soft_label,
        axis,
        ignore_index,
        device,
        needs=(True,) * 3,
    ):
        xp = device.xp

        def grad(softmax, loss_grad):
            args = (Logits, Label, softmax, Loss, None, loss_grad, soft_label, axis, ignore_index)
            return softmax_with_cross_entropy.backward(*args, device)[0]

        g, ax = ddLogits, axis % Logits.ndim
        d_softmax = d_softmax_grad = d_loss_grad = None
        if needs[0]:
            # The loss part is affine in Softmax: its derivative along g is a difference.
            if Loss_grad is not None:
                d_softmax = grad(g, Loss_grad) - grad(xp.zeros_like(g), Loss_grad)
            else:
                d_softmax = xp.zeros_like(g)
            if Softmax_grad is not None:
                s = (Softmax_grad * Softmax).sum(axis=ax, keepdims=True)
                t = (g * Softmax).sum(axis=ax, keepdims=True)
                d_softmax = d_softmax + g * (Softmax_grad - s) - Softmax_grad * t
        if needs[1] and Softmax_grad is not None:
            d_softmax_grad = Softmax * (g - (g * Softmax).sum(axis=ax, keepdims=True))
        if needs[2] and Loss_grad is not None:
            d_loss_grad = (g * grad(Softmax, xp.ones_like(Loss_grad))).sum(axis=ax, keepdims=True)
        return d_softmax, d_softmax_grad, d_loss_grad


@register_op
class accuracy:
    """Accuracy (float32, 0-d) = the fraction of rows of X [N, C] whose int64 Label [N, 1]
    (or [N]) is among the row's k highest scores (ties go to the lower class id). An empty
    batch gives NaN, like the mean of nothing."""

    inputs, outputs = ("X", "Label"), ("Accuracy",)
    attrs = {"k": 1}

    def infer(X, Label, k):
        if k < 1:
            raise AttrError(f"k must be at least 1, got {k}")
        if X.ndim not in (0, 2):
            fail(f"X must be scores [N, C], got {list(X.shape)}")
        _infer_loss_shape(X, Label, False, -1, "X")
        return VarInfo((), "float32")

    def forward(X, Label, k, xp):
        top = xp.argsort(-X, axis=1, kind="stable")[:, :k]
        hits = (top == Label.reshape(-1, 1)).any(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return xp.asarray(hits.sum().astype(np.float32) / np.float32(len(hits)))


# ---- regression and binary losses (Fluid 1.8 ops); labels, targets and weights get no
# gradient, as in Fluid ----


def _same_shape(a: VarInfo, b: VarInfo, a_slot: str, b_slot: str) -> None:
    """DTypeError/ShapeError unless `b` has `a`'s float dtype and shape (-1 fits any dim)."""
    if not is_floating(a.dtype):
        raise DTypeError(f"{a_slot} must be floating point, got {a.dtype}; cast it first")
    if b.dtype != a.dtype:
        raise DTypeError(f"{b_slot} is {b.dtype} but {a_slot} is {a.dtype}; cast one of them")
    if not _fits(a.shape, b.shape):
        fail(f"{b_slot} {list(b.shape)} must be shaped like {a_slot} {list(a.shape)}")


@register_op
class sigmoid_cross_entropy_with_logits:
    """Out = max(X, 0) - X * Label + log(1 + exp(-|X|)) per element: the cross entropy of
    sigmoid(X) against probabilities Label (X's shape and dtype), without overflow. Elements
    whose Label truncates to ignore_index give 0 loss and 0 gradient; with normalize, Out is
    divided by the number of elements not ignored (at least 1). dX = sigmoid(X) - Label."""

    inputs, outputs = ("X", "Label"), ("Out",)
    attrs = {"ignore_index": -100, "normalize": False}
    no_grad_inputs = ("Label",)

    def infer(X, Label, ignore_index, normalize):
        _same_shape(X, Label, "X", "Label")
        return X

    def forward(X, Label, ignore_index, normalize, xp):
        loss = xp.maximum(X, 0) - X * Label + xp.log1p(xp.exp(-xp.absolute(X)))
        return _ignored_and_normalized(loss, Label, ignore_index, normalize, xp)

    def backward(X, Label, Out, Out_grad, ignore_index, normalize, xp):
        sigmoid = (xp.tanh(X * 0.5) + 1) * xp.asarray(0.5, X.dtype)
        grad = (sigmoid - Label) * Out_grad
        return (_ignored_and_normalized(grad, Label, ignore_index, normalize, xp),)


def _ignored_and_normalized(values, label, ignore_index: int, normalize: bool, xp):
    """`values` zero where trunc(label) == ignore_index, divided by the count of the others
    (at least 1) when `normalize` (Fluid's kernel: the label cast to int)."""
    ignored = xp.trunc(label) == ignore_index
    values = xp.where(ignored, values.dtype.type(0), values)
    if normalize:
        kept = xp.maximum(ignored.size - ignored.sum(), 1)  # on the device: no host read
        values = values / kept.astype(values.dtype)
    return xp.asarray(values)


@register_op
class huber_loss:
    """Residual = Y - X; Out = 0.5 * Residual^2 where |Residual| <= delta, else
    delta * (|Residual| - 0.5 * delta). X and Y have one shape; so have Residual and Out."""

    inputs, outputs = ("X", "Y"), ("Residual", "Out")
    attrs = {"delta": Required(float)}

    def infer(X, Y, delta):
        _same_shape(X, Y, "X", "Y")
        if delta < 0:
            raise AttrError(f"delta must be >= 0, got {delta}")
        return X, X

    def forward(X, Y, delta, xp):
        residual = Y - X
        size = xp.absolute(residual)
        quadratic = 0.5 * residual * residual
        linear = delta * (size - 0.5 * delta)
        return residual, xp.asarray(xp.where(size <= delta, quadratic, linear), X.dtype)

    def backward(X, Y, Residual, Out, Residual_grad, Out_grad, delta, xp):
        grad = xp.zeros_like(Residual) if Residual_grad is None else Residual_grad.copy()
        if Out_grad is not None:
            slope = xp.where(xp.absolute(Residual) <= delta, Residual, delta * xp.sign(Residual))
            grad += slope * Out_grad
        return -grad, grad


@register_op
class smooth_l1_loss:
    """Diff = (X - Y) * InsideWeight; per element e = 0.5 * (sigma * Diff)^2 where
    |Diff| < 1 / sigma^2, else |Diff| - 0.5 / sigma^2; Out [N, 1] = the sum over each row of
    e * OutsideWeight. X, Y and the weights (both or neither) are [N, ...] of one shape."""

    inputs, outputs = ("X", "Y", "InsideWeight?", "OutsideWeight?"), ("Diff", "Out")
    attrs = {"sigma": 1.0}
    no_grad_inputs = ("InsideWeight", "OutsideWeight")

    def infer(X, Y, InsideWeight, OutsideWeight, sigma):
        _same_shape(X, Y, "X", "Y")
        if X.ndim < 2:
            fail(f"X must be [N, ...] of rank >= 2, got {list(X.shape)}")
        if (InsideWeight is None) != (OutsideWeight is None):
            raise AttrError("InsideWeight and OutsideWeight must be given together")
        if InsideWeight is not None:
            _same_shape(X, InsideWeight, "X", "InsideWeight")
            _same_shape(X, OutsideWeight, "X", "OutsideWeight")
        return X, VarInfo((X.shape[0], 1), X.dtype)

    def forward(X, Y, InsideWeight, OutsideWeight, sigma, xp):
        diff = X - Y if InsideWeight is None else (X - Y) * InsideWeight
        s2 = sigma * sigma
        size = xp.absolute(diff)
        errors = xp.where(size < 1.0 / s2, 0.5 * s2 * diff * diff, size - 0.5 / s2)
        if OutsideWeight is not None:
            errors = errors * OutsideWeight
        rows = errors.reshape(X.shape[0], -1) if X.size else errors.reshape(X.shape[0], 0)
        return diff, xp.asarray(rows.sum(axis=1, keepdims=True), X.dtype)

    def backward(X, Y, InsideWeight, OutsideWeight, Diff, Out, Diff_grad, Out_grad, sigma, xp):
        grad = xp.zeros_like(Diff) if Diff_grad is None else Diff_grad.copy()
        if Out_grad is not None:
            s2 = sigma * sigma
            slope = xp.where(xp.absolute(Diff) < 1.0 / s2, s2 * Diff, xp.sign(Diff))
            if OutsideWeight is not None:
                slope = slope * OutsideWeight
            grad += slope * Out_grad.reshape((X.shape[0],) + (1,) * (X.ndim - 1))
        if InsideWeight is not None:
            grad = grad * InsideWeight
        return grad, -grad


@register_op
class log_loss:
    """Loss = -Labels * log(Predicted + epsilon) - (1 - Labels) * log(1 - Predicted + epsilon)
    per element, for probabilities Predicted and Labels of one shape ([N, 1] in Fluid)."""

    inputs, outputs = ("Predicted", "Labels"), ("Loss",)
    attrs = {"epsilon": 1e-4}
    no_grad_inputs = ("Labels",)

    def infer(Predicted, Labels, epsilon):
        _same_shape(Predicted, Labels, "Predicted", "Labels")
        return Predicted

    def forward(Predicted, Labels, epsilon, xp):
        p, y = Predicted, Labels
        return xp.asarray(-y * xp.log(p + epsilon) - (1 - y) * xp.log(1 - p + epsilon), p.dtype)

    def backward(Predicted, Labels, Loss, Loss_grad, epsilon, xp):
        p, y = Predicted, Labels
        slope = -y / (p + epsilon) + (1 - y) / (1 - p + epsilon)
        return (xp.asarray(Loss_grad * slope, p.dtype),)


_KLDIV_REDUCTIONS = ("none", "batchmean", "mean", "sum")


@register_op
class kldiv_loss:
    """Loss = Target * (log(Target) - X) per element (0 where Target <= 0), X holding
    log-probabilities, reduced by `reduction`: "none" (X's shape), "sum", "mean" (over every
    element) or "batchmean" (the sum over the first dim's size); reduced losses are 0-d."""

    inputs, outputs = ("X", "Target"), ("Loss",)
    attrs = {"reduction": "mean"}
    no_grad_inputs = ("Target",)

    def infer(X, Target, reduction):
        if reduction not in _KLDIV_REDUCTIONS:
            raise AttrError(
                f"reduction must be one of {list(_KLDIV_REDUCTIONS)}, got {reduction!r}"
            )
        _same_shape(X, Target, "X", "Target")
        if reduction == "batchmean" and X.ndim == 0:
            fail("batchmean needs X of rank >= 1 (its first dim is the batch)")
        return X if reduction == "none" else VarInfo((), X.dtype)

    def forward(X, Target, reduction, xp):
        positive = Target > 0
        safe_log = xp.log(xp.where(positive, Target, 1))
        pointwise = xp.where(positive, Target * (safe_log - X), 0).astype(X.dtype)
        if reduction == "none":
            return pointwise
        total = pointwise.sum(dtype=X.dtype)
        with np.errstate(invalid="ignore", divide="ignore"):
            return xp.asarray(total / _kldiv_count(X, reduction), X.dtype)

    def backward(X, Target, Loss, Loss_grad, reduction, xp):
        grad = xp.where(Target > 0, -Target, 0) * Loss_grad
        with np.errstate(invalid="ignore", divide="ignore"):
            return (xp.asarray(grad / _kldiv_count(X, reduction), X.dtype),)


def _kldiv_count(X: np.ndarray, reduction: str) -> float:
    """What the summed loss is divided by."""
    if reduction == "mean":
        return float(X.size)
    if reduction == "batchmean":
        return float(X.shape[0])
    return 1.0
