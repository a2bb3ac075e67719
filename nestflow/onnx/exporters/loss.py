"""ONNX mappers of nestflow.ops.loss: cross entropies, accuracy, regression and binary losses."""

from __future__ import annotations

from nestflow.onnx.exporters.graph import OpContext, exports


def _picked(ctx: OpContext, scores: str, axis: int) -> str:
    """-scores[label] along `axis` per row, 0 where the label is ignore_index (those rows'
    labels are replaced by 0 before the gather, which needs valid indexes)."""
    score_var = ctx.in_var("Logits" if ctx.has_input("Logits") else "X")
    label = ctx.input("Label")
    if ctx.in_var("Label").ndim < score_var.ndim:  # class ids given without the class dim
        label = ctx.unsqueeze(label, [axis])
    ignored = ctx.node("Equal", [label, ctx.scalar(ctx.attrs["ignore_index"], "int64")])
    ids = ctx.node("Where", [ignored, ctx.scalar(0, "int64"), label])
    picked = ctx.node("Neg", [ctx.node("GatherElements", [scores, ids], axis=axis)])
    return ctx.node("Where", [ignored, ctx.scalar(0, score_var.dtype), picked])


def _soft(ctx: OpContext, log_scores: str, axis: int) -> str:
    product = ctx.node("Mul", [ctx.input("Label"), log_scores])
    return ctx.node("Neg", [ctx.reduce("ReduceSum", product, [axis], keepdims=True)])


@exports("cross_entropy")
def cross_entropy(ctx: OpContext) -> None:
    x = ctx.input("X")
    axis = ctx.in_var("X").ndim - 1
    if ctx.attrs["soft_label"]:
        ctx.set_output("Y", _soft(ctx, ctx.node("Log", [x]), axis))
    else:
        ctx.set_output("Y", _picked(ctx, ctx.node("Log", [x]), axis))


@exports("softmax_with_cross_entropy")
def softmax_with_cross_entropy(ctx: OpContext) -> None:
    logits = ctx.input("Logits")
    axis = ctx.attrs["axis"] % ctx.in_var("Logits").ndim
    ctx.set_output("Softmax", ctx.node("Softmax", [logits], axis=axis))
    log_softmax = ctx.node("LogSoftmax", [logits], axis=axis)
    if ctx.attrs["soft_label"]:
        ctx.set_output("Loss", _soft(ctx, log_softmax, axis))
    else:
        ctx.set_output("Loss", _picked(ctx, log_softmax, axis))


@exports("accuracy")
def accuracy(ctx: OpContext) -> None:
    k = ctx.ints([ctx.attrs["k"]])
    _, top = ctx.node("TopK", [ctx.input("X"), k], outputs=2, axis=1, largest=1)
    labels = ctx.reshape(ctx.input("Label"), [-1, 1])
    hits = ctx.cast(ctx.node("Equal", [top, labels]), "float32")
    per_row = ctx.reduce("ReduceMax", hits, [1], keepdims=False)
    ctx.set_output("Accuracy", ctx.reduce("ReduceMean", per_row, None, keepdims=False))


def _ignored_and_normalized(ctx: OpContext, values: str, label: str, dtype: str) -> str:
    """values zeroed where trunc(label) == ignore_index; with normalize divided by the count
    of the others (at least 1)."""
    ignored = ctx.node(
        "Equal", [ctx.cast(label, "int64"), ctx.scalar(ctx.attrs["ignore_index"], "int64")]
    )
    values = ctx.node("Where", [ignored, ctx.scalar(0, dtype), values])
    if not ctx.attrs["normalize"]:
        return values
    kept = ctx.reduce("ReduceSum", ctx.cast(ctx.node("Not", [ignored]), dtype), None, False)
    return ctx.node("Div", [values, ctx.node("Max", [kept, ctx.scalar(1, dtype)])])


@exports("sigmoid_cross_entropy_with_logits")
def sigmoid_cross_entropy_with_logits(ctx: OpContext) -> None:
    x, label, dtype = ctx.input("X"), ctx.input("Label"), ctx.in_var("X").dtype
    positive = ctx.node("Max", [x, ctx.scalar(0, dtype)])
    tail = ctx.node("Exp", [ctx.node("Neg", [ctx.node("Abs", [x])])])
    log1p = ctx.node("Log", [ctx.node("Add", [tail, ctx.scalar(1, dtype)])])
    loss = ctx.node("Add", [ctx.node("Sub", [positive, ctx.node("Mul", [x, label])]), log1p])
    ctx.set_output("Out", _ignored_and_normalized(ctx, loss, label, dtype))


