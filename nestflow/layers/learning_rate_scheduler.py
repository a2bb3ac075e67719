"""Learning-rate schedules as ops in the program (Fluid 1.8's learning_rate_scheduler).

Each schedule appends one op (nestflow/ops/schedule.py) computing the learning rate from the
global step, and returns its [1] variable, to pass as an optimizer's `learning_rate=`:

    >>> import nestflow as nf
    >>> lr = nf.layers.exponential_decay(0.1, decay_steps=100, decay_rate=0.5)
    >>> opt = nf.optimizer.SGD(learning_rate=lr)

The global step is the persistable int64 [1] variable `@LR_DECAY_COUNTER@` of the main
program, shared by its schedules: the startup program sets it to -1 and an `increment` op at
the head of the main program's global block adds 1 each run, so the first run sees step 0,
like Fluid's `_decay_step_counter()` (noam_decay counts from 1, as Fluid's). Being persistable
it is saved and restored with the parameters; a failed run does not advance it.

`learning_rate` is a number or another schedule's variable (schedules compose, e.g.
linear_lr_warmup(piecewise_decay(...), ...)). The result is float32 as in Fluid (or the
composed schedule's dtype); `dtype="float64"` (not in Fluid) keeps float64 precision.
"""

from __future__ import annotations

import numbers
from typing import Any

from nestflow.core.dtype import dtype_name
from nestflow.errors import AttrError
from nestflow.framework.program import (
    OpRole,
    VarDesc,
    default_main_program,
    default_startup_program,
)
from nestflow.layers.helper import append_op

__all__ = [
    "cosine_decay",
    "exponential_decay",
    "inverse_time_decay",
    "linear_lr_warmup",
    "natural_exp_decay",
    "noam_decay",
    "piecewise_decay",
    "polynomial_decay",
]

LR_DECAY_COUNTER = "@LR_DECAY_COUNTER@"


def _decay_step_counter() -> VarDesc:
    """The main program's global step (created, with its startup value -1 and the increment
    op at the head of the global block, on first use)."""
    block = default_main_program().global_block()
    counter = block.find_var(LR_DECAY_COUNTER)
    if counter is not None:
        return counter
    counter = block.create_var(LR_DECAY_COUNTER, [1], "int64", persistable=True, stop_gradient=True)
    startup = default_startup_program().global_block()
    if startup.find_var(LR_DECAY_COUNTER) is None:
        out = startup.create_var(LR_DECAY_COUNTER, [1], "int64", persistable=True)
        attrs = {"shape": [1], "dtype": "int64", "value": -1.0}
        startup.append_op("fill_constant", {}, {"Out": [out]}, attrs)
    attrs = {"step": 1.0, "op_role": OpRole.LR_SCHED}
    block.prepend_op("increment", {"X": [counter]}, {"Out": [counter]}, attrs)
    return counter


