"""The fused CUDA kernels (`forward_cuda` / `backward_cuda`) of the optimizer and RNN-cell ops
against their xp bodies on CPUPlace, on edge shapes (one element, odd sizes, 0-d, an empty
batch, which the kernels leave to the body). The kernels are called directly, so one that
returns NotImplemented fails rather than passes through the body. Without a GPU, every kernel
source is compiled with NVRTC in a stand-in of the code CuPy wraps around it."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.ops import optimizer, registry, rnn_unit
from nestflow.ops.registry import get_op_def
from tests.ops.harness import assert_equal_on_device

KERNELS = registry.CUDA_ELEMENTWISE
_C_TYPES = {"float32": "float", "float64": "double", "int64": "long long"}


def _stand_in_source(name: str, in_params: str, out_params: str, operation: str, c_type: str):
    """The kernel laid out as cupy.ElementwiseKernel lays it out (element `i`, `raw` arrays
    indexed by hand, the others bound by reference), pointers standing for CuPy's CArrays and
    every type placeholder (T, L, B) `c_type`."""
    params, binds, letters = [], [], set()
    for text, const in [(p, "const ") for p in in_params.split(",")] + [
        (p, "") for p in out_params.split(",")
    ]:
        *words, type_, var = text.split()
        if len(type_) == 1:
            letters.add(type_)
        elif "raw" not in words:  # a typed scalar, as `float64 beta1`
            params.append(f"const {_C_TYPES[type_]} {var}")
            continue
        c_name = _C_TYPES.get(type_, type_)  # a placeholder letter, or int64, bool...
        if "raw" in words:
            params.append(f"{const}{c_name}* {var}")
        else:
            params.append(f"{const}{c_name}* _raw_{var}")
            binds.append(f"{const}{c_name} &{var} = _raw_{var}[i];")
    typedefs = "".join(f"typedef {c_type} {t};\n" for t in sorted(letters))
    return (
        f'{typedefs}extern "C" __global__ void {name}({", ".join(params)}, long long _n) {{\n'
        "for (ptrdiff_t i = blockIdx.x * (ptrdiff_t)blockDim.x + threadIdx.x; i < _n;"
        " i += (ptrdiff_t)blockDim.x * gridDim.x) {\n" + "\n".join(binds) + operation + "\n}\n}\n"
    )


@pytest.mark.parametrize("c_type", ["float", "double"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_source_compiles(name, c_type):
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="no NVRTC here")
    source = _stand_in_source(name, *KERNELS[name], c_type)
    try:
        program = nvrtc.createProgram(source, name, [], [])
    except Exception as err:  # CuPy without its NVRTC library
        pytest.skip(f"NVRTC cannot be loaded: {err}")
    try:
        nvrtc.compileProgram(program, ["-arch=compute_90", "-std=c++17"])
    except Exception as err:
        pytest.fail(f"{name} ({c_type}):\n{nvrtc.getProgramLog(program)}{err}\n{source}")


# ---- on a GPU: the kernels against the xp bodies ----

needs_gpu = pytest.mark.skipif(nf.cuda.device_count() == 0, reason="no CUDA GPU here")
R = np.random.default_rng(3)


def _normal(shape, dtype):
    return np.asarray(R.standard_normal(shape)).astype(dtype)


def _optimizer_case(op_type, shape, dtype, lr_dtype, attrs):
    param = {"Param": _normal(shape, dtype), "Grad": _normal(shape, dtype)}
    lr = {"LearningRate": np.array([0.05], lr_dtype)}
    powers = {"Beta1Pow": np.array([0.9**3]), "Beta2Pow": np.array([0.999**3])}
    powers = {k: v.astype(lr_dtype) for k, v in powers.items()}
    moments = {
        "Moment1": _normal(shape, dtype),
        "Moment2": np.abs(_normal(shape, dtype)),
    }
    return {
        "sgd": {**param, **lr},
        "momentum": {**param, "Velocity": _normal(shape, dtype), **lr},
        "adam": {**param, **lr, **moments, **powers},
        "adamw": {**param, **lr, **moments, **powers},
        "lamb": {**param, **lr, **moments, **powers},
        "adamax": {
            **param,
            **lr,
            "Moment": _normal(shape, dtype),
            "InfNorm": np.abs(_normal(shape, dtype)),
            "Beta1Pow": powers["Beta1Pow"],
        },
    }[op_type], get_op_def(op_type).check_attrs(attrs)


def _compare(op_type, cuda, body, inputs, attrs, covered=True):
    """`cuda` (the kernel) on CUDAPlace against `body` on CPUPlace."""
    from nestflow.core.device_context import device_context

    device = device_context(nf.CUDAPlace(0))
    on_device = {k: None if v is None else device.xp.asarray(v) for k, v in inputs.items()}
    got = cuda(**on_device, **attrs, device=device)
    if not covered:
        assert got is NotImplemented, f"{op_type}: an empty input should keep the xp body"
        return
    assert got is not NotImplemented, f"{op_type} fell back to its xp body"
    want = body(**inputs, **attrs, xp=np)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"{op_type} output {k}"
        if w is not None:
            assert_equal_on_device(g.get(), np.asarray(w), f"{op_type} output {k}")


OPTIMIZER_ATTRS = [
    ("sgd", {}),
    ("momentum", {"mu": 0.9}),
    ("momentum", {"mu": 0.8, "use_nesterov": True}),
    ("adam", {}),
    ("adam", {"beta1": 0.5, "beta2": 0.9, "epsilon": 1e-3, "lazy_mode": True}),
    ("adamw", {"coeff": 0.1}),
    ("adamax", {"beta1": 0.8}),
    ("lamb", {"weight_decay": 0.1}),
]


@needs_gpu
@pytest.mark.parametrize("dtype,lr_dtype", [("float32", "float32"), ("float64", "float32")])
@pytest.mark.parametrize("shape", [(1,), (7, 3), (), (0, 4)], ids=str)
@pytest.mark.parametrize("op_type,attrs", OPTIMIZER_ATTRS, ids=lambda v: str(v))
def test_optimizer_kernels(op_type, attrs, shape, dtype, lr_dtype):
    inputs, attrs = _optimizer_case(op_type, shape, dtype, lr_dtype, attrs)
    op = getattr(optimizer, op_type)
    _compare(op_type, op.forward_cuda, op.forward, inputs, attrs, covered=0 not in shape)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("lead,d", [((1,), 1), ((5,), 3), ((2, 3), 5), ((0,), 2)], ids=str)
@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_lstm_unit_kernels(lead, d, dtype, forget_bias):
    covered = 0 not in lead
    X, C_prev = _normal((*lead, 4 * d), dtype) * 3, _normal((*lead, d), dtype)
    attrs = {"forget_bias": forget_bias}
    op = rnn_unit.lstm_unit
    _compare("lstm_unit", op.forward_cuda, op.forward, {"X": X, "C_prev": C_prev}, attrs, covered)
    C, H = op.forward(X, C_prev, forget_bias, xp=np)
    for c_grad, h_grad in ((True, True), (True, False), (False, True)):
        grads = {
            "C_grad": _normal(C.shape, dtype) if c_grad else None,
            "H_grad": _normal(C.shape, dtype) if h_grad else None,
        }
        inputs = {"X": X, "C_prev": C_prev, "C": C, "H": H, **grads}
        _compare("lstm_unit_grad", op.backward_cuda, op.backward, inputs, attrs, covered)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("lead,d", [((1,), 1), ((5,), 3), ((2, 3), 5), ((0,), 2)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_gru_cell_kernels(lead, d, dtype, bias):
    covered = 0 not in lead
    inputs = {
        "X": _normal((*lead, 3 * d), dtype),
        "HiddenProj": _normal((*lead, 3 * d), dtype),
        "HiddenPrev": _normal((*lead, d), dtype),
        "Bias": _normal((3 * d,), dtype) if bias else None,
    }
    op = rnn_unit.gru_cell
    _compare("gru_cell", op.forward_cuda, op.forward, inputs, {}, covered)
    hidden = op.forward(**inputs, xp=np)
    grads = {"Hidden": hidden, "Hidden_grad": _normal(hidden.shape, dtype)}
    for needs in ((True,) * 4, (False, True, False, True)):
        attrs = {"needs": needs}
        _compare(
            "gru_cell_grad", op.backward_cuda, op.backward, {**inputs, **grads}, attrs, covered
        )