@exports("huber_loss")
def huber_loss(ctx: OpContext) -> None:
    dtype, delta = ctx.in_var("X").dtype, ctx.attrs["delta"]
    residual = ctx.node("Sub", [ctx.input("Y"), ctx.input("X")])
    size = ctx.node("Abs", [residual])
    square = ctx.node("Mul", [ctx.node("Mul", [residual, residual]), ctx.scalar(0.5, dtype)])
    linear = ctx.node(
        "Mul",
        [ctx.node("Sub", [size, ctx.scalar(0.5 * delta, dtype)]), ctx.scalar(delta, dtype)],
    )
    inside = ctx.node("LessOrEqual", [size, ctx.scalar(delta, dtype)])
    ctx.set_output("Residual", residual)
    ctx.set_output("Out", ctx.node("Where", [inside, square, linear]))


@exports("smooth_l1_loss")
def smooth_l1_loss(ctx: OpContext) -> None:
    dtype, sigma = ctx.in_var("X").dtype, ctx.attrs["sigma"]
    diff = ctx.node("Sub", [ctx.input("X"), ctx.input("Y")])
    if ctx.has_input("InsideWeight"):
        diff = ctx.node("Mul", [diff, ctx.input("InsideWeight")])
    s2 = sigma * sigma
    size = ctx.node("Abs", [diff])
    square = ctx.node("Mul", [ctx.node("Mul", [diff, diff]), ctx.scalar(0.5 * s2, dtype)])
    linear = ctx.node("Sub", [size, ctx.scalar(0.5 / s2, dtype)])
    errors = ctx.node(
        "Where", [ctx.node("Less", [size, ctx.scalar(1.0 / s2, dtype)]), square, linear]
    )
    if ctx.has_input("OutsideWeight"):
        errors = ctx.node("Mul", [errors, ctx.input("OutsideWeight")])
    rows = ctx.node("Flatten", [errors], axis=1)  # [N, rest], also for an empty batch
    ctx.set_output("Diff", diff)
    ctx.set_output("Out", ctx.reduce("ReduceSum", rows, [1], keepdims=True))


@exports("log_loss")
def log_loss(ctx: OpContext) -> None:
    p, y = ctx.input("Predicted"), ctx.input("Labels")
    dtype = ctx.in_var("Predicted").dtype
    eps, one = ctx.scalar(ctx.attrs["epsilon"], dtype), ctx.scalar(1, dtype)
    hit = ctx.node("Mul", [y, ctx.node("Log", [ctx.node("Add", [p, eps])])])
    miss_p = ctx.node("Add", [ctx.node("Sub", [one, p]), eps])
    miss = ctx.node("Mul", [ctx.node("Sub", [one, y]), ctx.node("Log", [miss_p])])
    ctx.set_output("Loss", ctx.node("Neg", [ctx.node("Add", [hit, miss])]))


@exports("kldiv_loss")
def kldiv_loss(ctx: OpContext) -> None:
    x, target, dtype = ctx.input("X"), ctx.input("Target"), ctx.in_var("X").dtype
    zero, one = ctx.scalar(0, dtype), ctx.scalar(1, dtype)
    positive = ctx.node("Greater", [target, zero])
    safe_log = ctx.node("Log", [ctx.node("Where", [positive, target, one])])
    pointwise = ctx.node("Mul", [target, ctx.node("Sub", [safe_log, x])])
    pointwise = ctx.node("Where", [positive, pointwise, zero])
    reduction = ctx.attrs["reduction"]
    if reduction == "none":
        ctx.set_output("Loss", pointwise)
        return
    total = ctx.reduce("ReduceSum", pointwise, None, keepdims=False)
    if reduction == "sum":
        ctx.set_output("Loss", total)
        return
    if reduction == "mean":  # over every element
        count = ctx.cast(ctx.node("Size", [x]), dtype)
    else:  # batchmean: over the first dim's size
        count = ctx.to_scalar(ctx.cast(ctx.dim(x, 0), dtype))
    ctx.set_output("Loss", ctx.node("Div", [total, count]))
