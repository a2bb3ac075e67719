"""Optimizer update ops: sgd, momentum (optionally Nesterov), adam, adagrad, rmsprop, adadelta,
adamax, adamw, lamb.

Each computes the new parameter (and new optimizer state) from the old ones and returns them;
kernels never write into their inputs. The program names the parameter itself as ParamOut
(and each state variable as its own ...Out), and since the executor stores persistables back
only after a whole run succeeded, a failed step leaves parameters and state as they were.
LearningRate is a variable of one element ([1] or 0-d) so it can be changed between steps.
The formulas are torch.optim's (SGD with momentum/dampening 0, Adam without amsgrad, ...);
slot and attr names are Fluid 1.x's. Where Fluid's rule differs (rmsprop's epsilon, adamax's
epsilon, adadelta's learning rate) the op's docstring says how; lamb follows the paper.

A Grad may be a SelectedRows (a sparse gradient, `embedding(is_sparse=True)`), taken as Fluid
takes it. sgd, adagrad and adam with `lazy_mode` update only the rows it holds, and they write
those rows of Param (and of their state) in place, as Fluid's sparse kernels do: a copy of a
100,000-row table per step would cost more than the update itself (so a later op of the same
run that fails leaves these rows updated). For sgd and adagrad that is the dense update
exactly (the other rows' update is zero); adam with `lazy_mode` leaves the moments of absent
rows as they were (torch's SparseAdam). momentum, adam without `lazy_mode` and the others
update every row, with the rows scattered into a dense gradient first.
"""

from __future__ import annotations

import math

import numpy as np

from nestflow.core.device_context import ROW_CHUNK_ELEMENTS, device_context, thread_grain
from nestflow.core.dtype import is_floating
from nestflow.core.place import place_of
from nestflow.core.selected_rows import SelectedRows
from nestflow.errors import DTypeError
from nestflow.ops.registry import VarInfo, cuda_elementwise, fail, fused_kernel, register_op


def _check_update(Param: VarInfo, Grad: VarInfo, LearningRate: VarInfo, **state: VarInfo) -> None:
    if not is_floating(Param.dtype):
        raise DTypeError(f"Param must be floating point, got {Param.dtype}")
    for name, info in {"Grad": Grad, **state}.items():
        if info.dtype != Param.dtype:
            raise DTypeError(f"{name} is {info.dtype} but Param is {Param.dtype}")
        same = len(info.shape) == len(Param.shape) and all(
            a == b or -1 in (a, b) for a, b in zip(info.shape, Param.shape)
        )
        if not same:
            fail(f"{name} {list(info.shape)} must have Param's shape {list(Param.shape)}")
    if all(d >= 0 for d in LearningRate.shape) and math.prod(LearningRate.shape) != 1:
        fail(f"LearningRate must hold one value ([1] or 0-d), got {list(LearningRate.shape)}")


def _dense(Grad):
    """A SelectedRows gradient as the dense one it stands for (rows scattered in the order a
    dense lookup_table gradient adds them, so the update is the dense one bit for bit)."""
    return Grad.to_dense() if isinstance(Grad, SelectedRows) else Grad


def _rows_in_place(array, xp):
    """`array` itself when a sparse update may write its rows, else a copy (a read-only array:
    a memory-mapped or broadcast one). On a device, the checks left for the end of the run (a
    bad embedding id: DeviceContext.check) are read first, so a run they fail writes no row
    (one wait for the device per sparse update, and no CUDA-graph capture of the block)."""
    if xp is np:
        return array if array.flags.writeable else array.copy()
    device_context(place_of(array)).raise_failed_checks()
    return array


def _scalar(value, dtype, xp) -> np.ndarray:
    """A number or one-element array as a 0-d array of `dtype` on the place (so a 0-d Param
    stays 0-d)."""
    if xp is not np and isinstance(value, (int, float, np.generic)):
        # a kernel argument on a device (a Python number, rounded to the dtype: it takes the
        # array's dtype), not an array copied over (a synchronous copy there)
        return np.dtype(dtype).type(value).item()
    return xp.asarray(value, dtype=dtype).reshape(())


# The fused CUDA kernels (`forward_cuda`, defined by registry.cuda_elementwise): each
# computes its op's update in one launch, in the xp body's order of operations; T is Param's
# dtype, L LearningRate's and B the beta powers'. The one-element inputs are read in the kernel
# (`raw`, element 0), never on the host, and the bias corrections are taken in double, as the
# body takes them in float64.

_FLOATS = ("float32", "float64")


def _fusable(Param, *state) -> bool:
    """Whether the fused kernels take this update: a non-empty float32/float64 Param and dense
    state (Grad, moments) of its dtype and shape (a SelectedRows Grad keeps the xp body)."""
    if Param.dtype.name not in _FLOATS or Param.size == 0:
        return False
    return all(
        not isinstance(a, SelectedRows) and a.dtype == Param.dtype and a.shape == Param.shape
        for a in state
    )


