"""The shared operator test harness (PaddlePaddle's OpTest, in a few screens).

An op test is a list of `OpCase`s and one parametrized test:

    CASES = [
        OpCase("relu", {"X": x}, lambda X: {"Out": np.maximum(X, 0)}, grad=("X",)),
    ]

    @pytest.mark.parametrize("case", CASES, ids=case_id)
    def test_op(case):
        case.check()

`check()` builds a one-op Program (one data variable per input array, exact shapes and dtypes),
appends the op with `block.append_op` (so build-time inference runs and is compared with what the
kernel returns), runs it with an Executor and compares each output with the NumPy reference.
With `grad`, it then checks the op's grad maker and gradient kernel in float64 against central
differences of sum(output * upstream) for random upstream gradients. With `grad2` as well, it
checks the second order the same way: the gradients of sum(gradient * v) (v random), taken by
nf.gradients through the gradient op, with respect to the `grad` inputs and the upstream
gradients, against central differences of the first-order gradients.

Every check also runs the op (and its gradient ops) on each device place of `DEVICE_PLACES`: the
stand-in device always (NumPy memory behind a CuPy-like module that refuses host arrays), a CUDA
GPU where CuPy finds one. Their results must equal CPUPlace's (float64 to 1e-10, others to
1e-5); `DEVICE_CHECKED` collects the op types run on them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import nestflow as nf
from nestflow.core.place import StandInPlace, cuda_device_count
from nestflow.errors import PlaceError
from nestflow.framework.program import GRAD_SUFFIX, Block, OpDesc, Program
from nestflow.ops.registry import get_op_def

Array = np.ndarray
Arrays = dict[str, "np.ndarray | list[np.ndarray]"]

# Every op type whose gradient a case has checked in this process.
GRAD_CHECKED: set[str] = set()
# Every op type whose second order (its gradient op's gradient) a case has checked.
GRAD2_CHECKED: set[str] = set()
# Every op type (gradient ops included) a case has run on a device place in this process.
DEVICE_CHECKED: set[str] = set()


def _device_places() -> list[nf.Place]:
    """The stand-in, and CUDAPlace(0) where CuPy finds a GPU; NESTFLOW_TEST_DEVICES
    ("standin", "cuda" or both, comma-separated) narrows them (make gpu-check runs CUDA alone)."""
    wanted = os.environ.get("NESTFLOW_TEST_DEVICES", "standin,cuda").split(",")
    places: list[nf.Place] = [StandInPlace(0)] if "standin" in wanted else []
    try:
        if "cuda" in wanted and cuda_device_count():
            places.append(nf.CUDAPlace(0))
    except PlaceError:
        pass  # no CuPy or no driver: the stand-in alone
    return places


DEVICE_PLACES = _device_places()


def _on_cuda(place: nf.Place) -> bool:
    return isinstance(place, nf.CUDAPlace)


# make gpu-check counts the op types checked on the device across pytest's processes from here.
_CHECKED_LOG = os.environ.get("NESTFLOW_DEVICE_CHECKED_LOG")


def _checked_on_device(op_types) -> None:
    op_types = set(op_types) - DEVICE_CHECKED
    DEVICE_CHECKED.update(op_types)
    if _CHECKED_LOG and op_types:
        with open(_CHECKED_LOG, "a") as log:
            log.write("".join(f"{t}\n" for t in sorted(op_types)))


def draws_on_the_device(op_type: str, attrs: dict) -> bool:
    """Whether the op's outputs are random draws. On CUDA they come from CuPy's generator
    (reproducible, not bit-equal to the CPU's), so only their shapes and dtypes are compared
    there; the stand-in draws from the host generator and is compared exactly."""
    attrs = get_op_def(op_type).check_attrs(attrs)
    if op_type in ("uniform_random", "gaussian_random"):
        return True
    if op_type == "dropout":
        return not attrs["is_test"] and attrs["dropout_prob"] > 0
    if op_type == "scaled_dot_product_attention":
        return not attrs["is_test"] and attrs["dropout_rate"] > 0
    return False


# How far a device's floats may lie from CPUPlace's: a sum is rounded in another order there
# (cuBLAS, CuPy's reductions), and 16-bit floats by two of their own units in the last place.
DEVICE_TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "float16": 2**-9, "bfloat16": 2**-6}


def assert_equal_on_device(got, want, where: str, values: bool = True) -> None:
    """A device run's result against CPUPlace's: floats within DEVICE_TOLERANCE (float64 1e-10,
    float32 1e-5) relative to each value and to the result's largest magnitude (the rounding of
    a sum scales with its terms, not with its result), everything else exactly; with `values`
    False, the shape and dtype alone."""
    assert isinstance(got, np.ndarray), f"{where} is {type(got).__name__}, not ndarray"
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{where}: {got.dtype}{list(got.shape)}, CPUPlace gave {want.dtype}{list(want.shape)}"
    )
    if not values:
        return
    tol = DEVICE_TOLERANCE.get(want.dtype.name)
    if tol is None and want.dtype.kind == "c":
        tol = DEVICE_TOLERANCE["float64" if want.dtype == np.complex128 else "float32"]
    if tol is None:
        np.testing.assert_array_equal(got, want, err_msg=where)
        return
    got64, want64 = (
        got.astype(np.complex128 if got.dtype.kind == "c" else np.float64),
        want.astype(np.complex128 if want.dtype.kind == "c" else np.float64),
    )
    finite = want64[np.isfinite(want64)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got64, want64, rtol=tol, atol=tol * scale, err_msg=where)


@dataclass(eq=False)  # cases hold arrays: compare them by identity
class OpCase:
    """One op, its inputs, attributes and NumPy reference: a forward and gradient check."""

    op_type: str
    inputs: Arrays
    reference: Callable[..., dict[str, Any]]  # reference(**inputs, **attrs) -> {slot: expected}
    attrs: dict = field(default_factory=dict)
    grad: tuple[str, ...] = ()  # input slots whose gradients are checked numerically
    outputs: tuple[str, ...] | None = None  # output slots compared (default: reference's keys)
    grad_outputs: tuple[str, ...] | None = None  # differentiated (default: float compared ones)
    grad2: bool = False  # also check the second order (the gradient op's own gradient)
    atol: float = 1e-6
    rtol: float = 1e-5
    grad_atol: float = 1e-6
    grad_rtol: float = 1e-5
    check_dtype: bool = True  # output dtype must equal the reference's
    id: str = ""

    def check(self) -> None:
        self.check_forward()
        if self.grad:
            self.check_grad()
        if self.grad2:
            check_second_order(self)

    # ---- forward ----

    def expected(self, inputs: Arrays | None = None) -> dict[str, Any]:
        inputs = self.inputs if inputs is None else inputs
        result = self.reference(**inputs, **self.attrs)
        slots = self.outputs if self.outputs is not None else tuple(result)
        return {slot: result[slot] for slot in slots}

    def check_forward(self) -> None:
        expected = self.expected()
        counts = {s: len(v) for s, v in expected.items() if isinstance(v, list)}
        built = _OneOp(self, self.inputs, counts)
        actual = built.run(self.inputs, list(expected))
        for slot, want in expected.items():
            got = actual[slot]
            wants = want if isinstance(want, list) else [want]
            gots = got if isinstance(got, list) else [got]
            assert len(gots) == len(wants), f"{self.op_type}.{slot}: {len(gots)} outputs"
            for i, (g, w) in enumerate(zip(gots, wants)):
                where = f"{self.op_type} output {slot}[{i}]"
                assert isinstance(g, np.ndarray), f"{where} is {type(g).__name__}, not ndarray"
                w = np.asarray(w)
                assert g.shape == w.shape, f"{where}: shape {g.shape}, expected {w.shape}"
                if self.check_dtype:
                    assert g.dtype == w.dtype, f"{where}: dtype {g.dtype}, expected {w.dtype}"
                np.testing.assert_allclose(g, w, rtol=self.rtol, atol=self.atol, err_msg=where)
        for place in DEVICE_PLACES:
            on_device = built.run(self.inputs, list(expected), place)
            values = not (_on_cuda(place) and draws_on_the_device(self.op_type, self.attrs))
            for slot in expected:
                for i, (g, c) in enumerate(zip(_listed(on_device[slot]), _listed(actual[slot]))):
                    where = f"{self.op_type} output {slot}[{i}] on {place}"
                    assert_equal_on_device(g, c, where, values)
            _checked_on_device([self.op_type])

    # ---- gradient ----

    def check_grad(self, eps: float = 1e-6) -> None:
        op_def = get_op_def(self.op_type)
        assert op_def.grad_maker is not None, f"'{self.op_type}' has no gradient"
        inputs = {slot: _to_float64(v) for slot, v in self.inputs.items()}
        for slot in self.grad:
            assert slot in inputs, f"grad slot '{slot}' is not an input of the case"
            arrays = inputs[slot] if isinstance(inputs[slot], list) else [inputs[slot]]
            assert all(a.dtype == np.float64 for a in arrays), (
                f"'{slot}' is not floating point: integer/bool inputs have no gradient"
            )
        expected = self.expected(inputs)
        counts = {s: len(v) for s, v in expected.items() if isinstance(v, list)}
        forward = _OneOp(self, inputs, counts)
        outs = forward.run(inputs, list(expected))
        diff_slots = self.grad_outputs or tuple(
            s
            for s in expected
            if all(isinstance(a, np.ndarray) and a.dtype.kind == "f" for a in _listed(outs[s]))
        )
        rng = np.random.default_rng(7)
        upstream = {
            name: np.asarray(rng.standard_normal(value.shape))
            for slot in diff_slots
            for name, value in zip(forward.out_names[slot], _listed(outs[slot]))
        }

        def objective(values: Arrays) -> float:
            got = forward.run(values, list(diff_slots))
            return float(
                sum(
                    np.sum(value * upstream[name])
                    for slot in diff_slots
                    for name, value in zip(forward.out_names[slot], _listed(got[slot]))
                )
            )

        checked = [n for slot in self.grad for n in forward.in_names[slot]]
        grad_program = _GradProgram(forward, checked, upstream)
        analytic = grad_program.run(inputs)
        for place in DEVICE_PLACES:
            on_device = grad_program.run(inputs, place)
            values = not (_on_cuda(place) and draws_on_the_device(self.op_type, self.attrs))
            for name in checked:
                where = f"{self.op_type} d/d{name} on {place}"
                assert_equal_on_device(on_device[name], analytic[name], where, values)
            _checked_on_device(op.type for op in grad_program.block.ops)
        for slot in self.grad:
            for i, (name, x) in enumerate(zip(forward.in_names[slot], _listed(inputs[slot]))):
                where = f"{self.op_type} d/d{slot}[{i}]"
                got = analytic[name]
                assert isinstance(got, np.ndarray), f"{where} is {type(got).__name__}"
                assert got.shape == x.shape, f"{where}: shape {got.shape}, expected {x.shape}"
                numeric = np.zeros_like(x)
                for index in np.ndindex(x.shape):
                    moved = {}
                    for sign in (1.0, -1.0):
                        shifted = x.copy()
                        shifted[index] += sign * eps
                        moved[sign] = objective(_replace(inputs, slot, i, shifted))
                    numeric[index] = (moved[1.0] - moved[-1.0]) / (2 * eps)
                np.testing.assert_allclose(
                    got, numeric, rtol=self.grad_rtol, atol=self.grad_atol, err_msg=where
                )
        GRAD_CHECKED.add(self.op_type)


def check_second_order(case: OpCase, eps: float = 1e-5) -> None:
    """The case's op differentiated twice by nf.gradients in float64: the gradients of
    S = sum_i <dL/dx_i, v_i> (L = sum(output * upstream), v random) with respect to the `grad`
    inputs and the upstream gradients, against central differences of S."""
    assert case.grad, f"{case.op_type}: grad2 needs grad slots"
    inputs = {slot: _to_float64(v) for slot, v in case.inputs.items()}
    expected = case.expected(inputs)
    counts = {s: len(v) for s, v in expected.items() if isinstance(v, list)}
    one = _OneOp(case, inputs, counts)
    outs = one.run(inputs, list(expected))
    slots = case.grad_outputs or tuple(
        s for s in expected if all(a.dtype.kind == "f" for a in _listed(outs[s]))
    )
    rng = np.random.default_rng(11)
    block = one.block
    targets = [block.var(n) for s in slots for n in one.out_names[s]]
    values = {n: np.asarray(v) for s in slots for n, v in zip(one.out_names[s], _listed(outs[s]))}
    upstream = []
    for target in targets:
        upstream.append(block.create_var("up_" + target.name, values[target.name].shape, "float64"))
    checked = [block.var(n) for slot in case.grad for n in one.in_names[slot]]
    for var in checked + upstream:
        var.stop_gradient = False
    firsts = nf.gradients(targets, checked, target_gradients=upstream)
    assert all(g is not None for g in firsts), f"{case.op_type}: an input got no gradient"
    arrays = dict(one.feed(inputs))
    arrays.update(
        {u.name: rng.standard_normal(values[t.name].shape) for t, u in zip(targets, upstream)}
    )
    directions = [block.create_var("v_" + g.name, g.shape, "float64") for g in firsts]
    firsts_shapes = [arrays[v.name].shape for v in checked]
    feed_v = {d.name: rng.standard_normal(s) for d, s in zip(directions, firsts_shapes)}
    wrt = checked + upstream
    seconds = nf.gradients(firsts, wrt, target_gradients=directions)

    def run(feed, fetch, place=None):
        return nf.Executor(place).run(one.program, {**feed, **feed_v}, fetch, nf.Scope())

    fetch = [g for g in seconds if g is not None]
    analytic = dict(zip([g.name for g in fetch], run(arrays, fetch)))
    for place in DEVICE_PLACES:
        for g, value in zip(fetch, run(arrays, fetch, place)):
            assert_equal_on_device(
                value, analytic[g.name], f"{case.op_type} d2/d{g.name} on {place}"
            )
        _checked_on_device(op.type for op in one.program.global_block().ops)

    def objective(feed) -> float:
        got = run(feed, firsts)
        return float(sum(np.sum(a * feed_v[d.name]) for a, d in zip(got, directions)))

    for var, grad in zip(wrt, seconds):
        x = arrays[var.name]
        got = np.zeros_like(x) if grad is None else analytic[grad.name]
        numeric = np.zeros_like(x)
        for index in np.ndindex(x.shape):
            moved = {}
            for sign in (1.0, -1.0):
                shifted = x.copy()
                shifted[index] += sign * eps
                moved[sign] = objective({**arrays, var.name: shifted})
            numeric[index] = (moved[1.0] - moved[-1.0]) / (2 * eps)
        np.testing.assert_allclose(
            got,
            numeric,
            rtol=case.grad_rtol,
            atol=case.grad_atol,
            err_msg=f"{case.op_type} second order d/d{var.name}",
        )
    GRAD2_CHECKED.add(case.op_type)


def case_id(case: OpCase) -> str:
    return case.id or case.op_type


def cases_in(namespace: dict[str, Any]) -> list[OpCase]:
    """Every OpCase in a module namespace (directly or in a list/tuple), in definition order."""
    found: list[OpCase] = []
    for value in list(namespace.values()):
        items = value if isinstance(value, (list, tuple)) else [value]
        found.extend(c for c in items if isinstance(c, OpCase) and c not in found)
    return found


# ---- the one-op programs ----


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def _to_float64(value):
    if isinstance(value, list):
        return [_to_float64(v) for v in value]
    value = np.asarray(value)
    return value.astype(np.float64) if value.dtype.kind == "f" else value


def _replace(inputs: Arrays, slot: str, i: int, array: np.ndarray) -> Arrays:
    moved = dict(inputs)
    if isinstance(moved[slot], list):
        moved[slot] = [array if j == i else a for j, a in enumerate(moved[slot])]
    else:
        moved[slot] = array
    return moved


def _check_inferred(block: Block, name: str, value: Any, what: str) -> None:
    """Build-time inference must agree with what the kernel produced (-1 dims aside)."""
    if not isinstance(value, np.ndarray):
        return
    var = block.find_var(name)
    assert var is not None, f"{what}: inference did not declare output '{name}'"
    assert len(var.shape) == value.ndim and all(
        d == -1 or d == a for d, a in zip(var.shape, value.shape)
    ), f"{what}: inferred shape {list(var.shape)} but the kernel gave {list(value.shape)}"
    assert np.dtype(var.dtype) == value.dtype, (
        f"{what}: inferred dtype {var.dtype} but the kernel gave {value.dtype}"
    )


class _OneOp:
    """A Program holding one data variable per input array and the op under test."""

    def __init__(self, case: OpCase, inputs: Arrays, counts: dict[str, int]):
        self.case = case
        self.program = Program()
        self.block = block = self.program.global_block()
        op_def = get_op_def(case.op_type)
        self.in_names: dict[str, list[str]] = {}
        for slot, value in inputs.items():
            arrays = _listed(value)
            names = (
                [f"in_{slot}_{i}" for i in range(len(arrays))]
                if isinstance(value, list)
                else [f"in_{slot}"]
            )
            for name, array in zip(names, arrays):
                array = np.asarray(array)
                block.create_var(name, shape=array.shape, dtype=array.dtype)
            self.in_names[slot] = names
        self.out_names: dict[str, list[str]] = {}
        for slot in op_def.outputs:
            if slot.duplicable:
                if slot.name in counts:
                    self.out_names[slot.name] = [
                        f"out_{slot.name}_{i}" for i in range(counts[slot.name])
                    ]
            else:
                self.out_names[slot.name] = [f"out_{slot.name}"]
        self.op: OpDesc = block.append_op(
            case.op_type, dict(self.in_names), dict(self.out_names), dict(case.attrs)
        )
        self.executor = nf.Executor()
        self.scope = nf.Scope()

    def feed(self, inputs: Arrays) -> dict[str, np.ndarray]:
        return {
            name: np.asarray(array)
            for slot, value in inputs.items()
            for name, array in zip(self.in_names[slot], _listed(value))
        }

    def run(self, inputs: Arrays, slots: list[str], place: nf.Place | None = None) -> dict:
        fetch = [name for slot in slots for name in self.out_names[slot]]
        executor = self.executor if place is None else nf.Executor(place)
        values = dict(zip(fetch, executor.run(self.program, self.feed(inputs), fetch, self.scope)))
        result: dict[str, Any] = {}
        for slot in slots:
            got = [values[n] for n in self.out_names[slot]]
            for name, value in zip(self.out_names[slot], got):
                _check_inferred(self.block, name, value, f"{self.case.op_type} output {slot}")
            is_list = get_op_def(self.case.op_type).output_slot(slot).duplicable
            result[slot] = got if is_list else got[0]
        return result


class _HarnessGradContext:
    """The GradContext append_backward would give: gradients for the checked inputs and for
    the outputs given an upstream gradient, nothing else."""

    def __init__(self, names: set[str]):
        self.names = names

    def grad_of(self, name: str) -> str | None:
        return name + GRAD_SUFFIX if name in self.names else None

    def backward_block(self, sub_block, out_grads, wanted):
        raise NotImplementedError("the op harness checks ops without sub-blocks")


class _GradProgram:
    """The forward op plus the gradient ops its grad maker emits, in a program of its own."""

    def __init__(self, forward: _OneOp, checked: list[str], upstream: dict[str, np.ndarray]):
        case = forward.case
        self.forward = forward
        # A program of its own, so the forward program (the objective) stays one op.
        self.program = Program()
        block = self.block = self.program.global_block()
        for names in forward.in_names.values():
            for name in names:
                var = forward.block.var(name)
                block.create_var(name, shape=var.shape, dtype=var.dtype)
        op = block.append_op(case.op_type, forward.op.inputs, forward.op.outputs, case.attrs)
        for name, value in upstream.items():
            block.create_var(name + GRAD_SUFFIX, shape=value.shape, dtype=value.dtype)
        ctx = _HarnessGradContext(set(checked) | set(upstream))
        specs = get_op_def(case.op_type).grad_maker(op, ctx)
        assert specs, f"'{case.op_type}' grad maker made no gradient ops"
        for spec in specs:
            block.append_op(spec.type, spec.inputs, spec.outputs, spec.attrs)
        self.checked = checked
        self.upstream = upstream

    def run(self, inputs: Arrays, place: nf.Place | None = None) -> dict[str, Any]:
        feed = self.forward.feed(inputs)
        feed.update({name + GRAD_SUFFIX: value for name, value in self.upstream.items()})
        fetch = [name + GRAD_SUFFIX for name in self.checked]
        values = nf.Executor(place).run(self.program, feed, fetch, nf.Scope())
        for name, value in zip(fetch, values):
            _check_inferred(self.block, name, value, f"{self.forward.case.op_type} gradient")
        return dict(zip(self.checked, values))
