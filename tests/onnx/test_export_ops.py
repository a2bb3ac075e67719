"""Every exported op: onnxruntime's outputs equal nestflow's (1e-5, float32) on random inputs at
batch sizes 1, 7 and 0 (an empty batch), under opset 17 and, for a sample, 13 and 21."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.onnx.export_harness import BATCHES, Feed, OpExport, Param, case_id

pytest.importorskip("onnxruntime")

R = np.random.default_rng(1)
X = Feed([-1, 3, 4])
X2 = Feed([-1, 5])
POS = Feed([-1, 3, 4], make=lambda rng, n: rng.uniform(0.1, 3, size=(n, 3, 4)).astype("f4"))
PROB = Feed([-1, 5], make=lambda rng, n: rng.uniform(0.05, 0.95, size=(n, 5)).astype("f4"))


def _ids(high, shape=(-1, 1), dtype="int64"):
    return Feed(list(shape), dtype, low=0, high=high)


def _label_rows(classes, tail=()):
    return Feed([-1, 1, *tail], "int64", low=0, high=classes)


def _softmax_rows(rng, n):
    p = rng.uniform(0.1, 1.0, size=(n, 5)).astype("f4")
    return p / p.sum(axis=1, keepdims=True)


def _images(c=3, h=6, w=6):
    return Feed([-1, c, h, w])


def _pool(name, kind, chw=(3, 7, 7), **attrs):
    return OpExport(
        "pool2d", {"X": _images(*chw)}, {"pooling_type": kind, **attrs}, id=f"pool2d-{name}"
    )


def _filter(m, c, kh, kw):
    return Param(R.normal(size=(m, c, kh, kw)).astype("f4"))


def _binary(op, **attrs):
    return [
        OpExport(op, {"X": X, "Y": Feed([-1, 3, 4])}, attrs, id=f"{op}-same"),
        OpExport(op, {"X": X, "Y": Param(R.normal(size=(4,)).astype("f4"))}, id=f"{op}-bcast"),
        OpExport(
            op,
            {"X": X, "Y": Param(R.normal(size=(3,)).astype("f4"))},
            {"axis": 1},
            id=f"{op}-axis1",
        ),
    ]


def _bn(x: Feed) -> dict:
    """batch_norm's inputs for 3 channels: X and its four [3] parameter vectors."""
    vectors = {slot: Param(R.normal(size=3).astype("f4")) for slot in ("Scale", "Bias", "Mean")}
    return {"X": x, **vectors, "Variance": Param(R.uniform(0.5, 2, size=3).astype("f4"))}


POW_BASE = Feed([-1, 3, 4], make=lambda rng, n: rng.uniform(0.5, 2, size=(n, 3, 4)).astype("f4"))

