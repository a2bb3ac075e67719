"""`grad_no_need_buffer` declarations hold: a gradient kernel given stand-ins (NaN, or garbage
integers, of the same shape and dtype) for the slots its op declares gives exactly the
gradients it gives with the real values. Every OpCase with a gradient check in tests/ops is
run this way for the ops that declare any."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from nestflow.core.dtype import is_floating
from nestflow.errors import NestflowError
from nestflow.ops.registry import get_op_def, place_args, register_op, registered_ops
from tests.ops.harness import OpCase, case_id
from tests.ops.test_gradient_coverage import _op_test_cases


def _declared(op_type: str) -> frozenset[str]:
    grad_def = registered_ops().get(op_type + "_grad")
    return grad_def.no_need_buffer if grad_def is not None else frozenset()


CASES = [
    case
    for case in _op_test_cases()
    if case.grad and get_op_def(case.op_type).forward and _declared(case.op_type)
]


def _kwargs(function, available: dict) -> dict:
    names = inspect.signature(function).parameters
    wanted = {name: available[name] for name in names if name in available}
    return {**wanted, **place_args(function)}  # CPUPlace's xp / device, where declared


def _outputs(op_def, value) -> dict:
    values = value if isinstance(value, tuple) else (value,)
    return {slot.name: v for slot, v in zip(op_def.outputs, values)}


def _stand_in(value):
    if isinstance(value, list):
        return [_stand_in(v) for v in value]
    if not isinstance(value, np.ndarray):
        return value
    if is_floating(value.dtype):  # bfloat16 too, whose NumPy kind is "V"
        return np.full_like(value, np.nan)
    if value.dtype.kind in "iu":
        return np.full_like(value, 7)
    return value


def _upstream(value, rng):
    if isinstance(value, list):
        return [_upstream(v, rng) for v in value]
    if isinstance(value, np.ndarray) and is_floating(value.dtype):
        return rng.standard_normal(value.shape).astype(value.dtype)
    return None


def _gradients(op_def, values: dict, grads: dict, attrs: dict):
    available = {**attrs, **values, **{f"{slot}_grad": g for slot, g in grads.items()}}
    return op_def.backward(**_kwargs(op_def.backward, available))


def _assert_same(got, want, where: str) -> None:
    if isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{i}]")
    elif want is None:
        assert got is None, where
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=where)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_gradient_ignores_the_values_of_no_need_buffer_slots(case: OpCase):
    op_def = get_op_def(case.op_type)
    attrs = op_def.check_attrs(case.attrs)
    inputs = {slot.name: case.inputs.get(slot.name) for slot in op_def.inputs}
    np.random.seed(0)  # ops that draw (dropout) draw the same both times
    outputs = _outputs(op_def, op_def.forward(**_kwargs(op_def.forward, {**attrs, **inputs})))
    rng = np.random.default_rng(3)
    grads = {slot: _upstream(value, rng) for slot, value in outputs.items()}
    values = {**inputs, **outputs}
    want = _gradients(op_def, values, grads, attrs)
    standing_in = {
        slot: _stand_in(value) if slot in _declared(case.op_type) else value
        for slot, value in values.items()
    }
    got = _gradients(op_def, standing_in, grads, attrs)
    where = f"{case.op_type} gradient with stand-ins for {sorted(_declared(case.op_type))}"
    _assert_same(got, want, where)


def test_every_op_declaring_no_need_buffer_is_checked():
    declaring = {d.forward_type for d in registered_ops().values() if d.forward_type}
    declaring = {name for name in declaring if _declared(name)}
    checked = {case.op_type for case in CASES}
    assert declaring <= checked, f"no gradient case runs these ops: {declaring - checked}"


def test_the_gradient_op_carries_the_declaration():
    assert get_op_def("elementwise_add_grad").no_need_buffer == {"X", "Y", "Out"}
    assert get_op_def("tanh_grad").no_need_buffer == {"X"}
    assert not get_op_def("elementwise_mul_grad").no_need_buffer & {"X", "Y"}
    assert not get_op_def("tanh").no_need_buffer  # the forward op reads its input


@pytest.mark.parametrize(
    "body",
    [
        {"no_need_buffer": ("Out",)},  # not an input slot
        {"grad_no_need_buffer": ("Z",)},  # not a slot
        {"grad_no_need_buffer": ("X",), "drop_backward": True},  # no gradient kernel
    ],
)
def test_a_bad_declaration_is_refused_at_registration(body):
    namespace = {
        "inputs": ("X",),
        "outputs": ("Out",),
        "forward": staticmethod(lambda X: X),
        "backward": staticmethod(lambda X, Out, Out_grad: (Out_grad,)),
        **{key: value for key, value in body.items() if key != "drop_backward"},
    }
    if body.get("drop_backward"):
        del namespace["backward"]
    cls = type("test_bad_no_need_buffer", (), namespace)
    with pytest.raises(NestflowError, match="no_need_buffer"):
        register_op(cls)
    assert "test_bad_no_need_buffer" not in registered_ops()
