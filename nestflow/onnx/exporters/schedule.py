"""ONNX mappers of nestflow.ops.schedule: learning-rate schedules, computed in float64 from the
global step as nestflow computes them, then cast to their dtype ([1])."""

from __future__ import annotations

import math

from nestflow.onnx.exporters.graph import OpContext, exports


class _Float64:
    """float64 arithmetic on [1] tensors for one schedule op."""

    def __init__(self, ctx: OpContext):
        self.ctx = ctx

    def c(self, value: float) -> str:
        return self.ctx.const([float(value)], "float64")

    def of(self, slot: str) -> str:
        return self.ctx.cast(self.ctx.reshape(self.ctx.input(slot), [1]), "float64")

    def op(self, op_type: str, *inputs: str) -> str:
        return self.ctx.node(op_type, list(inputs))

    def base(self) -> str:
        """The rate a schedule scales: the LearningRate input, else the attr."""
        if self.ctx.has_input("LearningRate"):
            return self.of("LearningRate")
        return self.c(self.ctx.attrs["learning_rate"])

    def ratio(self, step: str) -> str:
        a = self.ctx.attrs
        ratio = self.op("Div", step, self.c(a["decay_steps"]))
        return self.op("Floor", ratio) if a["staircase"] else ratio

    def out(self, value: str) -> None:
        self.ctx.set_output("Out", self.ctx.cast(value, self.ctx.attrs["dtype"]))


@exports("exponential_decay", "natural_exp_decay", "inverse_time_decay")
def decay(ctx: OpContext) -> None:
    f = _Float64(ctx)
    ratio = f.ratio(f.of("Step"))
    rate = f.c(ctx.attrs["decay_rate"])
    if ctx.op.type == "exponential_decay":
        factor = f.op("Pow", rate, ratio)
    elif ctx.op.type == "natural_exp_decay":
        factor = f.op("Exp", f.op("Neg", f.op("Mul", rate, ratio)))
    else:
        factor = f.op("Reciprocal", f.op("Add", f.c(1.0), f.op("Mul", rate, ratio)))
    f.out(f.op("Mul", f.base(), factor))


@exports("polynomial_decay")
def polynomial_decay(ctx: OpContext) -> None:
    a = ctx.attrs
    f = _Float64(ctx)
    step = f.of("Step")
    decay_steps = f.c(a["decay_steps"])
    if a["cycle"]:
        periods = f.op("Ceil", f.op("Div", step, decay_steps))
        periods = f.op("Max", periods, f.c(1.0))  # step 0 counts as the first period
        steps = f.op("Mul", decay_steps, periods)
    else:
        step, steps = f.op("Min", step, decay_steps), decay_steps
    left = f.op("Sub", f.c(1.0), f.op("Div", step, steps))
    end = f.c(a["end_learning_rate"])
    span = f.op("Sub", f.base(), end)
    f.out(f.op("Add", f.op("Mul", span, f.op("Pow", left, f.c(a["power"]))), end))


@exports("piecewise_decay")
def piecewise_decay(ctx: OpContext) -> None:
    f = _Float64(ctx)
    step = f.of("Step")
    boundaries, values = ctx.attrs["boundaries"], ctx.attrs["values"]
    value = f.c(values[-1])
    for boundary, below in reversed(list(zip(boundaries, values))):
        value = ctx.node("Where", [f.op("Less", step, f.c(boundary)), f.c(below), value])
    f.out(value)


@exports("cosine_decay")
def cosine_decay(ctx: OpContext) -> None:
    a = ctx.attrs
    f = _Float64(ctx)
    epoch = f.op("Floor", f.op("Div", f.of("Step"), f.c(a["step_each_epoch"])))
    angle = f.op("Mul", epoch, f.c(math.pi / a["epochs"]))
    half = f.op("Mul", f.op("Add", f.op("Cos", angle), f.c(1.0)), f.c(0.5))
    f.out(f.op("Mul", f.base(), half))


@exports("noam_decay")
def noam_decay(ctx: OpContext) -> None:
    a = ctx.attrs
    f = _Float64(ctx)
    n = f.op("Add", f.of("Step"), f.c(1.0))
    factor = f.op(
        "Min",
        f.op("Pow", n, f.c(-0.5)),
        f.op("Mul", n, f.c(a["warmup_steps"] ** -1.5)),
    )
    f.out(f.op("Mul", f.op("Mul", f.base(), f.c(a["d_model"] ** -0.5)), factor))


@exports("linear_lr_warmup")
def linear_lr_warmup(ctx: OpContext) -> None:
    a = ctx.attrs
    f = _Float64(ctx)
    step = f.of("Step")
    warmup = a["warmup_steps"]
    fraction = f.op("Div", step, f.c(warmup)) if warmup else f.c(0.0)
    rising = f.op(
        "Add", f.c(a["start_lr"]), f.op("Mul", f.c(a["end_lr"] - a["start_lr"]), fraction)
    )
    warming = f.op("Less", step, f.c(warmup))
    f.out(ctx.node("Where", [warming, rising, f.base()]))