CASES = [
    *_binary("elementwise_add"),
    *_binary("elementwise_sub"),
    *_binary("elementwise_mul"),
    *_binary("elementwise_max"),
    *_binary("elementwise_min"),
    OpExport("elementwise_div", {"X": X, "Y": POS}, id="elementwise_div"),
    OpExport(
        "elementwise_div",
        {"X": Feed([-1, 4], "int64", low=-20, high=20), "Y": Param(np.array([3, -2, 5, 7]))},
        id="elementwise_div-int-truncates",
    ),
    OpExport("elementwise_pow", {"X": POW_BASE, "Y": Param(np.array([1.5, 2, -1, 0.5], "f4"))}),
    OpExport("scale", {"X": X}, {"scale": 2.5, "bias": -1.0}),
    OpExport(
        "scale", {"X": X}, {"scale": 2.5, "bias": 1.0, "bias_after_scale": False}, id="scale-before"
    ),
    OpExport(
        "scale",
        {"X": Feed([-1, 3], "int64", low=-9, high=9)},
        {"scale": 0.5, "bias": 1.0},
        id="scale-int",
    ),
    OpExport("square", {"X": X}),
    OpExport("sum", {"X": [X, Feed([-1, 3, 4]), Feed([-1, 3, 4])]}),
    OpExport("sum", {"X": [Feed([-1, 2], "int64"), Feed([-1, 2], "int64")]}, id="sum-int"),
    OpExport("matmul", {"X": X, "Y": Param(R.normal(size=(4, 2)).astype("f4"))}),
    OpExport(
        "matmul",
        {"X": X, "Y": Param(R.normal(size=(5, 4)).astype("f4"))},
        {"transpose_Y": True, "alpha": 0.5},
        id="matmul-tY-alpha",
    ),
    OpExport(
        "matmul",
        {"X": Feed([-1, 4, 3]), "Y": Feed([-1, 4, 2])},
        {"transpose_X": True},
        id="matmul-batched-tX",
    ),
    OpExport("matmul", {"X": X, "Y": Param(R.normal(size=(4,)).astype("f4"))}, id="matmul-vecY"),
    OpExport(
        "matmul",
        {
            "X": Param(R.normal(size=(3,)).astype("f4")),
            "Y": Param(R.normal(size=(3,)).astype("f4")),
        },
        batches=(1,),
        id="matmul-two-vectors",
    ),
    OpExport(
        "matmul",
        {
            "X": Param(R.normal(size=(3,)).astype("f4")),
            "Y": Param(R.normal(size=(1, 4)).astype("f4")),
        },
        {"transpose_X": True},
        batches=(1,),
        id="matmul-column-vector",
    ),
    OpExport("mul", {"X": X2, "Y": Param(R.normal(size=(5, 3)).astype("f4"))}),
    OpExport(
        "mul",
        {"X": X, "Y": Param(R.normal(size=(4, 2)).astype("f4"))},
        {"x_num_col_dims": 2},
        id="mul-x2",
    ),
    OpExport(
        "mul",
        {"X": X, "Y": Param(R.normal(size=(6, 2, 3)).astype("f4"))},
        {"x_num_col_dims": 1, "y_num_col_dims": 2},
        id="mul-y2",
    ),
    # activations
    *[
        OpExport(op, {"X": X})
        for op in ("relu", "sigmoid", "tanh", "exp", "abs", "softsign", "softplus", "sign")
    ],
    OpExport("relu", {"X": Feed([-1, 3], "int32", low=-5, high=5)}, id="relu-int"),
    OpExport(
        "softplus",
        {"X": Feed([-1, 3], make=lambda r, n: np.tile([[-90.0, 0.0, 90.0]], (n, 1)).astype("f4"))},
        id="softplus-large",
    ),
    *[OpExport(op, {"X": POS}) for op in ("log", "sqrt", "rsqrt")],
    OpExport("softmax", {"X": X}),
    OpExport("softmax", {"X": X}, {"axis": 1}, id="softmax-axis1"),
    OpExport("pow", {"X": POS}, {"factor": 2.5}),
    OpExport("pow", {"X": POS, "FactorTensor": Param(np.array([0.5], "f4"))}, id="pow-tensor"),
    OpExport("clip", {"X": X}, {"min": -0.5, "max": 0.7}),
    OpExport("leaky_relu", {"X": X}, {"alpha": 0.1}),
    OpExport("leaky_relu", {"X": X}, {"alpha": 2.0}, id="leaky_relu-alpha2"),
    OpExport("elu", {"X": X}, {"alpha": 0.7}),
    OpExport("elu", {"X": X}, {"alpha": -0.5}, id="elu-negative-alpha"),
    OpExport("hard_sigmoid", {"X": X}, {"slope": 0.3, "offset": 0.4}),
    OpExport("gelu", {"X": X}),
    OpExport("gelu", {"X": X}, {"approximate": True}, id="gelu-tanh"),
    OpExport("swish", {"X": X}, {"beta": 1.5}),
    OpExport("clip_by_norm", {"X": X}, {"max_norm": 1.0}),
    OpExport("clip_by_norm", {"X": X}, {"max_norm": 1e4}, id="clip_by_norm-unclipped"),
    OpExport(
        "clip_by_global_norm",
        {"X": [X, X2]},
        {"max_global_norm": 1.5},
        outputs={"Out": 2},
    ),
    # logic
    *[
        OpExport(op, {"X": X, "Y": Feed([-1, 3, 4], make=lambda r, n: np.zeros((n, 3, 4), "f4"))})
        for op in ("greater_than", "less_than", "greater_equal", "less_equal")
    ],
    *[
        OpExport(op, {"X": Feed([-1, 4], "int64"), "Y": Param(np.array([1, 2, 0, 3]))})
        for op in ("equal", "not_equal")
    ],
    OpExport(
        "less_than",
        {"X": X, "Y": Param(np.array([0.0, 0.5, -0.5], "f4"))},
        {"axis": 1},
        id="less_than-axis1",
    ),
    *[
        OpExport(op, {"X": Feed([-1, 4], "bool"), "Y": Feed([-1, 4], "bool")})
        for op in ("logical_and", "logical_or", "logical_xor")
    ],
    OpExport("logical_not", {"X": Feed([-1, 4], "bool")}),
    # reductions
    OpExport("mean", {"X": X}),
    OpExport("reduce_mean", {"X": X}, {"dim": [0]}, id="reduce_mean-batch"),
    *[
        OpExport(op, {"X": X}, {"dim": [1]}, id=f"{op}-dim1")
        for op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod")
    ],
    OpExport("reduce_sum", {"X": X}, {"dim": [0, 2], "keep_dim": True}, id="reduce_sum-keep"),
    OpExport("reduce_sum", {"X": X}, {"reduce_all": True}, id="reduce_sum-all"),
    OpExport("reduce_max", {"X": X}, {"dim": [-1]}, id="reduce_max-last"),
    OpExport("reduce_sum", {"X": Feed([-1, 3], "int64")}, {"dim": [1]}, id="reduce_sum-int"),
    *[
        OpExport(op, {"X": Feed([-1, 4], "bool")}, {"dim": [1]})
        for op in ("reduce_all", "reduce_any")
    ],
    OpExport("reduce_any", {"X": Feed([-1, 4], "bool")}, {"dim": [0]}, id="reduce_any-batch"),
    # tensor
    OpExport("fill_constant", {}, {"shape": [2, 3], "dtype": "float32", "value": 1.5}),
    OpExport(
        "fill_constant", {}, {"shape": [2], "dtype": "int64", "value": 7}, id="fill_constant-int"
    ),
    OpExport("assign_value", {}, {"shape": [2, 2], "dtype": "float32", "values": [1, 2, 3, 4]}),
    OpExport("assign", {"X": X}),
    OpExport("cast", {"X": X}, {"out_dtype": "int32"}),
    OpExport("cast", {"X": Feed([-1, 3], "int64")}, {"out_dtype": "float32"}, id="cast-int-float"),
    OpExport("cast", {"X": X}, {"out_dtype": "bool"}, id="cast-bool"),
    OpExport("increment", {"X": Feed([1], "int64")}, {"step": 2.0}),
    OpExport("increment", {"X": X}, {"step": 0.5}, id="increment-float"),
    OpExport("fill_zeros_like", {"X": X}),
    OpExport("fill_any_like", {"X": X}, {"value": 3.0, "dtype": "int64"}),
    OpExport("reshape", {"X": X}, {"shape": [0, -1]}, batches=(1, 7)),  # nestflow: no [0, -1] of 0
    OpExport("reshape", {"X": X}, {"shape": [-1, 6]}, id="reshape-inferred-batch"),
    OpExport(
        "reshape", {"X": X}, {"shape": [-1, 2, 2, 3]}, batches=(1, 7), id="reshape-batch-inferred"
    ),
    OpExport("transpose", {"X": X}, {"axis": [2, 0, 1]}),
    OpExport("concat", {"X": [X, Feed([-1, 2, 4])]}, {"axis": 1}),
    OpExport("split", {"X": Feed([-1, 6])}, {"num": 3, "axis": 1}, outputs={"Out": 3}),
    OpExport(
        "split",
        {"X": Feed([-1, 6])},
        {"sections": [1, -1, 2], "axis": 1},
        outputs={"Out": 3},
        id="split-sections",
    ),
    OpExport(
        "split",
        {"X": Feed([-1, -1, 2], make=lambda r, n: r.normal(size=(n, 5, 2)).astype("f4"))},
        {"sections": [2, -1], "axis": 1},
        outputs={"Out": 2},
        id="split-run-time-rest",
    ),
    OpExport(
        "split",
        {"X": Feed([-1, -1], make=lambda r, n: r.normal(size=(n, 6)).astype("f4"))},
        {"num": 2, "axis": 1},
        outputs={"Out": 2},
        id="split-run-time-equal",
    ),
    OpExport("slice", {"Input": X}, {"axes": [1, 2], "starts": [1, -3], "ends": [3, 100]}),
    OpExport(
        "slice",
        {"Input": X},
        {"axes": [1], "starts": [2], "ends": [3], "decrease_axis": [1]},
        id="slice-decrease",
    ),
    OpExport(
        "strided_slice",
        {"Input": X},
        {"axes": [1, 2], "starts": [0, -1], "ends": [3, -1], "strides": [2, -1]},
    ),
    OpExport(
        "strided_slice",
        {"Input": X},
        {"axes": [2], "starts": [3], "ends": [0], "strides": [-2]},
        id="strided_slice-neg",
    ),
    OpExport("lookup_table", {"W": Param(R.normal(size=(6, 3)).astype("f4")), "Ids": _ids(6)}),
    OpExport(
        "lookup_table",
        {"W": Param(R.normal(size=(6, 3)).astype("f4")), "Ids": _ids(6, (-1, 4))},
        {"padding_idx": 2},
        id="lookup_table-padding",
    ),
    OpExport(
        "dropout", {"X": X}, {"dropout_prob": 0.3, "is_test": True}, outputs={"Out": 1, "Mask": 1}
    ),
    OpExport(
        "dropout",
        {"X": X},
        {"dropout_prob": 0.3},
        outputs={"Out": 1, "Mask": 1},
        id="dropout-training-becomes-test",
    ),
    # indexing
    OpExport("where", {"Condition": Feed([-1, 3, 4], "bool"), "X": X, "Y": Feed([-1, 3, 4])}),
    OpExport("where_index", {"Condition": Feed([-1, 3], "bool")}),
    OpExport("arg_max", {"X": X}, {"axis": 1}),
    OpExport(
        "arg_min",
        {"X": X},
        {"axis": -1, "keepdims": True, "dtype": "int32"},
        id="arg_min-keep-int32",
    ),
    OpExport(
        "arg_max", {"X": X}, {"axis": 0, "flatten": True}, batches=(1, 7), id="arg_max-flatten"
    ),
    OpExport("top_k", {"X": X2}, {"k": 2}, outputs={"Out": 1, "Indices": 1}),
    OpExport(
        "top_k",
        {"X": Feed([-1, 5], make=lambda r, n: r.integers(0, 3, size=(n, 5)).astype("f4"))},
        {"k": 3},
        outputs={"Out": 1, "Indices": 1},
        id="top_k-ties",
    ),
    OpExport(
        "top_k",
        {"X": X2, "K": Param(np.array([3], "int32"))},
        outputs={"Out": 1, "Indices": 1},
        id="top_k-K",
    ),
    OpExport("gather", {"X": Param(R.normal(size=(5, 3)).astype("f4")), "Index": _ids(5)}),
    OpExport(
        "gather",
        {"X": Param(R.normal(size=(5, 3)).astype("f4")), "Index": _ids(5, (-1,), "int32")},
        id="gather-int32",
    ),
    OpExport(
        "gather_nd",
        {
            "X": Param(R.normal(size=(5, 4, 3)).astype("f4")),
            "Index": Feed([-1, 2], "int64", low=0, high=4),
        },
    ),
    OpExport(
        "scatter",
        {
            "X": Param(R.normal(size=(6, 3)).astype("f4")),
            "Ids": Param(np.array([4, 1, 0])),
            "Updates": Param(R.normal(size=(3, 3)).astype("f4")),
        },
        batches=(1,),
    ),
    OpExport(
        "scatter",
        {
            "X": Param(R.normal(size=(6, 3)).astype("f4")),
            "Ids": Param(np.array([4, 1, 4])),
            "Updates": Param(R.normal(size=(3, 3)).astype("f4")),
        },
        {"overwrite": False},
        batches=(1,),
        id="scatter-add",
    ),
    OpExport("one_hot", {"X": _ids(5)}, {"depth": 5}),
    OpExport("one_hot_v2", {"X": _ids(4, (-1, 3))}, {"depth": 4, "dtype": "int64"}),
    OpExport(
        "one_hot",
        {"X": _ids(7)},
        {"depth": 5, "allow_out_of_range": True},
        id="one_hot-out-of-range",
    ),
    OpExport("pad", {"X": X}, {"paddings": [0, 0, 1, 2, 0, 1], "pad_value": -2.0}),
    OpExport("expand", {"X": X}, {"expand_times": [1, 2, 3]}),
    OpExport("squeeze", {"X": Feed([-1, 1, 4, 1])}, {"axes": [1]}),
    OpExport(
        "squeeze2", {"X": Feed([-1, 1, 4, 1])}, outputs={"Out": 1, "XShape": 1}, id="squeeze2-all"
    ),
    OpExport("unsqueeze", {"X": X}, {"axes": [0, -1]}),
    OpExport("unsqueeze2", {"X": X}, {"axes": [1, 1]}, outputs={"Out": 1, "XShape": 1}),
    OpExport("stack", {"X": [X, Feed([-1, 3, 4])]}, {"axis": -1}, outputs={"Y": 1}),
    OpExport("unstack", {"X": X}, {"axis": 1, "num": 3}, outputs={"Y": 3}),
    OpExport("cumsum", {"X": X}, {"axis": 1}),
    OpExport(
        "cumsum",
        {"X": X},
        {"axis": -1, "exclusive": True, "reverse": True},
        id="cumsum-exclusive-reverse",
    ),
    OpExport("cumsum", {"X": X}, {"flatten": True}, id="cumsum-flatten"),
    OpExport(
        "range",
        {
            "Start": Param(np.array([1], "int64")),
            "End": Param(np.array([9], "int64")),
            "Step": Param(np.array([3], "int64")),
        },
    ),
    OpExport(
        "range",
        {
            "Start": Param(np.array([0.5], "f4")),
            "End": Param(np.array([-1.0], "f4")),
            "Step": Param(np.array([-0.25], "f4")),
        },
        id="range-float-down",
    ),
    OpExport("shape", {"Input": X}),
    OpExport("fill_constant_batch_size_like", {"Input": X}, {"shape": [-1, 5], "value": 2.0}),
    OpExport(
        "fill_constant_batch_size_like",
        {"Input": X},
        {
            "shape": [2, -1, 3],
            "output_dim_idx": 1,
            "input_dim_idx": 2,
            "dtype": "int64",
            "value": 4,
        },
        id="fill_cbsl-dim1",
    ),
    # losses
    OpExport(
        "cross_entropy",
        {"X": Feed([-1, 5], make=_softmax_rows), "Label": _label_rows(5)},
        outputs={"Y": 1},
    ),
    OpExport(
        "cross_entropy",
        {
            "X": Feed([-1, 5], make=_softmax_rows),
            "Label": Feed(
                [-1, 1],
                "int64",
                make=lambda r, n: np.where(np.arange(n)[:, None] % 2 == 0, -100, 3),
            ),
        },
        outputs={"Y": 1},
        id="cross_entropy-ignored",
    ),
    OpExport(
        "cross_entropy",
        {"X": Feed([-1, 5], make=_softmax_rows), "Label": Feed([-1, 5], make=_softmax_rows)},
        {"soft_label": True},
        outputs={"Y": 1},
        id="cross_entropy-soft",
    ),
    OpExport(
        "softmax_with_cross_entropy",
        {"Logits": X2, "Label": _label_rows(5)},
        outputs={"Softmax": 1, "Loss": 1},
    ),
    OpExport(
        "softmax_with_cross_entropy",
        {"Logits": X, "Label": Feed([-1, 1, 4], "int64", low=0, high=3)},
        {"axis": 1},
        outputs={"Softmax": 1, "Loss": 1},
        id="swce-axis1",
    ),
    OpExport(
        "softmax_with_cross_entropy",
        {"Logits": X2, "Label": Feed([-1, 5], make=_softmax_rows)},
        {"soft_label": True},
        outputs={"Softmax": 1, "Loss": 1},
        id="swce-soft",
    ),
    OpExport(
        "accuracy",
        {"X": X2, "Label": _label_rows(5)},
        {"k": 2},
        outputs={"Accuracy": 1},
        batches=(1, 7),
    ),
    OpExport("sigmoid_cross_entropy_with_logits", {"X": X2, "Label": PROB}),
    OpExport(
        "sigmoid_cross_entropy_with_logits",
        {
            "X": X2,
            "Label": Feed(
                [-1, 5],
                make=lambda r, n: np.where(r.random((n, 5)) < 0.3, -100.0, r.random((n, 5))).astype(
                    "f4"
                ),
            ),
        },
        {"normalize": True},
        batches=(1, 7),
        id="sce-ignored-normalized",
    ),
    OpExport(
        "huber_loss",
        {"X": X2, "Y": Feed([-1, 5])},
        {"delta": 0.8},
        outputs={"Residual": 1, "Out": 1},
    ),
    OpExport(
        "smooth_l1_loss",
        {"X": X, "Y": Feed([-1, 3, 4])},
        {"sigma": 2.0},
        outputs={"Diff": 1, "Out": 1},
    ),
    OpExport(
        "smooth_l1_loss",
        {"X": X, "Y": Feed([-1, 3, 4]), "InsideWeight": POS, "OutsideWeight": POS},
        outputs={"Diff": 1, "Out": 1},
        id="smooth_l1-weights",
    ),
    OpExport("log_loss", {"Predicted": PROB, "Labels": PROB}, outputs={"Loss": 1}),
    *[
        OpExport(
            "kldiv_loss",
            {
                "X": X2,
                "Target": Feed(
                    [-1, 5],
                    make=lambda r, n: np.where(
                        r.random((n, 5)) < 0.3, 0.0, r.random((n, 5))
                    ).astype("f4"),
                ),
            },
            {"reduction": red},
            outputs={"Loss": 1},
            batches=(1, 7),
            id=f"kldiv-{red}",
        )
        for red in ("none", "sum", "mean", "batchmean")
    ],
    # vision
    OpExport(
        "conv2d",
        {"Input": _images(), "Filter": _filter(4, 3, 3, 3)},
        {"paddings": [1, 1]},
        outputs={"Output": 1},
    ),
    OpExport(
        "conv2d",
        {"Input": _images(4, 7, 7), "Filter": _filter(6, 2, 3, 2)},
        {"strides": [2, 1], "paddings": [1, 0, 2, 1], "dilations": [1, 2], "groups": 2},
        outputs={"Output": 1},
        id="conv2d-groups-asym",
    ),
    OpExport(
        "conv2d",
        {"Input": _images(3, 7, 5), "Filter": _filter(2, 3, 3, 3)},
        {"strides": [2, 2], "padding_algorithm": "SAME"},
        outputs={"Output": 1},
        id="conv2d-same",
    ),
    OpExport(
        "conv2d",
        {
            "Input": Feed(
                [-1, 3, -1, -1], make=lambda r, n: r.normal(size=(n, 3, 7, 5)).astype("f4")
            ),
            "Filter": _filter(2, 3, 3, 3),
        },
        {"strides": [2, 2], "padding_algorithm": "SAME"},
        outputs={"Output": 1},
        id="conv2d-same-dynamic",
    ),
    OpExport(
        "conv2d",
        {"Input": Feed([-1, 6, 6, 3]), "Filter": _filter(4, 3, 3, 3)},
        {"data_format": "NHWC", "padding_algorithm": "VALID"},
        outputs={"Output": 1},
        id="conv2d-nhwc",
    ),
    OpExport(
        "depthwise_conv2d",
        {"Input": _images(), "Filter": _filter(3, 1, 3, 3)},
        {"groups": 3, "paddings": [1, 1], "fuse_relu_before_depthwise_conv": True},
        outputs={"Output": 1},
    ),
    OpExport(
        "conv2d_transpose",
        {"Input": _images(3, 4, 5), "Filter": _filter(3, 2, 3, 3)},
        {"strides": [2, 2], "paddings": [1, 1]},
        outputs={"Output": 1},
    ),
    OpExport(
        "conv2d_transpose",
        {"Input": _images(4, 4, 4), "Filter": _filter(4, 1, 2, 3)},
        {"strides": [2, 3], "groups": 2, "output_size": [9, 13], "dilations": [2, 1]},
        outputs={"Output": 1},
        id="conv2d_transpose-output_size",
    ),
    OpExport(
        "depthwise_conv2d_transpose",
        {"Input": _images(3, 4, 4), "Filter": _filter(3, 1, 3, 3)},
        {"groups": 3},
        outputs={"Output": 1},
    ),
    _pool("max", "max", ksize=[3, 3], strides=[2, 2], paddings=[1, 1]),
    _pool("avg-exclusive", "avg", ksize=[3, 3], strides=[2, 2], paddings=[1, 1]),
    _pool("avg-inclusive", "avg", ksize=[3, 3], strides=[2, 2], paddings=[1, 1], exclusive=False),
    _pool("max-ceil", "max", (3, 8, 7), ksize=[3, 2], strides=[2, 2], ceil_mode=True),
    _pool(
        "avg-ceil", "avg", (3, 8, 7), ksize=[3, 2], strides=[2, 2], ceil_mode=True, paddings=[1, 0]
    ),
    _pool(
        "avg-ceil-inclusive",
        "avg",
        (3, 8, 7),
        ksize=[3, 2],
        strides=[2, 2],
        ceil_mode=True,
        exclusive=False,
    ),
    _pool("same", "max", ksize=[3, 3], padding_algorithm="SAME", strides=[2, 2]),
    _pool("global-avg", "avg", (3, 7, 6), ksize=[1, 1], global_pooling=True),
    _pool("adaptive-divides", "max", (3, 6, 6), ksize=[2, 3], adaptive=True),
    _pool("adaptive-uneven", "avg", (3, 7, 5), ksize=[3, 2], adaptive=True),
    OpExport(
        "pool2d",
        {"X": Feed([-1, 5, 6, 3])},
        {"pooling_type": "max", "ksize": [1, 1], "global_pooling": True, "data_format": "NHWC"},
        id="pool2d-global-max-nhwc",
    ),
    OpExport(
        "lrn",
        {"X": _images(6, 3, 3)},
        {"n": 3, "k": 1.5, "alpha": 0.2, "beta": 0.6},
        outputs={"Out": 1, "MidOut": 1},
    ),
    OpExport("lrn", {"X": _images(7, 2, 2)}, outputs={"Out": 1, "MidOut": 1}, id="lrn-defaults"),
    OpExport("flatten", {"X": X}, {"axis": 2}),
    OpExport("flatten2", {"X": X}, {"axis": 1}, outputs={"Out": 1, "XShape": 1}),
    # norm
    OpExport(
        "batch_norm", _bn(_images(3, 2, 2)), {"is_test": True}, outputs={"Y": 1, "SavedVariance": 1}
    ),
    OpExport(
        "batch_norm",
        _bn(Feed([-1, 2, 3])),
        {"is_test": True, "data_layout": "NHWC"},
        outputs={"Y": 1},
        id="batch_norm-nhwc",
    ),
    OpExport(
        "batch_norm",
        _bn(_images(3, 2, 2)),
        {"is_test": True, "trainable_statistics": True},
        outputs={"Y": 1, "MeanOut": 1, "VarianceOut": 1, "SavedMean": 1, "SavedVariance": 1},
        batches=(1, 7),
        atol=1e-4,
        id="batch_norm-batch-statistics",
    ),
    OpExport(
        "layer_norm",
        {
            "X": X,
            "Scale": Param(R.normal(size=4).astype("f4")),
            "Bias": Param(R.normal(size=4).astype("f4")),
        },
        {"begin_norm_axis": 2},
        outputs={"Y": 1, "Mean": 1, "Variance": 1},
    ),
    OpExport(
        "layer_norm", {"X": X}, {"begin_norm_axis": 1}, outputs={"Y": 1}, id="layer_norm-plain"
    ),
    # sequences
    OpExport("sequence_mask", {"X": _ids(6, (-1,))}, {"maxlen": 6}, outputs={"Y": 1}),
    OpExport(
        "sequence_mask",
        {"X": _ids(6, (-1, 2), "int32")},
        {"out_dtype": "float32"},
        outputs={"Y": 1},
        id="sequence_mask-longest",
    ),
    *[
        OpExport(
            "sequence_pool",
            {"X": Feed([-1, 5, 3]), "Length": _ids(6, (-1,))},
            {"pooltype": kind, "pad_value": -1.5},
            outputs={"Out": 1, "MaxIndex": 1},
            id=f"sequence_pool-{kind}",
        )
        for kind in ("SUM", "AVERAGE", "SQRT", "MAX", "FIRST", "LAST")
    ],
    OpExport(
        "sequence_pool",
        {"X": Feed([-1, 4, 2, 3])},
        {"pooltype": "LAST"},
        id="sequence_pool-no-length",
    ),
    OpExport(
        "sequence_reverse", {"X": Feed([-1, 5, 3]), "Length": _ids(6, (-1,))}, outputs={"Y": 1}
    ),
    OpExport(
        "sequence_reverse", {"X": Feed([-1, 5, 3])}, outputs={"Y": 1}, id="sequence_reverse-whole"
    ),
    OpExport(
        "lstm_unit",
        {"X": Feed([-1, 12]), "C_prev": Feed([-1, 3])},
        {"forget_bias": 0.5},
        outputs={"C": 1, "H": 1},
    ),
    OpExport(
        "gru_cell",
        {
            "X": Feed([-1, 9]),
            "HiddenProj": Feed([-1, 9]),
            "HiddenPrev": Feed([-1, 3]),
            "Bias": Param(R.normal(size=9).astype("f4")),
        },
        outputs={"Hidden": 1},
    ),
    OpExport("rnn_memory_boot", {"Ref": X}, {"shape": [2, 3], "value": 0.5}),
    OpExport(
        "gather_tree",
        {"Ids": Feed([-1, 2, 3], "int64", high=9), "Parents": Feed([-1, 2, 3], "int64", high=3)},
    ),
    OpExport(
        "gather_tree",
        {"Ids": Feed([-1, 4, 2], "int32", high=9), "Parents": Feed([-1, 4, 2], "int32", high=2)},
        id="gather_tree-int32",
    ),
    # control-flow helpers that are plain ops
    OpExport("select_output", {"X": X2, "Mask": Param(np.array([1], "int32"))}, outputs={"Out": 2}),
]


