"""print: prints at run time (message, name, shape, dtype, values) and passes its input through;
print_grad passes the gradient through and prints it in the backward phase."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.core import standin
from nestflow.errors import AttrError
from nestflow.ops.debug import format_value
from nestflow.ops.registry import get_op_def
from tests.ops.harness import OpCase, case_id

L = nf.layers

R = np.random.default_rng(5)

CASES = [
    OpCase(
        "print",
        {"In": R.standard_normal((2, 3))},
        lambda In, **attrs: {"Out": In},
        {"message": "m", "print_phase": phase},
        grad=("In",),
        id=f"print-{phase}",
    )
    for phase in ("forward", "backward", "both")
] + [
    OpCase("print", {"In": np.zeros((0, 4), np.int32)}, lambda In: {"Out": In}, id="print-empty"),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op(case, capsys):
    case.check()
    printed = capsys.readouterr().out
    phase = case.attrs.get("print_phase", "both")
    assert ("Variable: in_In\n" in printed) is (phase != "backward")
    assert ("Variable: out_Out@GRAD\n" in printed) is (bool(case.grad) and phase != "forward")


def _run(fetch, feed):
    return nf.Executor().run(feed=feed, fetch_list=fetch, scope=nf.Scope())


def test_print_shows_message_name_shape_dtype_and_first_values(capsys):
    x = L.data("x", [-1, 3], "float32")
    out = L.Print(x, message="activations:", summarize=4)
    y = L.scale(out, 2.0)
    xs = np.arange(6, dtype="float32").reshape(2, 3)
    passed, doubled = _run([out, y], {"x": xs})
    printed = capsys.readouterr().out
    assert "activations: Variable: x" in printed
    assert "shape: [2, 3]" in printed
    assert "dtype: float32" in printed
    assert "data: [0.0, 1.0, 2.0, 3.0] ..." in printed
    np.testing.assert_array_equal(passed, xs)
    np.testing.assert_array_equal(doubled, 2 * xs)


def test_print_summarize_minus_one_prints_every_value(capsys):
    x = L.data("x", [4], "int64")
    out = L.Print(x, summarize=-1)
    _run([out], {"x": np.array([5, 6, 7, 8])})
    printed = capsys.readouterr().out
    assert "data: [5, 6, 7, 8]\n" in printed
    assert "..." not in printed


def test_print_of_an_empty_tensor(capsys):
    x = L.data("x", [-1, 2], "float64")
    out = L.Print(x)
    (value,) = _run([out], {"x": np.zeros((0, 2))})
    assert value.shape == (0, 2)
    assert "shape: [0, 2]" in capsys.readouterr().out


def test_print_phase_backward_prints_nothing_in_the_forward_pass(capsys):
    x = L.data("x", [2], "float32")
    out = L.Print(x, message="quiet", print_phase="backward")
    (value,) = _run([out], {"x": np.ones(2, "float32")})
    np.testing.assert_array_equal(value, np.ones(2))
    assert capsys.readouterr().out == ""


def test_print_rejects_an_unknown_phase():
    x = L.data("x", [2], "float32")
    with pytest.raises(AttrError, match="print_phase must be one of"):
        L.Print(x, print_phase="sideways")


def test_format_value_of_a_device_array_equals_the_hosts():
    x = np.arange(30.0).reshape(5, 6)
    for summarize in (4, -1):
        shown = format_value("x", standin.xp.asarray(x), "m", summarize)
        assert shown == format_value("x", x, "m", summarize)


def test_format_value_of_a_non_tensor():
    assert format_value("steps", [1, 2], "m") == "m Variable: steps\n  - value: [1, 2]"


class _Grads:
    """A GradContext stand-in: every variable's gradient is `<name>@GRAD`."""

    def grad_of(self, name):
        return name + "@GRAD"