def _one_float(*arrays) -> bool:
    """Whether these (LearningRate, beta powers) are one-element float32/float64 arrays."""
    return all(a.dtype.name in _FLOATS and a.size == 1 for a in arrays)


def _splits(xp, Param, *state) -> bool:
    """Whether a dense update runs over chunks of its values on the CPU's intra-op pool:
    C-contiguous host arrays (`state`: Grad and the moments) of Param's shape, at least two
    chunks' worth (flattening any other would copy it)."""
    return (
        xp is np
        and Param.size >= 2 * ROW_CHUNK_ELEMENTS
        and all(
            type(a) is np.ndarray and a.shape == Param.shape and a.flags.c_contiguous
            for a in (Param, *state)
        )
    )


def _in_chunks(forward, full: dict, outs: int, out=None, **rest):
    """forward(**full, **rest) over flat chunks of the Param-shaped arrays `full` on the
    CPU's intra-op pool, each chunk's working arrays in cache: its first `outs` results put
    together (ParamOut into `out`, the buffer the executor lends, where it fits; None where
    the update gives None), the rest (the beta powers) from the first chunk. Every value is
    updated on its own, so the bits do not depend on the split."""
    param = full["Param"]
    flat = {name: a.reshape(-1) for name, a in full.items()}
    results = [np.empty(param.size, param.dtype) for _ in range(outs)]
    if (
        out is not None
        and out.shape == param.shape
        and out.dtype == param.dtype
        and out.flags.c_contiguous
    ):
        results[0] = out.reshape(-1)

    def part(start: int, stop: int) -> tuple:
        got = forward(**{name: a[start:stop] for name, a in flat.items()}, **rest)
        got = got if isinstance(got, tuple) else (got,)
        for into, value in zip(results, got[:outs]):
            if value is not None:
                into[start:stop] = value
        return got

    n = param.size
    first = device_context().parallel_for(n, part, thread_grain(n, 1, ROW_CHUNK_ELEMENTS))[0]
    joined = tuple(
        None if value is None else into.reshape(param.shape)
        for into, value in zip(results, first[:outs])
    )
    return joined + first[outs:] if len(first) > 1 else joined[0]


_SGD = cuda_elementwise(
    "nestflow_sgd",
    "T param, T grad, raw L lr",
    "T param_out",
    "param_out = param - grad * (T)lr[0];",
)


@register_op
class sgd:
    """ParamOut = Param - lr * Grad."""

    inputs, outputs = ("Param", "Grad", "LearningRate"), ("ParamOut",)
    inplace = {"ParamOut": "Grad"}

    def infer(Param, Grad, LearningRate):
        _check_update(Param, Grad, LearningRate)
        return Param

    def forward(Param, Grad, LearningRate, xp, out=None):
        lr = _scalar(LearningRate, Param.dtype, xp)
        if isinstance(Grad, SelectedRows):
            grad = Grad.merged()
            param = _rows_in_place(Param, xp)
            rows = grad.rows
            param[rows] = param[rows] - lr * grad.values.astype(Param.dtype, copy=False)
            return param
        if not Param.ndim:
            return xp.asarray(Param - lr * Grad)
        if _splits(xp, Param, Grad):
            full = {"Param": Param, "Grad": Grad}
            return _in_chunks(sgd.forward, full, 1, out, LearningRate=LearningRate, xp=xp)
        # One new array at most (none when the executor lends Grad's buffer as `out`).
        step = xp.multiply(Grad, lr, out=out)
        return xp.subtract(Param, step, out=step)

    def forward_cuda(Param, Grad, LearningRate, device, out=None):
        if not (_fusable(Param, Grad) and _one_float(LearningRate)):
            return NotImplemented
        return fused_kernel(device, _SGD)(Param, Grad, LearningRate)


_MOMENTUM = """
T m = (T)mu;
T v = velocity * m + grad;
velocity_out = v;
"""
_MOMENTUM_KERNELS = {
    False: cuda_elementwise(
        "nestflow_momentum",
        "T param, T grad, T velocity, raw L lr, float64 mu",
        "T param_out, T velocity_out",
        _MOMENTUM + "param_out = param - v * (T)lr[0];",
    ),
    True: cuda_elementwise(
        "nestflow_momentum_nesterov",
        "T param, T grad, T velocity, raw L lr, float64 mu",
        "T param_out, T velocity_out",
        _MOMENTUM + "param_out = param - (v * m + grad) * (T)lr[0];",
    ),
}