def _number(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AttrError(f"{what} must be a number, got {type(value).__name__} ({value!r})")
    return float(value)


def _schedule(op_type: str, learning_rate: Any, dtype: Any, **attrs: Any) -> VarDesc:
    """Append the `op_type` schedule op reading the global step and, when `learning_rate` is a
    variable, that variable (whose dtype the result takes unless `dtype` is given)."""
    inputs: dict[str, Any] = {"Step": _decay_step_counter()}
    if isinstance(learning_rate, VarDesc):
        inputs["LearningRate"] = learning_rate
        dtype = dtype or learning_rate.dtype
    else:
        attrs["learning_rate"] = _number(f"{op_type}: learning_rate", learning_rate)
    attrs = {
        k: _number(f"{op_type}: {k}", v) if k not in ("staircase", "cycle") else v
        for k, v in attrs.items()
    }
    attrs["dtype"] = dtype_name(dtype or "float32")
    attrs["op_role"] = OpRole.LR_SCHED
    return append_op(op_type, inputs, attrs, name=op_type, stop_gradient=True)


def exponential_decay(learning_rate, decay_steps, decay_rate, staircase=False, *, dtype=None):
    """learning_rate * decay_rate ^ (step / decay_steps), the exponent floored when
    `staircase`. AttrError for decay_steps <= 0.

    >>> lr = nf.layers.exponential_decay(0.1, decay_steps=1, decay_rate=0.5)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> [round(float(exe.run(fetch_list=[lr])[0][0]), 4) for _ in range(3)]
    [0.1, 0.05, 0.025]
    """
    attrs = {"decay_steps": decay_steps, "decay_rate": decay_rate, "staircase": bool(staircase)}
    return _schedule("exponential_decay", learning_rate, dtype, **attrs)


def natural_exp_decay(learning_rate, decay_steps, decay_rate, staircase=False, *, dtype=None):
    """learning_rate * exp(-decay_rate * step / decay_steps), the ratio floored when
    `staircase`.

    >>> lr = nf.layers.natural_exp_decay(0.1, decay_steps=1, decay_rate=1.0)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> [round(float(exe.run(fetch_list=[lr])[0][0]), 4) for _ in range(3)]
    [0.1, 0.0368, 0.0135]
    """
    attrs = {"decay_steps": decay_steps, "decay_rate": decay_rate, "staircase": bool(staircase)}
    return _schedule("natural_exp_decay", learning_rate, dtype, **attrs)


def inverse_time_decay(learning_rate, decay_steps, decay_rate, staircase=False, *, dtype=None):
    """learning_rate / (1 + decay_rate * step / decay_steps), the ratio floored when
    `staircase`.

    >>> lr = nf.layers.inverse_time_decay(0.1, decay_steps=1, decay_rate=1.0)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> [round(float(exe.run(fetch_list=[lr])[0][0]), 4) for _ in range(3)]
    [0.1, 0.05, 0.0333]
    """
    attrs = {"decay_steps": decay_steps, "decay_rate": decay_rate, "staircase": bool(staircase)}
    return _schedule("inverse_time_decay", learning_rate, dtype, **attrs)


def polynomial_decay(
    learning_rate, decay_steps, end_learning_rate=0.0001, power=1.0, cycle=False, *, dtype=None
):
    """(learning_rate - end_learning_rate) * (1 - step / decay_steps) ^ power +
    end_learning_rate, the step held at decay_steps; with `cycle` the decay restarts, over
    decay_steps * ceil(step / decay_steps) steps.

    >>> lr = nf.layers.polynomial_decay(0.1, decay_steps=2, end_learning_rate=0.0)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> [round(float(exe.run(fetch_list=[lr])[0][0]), 4) for _ in range(3)]
    [0.1, 0.05, 0.0]
    """
    attrs = {
        "decay_steps": decay_steps,
        "end_learning_rate": end_learning_rate,
        "power": power,
        "cycle": bool(cycle),
    }
    return _schedule("polynomial_decay", learning_rate, dtype, **attrs)


def piecewise_decay(boundaries, values, *, dtype=None):
    """values[i] while step < boundaries[i] (and after boundaries[i - 1]), values[-1] from the
    last boundary on. `boundaries` must increase strictly and `values` have one more entry
    (AttrError otherwise).

    >>> lr = nf.layers.piecewise_decay(boundaries=[1, 2], values=[0.1, 0.01, 0.001])
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> [round(float(exe.run(fetch_list=[lr])[0][0]), 4) for _ in range(3)]
    [0.1, 0.01, 0.001]
    """
    if not isinstance(boundaries, (list, tuple)) or not isinstance(values, (list, tuple)):
        raise AttrError(
            f"piecewise_decay: boundaries and values must be lists, got {boundaries!r} and "
            f"{values!r}"
        )
    inputs = {"Step": _decay_step_counter()}
    attrs = {
        "boundaries": [_number("piecewise_decay: boundaries", b) for b in boundaries],
        "values": [_number("piecewise_decay: values", v) for v in values],
        "dtype": dtype_name(dtype or "float32"),
        "op_role": OpRole.LR_SCHED,
    }
    return append_op("piecewise_decay", inputs, attrs, name="piecewise_decay", stop_gradient=True)


def cosine_decay(learning_rate, step_each_epoch, epochs, *, dtype=None):
    """learning_rate * 0.5 * (cos(epoch * pi / epochs) + 1), epoch = floor(step /
    step_each_epoch).

    >>> lr = nf.layers.cosine_decay(0.1, step_each_epoch=1, epochs=2)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> [round(float(exe.run(fetch_list=[lr])[0][0]), 4) for _ in range(3)]
    [0.1, 0.05, 0.0]
    """
    attrs = {"step_each_epoch": step_each_epoch, "epochs": epochs}
    return _schedule("cosine_decay", learning_rate, dtype, **attrs)


def noam_decay(d_model, warmup_steps, learning_rate=1.0, *, dtype=None):
    """learning_rate * d_model^-0.5 * min(n^-0.5, warmup_steps^-1.5 * n), n = step + 1 (the
    Transformer's schedule; Fluid's noam counts from 1).

    >>> lr = nf.layers.noam_decay(d_model=4, warmup_steps=2)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> [round(float(exe.run(fetch_list=[lr])[0][0]), 4) for _ in range(3)]
    [0.1768, 0.3536, 0.2887]
    """
    attrs = {"d_model": d_model, "warmup_steps": warmup_steps}
    return _schedule("noam_decay", learning_rate, dtype, **attrs)


def linear_lr_warmup(learning_rate, warmup_steps, start_lr, end_lr, *, dtype=None):
    """start_lr + (end_lr - start_lr) * step / warmup_steps while step < warmup_steps, then
    learning_rate (a number or another schedule's variable, evaluated at the same step).

    >>> lr = nf.layers.linear_lr_warmup(0.1, warmup_steps=2, start_lr=0.0, end_lr=0.1)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> [round(float(exe.run(fetch_list=[lr])[0][0]), 4) for _ in range(3)]
    [0.0, 0.05, 0.1]
    """
    attrs = {"warmup_steps": warmup_steps, "start_lr": start_lr, "end_lr": end_lr}
    return _schedule("linear_lr_warmup", learning_rate, dtype, **attrs)
