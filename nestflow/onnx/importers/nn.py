"""Mappers of ONNX's network layers: Conv, pooling, normalisation, LRN, Dropout, softmax.

nestflow's conv2d/pool2d are 2-D: a 1-D Conv or pool runs as a 2-D one over [N, C, 1, W]
(its input unsqueezed at dim 2, its output squeezed back). ONNX pads are
[x1_begin, x2_begin, x1_end, x2_end]; nestflow's [top, bottom, left, right].
"""

from __future__ import annotations

import math

import numpy as np

from nestflow.errors import AttrError
from nestflow.onnx.importers.registry import Node, mapper


def _ints_attr(node: Node, name: str, count: int, least: int, default=None) -> list[int]:
    """Attribute `name` of a Conv or pool node: `count` ints, each >= `least`. Checked here,
    not left to the kernel: a stride of 0 would divide by zero, a negative pad or dilation
    index out of the input."""
    values = node.attr(name, default)
    if (
        not isinstance(values, list)
        or len(values) != count
        or any(not isinstance(v, int) or v < least for v in values)
    ):
        raise AttrError(
            f"attribute {name}={values} must be {count} ints >= {least} (one per spatial dim"
            f"{', begins then ends' if name == 'pads' else ''})"
        )
    return values


def _group(node: Node, channels: int, w_shape) -> int:
    """The `group` attribute: >= 1 and fitting the input's channels C and the filter W (where
    known): a Conv's W is [M, C / group, ...], a ConvTranspose's [C, M / group, ...]."""
    group = node.attr("group", 1)
    fits = isinstance(group, int) and group >= 1
    if fits and node.op_type == "Conv":
        fits = (channels < 0 or w_shape[1] < 0 or channels == w_shape[1] * group) and (
            w_shape[0] < 0 or w_shape[0] % group == 0
        )
    elif fits:
        fits = (channels < 0 or w_shape[0] < 0 or channels == w_shape[0]) and (
            channels < 0 or channels % group == 0
        )
    if not fits:
        raise AttrError(
            f"attribute group={group} does not fit input channels {channels} and filter "
            f"shape {list(w_shape)}"
        )
    return group