@register_op
class momentum:
    """VelocityOut = mu * Velocity + Grad; ParamOut = Param - lr * (Grad + mu * VelocityOut)
    with use_nesterov, else Param - lr * VelocityOut (torch.optim.SGD, dampening 0)."""

    inputs = ("Param", "Grad", "Velocity", "LearningRate")
    outputs = ("ParamOut", "VelocityOut")
    attrs = {"mu": 0.9, "use_nesterov": False}
    inplace = {"ParamOut": "Grad"}

    def infer(Param, Grad, Velocity, LearningRate, mu, use_nesterov):
        _check_update(Param, Grad, LearningRate, Velocity=Velocity)
        return Param, Param

    def forward(Param, Grad, Velocity, LearningRate, mu, use_nesterov, xp, out=None):
        dtype = Param.dtype
        lr, mu = _scalar(LearningRate, dtype, xp), _scalar(mu, dtype, xp)
        Grad = _dense(Grad)  # Fluid's sparse momentum also decays every row's velocity
        if not Param.ndim:
            velocity = xp.asarray(mu * Velocity + Grad)
            step = Grad + mu * velocity if use_nesterov else velocity
            return xp.asarray(Param - lr * step), velocity
        if _splits(xp, Param, Grad, Velocity):
            full = {"Param": Param, "Grad": Grad, "Velocity": Velocity}
            rest = {"LearningRate": LearningRate, "mu": mu, "use_nesterov": use_nesterov}
            return _in_chunks(momentum.forward, full, 2, out, **rest, xp=xp)
        velocity = xp.multiply(Velocity, mu)
        velocity += Grad
        if use_nesterov:
            step = xp.multiply(velocity, mu)
            step += Grad
            step *= lr
        else:
            step = xp.multiply(velocity, lr, out=out)
        return xp.subtract(Param, step, out=step), velocity

    def forward_cuda(Param, Grad, Velocity, LearningRate, mu, use_nesterov, device, out=None):
        if not (_fusable(Param, Grad, Velocity) and _one_float(LearningRate)):
            return NotImplemented
        kernel = fused_kernel(device, _MOMENTUM_KERNELS[bool(use_nesterov)])
        return kernel(Param, Grad, Velocity, LearningRate, np.float64(mu))


# adam and adamw (AdamW's `param`: Param * (1 - lr * coeff), the decay taken first). The beta
# powers' outputs are written by element 0's thread, so the whole update is one launch.
_ADAM = """
double correction1 = 1.0 - (double)beta1_pow[0];
double correction2 = 1.0 - (double)beta2_pow[0];
T step = (T)((double)lr[0] / correction1);
T p = {param};
T m = moment1 * (T)beta1 + grad * (T)(1.0 - beta1);
T v = moment2 * (T)beta2 + grad * grad * (T)(1.0 - beta2);
T denom = sqrt(v) / (T)sqrt(correction2) + (T)epsilon;
moment1_out = m;
moment2_out = v;
param_out = p - m / denom * step;
if (i == 0) {{
  beta1_pow_out[0] = beta1_pow[0] * (B)beta1;
  beta2_pow_out[0] = beta2_pow[0] * (B)beta2;
}}
"""
_ADAM_IN = (
    "T param, T grad, raw L lr, T moment1, T moment2, raw B beta1_pow, raw B beta2_pow, "
    "float64 beta1, float64 beta2, float64 epsilon"
)
_ADAM_OUT = "T param_out, T moment1_out, T moment2_out, raw B beta1_pow_out, raw B beta2_pow_out"
_ADAM_KERNEL = cuda_elementwise("nestflow_adam", _ADAM_IN, _ADAM_OUT, _ADAM.format(param="param"))
_ADAMW_KERNEL = cuda_elementwise(
    "nestflow_adamw",
    _ADAM_IN + ", float64 coeff",
    _ADAM_OUT,
    _ADAM.format(param="param * (T)(1.0 - (double)lr[0] * coeff)"),
)


def _adam_fusable(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow) -> bool:
    """Whether the Adam-family kernels (adam, adamw, lamb) take these inputs."""
    return (
        _fusable(Param, Grad, Moment1, Moment2)
        and _one_float(LearningRate, Beta1Pow, Beta2Pow)
        and Beta1Pow.dtype == Beta2Pow.dtype
    )


def _adam_cuda(
    name, Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, device, *attrs
):
    """adam's or adamw's fused update, NotImplemented where the kernel does not cover it."""
    if not _adam_fusable(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow):
        return NotImplemented
    xp = device.xp
    # Raw outputs (the beta powers) take no shape from the loop: every output is passed in.
    outs = (
        xp.empty_like(Param),
        xp.empty_like(Moment1),
        xp.empty_like(Moment2),
        xp.empty_like(Beta1Pow),
        xp.empty_like(Beta2Pow),
    )
    scalars = tuple(np.float64(a) for a in attrs)
    args = (Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow)
    return fused_kernel(device, name)(*args, *scalars, *outs)


