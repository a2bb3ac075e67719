"""Mappers of ONNX's losses, composed of nestflow ops: NegativeLogLikelihoodLoss and
SoftmaxCrossEntropyLoss (its log-softmax, then the same picking, weighting and reduction)."""

from __future__ import annotations

from nestflow.onnx.importers.registry import Node, mapper


def _negative_log_likelihood(node: Node, log_prob: str, target: str, weight: str | None) -> str:
    """-log_prob[n, target[n, ...], ...] weighted by weight[target] (0 where the target is
    ignore_index), reduced by the node's `reduction` (mean: divided by the weights' sum)."""
    dtype = node.graph.info(log_prob).dtype
    target_dtype = node.graph.info(target).dtype
    ignore = node.attr("ignore_index")
    kept = None
    if ignore is not None:  # ignored targets pick class 0 with weight 0
        kept = node.op("not_equal", {"X": target, "Y": node.constant(ignore, target_dtype)})
        target = node.op(
            "where", {"Condition": kept, "X": target, "Y": node.constant(0, target_dtype)}
        )
    index = node.op("unsqueeze", {"X": target}, {"axes": [1]})
    picked = node.op("onnx_gather_elements", {"X": log_prob, "Index": index}, {"axis": 1})
    loss = node.op(
        "scale", {"X": node.op("squeeze", {"X": picked}, {"axes": [1]})}, {"scale": -1.0}
    )
    weights = None
    if weight is not None:
        weights = node.op("onnx_gather", {"X": weight, "Index": target}, {"axis": 0})
    if kept is not None:
        mask = node.op("cast", {"X": kept}, {"out_dtype": dtype})
        weights = mask if weights is None else node.op("elementwise_mul", {"X": weights, "Y": mask})
    if weights is not None:
        loss = node.op("elementwise_mul", {"X": loss, "Y": weights})
    reduction = node.attr("reduction", "mean")
    if reduction == "none":
        return loss
    total = node.op("reduce_sum", {"X": loss}, {"reduce_all": True})
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise node.unsupported(f"reduction '{reduction}'")
    if weights is None:
        return node.op("reduce_mean", {"X": loss}, {"reduce_all": True})
    weight_total = node.op("reduce_sum", {"X": weights}, {"reduce_all": True})
    return node.op("elementwise_div", {"X": total, "Y": weight_total})


@mapper("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(node: Node) -> None:
    weight = node.input(2) if node.has_input(2) else None
    node.set_output(0, _negative_log_likelihood(node, node.input(0), node.input(1), weight))


@mapper("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(node: Node) -> None:
    log_prob = node.op("onnx_log_softmax", {"X": node.input(0)}, {"axis": 1}, out=1)
    weight = node.input(2) if node.has_input(2) else None
    node.set_output(0, _negative_log_likelihood(node, log_prob, node.input(1), weight))