@pytest.mark.parametrize("phase, prints", [("forward", False), ("backward", True), ("both", True)])
def test_print_grad_passes_the_gradient_through_and_prints_by_phase(capsys, phase, prints):
    x = L.data("x", [2, 2], "float64")
    out = L.Print(x, message="g", print_phase=phase)
    block = nf.default_main_program().global_block()
    (spec,) = get_op_def("print").grad_maker(block.ops[-1], _Grads())
    assert spec.type == "print_grad"
    assert spec.inputs == {"In": [out.name + "@GRAD"]}
    assert spec.outputs == {"Out": ["x@GRAD"]}
    block.create_var(out.name + "@GRAD", [2, 2], "float64")
    block.append_op(spec.type, inputs=spec.inputs, outputs=spec.outputs, attrs=spec.attrs)
    assert block.var("x@GRAD").shape == (2, 2)
    grad = np.array([[1.0, -2.0], [3.0, 0.5]])
    (value,) = _run(["x@GRAD"], {"x": np.zeros((2, 2)), out.name + "@GRAD": grad})
    np.testing.assert_array_equal(value, grad)
    printed = capsys.readouterr().out
    assert (f"g Variable: {out.name}@GRAD" in printed) is prints
    if prints:
        assert "data: [1.0, -2.0, 3.0, 0.5]" in printed


def test_print_has_no_gradient_op_when_no_gradient_flows():
    class NoGrads:
        def grad_of(self, name):
            return None

    x = L.data("x", [2], "float32")
    L.Print(x)
    op = nf.default_main_program().global_block().ops[-1]
    assert get_op_def("print").grad_maker(op, NoGrads()) == []


def test_print_inside_a_while_body_prints_every_iteration(capsys):
    """Issue 3 item 7: print also runs inside sub-blocks: once per loop iteration, with the
    value the body sees at that iteration."""
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 3)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():
        L.Print(i, message="step")
        L.increment(i)
        L.less_than(i, n, out=cond)
    (final,) = _run([i], {})
    assert final.tolist() == [3]
    printed = capsys.readouterr().out
    assert printed.count(f"step Variable: {i.name}\n") == 3
    for k in range(3):
        assert f"data: [{k}]\n" in printed


def test_print_inside_an_ifelse_branch_prints_the_branch_rows(capsys):
    """Inside an IfElse branch print shows the rows that branch got."""
    x = L.data("x", [-1, 1], "float64")
    cond = L.greater_than(x, 0.0)
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.Print(ie.input(x), message="positive", summarize=-1))
    with ie.false_block():
        ie.output(L.scale(ie.input(x), -1.0))
    (out,) = ie(cond)
    (value,) = _run([out], {"x": np.array([[-1.0], [2.0], [3.0]])})
    np.testing.assert_array_equal(value, [[1.0], [2.0], [3.0]])
    printed = capsys.readouterr().out
    assert printed.count("positive Variable: ") == 1
    assert "shape: [2, 1]" in printed and "data: [2.0, 3.0]\n" in printed


def test_print_of_a_gradient_through_append_backward(capsys):
    """print_phase="backward" prints the gradient that append_backward routes through it, and
    the gradient reaching the parameter is unchanged by the print."""
    x = L.data("x", [-1, 2], "float64")
    w = L.create_parameter([2], "float64", name="w", initializer=nf.initializer.Constant(1.0))
    h = L.Print(L.elementwise_mul(x, w), message="dh", print_phase="backward", summarize=-1)
    loss = L.mean(h)
    nf.append_backward(loss)
    assert "print_grad" in [op.type for op in nf.default_main_program().global_block().ops]
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    xs = np.array([[1.0, 2.0], [3.0, 4.0]])
    (grad,) = nf.Executor().run(feed={"x": xs}, fetch_list=["w@GRAD"], scope=scope)
    np.testing.assert_allclose(grad, xs.mean(axis=0) / 2, rtol=1e-12)
    printed = capsys.readouterr().out
    assert printed.count("dh Variable: ") == 1  # the backward pass only
    assert f"dh Variable: {h.name}@GRAD" in printed
    assert "data: [0.25, 0.25, 0.25, 0.25]\n" in printed