@register_op
class adam:
    """Moment1Out = b1*m + (1-b1)*g; Moment2Out = b2*v + (1-b2)*g^2; with Beta1Pow = b1^t,
    ParamOut = Param - lr/(1-b1^t) * m' / (sqrt(v')/sqrt(1-b2^t) + epsilon) (torch.optim.Adam).
    Beta1Pow/Beta2Pow start at beta1/beta2 and are multiplied by them each step.

    `lazy_mode` (Fluid's) matters for a SelectedRows Grad only: the rows it holds are updated
    and the other rows' parameters and moments stay as they are (torch's SparseAdam); without
    it every row is updated as with the dense gradient."""

    inputs = ("Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow")
    outputs = ("ParamOut", "Moment1Out", "Moment2Out", "Beta1PowOut", "Beta2PowOut")
    attrs = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "lazy_mode": False}
    inplace = {"ParamOut": "Grad"}

    def infer(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, **_attrs):
        _check_update(Param, Grad, LearningRate, Moment1=Moment1, Moment2=Moment2)
        for name, info in (("Beta1Pow", Beta1Pow), ("Beta2Pow", Beta2Pow)):
            if all(d >= 0 for d in info.shape) and math.prod(info.shape) != 1:
                fail(f"{name} must hold one value ([1] or 0-d), got {list(info.shape)}")
        return Param, Moment1, Moment2, Beta1Pow, Beta2Pow

    def forward(
        Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, xp, out=None, **attrs
    ):
        lazy = attrs.pop("lazy_mode", False)
        if isinstance(Grad, SelectedRows):
            if lazy and Param.ndim:
                return _lazy_adam(
                    Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, xp, **attrs
                )
            Grad = _dense(Grad)
        if not Param.ndim:  # ufuncs give 0-d inputs back as scalars, which take no out=
            flat = [a.reshape(1) for a in (Param, Grad)]
            moments = [a.reshape(1) for a in (Moment1, Moment2)]
            new = adam.forward(*flat, LearningRate, *moments, Beta1Pow, Beta2Pow, xp, **attrs)
            return (*(a.reshape(()) for a in new[:3]), *new[3:])
        if _splits(xp, Param, Grad, Moment1, Moment2):
            full = {"Param": Param, "Grad": Grad, "Moment1": Moment1, "Moment2": Moment2}
            powers = {"Beta1Pow": Beta1Pow, "Beta2Pow": Beta2Pow}
            rest = {"LearningRate": LearningRate, **powers, **attrs}
            return _in_chunks(adam.forward, full, 3, out, **rest, xp=xp)
        beta1, beta2, epsilon = attrs["beta1"], attrs["beta2"], attrs["epsilon"]
        dtype = Param.dtype
        # Bias corrections in float64 (like torch's Python floats), applied in Param's dtype.
        correction1 = 1.0 - _value(Beta1Pow, xp)
        correction2 = 1.0 - _value(Beta2Pow, xp)
        step = _scalar(_value(LearningRate, xp) / correction1, dtype, xp)
        b1, b2 = _scalar(beta1, dtype, xp), _scalar(beta2, dtype, xp)
        # torch.optim.Adam's order of operations, with one scratch array (Grad's buffer when
        # the executor lends it) instead of a temporary per operation.
        m = xp.multiply(Moment1, b1)
        scratch = xp.multiply(Grad, _scalar(1.0 - beta1, dtype, xp))
        m += scratch
        v = xp.multiply(Moment2, b2)
        xp.multiply(Grad, Grad, out=scratch)
        scratch *= _scalar(1.0 - beta2, dtype, xp)
        v += scratch
        if out is not None:
            scratch = out
        denom = xp.sqrt(v, out=scratch)
        denom /= _scalar(xp.sqrt(correction2), dtype, xp)
        denom += _scalar(epsilon, dtype, xp)
        update = xp.divide(m, denom, out=denom)
        update *= step
        param = xp.subtract(Param, update, out=update)
        return (
            xp.asarray(param, dtype),
            xp.asarray(m, dtype),
            xp.asarray(v, dtype),
            xp.asarray(Beta1Pow * beta1, Beta1Pow.dtype),
            xp.asarray(Beta2Pow * beta2, Beta2Pow.dtype),
        )

    def forward_cuda(
        Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, device, out=None, **attrs
    ):
        # lazy_mode matters for a SelectedRows Grad alone, which the kernel leaves to the body
        args = (Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, device)
        return _adam_cuda(_ADAM_KERNEL, *args, attrs["beta1"], attrs["beta2"], attrs["epsilon"])


