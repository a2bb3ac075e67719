"""CRF layers (Fluid 1.8's): linear_chain_crf, crf_decoding and the chunk_eval metric, over
padded `[batch, time, num_tags]` emissions with an optional int `[batch]` length."""

from __future__ import annotations

from typing import Any

from nestflow.errors import AttrError, ShapeError
from nestflow.framework import unique_name
from nestflow.framework.program import VarDesc, default_main_program
from nestflow.layers.helper import (
    append_op,
    as_int,
    layer_error,
    parameter_from_attr,
    require_float_input,
)
from nestflow.layers.initializer import ParamAttr, Xavier
from nestflow.layers.sequence import check_lengths
from nestflow.ops.crf import CHUNK_SCHEMES


def _emission(layer: str, input: Any) -> VarDesc:
    if not isinstance(input, VarDesc):
        raise layer_error(AttrError, layer, f"input must be a variable, got {type(input).__name__}")
    require_float_input(input, layer)
    if len(input.shape) != 3 or input.shape[2] < 1:
        raise layer_error(
            ShapeError,
            layer,
            f"input '{input.name}' has shape {list(input.shape)}; emissions are a padded "
            "[batch, time, num_tags] tensor (num_tags known), with length= for shorter rows",
        )
    return input


def linear_chain_crf(
    input: VarDesc, label: VarDesc, param_attr: Any = None, length: VarDesc | None = None
) -> VarDesc:
    """The linear-chain CRF cost: [N, 1] negative log-likelihood of each row's `label` path
    (Fluid names it LogLikelihood; minimise its mean). `input` is the padded emission scores
    [N, T, D], `label` int64 [N, T] or [N, T, 1], `length` int [N] (None: T steps a row).
    Creates the transition parameter [D + 2, D] (rows 0 and 1: start and end weights), named
    by `param_attr` so that crf_decoding can share it.

    >>> x = nf.data("x", [-1, 4, 3]); y = nf.data("y", [-1, 4], "int64")
    >>> n = nf.data("n", [-1], "int64")
    >>> cost = nf.layers.linear_chain_crf(x, y, param_attr=nf.ParamAttr(name="crfw"), length=n)
    >>> cost.shape, nf.default_main_program().global_block().var("crfw").shape
    ((-1, 1), (5, 3))
    >>> exe = nf.Executor(); _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.zeros((2, 4, 3), "float32"), "y": np.zeros((2, 4), "int64"),
    ...         "n": np.array([4, 2])}
    >>> exe.run(feed=feed, fetch_list=[cost])[0].shape
    (2, 1)
    """
    x = _emission("linear_chain_crf", input)
    tags = x.shape[2]
    transition = parameter_from_attr(
        param_attr, [tags + 2, tags], x.dtype, unique_name.generate("crfw"), Xavier()
    )
    if transition is None:
        raise layer_error(
            AttrError, "linear_chain_crf", "param_attr=False: the CRF needs its transition"
        )
    inputs = {"Emission": x, "Transition": transition, "Label": label}
    inputs["Length"] = check_lengths("linear_chain_crf", x, length)
    outs = ("Alpha", "EmissionExps", "TransitionExps", "LogLikelihood")
    return append_op("linear_chain_crf", inputs, outputs=outs, name="linear_chain_crf")[-1]


def crf_decoding(
    input: VarDesc, param_attr: Any, label: VarDesc | None = None, length: VarDesc | None = None
) -> VarDesc:
    """The Viterbi path [N, T] (int64; 0 at padding) of the padded emissions `input` [N, T, D]
    under the transition parameter `param_attr` names (made by linear_chain_crf). With `label`,
    Fluid's comparison instead: 1 where the path's tag equals the label, else 0.

    >>> x = nf.data("x", [-1, 4, 3]); y = nf.data("y", [-1, 4], "int64")
    >>> _ = nf.layers.linear_chain_crf(x, y, param_attr=nf.ParamAttr(name="crfw"))
    >>> path = nf.layers.crf_decoding(x, param_attr=nf.ParamAttr(name="crfw"))
    >>> exe = nf.Executor(); _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.eye(3, dtype="float32")[[0, 1, 2, 2]][None] * 9,
    ...         "y": np.zeros((1, 4), "int64")}
    >>> exe.run(feed=feed, fetch_list=[path])[0].tolist()
    [[0, 1, 2, 2]]
    """
    x = _emission("crf_decoding", input)
    attr = ParamAttr.of(param_attr)
    name = attr.name if attr is not None else None
    transition = default_main_program().global_block().find_var(name) if name else None
    if transition is None:
        raise layer_error(
            AttrError,
            "crf_decoding",
            f"param_attr must name the transition parameter linear_chain_crf made (e.g. "
            f"nf.ParamAttr(name='crfw') given to both); got {param_attr!r}, which names "
            f"{'no parameter of the program' if name else 'nothing'}",
        )
    inputs = {"Emission": x, "Transition": transition, "Label": [] if label is None else label}
    inputs["Length"] = check_lengths("crf_decoding", x, length)
    return append_op(
        "crf_decoding", inputs, outputs=("ViterbiPath",), name="crf_decoding", stop_gradient=True
    )


def chunk_eval(
    input: VarDesc,
    label: VarDesc,
    chunk_scheme: str,
    num_chunk_types: int,
    excluded_chunk_types: list[int] | None = None,
    seq_length: VarDesc | None = None,
) -> tuple[VarDesc, ...]:
    """Chunk precision, recall and F1 of the predicted tags `input` against `label` (both int
    [N, T] or [N, T, 1], the first `seq_length[n]` steps of row n counted) in `chunk_scheme`
    "IOB", "IOE", "IOBES" or "plain" with `num_chunk_types` types (tag = type * tags of the
    scheme + the tag's index in it, num_chunk_types * tags is "outside"). Returns Fluid's
    (precision, recall, f1_score, num_infer_chunks, num_label_chunks, num_correct_chunks).

    >>> p = nf.data("p", [-1, 5], "int64"); y = nf.data("y", [-1, 5], "int64")
    >>> prec, rec, f1, *counts = nf.layers.chunk_eval(p, y, "IOB", num_chunk_types=2)
    >>> out = nf.Executor().run(feed={"p": np.array([[0, 1, 4, 2, 4]]),
    ...                               "y": np.array([[0, 1, 4, 2, 3]])},
    ...                         fetch_list=[prec, rec, f1, *counts])
    >>> [round(float(v[0]), 3) for v in out]
    [0.5, 0.5, 0.5, 2.0, 2.0, 1.0]
    """
    if chunk_scheme not in CHUNK_SCHEMES:
        raise layer_error(
            AttrError,
            "chunk_eval",
            f"chunk_scheme must be one of {list(CHUNK_SCHEMES)}, got {chunk_scheme!r}",
        )
    attrs = {
        "num_chunk_types": as_int(num_chunk_types, "chunk_eval: num_chunk_types"),
        "chunk_scheme": chunk_scheme,
        "excluded_chunk_types": [as_int(t, "chunk_eval: excluded_chunk_types")
                                 for t in (excluded_chunk_types or [])],
    }  # fmt: skip
    inputs = {"Inference": input, "Label": label}
    inputs["SeqLength"] = check_lengths("chunk_eval", input, seq_length)
    outs = ("Precision", "Recall", "F1-Score", "NumInferChunks", "NumLabelChunks",
            "NumCorrectChunks")  # fmt: skip
    return append_op("chunk_eval", inputs, attrs, outputs=outs, stop_gradient=True)


__all__ = ["chunk_eval", "crf_decoding", "linear_chain_crf"]