def _spatial_attrs(node: Node, x_shape, kernel) -> dict:
    """Strides, dilations and nestflow paddings of a Conv or pool node over input `x_shape`
    with window `kernel` (auto_pad SAME_* resolved from the input's spatial sizes)."""
    dims = len(kernel)
    strides = _ints_attr(node, "strides", dims, 1, [1] * dims)
    dilations = _ints_attr(node, "dilations", dims, 1, [1] * dims)
    auto_pad = node.attr("auto_pad", "NOTSET")
    pads = _ints_attr(node, "pads", 2 * dims, 0, [0] * 2 * dims)
    if auto_pad == "VALID":
        pads = [0] * 2 * dims
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        sizes = x_shape[2:]
        if any(s < 0 for s in sizes):
            raise node.unsupported(
                f"auto_pad {auto_pad} over input {list(x_shape)} of unknown spatial size"
            )
        begins, ends = [], []
        for size, k, s, d in zip(sizes, kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, large = total // 2, total - total // 2
            begin, end = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
            begins.append(begin)
            ends.append(end)
        pads = begins + ends
    elif auto_pad != "NOTSET":
        raise node.unsupported(f"auto_pad '{auto_pad}'")
    return {"strides": list(strides), "dilations": list(dilations), "pads": list(pads)}


def _as_2d(geometry: dict, dims: int) -> dict:
    """ONNX geometry of 1 or 2 spatial dims as nestflow 2-D attrs."""
    pads = geometry["pads"]
    if dims == 1:
        return {
            "strides": [1, *geometry["strides"]],
            "dilations": [1, *geometry["dilations"]],
            "paddings": [0, 0, pads[0], pads[1]],
        }
    return {
        "strides": geometry["strides"],
        "dilations": geometry["dilations"],
        "paddings": [pads[0], pads[2], pads[1], pads[3]],
    }


def _spatial_dims(node: Node, rank: int) -> int:
    dims = rank - 2
    if dims not in (1, 2):
        raise node.unsupported(f"{node.op_type} over {dims} spatial dims (input rank {rank})")
    return dims


def _to_4d(node: Node, x: str, dims: int) -> str:
    return x if dims == 2 else node.op("unsqueeze", {"X": x}, {"axes": [2]})


def _from_4d(node: Node, y: str, dims: int, out: int = 0) -> None:
    if dims == 2:
        node.set_output(out, y)
    else:
        node.op("squeeze", {"X": y}, {"axes": [2]}, out=out)


@mapper("Conv")
def conv(node: Node) -> None:
    """Conv, with what follows it when only it reads the conv: an inference
    BatchNormalization of constants (folded into the filter and bias), then (2-D only) an
    Add or Sum of one other value already computed (conv2d's ResidualData), then a Relu
    (conv2d's fused relu); one conv2d op computes them all."""
    x_shape, w_shape = node.shape(0), node.shape(1)
    dims = _spatial_dims(node, len(x_shape))
    kernel = _kernel(node, dims, w_shape)
    geometry = _as_2d(_spatial_attrs(node, x_shape, kernel), dims)
    attrs = {**geometry, "groups": _group(node, x_shape[1], w_shape)}
    folded = _folded_batch_norm(node)
    if folded is not None:
        w, bias = (node.constant(v) for v in folded[:2])
    else:
        w, bias = node.input(1), node.input(2)
    inputs = {"Input": _to_4d(node, node.input(0), dims), "Filter": _to_4d(node, w, dims)}
    inputs["Bias"] = bias  # B [M] lines up with the channels (dim 1)
    last = folded[2] if folded is not None else node.proto.output[0]
    absorbed = [] if folded is None else [last]
    if dims == 2:
        out_shape = _conv_output_shape(x_shape, w_shape, geometry)
        residual, relu, after = _fused_after(node, last, out_shape)
        if residual is not None:
            inputs["ResidualData"] = residual
            attrs["fuse_residual_connection"] = True
        if relu:
            attrs["fuse_activation"] = "relu"
        absorbed += after
    y = node.op("conv2d", inputs, attrs, outputs=("Output",))
    _from_4d(node, y, dims)
    for name in absorbed:  # bound to the fused result when the importer reaches them
        node.graph.absorbed[name] = node.name_of_output(0)


def _kernel(node: Node, dims: int, w_shape) -> list[int]:
    """A Conv's or ConvTranspose's kernel_shape: W's spatial dims, which the attribute (when
    given) must repeat."""
    if len(w_shape) != dims + 2:
        raise AttrError(f"filter W of shape {list(w_shape)} must have rank {dims + 2}")
    known = list(w_shape[2:])
    if node.has_attr("kernel_shape"):
        kernel = _ints_attr(node, "kernel_shape", dims, 1)
        if any(k != w for k, w in zip(kernel, known) if w >= 0):
            raise AttrError(f"attribute kernel_shape={kernel} differs from W's {known}")
        return kernel
    return known


def _conv_output_shape(x_shape, w_shape, geometry: dict) -> tuple[int, ...]:
    """A 2-D Conv's output shape (-1 where unknown) from nestflow's 2-D geometry."""
    sizes = []
    for d in range(2):
        size, k = x_shape[2 + d], w_shape[2 + d]
        extent = geometry["dilations"][d] * (k - 1) + 1
        pads = geometry["paddings"][2 * d] + geometry["paddings"][2 * d + 1]
        stride = geometry["strides"][d]
        sizes.append(-1 if size < 0 or k < 0 else (size + pads - extent) // stride + 1)
    return (x_shape[0], w_shape[0], *sizes)


def _reader(node: Node, name: str, *op_types: str):
    """The one node (of the default domain and one of op_types) reading value `name`."""
    readers = node.graph.readers.get(name, [])
    reader = readers[0] if len(readers) == 1 else None
    if reader is None or reader.domain not in ("", "ai.onnx") or reader.op_type not in op_types:
        return None
    return reader


def _fused_after(node: Node, name: str, out_shape) -> tuple[str | None, bool, list[str]]:
    """What conv2d's fused form computes of the nodes after value `name` (the conv's result):
    (ResidualData: the other addend of an Add or Sum of two values that only it reads, when
    that addend is already computed, of the conv's dtype and adds into its output in place;
    whether a Relu alone reads the result; the ONNX values thereby computed)."""
    graph, residual, absorbed = node.graph, None, []
    add = _reader(node, name, "Add", "Sum")
    if add is not None and len(add.input) == 2 and len(add.output) == 1 and add.output[0]:
        other = add.input[1] if add.input[0] == name else add.input[0]
        bound = graph.lookup(other) if other and other != name else None
        info = graph.info(bound) if bound is not None else None
        if info is not None and info.dtype == node.dtype(0) and _adds_into(info.shape, out_shape):
            residual, name = bound, add.output[0]
            absorbed.append(name)
    relu = _reader(node, name, "Relu")
    if relu is not None and len(relu.output) == 1 and relu.output[0]:
        absorbed.append(relu.output[0])
    return residual, relu is not None, absorbed


def _adds_into(shape, into) -> bool:
    """Whether an Add of a value of `shape` to one of shape `into` has shape `into` (-1:
    unknown; an unknown dim in both, such as the batch, is taken to be one size)."""
    return len(shape) == len(into) and all(
        s == t or s == 1 or (s < 0 and t > 1) for s, t in zip(shape, into)
    )


def _folded_batch_norm(node: Node) -> tuple[np.ndarray, np.ndarray, str] | None:
    """When the Conv's filter (and bias) and the statistics of the inference
    BatchNormalization that alone reads its output are all constants: the filter and bias
    with that affine map folded in (constant folding: Y = conv(X, W * f) + (B - mean) * f +
    beta, f = scale / sqrt(var + epsilon)), and the BatchNormalization's output name."""
    bn = node.sole_reader(0)
    if bn is None or bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
        return None
    bn_attrs = {a.name: a for a in bn.attribute}
    if "training_mode" in bn_attrs and bn_attrs["training_mode"].i:
        return None
    if len([o for o in bn.output if o]) != 1 or not bn.output[0]:
        return None
    graph = node.graph
    values = [graph.consts.get(graph.lookup(name) or "") for name in bn.input[1:5]]
    w = node.fixed(1)
    b = node.fixed(2) if node.has_input(2) else np.zeros(1, "float32")
    if w is None or b is None or any(v is None for v in values) or len(bn.input) != 5:
        return None
    epsilon = bn_attrs["epsilon"].f if "epsilon" in bn_attrs else 1e-5
    scale, beta, mean, var = (v.astype(np.float64) for v in values)
    factor = scale / np.sqrt(var + epsilon)
    shape = (-1,) + (1,) * (w.ndim - 1)
    weight = (w.astype(np.float64) * factor.reshape(shape)).astype(w.dtype)
    bias = ((b.astype(np.float64) - mean) * factor + beta).astype(w.dtype)
    return weight, bias, bn.output[0]


# ---- pooling ----


def _ceil_mode(node: Node, x_shape, geometry: dict, kernel) -> bool:
    """Whether nestflow's ceil_mode gives ONNX's output size: ONNX drops a last window that
    would start in the end padding, where pool2d (Fluid) refuses it; that output size is then
    the floor one."""
    if not node.attr("ceil_mode", 0):
        return False
    dims = len(kernel)
    sizes, pads, strides = x_shape[2:], geometry["pads"], geometry["strides"]
    if any(s < 0 for s in sizes):
        return True
    for d in range(dims):
        span = sizes[d] + pads[d] + pads[dims + d] - kernel[d]
        ceil_out = -(-span // strides[d]) + 1
        if (ceil_out - 1) * strides[d] >= sizes[d] + pads[d]:
            ceil_out -= 1
        if ceil_out != span // strides[d] + 1:
            return True
    return False


@mapper("MaxPool", "AveragePool")
def pool(node: Node) -> None:
    x_shape = node.shape(0)
    dims = _spatial_dims(node, len(x_shape))
    kernel = _ints_attr(node, "kernel_shape", dims, 1)
    geometry = _spatial_attrs(node, x_shape, kernel)
    if any(d != 1 for d in geometry["dilations"]):
        raise node.unsupported(f"{node.op_type} with dilations {geometry['dilations']}")
    if node.wants_output(1):
        raise node.unsupported("MaxPool's Indices output")
    if node.attr("storage_order", 0):
        raise node.unsupported("storage_order=1")
    ceil_mode = _ceil_mode(node, x_shape, geometry, kernel)
    x = _to_4d(node, node.input(0), dims)
    dtype = node.dtype(0)
    if dtype in ("int8", "uint8"):  # pool2d computes in floats; 8-bit values are exact there
        x = node.op("cast", {"X": x}, {"out_dtype": "float32"})
    include_pad = node.op_type == "AveragePool" and node.attr("count_include_pad", 0)
    if include_pad and any(geometry["pads"]):
        # ONNX averages the declared padding (as zeros) but not what ceil_mode adds past it:
        # pad explicitly, then average the padded input's elements only.
        pads = _as_2d(geometry, dims)["paddings"]
        x = node.op("pad", {"X": x}, {"paddings": [0, 0, 0, 0, *pads], "pad_value": 0.0})
        geometry = {**geometry, "pads": [0] * len(geometry["pads"])}
    attrs = {
        "pooling_type": "max" if node.op_type == "MaxPool" else "avg",
        "ksize": list(kernel) if dims == 2 else [1, *kernel],
        "strides": _as_2d(geometry, dims)["strides"],
        "paddings": _as_2d(geometry, dims)["paddings"],
        "ceil_mode": ceil_mode,
        "exclusive": True,
    }
    y = node.op("pool2d", {"X": x}, attrs)
    if dtype in ("int8", "uint8"):
        y = node.op("cast", {"X": y}, {"out_dtype": dtype})
    _from_4d(node, y, dims)


@mapper("GlobalAveragePool", "GlobalMaxPool")
def global_pool(node: Node) -> None:
    rank = node.rank(0)
    op_type = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    attrs = {"dim": list(range(2, rank)), "keep_dim": True}
    node.op(op_type, {"X": node.input(0)}, attrs, out=0)


# ---- normalisation ----


def _mark_statistics(node: Node, *indices: int) -> None:
    """Running statistics are state, not trainable parameters."""
    for i in indices:
        var = node.graph.block.find_var(node.name_of(i))
        if var is not None and var.is_parameter:
            var.trainable = False


@mapper("BatchNormalization")
def batch_norm(node: Node) -> None:
    epsilon = node.attr("epsilon", 1e-5)
    training = bool(node.attr("training_mode", 0))
    if node.wants_output(3) or node.wants_output(4):
        raise node.unsupported("BatchNormalization's saved mean/variance outputs (opset < 9)")
    _mark_statistics(node, 3, 4)
    x, scale, bias, mean, var = (node.input(i) for i in range(5))
    inputs = {"X": x, "Scale": scale, "Bias": bias, "Mean": mean, "Variance": var}
    momentum = node.attr("momentum", 0.9)
    if training and epsilon <= 1e-3:  # batch statistics; running ones move by momentum
        attrs = {"is_test": False, "epsilon": epsilon, "momentum": momentum}
        outputs = ("Y", "MeanOut", "VarianceOut")
        node.op("batch_norm", inputs, attrs, outputs=outputs, out=(0, 1, 2))
        return
    if training:  # an epsilon outside batch_norm's range: the statistics composed
        axes = [a for a in range(node.rank(0)) if a != 1]
        normed, batch_mean, batch_var, _ = _standardized(node, x, axes, epsilon)
        scaled = node.op("elementwise_mul", {"X": normed, "Y": scale}, {"axis": 1})
        node.op("elementwise_add", {"X": scaled, "Y": bias}, {"axis": 1}, out=0)
        for k, (running, batch) in enumerate(((mean, batch_mean), (var, batch_var)), 1):
            flat = node.op("reshape", {"X": batch}, {"shape": [-1]})
            kept = node.op("scale", {"X": running}, {"scale": momentum})
            moved = node.op("scale", {"X": flat}, {"scale": 1.0 - momentum})
            node.op("elementwise_add", {"X": kept, "Y": moved}, out=k)
        return
    if epsilon <= 1e-3:  # batch_norm's (Fluid's) range
        node.op("batch_norm", inputs, {"is_test": True, "epsilon": epsilon}, outputs=("Y",), out=0)
        return
    # Y = (X - mean) * scale / sqrt(var + epsilon) + bias, per channel (dim 1)
    shifted = node.op("scale", {"X": var}, {"bias": epsilon})
    factor = node.op("elementwise_div", {"X": scale, "Y": node.op("sqrt", {"X": shifted})})
    centered = node.op("elementwise_sub", {"X": x, "Y": mean}, {"axis": 1})
    scaled = node.op("elementwise_mul", {"X": centered, "Y": factor}, {"axis": 1})
    node.op("elementwise_add", {"X": scaled, "Y": bias}, {"axis": 1}, out=0)


@mapper("InstanceNormalization")
def instance_norm(node: Node) -> None:
    # Each (sample, channel) normalised over its spatial dims, then scaled per channel.
    axes = list(range(2, node.rank(0)))
    normed = _standardized(node, node.input(0), axes, node.attr("epsilon", 1e-5))[0]
    scaled = node.op("elementwise_mul", {"X": normed, "Y": node.input(1)}, {"axis": 1})
    node.op("elementwise_add", {"X": scaled, "Y": node.input(2)}, {"axis": 1}, out=0)


@mapper("LayerNormalization")
def layer_norm(node: Node) -> None:
    if node.attr("stash_type", 1) != 1:
        raise node.unsupported(f"stash_type {node.attr('stash_type')}")
    rank = node.rank(0)
    axis = node.attr("axis", -1) % rank
    epsilon = node.attr("epsilon", 1e-5)
    x = node.input(0)
    statistics = node.wants_output(1) or node.wants_output(2)
    if statistics or axis == 0 or epsilon > 1e-3 or node.shape(1) != node.shape(0)[axis:]:
        _layer_norm_composed(node, x, list(range(axis, rank)), epsilon)
        return
    width = int(np.prod(node.shape(0)[axis:]))
    scale = node.op("reshape", {"X": node.input(1)}, {"shape": [width]})
    bias = None
    if node.has_input(2):
        bias = node.op("reshape", {"X": node.input(2)}, {"shape": [width]})
    attrs = {"epsilon": epsilon, "begin_norm_axis": axis}
    node.op("layer_norm", {"X": x, "Scale": scale, "Bias": bias}, attrs, outputs=("Y",), out=0)


def _standardized(node: Node, x: str, axes: list[int], epsilon: float) -> tuple[str, ...]:
    """(x - mean) / sqrt(var + epsilon) over `axes` (biased variance), with mean, var and
    1 / sqrt(var + epsilon), each keeping the reduced dims as 1."""
    keep = {"dim": axes, "keep_dim": True}
    mean = node.op("reduce_mean", {"X": x}, keep)
    centered = node.op("elementwise_sub", {"X": x, "Y": mean})
    var = node.op("reduce_mean", {"X": node.op("square", {"X": centered})}, keep)
    inv_std = node.op("rsqrt", {"X": node.op("scale", {"X": var}, {"bias": epsilon})})
    return node.op("elementwise_mul", {"X": centered, "Y": inv_std}), mean, var, inv_std


def _layer_norm_composed(node: Node, x: str, axes: list[int], epsilon: float) -> None:
    """LayerNormalization from reductions; also gives its Mean and InvStdDev outputs."""
    normed, mean, _, inv_std = _standardized(node, x, axes, epsilon)
    y = node.op("elementwise_mul", {"X": normed, "Y": node.input(1)})
    if node.has_input(2):
        y = node.op("elementwise_add", {"X": y, "Y": node.input(2)})
    node.set_output(0, y)
    node.set_output(1, mean)
    node.set_output(2, inv_std)


@mapper("LRN")
def lrn(node: Node) -> None:
    size = node.attr("size")
    attrs = {
        "n": size,
        "k": node.attr("bias", 1.0),
        "alpha": node.attr("alpha", 1e-4) / size,  # ONNX divides alpha by size; Fluid not
        "beta": node.attr("beta", 0.75),
    }
    node.op("lrn", {"X": node.input(0)}, attrs, outputs=("Out", "MidOut"), out=(0, None))


@mapper("Dropout")
def dropout(node: Node) -> None:
    """Inference: the input passes through (the mask, if asked for, is all true)."""
    training = node.const(2) if node.has_input(2) else None
    if node.has_input(2) and (training is None or bool(np.asarray(training).reshape(-1)[0])):
        ratio = node.const(1) if node.has_input(1) else None
        if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
            raise node.unsupported("Dropout in training mode (random masks)")
    x = node.input(0)
    node.set_output(0, node.name_of(0))
    if node.wants_output(1):
        mask_dtype = "bool" if node.opset >= 10 else node.dtype(0)
        node.op("fill_any_like", {"X": x}, {"value": 1.0, "dtype": mask_dtype}, out=1)


# ---- softmax family ----


def _coerced_2d(node: Node, x: str, axis: int, rank: int, op_type: str, out: int) -> None:
    """Softmax before opset 13: X flattened to 2-D at `axis`, op over the rows, reshaped back."""
    if axis == rank - 1:
        node.op(op_type, {"X": x}, {"axis": -1}, out=out)
        return
    flat = node.op("flatten", {"X": x}, {"axis": axis})
    y = node.op(op_type, {"X": flat}, {"axis": -1})
    shape = node.shape(0)
    if -1 not in shape:
        node.op("reshape", {"X": y}, {"shape": list(shape)}, out=out)
    else:
        node.op("onnx_reshape", {"X": y, "Shape": node.op("onnx_shape", {"Input": x})}, out=out)


@mapper("Softmax")
def softmax(node: Node) -> None:
    rank = node.rank(0)
    if node.opset >= 13:
        node.op("softmax", {"X": node.input(0)}, {"axis": node.attr("axis", -1)}, out=0)
        return
    _coerced_2d(node, node.input(0), node.attr("axis", 1) % max(rank, 1), rank, "softmax", 0)


@mapper("LogSoftmax")
def log_softmax(node: Node) -> None:
    rank = node.rank(0)
    axis = node.attr("axis", -1 if node.opset >= 13 else 1) % max(rank, 1)
    if node.opset < 13 and axis != rank - 1:
        _coerced_2d(node, node.input(0), axis, rank, "onnx_log_softmax", 0)
        return
    node.op("onnx_log_softmax", {"X": node.input(0)}, {"axis": axis}, out=0)


@mapper("LpNormalization")
def lp_normalization(node: Node) -> None:
    x, p = node.input(0), node.attr("p", 2)
    if p not in (1, 2):
        raise node.unsupported(f"LpNormalization with p={p}")
    keep = {"dim": [node.attr("axis", -1)], "keep_dim": True}
    if p == 1:
        norm = node.op("reduce_sum", {"X": node.op("abs", {"X": x})}, keep)
    else:
        norm = node.op(
            "sqrt", {"X": node.op("reduce_sum", {"X": node.op("square", {"X": x})}, keep)}
        )
    # a zero vector stays zero (ONNX's reference), not 0 / 0
    zero = node.op("equal", {"X": norm, "Y": node.constant(0, node.dtype(0))})
    safe = node.op("where", {"Condition": zero, "X": node.constant(1, node.dtype(0)), "Y": norm})
    node.op("elementwise_div", {"X": x, "Y": safe}, out=0)


@mapper("MeanVarianceNormalization")
def mean_variance_normalization(node: Node) -> None:
    axes = node.attr("axes", [0, 2, 3])
    normed = _standardized(node, node.input(0), [a % node.rank(0) for a in axes], 1e-9)[0]
    node.set_output(0, normed)


@mapper("ConvTranspose")
def conv_transpose(node: Node) -> None:
    x_shape, w_shape = node.shape(0), node.shape(1)
    dims = _spatial_dims(node, len(x_shape))
    kernel = _kernel(node, dims, w_shape)
    strides = _ints_attr(node, "strides", dims, 1, [1] * dims)
    dilations = _ints_attr(node, "dilations", dims, 1, [1] * dims)
    extra = _ints_attr(node, "output_padding", dims, 0, [0] * dims)
    pads = _ints_attr(node, "pads", 2 * dims, 0, [0] * 2 * dims)
    sizes = list(x_shape[2:])
    full = [
        (s - 1) * st + (k - 1) * d + 1 for s, st, k, d in zip(sizes, strides, kernel, dilations)
    ]
    wanted = node.attr("output_shape")
    auto_pad = node.attr("auto_pad", "NOTSET")
    if wanted is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if -1 in sizes:
            raise node.unsupported(
                f"ConvTranspose output_shape/auto_pad over input {list(x_shape)}"
            )
        if wanted is None:
            wanted = [s * st for s, st in zip(sizes, strides)]
        wanted = list(wanted)[-dims:]
        totals = [f + e - o for f, e, o in zip(full, extra, wanted)]
        upper = auto_pad == "SAME_UPPER"  # else the begin gets the larger half (ONNX)
        begins = [t // 2 if upper else t - t // 2 for t in totals]
        ends = [t - b for t, b in zip(totals, begins)]
        if min(begins) < 0:
            raise node.unsupported(f"ConvTranspose output_shape {wanted} past the full output")
        # a negative end pad is output past the full one, zeros but for the bias (output_size)
        extra = [x + max(-e, 0) for x, e in zip(extra, ends)]
        pads = begins + [max(e, 0) for e in ends]
    elif auto_pad == "VALID":
        pads = [0] * 2 * dims
    geometry = _as_2d({"strides": strides, "dilations": dilations, "pads": pads}, dims)
    attrs = {**geometry, "groups": _group(node, x_shape[1], w_shape)}
    if any(extra):
        if -1 in sizes:
            raise node.unsupported(f"ConvTranspose output_padding over input {list(x_shape)}")
        outs = [f - pads[d] - pads[d + dims] + extra[d] for d, f in enumerate(full)]
        attrs["output_size"] = outs if dims == 2 else [1, *outs]
    x, w = _to_4d(node, node.input(0), dims), _to_4d(node, node.input(1), dims)
    y = node.op("conv2d_transpose", {"Input": x, "Filter": w}, attrs, outputs=("Output",))
    if node.has_input(2):
        y = node.op("elementwise_add", {"X": y, "Y": node.input(2)}, {"axis": 1})
    _from_4d(node, y, dims)


# ---- resizing ----


@mapper("Resize", "Upsample")
def resize(node: Node) -> None:
    """onnx_resize; Resize before opset 11 and Upsample take scales only and compute as
    "asymmetric" coordinates with nearest rounding down (their only definition)."""
    mode = node.attr("mode", "nearest")
    mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
    x = node.input(0)
    if node.op_type == "Upsample" or node.opset < 11:
        attrs = {
            "mode": mode,
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": "floor",
        }
        if node.has_attr("scales"):  # Upsample-7
            scales = node.constant(np.asarray(node.attr("scales"), np.float32))
        else:
            scales = node.input(1)
        node.op("onnx_resize", {"X": x, "Scales": scales}, attrs, out=0)
        return
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": node.attr("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": node.attr("nearest_mode", "round_prefer_floor"),
        "cubic_coeff_a": node.attr("cubic_coeff_a", -0.75),
        "exclude_outside": bool(node.attr("exclude_outside", 0)),
        "extrapolation_value": node.attr("extrapolation_value", 0.0),
        "antialias": bool(node.attr("antialias", 0)),
        "axes": node.attr("axes", []),
        "keep_aspect_ratio_policy": node.attr("keep_aspect_ratio_policy", "stretch"),
    }
    inputs = {"X": x, "Roi": node.input(1), "Scales": node.input(2), "Sizes": node.input(3)}
    node.op("onnx_resize", inputs, attrs, out=0)


@mapper("RMSNormalization")
def rms_normalization(node: Node) -> None:
    """Y = X / sqrt(mean(X^2 over the dims from `axis` on) + epsilon) * scale (computed in
    float32 for float16 X: stash_type 1)."""
    x, dtype, rank = node.input(0), node.dtype(0), node.rank(0)
    if node.attr("stash_type", 1) != 1:
        raise node.unsupported(f"stash_type {node.attr('stash_type')}")
    if dtype == "float16":
        x = node.op("cast", {"X": x}, {"out_dtype": "float32"})
    axes = list(range(node.attr("axis", -1) % rank, rank))
    mean_square = node.op(
        "reduce_mean", {"X": node.op("square", {"X": x})}, {"dim": axes, "keep_dim": True}
    )
    inv_rms = node.op(
        "rsqrt", {"X": node.op("scale", {"X": mean_square}, {"bias": node.attr("epsilon", 1e-5)})}
    )
    normed = node.op("elementwise_mul", {"X": x, "Y": inv_rms})
    if dtype == "float16":
        normed = node.op("cast", {"X": normed}, {"out_dtype": dtype})
    node.op("elementwise_mul", {"X": normed, "Y": node.input(1)}, out=0)


@mapper("LpPool", "GlobalLpPool")
def lp_pool(node: Node) -> None:
    """(sum of |X|^p over each window)^(1/p): an average pool (padding counted, as zeros)
    of |X|^p times the window size."""
    p = float(node.attr("p", 2))
    x = node.input(0)
    powered = node.op("pow", {"X": node.op("abs", {"X": x})}, {"factor": p})
    rank = node.rank(0)
    if node.op_type == "GlobalLpPool":
        total = node.op(
            "reduce_sum", {"X": powered}, {"dim": list(range(2, rank)), "keep_dim": True}
        )
    else:
        x_shape = node.shape(0)
        dims = _spatial_dims(node, rank)
        kernel = _ints_attr(node, "kernel_shape", dims, 1)
        geometry = _spatial_attrs(node, x_shape, kernel)
        if any(d != 1 for d in geometry["dilations"]):
            raise node.unsupported(f"LpPool with dilations {geometry['dilations']}")
        flat = _as_2d(geometry, dims)
        attrs = {
            "pooling_type": "avg",
            "ksize": list(kernel) if dims == 2 else [1, *kernel],
            "strides": flat["strides"],
            "paddings": flat["paddings"],
            "ceil_mode": _ceil_mode(node, x_shape, geometry, kernel),
            "exclusive": False,
        }
        mean = node.op("pool2d", {"X": _to_4d(node, powered, dims)}, attrs)
        total = node.op("scale", {"X": mean}, {"scale": float(np.prod(kernel))})
        if dims == 1:
            total = node.op("squeeze", {"X": total}, {"axes": [2]})
    node.op("pow", {"X": total}, {"factor": 1.0 / p}, out=0)