def _lazy_adam(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, xp, **attrs):
    """adam on the rows of the SelectedRows `Grad` only, written in place; each row's
    arithmetic is the dense kernel's, in its order."""
    beta1, beta2, epsilon = attrs["beta1"], attrs["beta2"], attrs["epsilon"]
    dtype = Param.dtype
    grad = Grad.merged()
    rows, g = grad.rows, grad.values.astype(dtype, copy=False)
    correction1 = 1.0 - _value(Beta1Pow, xp)
    correction2 = 1.0 - _value(Beta2Pow, xp)
    step = _scalar(_value(LearningRate, xp) / correction1, dtype, xp)
    # take: a row gather several times faster than fancy indexing on NumPy
    m = xp.take(Moment1, rows, axis=0) * _scalar(beta1, dtype, xp)
    m += g * _scalar(1.0 - beta1, dtype, xp)
    v = xp.take(Moment2, rows, axis=0) * _scalar(beta2, dtype, xp)
    scratch = g * g
    scratch *= _scalar(1.0 - beta2, dtype, xp)
    v += scratch
    denom = xp.sqrt(v)
    denom /= _scalar(xp.sqrt(correction2), dtype, xp)
    denom += _scalar(epsilon, dtype, xp)
    update = xp.divide(m, denom, out=denom)
    update *= step
    param = _rows_in_place(Param, xp)
    moment1, moment2 = _rows_in_place(Moment1, xp), _rows_in_place(Moment2, xp)
    param[rows] = xp.take(param, rows, axis=0) - update
    moment1[rows] = m
    moment2[rows] = v
    return (
        param,
        moment1,
        moment2,
        xp.asarray(Beta1Pow * beta1, Beta1Pow.dtype),
        xp.asarray(Beta2Pow * beta2, Beta2Pow.dtype),
    )


def _check_one_value(name: str, info: VarInfo | None) -> None:
    if info is not None and all(d >= 0 for d in info.shape) and math.prod(info.shape) != 1:
        fail(f"{name} must hold one value ([1] or 0-d), got {list(info.shape)}")


def _value(array, xp, default: float = 1.0):
    """A one-element input (`default` when absent) in float64: a Python float on the host,
    where reading it costs nothing, a 0-d array on a device, where reading it would wait for
    the device (the arithmetic that follows is the same on both)."""
    if array is None:
        return default
    if xp is np:
        return float(array.reshape(()))
    return array.reshape(()).astype(np.float64)


def _arrays(xp, dtype, *values) -> tuple[np.ndarray | None, ...]:
    """Results as arrays of `dtype` (NumPy turns 0-d results into scalars); None stays None."""
    return tuple(None if v is None else xp.asarray(v, dtype) for v in values)


@register_op
class adagrad:
    """MomentOut = Moment + Grad^2; ParamOut = Param - lr * Grad / (sqrt(MomentOut) + epsilon)
    (Fluid's adagrad op; torch.optim.Adagrad with lr_decay 0)."""

    inputs = ("Param", "Grad", "Moment", "LearningRate")
    outputs = ("ParamOut", "MomentOut")
    attrs = {"epsilon": 1e-6}

    def infer(Param, Grad, Moment, LearningRate, epsilon):
        _check_update(Param, Grad, LearningRate, Moment=Moment)
        return Param, Param

    def forward(Param, Grad, Moment, LearningRate, epsilon, xp):
        if isinstance(Grad, SelectedRows):  # the other rows' update is zero: skip them
            grad = Grad.merged()
            rows, g = grad.rows, grad.values.astype(Param.dtype, copy=False)
            moment = Moment[rows] + g * g
            std = xp.sqrt(moment) + _scalar(epsilon, Param.dtype, xp)
            lr = _scalar(LearningRate, Param.dtype, xp)
            param, moments = _rows_in_place(Param, xp), _rows_in_place(Moment, xp)
            param[rows] = param[rows] - lr * (g / std)
            moments[rows] = moment
            return param, moments
        if _splits(xp, Param, Grad, Moment):
            full = {"Param": Param, "Grad": Grad, "Moment": Moment}
            rest = {"LearningRate": LearningRate, "epsilon": epsilon}
            return _in_chunks(adagrad.forward, full, 2, **rest, xp=xp)
        moment = Moment + Grad * Grad
        std = xp.sqrt(moment) + _scalar(epsilon, Param.dtype, xp)
        lr = _scalar(LearningRate, Param.dtype, xp)
        return _arrays(xp, Param.dtype, Param - lr * (Grad / std), moment)