def _schedules(step: int) -> list[OpExport]:
    at = {"Step": Param(np.array([step], "int64"))}
    rate = {**at, "LearningRate": Param(np.array([0.3], "float32"))}
    decay = {"decay_steps": 4.0, "decay_rate": 0.5}
    cases = [
        ("exponential_decay", at, {**decay, "learning_rate": 0.1}),
        ("exponential_decay", at, {**decay, "staircase": True}),
        ("natural_exp_decay", rate, decay),
        ("inverse_time_decay", at, {**decay, "staircase": True, "dtype": "float64"}),
        ("polynomial_decay", at, {"decay_steps": 10.0, "power": 2.0, "learning_rate": 0.5}),
        ("polynomial_decay", rate, {"decay_steps": 4.0, "cycle": True}),
        ("piecewise_decay", at, {"boundaries": [3, 10], "values": [1.0, 0.5, 0.1]}),
        ("cosine_decay", at, {"step_each_epoch": 2.0, "epochs": 20.0}),
        ("noam_decay", at, {"d_model": 16.0, "warmup_steps": 5.0}),
        ("linear_lr_warmup", rate, {"warmup_steps": 10.0, "start_lr": 0.0, "end_lr": 0.2}),
    ]
    return [
        OpExport(op, inputs, attrs, batches=(1,), id=f"{op}-{i}-step{step}")
        for i, (op, inputs, attrs) in enumerate(cases)
    ]


