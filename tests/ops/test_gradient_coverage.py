"""Every registered op with a gradient has a numeric gradient check (an OpCase with `grad`)."""

from __future__ import annotations

import importlib
from pathlib import Path

from nestflow.ops.registry import registered_ops
from tests.ops.harness import OpCase, cases_in

# Ops whose gradients need sub-blocks, step scopes or tensor arrays, which a one-op program
# cannot hold; each is checked numerically through the layers that build it.
CHECKED_ELSEWHERE = {
    "block": "tests/layers/test_block_op.py",
    "conditional_block": "tests/layers/test_cond.py",
    "ifelse": "tests/layers/test_ifelse.py",
    "recurrent": "tests/layers/test_rnn.py",
    "while": "tests/layers/test_while.py",
    "array_read": "tests/layers/test_while.py (tensor array gradients)",
    "array_write": "tests/layers/test_while.py (tensor array gradients)",
    "array_to_tensor": "tests/layers/test_while.py (tensor array gradients)",
}


def _op_test_cases() -> list[OpCase]:
    cases: list[OpCase] = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        if path.stem == Path(__file__).stem:
            continue
        module = importlib.import_module(f"tests.ops.{path.stem}")
        cases.extend(cases_in(vars(module)))
    return cases


def uncovered_ops() -> list[str]:
    """Differentiable ops no OpCase checks the gradient of (nor a listed test elsewhere)."""
    checked = {case.op_type for case in _op_test_cases() if case.grad}
    differentiable = {
        name
        for name, op_def in registered_ops().items()
        if op_def.has_gradient and op_def.forward_type is None
    }
    return sorted(differentiable - checked - set(CHECKED_ELSEWHERE))


def test_every_differentiable_op_has_a_gradient_check():
    missing = uncovered_ops()
    print("ops without a numeric gradient check:", missing or "none")
    assert not missing, f"no OpCase with grad=... in tests/ops checks these ops: {missing}"


def test_the_allow_list_names_only_registered_differentiable_ops():
    ops = registered_ops()
    for name in CHECKED_ELSEWHERE:
        assert name in ops and ops[name].has_gradient, name


if __name__ == "__main__":
    print("\n".join(uncovered_ops()) or "every differentiable op is covered")


def unchecked_input_slots() -> dict[str, list[str]]:
    """Per op, the input slots that receive gradients but no OpCase checks numerically
    (issue 3: "compares analytic gradients ... for every differentiable input")."""
    checked: dict[str, set[str]] = {}
    for case in _op_test_cases():
        checked.setdefault(case.op_type, set()).update(case.grad)
    missing = {}
    for name, op_def in registered_ops().items():
        if not op_def.has_gradient or op_def.forward_type is not None:
            continue
        if name in CHECKED_ELSEWHERE:
            continue
        slots = sorted({s.name for s in op_def.grad_inputs} - checked.get(name, set()))
        if slots:
            missing[name] = slots
    return missing


def test_every_differentiable_input_slot_has_a_gradient_check():
    missing = unchecked_input_slots()
    assert not missing, f"input slots with a gradient no OpCase checks: {missing}"