@register_op
class rmsprop:
    """torch.optim.RMSprop, with Fluid's slots and attrs (decay is torch's alpha):
    MeanSquareOut = decay * MeanSquare + (1 - decay) * Grad^2; with `centered`,
    MeanGradOut = decay * MeanGrad + (1 - decay) * Grad and avg = sqrt(MeanSquareOut -
    MeanGradOut^2) + epsilon, else avg = sqrt(MeanSquareOut) + epsilon;
    MomentOut = momentum * Moment + Grad / avg; ParamOut = Param - lr * MomentOut.

    Fluid's op differs: epsilon inside the square root and the learning rate inside the moment
    (MomentOut = momentum * Moment + lr * Grad / sqrt(MeanSquareOut + epsilon)). Without
    `centered`, MeanGrad is optional and passes through unchanged."""

    inputs = ("Param", "MeanSquare", "MeanGrad?", "LearningRate", "Grad", "Moment")
    outputs = ("ParamOut", "MomentOut", "MeanSquareOut", "MeanGradOut?")
    attrs = {"epsilon": 1e-10, "decay": 0.9, "momentum": 0.0, "centered": False}

    def infer(Param, MeanSquare, MeanGrad, LearningRate, Grad, Moment, centered, **_attrs):
        state = {"MeanSquare": MeanSquare, "Moment": Moment}
        if MeanGrad is not None:
            state["MeanGrad"] = MeanGrad
        elif centered:
            fail("centered rmsprop needs MeanGrad (the moving average of the gradient)")
        _check_update(Param, Grad, LearningRate, **state)
        return Param, Param, Param, MeanGrad

    def forward(Param, MeanSquare, MeanGrad, LearningRate, Grad, Moment, xp, **attrs):
        Grad = _dense(Grad)
        state = (MeanSquare, Grad, Moment) + (() if MeanGrad is None else (MeanGrad,))
        if _splits(xp, Param, *state):
            full = {"Param": Param, "MeanSquare": MeanSquare, "Grad": Grad, "Moment": Moment}
            scalars = {"LearningRate": LearningRate, "MeanGrad": MeanGrad}
            if MeanGrad is not None:  # sliced with the others
                full["MeanGrad"] = scalars.pop("MeanGrad")
            return _in_chunks(rmsprop.forward, full, 4, **scalars, **attrs, xp=xp)
        dtype = Param.dtype
        decay = _scalar(attrs["decay"], dtype, xp)
        rest = _scalar(1.0 - attrs["decay"], dtype, xp)
        mean_square = MeanSquare * decay + Grad * Grad * rest
        mean_grad = MeanGrad
        if attrs["centered"]:
            mean_grad = MeanGrad * decay + Grad * rest
            avg = xp.sqrt(mean_square - mean_grad * mean_grad)
        else:
            avg = xp.sqrt(mean_square)
        avg = avg + _scalar(attrs["epsilon"], dtype, xp)
        moment = Moment * _scalar(attrs["momentum"], dtype, xp) + Grad / avg
        param = Param - _scalar(LearningRate, dtype, xp) * moment
        return _arrays(xp, dtype, param, moment, mean_square, mean_grad)


@register_op
class adadelta:
    """torch.optim.Adadelta with Fluid's slots and attrs:
    AvgSquaredGradOut = rho * AvgSquaredGrad + (1 - rho) * Grad^2;
    delta = sqrt(AvgSquaredUpdate + epsilon) / sqrt(AvgSquaredGradOut + epsilon) * Grad;
    AvgSquaredUpdateOut = rho * AvgSquaredUpdate + (1 - rho) * delta^2;
    ParamOut = Param - lr * delta. Fluid's op has no learning rate: without the (optional)
    LearningRate input lr is 1, which is Fluid's rule."""

    inputs = ("Param", "Grad", "AvgSquaredGrad", "AvgSquaredUpdate", "LearningRate?")
    outputs = ("ParamOut", "AvgSquaredGradOut", "AvgSquaredUpdateOut")
    attrs = {"rho": 0.95, "epsilon": 1e-6}

    def infer(Param, Grad, AvgSquaredGrad, AvgSquaredUpdate, LearningRate, rho, epsilon):
        state = {"AvgSquaredGrad": AvgSquaredGrad, "AvgSquaredUpdate": AvgSquaredUpdate}
        _check_update(Param, Grad, LearningRate or VarInfo((1,), Param.dtype), **state)
        return Param, Param, Param

    def forward(Param, Grad, AvgSquaredGrad, AvgSquaredUpdate, LearningRate, rho, epsilon, xp):
        Grad = _dense(Grad)
        if _splits(xp, Param, Grad, AvgSquaredGrad, AvgSquaredUpdate):
            full = {"Param": Param, "Grad": Grad, "AvgSquaredGrad": AvgSquaredGrad}
            full["AvgSquaredUpdate"] = AvgSquaredUpdate
            scalars = {"LearningRate": LearningRate, "rho": rho, "epsilon": epsilon}
            return _in_chunks(adadelta.forward, full, 3, **scalars, xp=xp)
        dtype = Param.dtype
        keep, rest = _scalar(rho, dtype, xp), _scalar(1.0 - rho, dtype, xp)
        eps = _scalar(epsilon, dtype, xp)
        avg_grad = AvgSquaredGrad * keep + Grad * Grad * rest
        delta = xp.sqrt(AvgSquaredUpdate + eps) / xp.sqrt(avg_grad + eps) * Grad
        avg_update = AvgSquaredUpdate * keep + delta * delta * rest
        param = Param - _scalar(_value(LearningRate, xp), dtype, xp) * delta
        return _arrays(xp, dtype, param, avg_grad, avg_update)


# maximum as np.maximum takes it: a NaN on either side gives NaN
_ADAMAX = cuda_elementwise(
    "nestflow_adamax",
    "T param, T grad, raw L lr, T moment, T inf_norm, raw B beta1_pow, "
    "float64 beta1, float64 beta2, float64 epsilon",
    "T param_out, T moment_out, T inf_norm_out, raw B beta1_pow_out",
    """
T m = moment * (T)beta1 + grad * (T)(1.0 - beta1);
T decayed = inf_norm * (T)beta2;
T bound = fabs(grad) + (T)epsilon;
T u = (decayed > bound || decayed != decayed) ? decayed : bound;
T step = (T)((double)lr[0] / (1.0 - (double)beta1_pow[0]));
moment_out = m;
inf_norm_out = u;
param_out = param - step * (m / u);
if (i == 0) {
  beta1_pow_out[0] = beta1_pow[0] * (B)beta1;
}
""",
)