CASES += [case for step in (0, 3, 10, 25) for case in _schedules(step)]

OPSET_SAMPLE = [
    "mul-x2",
    "fill_cbsl-dim1",
    "sequence_pool-LAST",
    "kldiv-batchmean",
    "scale-int",
    "reduce_sum-dim1",
    "reduce_max-last",
    "split-sections",
    "split-run-time-equal",
    "layer_norm",
    "unsqueeze",
    "squeeze",
    "sequence_pool-MAX",
    "lstm_unit",
    "top_k",
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op_exports_and_matches_nestflow(case):
    case.check()


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("case", [c for c in CASES if case_id(c) in OPSET_SAMPLE], ids=case_id)
def test_op_exports_under_other_opsets(case, opset):
    replace(case, opset=opset, batches=BATCHES[:2]).check()


# exported by the round trips of test_export_control_flow.py and test_export.py
CONTROL_FLOW = {
    "ifelse",
    "recurrent",
    "while",
    "conditional_block",
    "select_input",
    "block",
    "create_array",
    "array_write",
    "array_read",
    "array_length",
    "array_to_tensor",
}


def test_every_mapper_is_exercised_and_the_exclusions_are_real_ops():
    from nestflow.onnx.exporter import NOT_EXPORTED
    from nestflow.onnx.exporters import MAPPERS
    from nestflow.ops.registry import has_op
    from tests.onnx.test_export_onnx_compat import CASES as ONNX_COMPAT_CASES
    from tests.onnx.test_export_onnx_compat_ops import CASES as ONNX_COMPAT_OP_CASES

    covered = {case.op_type for case in CASES + ONNX_COMPAT_CASES} | CONTROL_FLOW
    covered |= {case.export.op_type for case in ONNX_COMPAT_OP_CASES}
    assert set(MAPPERS) - covered == set()
    assert covered - set(MAPPERS) == set()
    assert all(has_op(op) and op not in MAPPERS for op in NOT_EXPORTED)
