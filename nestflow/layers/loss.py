"""Loss layers, with Fluid 1.8's signatures and defaults.

Each appends the Fluid op of the same name (square_error_cost composes elementwise_sub and
square, as Fluid does; smooth_l1 appends smooth_l1_loss). Inputs are floats of one shape
unless said otherwise; labels, targets and weights get no gradient, as in Fluid.

    >>> import nestflow as nf
    >>> p = nf.data("p", [4, 1], "float32")
    >>> y = nf.data("y", [4, 1], "float32")
    >>> nf.layers.square_error_cost(p, y).shape
    (4, 1)
"""

from __future__ import annotations

from nestflow.framework.program import VarDesc
from nestflow.layers.helper import append_op, as_float, as_int

__all__ = [
    "square_error_cost",
    "sigmoid_cross_entropy_with_logits",
    "huber_loss",
    "smooth_l1",
    "log_loss",
    "kldiv_loss",
]


def square_error_cost(input: VarDesc, label: VarDesc) -> VarDesc:
    """(input - label) ** 2 per element (elementwise_sub, then square).

    >>> pred, label = nf.data("pred", [-1, 1]), nf.data("label", [-1, 1])
    >>> cost = nf.layers.square_error_cost(pred, label)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"pred": np.array([[1.0], [3.0]], "float32"),
    ...     "label": np.array([[0.0], [1.0]], "float32")}, fetch_list=[cost])[0]
    array([[1.],
           [4.]], dtype=float32)
    """
    minus = append_op("elementwise_sub", {"X": input, "Y": label}, {"axis": -1})
    return append_op("square", {"X": minus})


def sigmoid_cross_entropy_with_logits(
    x: VarDesc,
    label: VarDesc,
    ignore_index: int = -100,
    name: str | None = None,
    normalize: bool = False,
) -> VarDesc:
    """The cross entropy of sigmoid(x) against probabilities `label` (x's shape), per element;
    elements labelled `ignore_index` give 0, and `normalize` divides by the count of the
    others.

    >>> x, label = nf.data("x", [-1, 2]), nf.data("label", [-1, 2])
    >>> loss = nf.layers.sigmoid_cross_entropy_with_logits(x, label)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"x": np.zeros((1, 2), "float32"),
    ...     "label": np.array([[0.0, 1.0]], "float32")}, fetch_list=[loss])[0].round(4)
    array([[0.6931, 0.6931]], dtype=float32)
    """
    attrs = {
        "ignore_index": as_int(ignore_index, "sigmoid_cross_entropy_with_logits: ignore_index"),
        "normalize": bool(normalize),
    }
    return append_op(
        "sigmoid_cross_entropy_with_logits", {"X": x, "Label": label}, attrs, name=name
    )


def huber_loss(input: VarDesc, label: VarDesc, delta: float) -> VarDesc:
    """0.5 * r^2 where |r| <= delta, else delta * (|r| - 0.5 * delta), for r = label - input;
    shaped like input ([N, 1] in Fluid).

    >>> pred, label = nf.data("pred", [-1, 1]), nf.data("label", [-1, 1])
    >>> loss = nf.layers.huber_loss(pred, label, delta=1.0)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"pred": np.array([[0.0], [0.0]], "float32"),
    ...     "label": np.array([[0.5], [3.0]], "float32")}, fetch_list=[loss])[0]
    array([[0.125],
           [2.5  ]], dtype=float32)
    """
    attrs = {"delta": as_float(delta, "huber_loss: delta")}
    _residual, out = append_op(
        "huber_loss", {"X": input, "Y": label}, attrs, outputs=("Residual", "Out")
    )
    return out


def smooth_l1(
    x: VarDesc,
    y: VarDesc,
    inside_weight: VarDesc | None = None,
    outside_weight: VarDesc | None = None,
    sigma: float | None = None,
) -> VarDesc:
    """The smooth L1 loss of x - y [N, ...] summed per row: [N, 1]. Elementwise weights go
    inside (on x - y) and outside (on each element's loss), both or neither; sigma (default
    1.0) sets where the quadratic part ends (|x - y| < 1 / sigma^2).

    >>> x, y = nf.data("x", [-1, 2]), nf.data("y", [-1, 2])
    >>> nf.layers.smooth_l1(x, y).shape
    (-1, 1)
    """
    inputs = {"X": x, "Y": y}
    if inside_weight is not None:
        inputs["InsideWeight"] = inside_weight
    if outside_weight is not None:
        inputs["OutsideWeight"] = outside_weight
    attrs = {"sigma": 1.0 if sigma is None else as_float(sigma, "smooth_l1: sigma")}
    _diff, out = append_op("smooth_l1_loss", inputs, attrs, outputs=("Diff", "Out"))
    return out


def log_loss(
    input: VarDesc, label: VarDesc, epsilon: float = 1e-4, name: str | None = None
) -> VarDesc:
    """-label * log(input + epsilon) - (1 - label) * log(1 - input + epsilon) per element, for
    probabilities `input` ([N, 1] in Fluid).

    >>> prob, label = nf.data("prob", [-1, 1]), nf.data("label", [-1, 1])
    >>> loss = nf.layers.log_loss(prob, label)
    >>> nf.Executor(nf.CPUPlace()).run(feed={"prob": np.array([[0.5]], "float32"),
    ...     "label": np.array([[1.0]], "float32")}, fetch_list=[loss])[0].round(4)
    array([[0.6929]], dtype=float32)
    """
    attrs = {"epsilon": as_float(epsilon, "log_loss: epsilon")}
    return append_op(
        "log_loss", {"Predicted": input, "Labels": label}, attrs, outputs=("Loss",), name=name
    )


def kldiv_loss(
    x: VarDesc, target: VarDesc, reduction: str = "mean", name: str | None = None
) -> VarDesc:
    """The KL divergence target * (log(target) - x) of log-probabilities x from `target`,
    reduced by "none", "sum", "mean" or "batchmean" (reduced: a 0-d result).

    >>> x, target = nf.data("x", [-1, 2]), nf.data("target", [-1, 2])
    >>> loss = nf.layers.kldiv_loss(x, target, reduction="sum")
    >>> float(nf.Executor(nf.CPUPlace()).run(feed={"x": np.log(np.array([[0.5, 0.5]], "float32")),
    ...     "target": np.array([[0.5, 0.5]], "float32")}, fetch_list=[loss])[0])
    0.0
    """
    return append_op(
        "kldiv_loss",
        {"X": x, "Target": target},
        {"reduction": reduction},
        outputs=("Loss",),
        name=name,
    )