@register_op
class adamax:
    """torch.optim.Adamax with Fluid's slots and attrs: MomentOut = beta1 * Moment +
    (1 - beta1) * Grad; InfNormOut = max(beta2 * InfNorm, |Grad| + epsilon);
    ParamOut = Param - lr / (1 - Beta1Pow) * MomentOut / InfNormOut, Beta1Pow = beta1^t.
    Fluid's op adds epsilon to beta2 * InfNorm instead. Beta1PowOut (optional; Fluid updates
    the power with a separate op) is Beta1Pow * beta1."""

    inputs = ("Param", "Grad", "LearningRate", "Moment", "InfNorm", "Beta1Pow")
    outputs = ("ParamOut", "MomentOut", "InfNormOut", "Beta1PowOut?")
    attrs = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}

    def infer(Param, Grad, LearningRate, Moment, InfNorm, Beta1Pow, **_attrs):
        _check_update(Param, Grad, LearningRate, Moment=Moment, InfNorm=InfNorm)
        _check_one_value("Beta1Pow", Beta1Pow)
        return Param, Param, Param, Beta1Pow

    def forward(Param, Grad, LearningRate, Moment, InfNorm, Beta1Pow, beta1, beta2, epsilon, xp):
        Grad = _dense(Grad)
        if _splits(xp, Param, Grad, Moment, InfNorm):
            full = {"Param": Param, "Grad": Grad, "Moment": Moment, "InfNorm": InfNorm}
            rest = {"LearningRate": LearningRate, "Beta1Pow": Beta1Pow, "beta1": beta1}
            return _in_chunks(adamax.forward, full, 3, **rest, beta2=beta2, epsilon=epsilon, xp=xp)
        dtype = Param.dtype
        moment = Moment * _scalar(beta1, dtype, xp) + Grad * _scalar(1.0 - beta1, dtype, xp)
        inf_norm = xp.maximum(InfNorm * _scalar(beta2, dtype, xp), xp.abs(Grad) + epsilon)
        step = _scalar(_value(LearningRate, xp) / (1.0 - _value(Beta1Pow, xp)), dtype, xp)
        param = Param - step * (moment / inf_norm)
        beta1_pow = xp.asarray(Beta1Pow * beta1, Beta1Pow.dtype)
        return (*_arrays(xp, dtype, param, moment, inf_norm), beta1_pow)

    def forward_cuda(
        Param, Grad, LearningRate, Moment, InfNorm, Beta1Pow, beta1, beta2, epsilon, device
    ):
        if not (_fusable(Param, Grad, Moment, InfNorm) and _one_float(LearningRate, Beta1Pow)):
            return NotImplemented
        xp = device.xp
        outs = (
            xp.empty_like(Param),
            xp.empty_like(Moment),
            xp.empty_like(InfNorm),
            xp.empty_like(Beta1Pow),
        )
        scalars = (np.float64(beta1), np.float64(beta2), np.float64(epsilon))
        args = (Param, Grad, LearningRate, Moment, InfNorm, Beta1Pow)
        return fused_kernel(device, _ADAMAX)(*args, *scalars, *outs)


@register_op
class adamw:
    """torch.optim.AdamW: the decoupled decay Param * (1 - lr * coeff), then adam's update
    (same slots and beta powers as adam)."""

    inputs = ("Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow")
    outputs = ("ParamOut", "Moment1Out", "Moment2Out", "Beta1PowOut", "Beta2PowOut")
    attrs = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "coeff": 0.01}
    inplace = {"ParamOut": "Grad"}

    def infer(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, **attrs):
        attrs.pop("coeff")
        return adam.infer(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, **attrs)

    def forward(
        Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, xp, out=None, **attrs
    ):
        Grad = _dense(Grad)
        kept = _scalar(1.0 - _value(LearningRate, xp) * attrs.pop("coeff"), Param.dtype, xp)
        decayed = xp.asarray(Param * kept)
        return adam.forward(
            decayed, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, xp, out, **attrs
        )

    def forward_cuda(
        Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, device, out=None, **attrs
    ):
        args = (Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, device)
        scalars = (attrs["beta1"], attrs["beta2"], attrs["epsilon"], attrs["coeff"])
        return _adam_cuda(_ADAMW_KERNEL, *args, *scalars)


# lamb's elementwise parts: the moments and the update direction r, then the step along r.
_LAMB_MOMENTS = cuda_elementwise(
    "nestflow_lamb_moments",
    "T param, T grad, T moment1, T moment2, raw B beta1_pow, raw B beta2_pow, "
    "float64 beta1, float64 beta2, float64 epsilon, float64 weight_decay",
    "T moment1_out, T moment2_out, T r, raw B beta1_pow_out, raw B beta2_pow_out",
    """
T m = moment1 * (T)beta1 + grad * (T)(1.0 - beta1);
T v = moment2 * (T)beta2 + grad * grad * (T)(1.0 - beta2);
T m_hat = m / (T)(1.0 - (double)beta1_pow[0]);
T v_hat = v / (T)(1.0 - (double)beta2_pow[0]);
moment1_out = m;
moment2_out = v;
r = m_hat / (sqrt(v_hat) + (T)epsilon) + param * (T)weight_decay;
if (i == 0) {
  beta1_pow_out[0] = beta1_pow[0] * (B)beta1;
  beta2_pow_out[0] = beta2_pow[0] * (B)beta2;
}
""",
)
_LAMB_STEP = cuda_elementwise(
    "nestflow_lamb_step",
    "T param, T r, raw T param_sq, raw T r_sq, raw L lr",
    "T param_out",
    """
T param_norm = sqrt(param_sq[0]);
T r_norm = sqrt(r_sq[0]);
T trust = (param_norm > 0 && r_norm > 0) ? param_norm / r_norm : (T)1;
param_out = param - (T)lr[0] * trust * r;
""",
)


@register_op
class lamb:
    """LAMB (You et al. 2019), Fluid's lamb op: Adam's bias-corrected moments give
    r = m_hat / (sqrt(v_hat) + epsilon) + weight_decay * Param, and
    ParamOut = Param - lr * (||Param|| / ||r||) * r, the trust ratio ||Param|| / ||r|| taken
    as 1 when either norm is 0 (Fluid 1.8 has no such guard: a zero Param would never move).
    Beta1Pow/Beta2Pow are beta^t; their outputs (optional, as in Fluid) are multiplied by
    beta."""

    inputs = ("Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow")
    outputs = ("ParamOut", "Moment1Out", "Moment2Out", "Beta1PowOut?", "Beta2PowOut?")
    attrs = {"weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6}

    def infer(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, **_attrs):
        _check_update(Param, Grad, LearningRate, Moment1=Moment1, Moment2=Moment2)
        _check_one_value("Beta1Pow", Beta1Pow)
        _check_one_value("Beta2Pow", Beta2Pow)
        return Param, Param, Param, Beta1Pow, Beta2Pow

    def forward(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, xp, **attrs):
        Grad = _dense(Grad)
        dtype = Param.dtype
        beta1, beta2 = attrs["beta1"], attrs["beta2"]
        m = Moment1 * _scalar(beta1, dtype, xp) + Grad * _scalar(1.0 - beta1, dtype, xp)
        v = Moment2 * _scalar(beta2, dtype, xp) + Grad * Grad * _scalar(1.0 - beta2, dtype, xp)
        m_hat = m / _scalar(1.0 - _value(Beta1Pow, xp), dtype, xp)
        v_hat = v / _scalar(1.0 - _value(Beta2Pow, xp), dtype, xp)
        r = m_hat / (xp.sqrt(v_hat) + attrs["epsilon"]) + Param * attrs["weight_decay"]
        param_norm, r_norm = xp.sqrt(xp.sum(Param * Param)), xp.sqrt(xp.sum(r * r))
        # The guard as a select, not an if: on a device the norms stay there.
        moves = (param_norm > 0) & (r_norm > 0)
        trust = xp.where(moves, param_norm / xp.where(moves, r_norm, 1), 1)
        lr = _scalar(_value(LearningRate, xp), dtype, xp)
        param = Param - _scalar(lr * trust, dtype, xp) * r
        return (
            *_arrays(xp, dtype, param, m, v),
            xp.asarray(Beta1Pow * beta1, Beta1Pow.dtype),
            xp.asarray(Beta2Pow * beta2, Beta2Pow.dtype),
        )

    def forward_cuda(
        Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, device, **attrs
    ):
        if not _adam_fusable(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow):
            return NotImplemented
        xp = device.xp
        outs = (
            xp.empty_like(Moment1),
            xp.empty_like(Moment2),
            xp.empty_like(Param),
            xp.empty_like(Beta1Pow),
            xp.empty_like(Beta2Pow),
        )
        scalars = tuple(np.float64(attrs[k]) for k in ("beta1", "beta2", "epsilon", "weight_decay"))
        m, v, r, beta1_pow, beta2_pow = fused_kernel(device, _LAMB_MOMENTS)(
            Param, Grad, Moment1, Moment2, Beta1Pow, Beta2Pow, *scalars, *outs
        )
        # The norms are reductions: the trust ratio is taken from their sums on the device.
        param_sq, r_sq = xp.sum(xp.square(Param)), xp.sum(xp.square(r))
        param = fused_kernel(device, _LAMB_STEP)(Param, r, param_sq, r_sq, LearningRate)
        return param, m, v, beta1_pow, beta2_pow
