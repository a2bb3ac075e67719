"""Linear-chain CRF ops (Fluid 1.8's, on padded batches): linear_chain_crf, crf_decoding and
the chunk_eval metric.

Emissions are a padded `[N, T, D]` float tensor (D tags) with an optional int `[N]` Length
(Fluid 1.8's padded form; without it every row is T steps long), labels `[N, T]` or
`[N, T, 1]` ints. The transition parameter is Fluid's `[D + 2, D]`: row 0 holds the start
weights, row 1 the end weights, rows 2.. the weight of tag i followed by tag j at [2 + i, j].

linear_chain_crf's LogLikelihood is, as Fluid's, the *negative* log-likelihood of each row's
label path (-log p(label | emission)): the cost to minimise. Its other outputs are Fluid's
intermediates: Alpha (the forward variables, each step normalised to sum 1), EmissionExps
(exp(emission - its row max)), TransitionExps (exp(transition)); padding steps hold 0.
"""

from __future__ import annotations

import numpy as np

from nestflow.core.dtype import is_floating
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from nestflow.ops.registry import Required, VarInfo, register_op
from nestflow.ops.sequence import _check_length_info, valid_lengths

_INT_DTYPES = ("int32", "int64")
CHUNK_SCHEMES = ("IOB", "IOE", "IOBES", "plain")


def _check_crf_infos(op: str, Emission: VarInfo, Transition: VarInfo, Label, Length) -> None:
    if not is_floating(Emission.dtype):
        raise DTypeError(f"{op}: Emission must be floating point, got {Emission.dtype}")
    if Emission.ndim != 3:
        raise ShapeError(
            f"{op}: Emission {list(Emission.shape)} must be a padded [batch, time, num_tags] "
            "tensor (with Length for rows shorter than time)"
        )
    _check_length_info(Emission, Length, op)
    tags = Emission.shape[2]
    if Transition.dtype != Emission.dtype:
        raise DTypeError(f"{op}: Transition is {Transition.dtype} but Emission is {Emission.dtype}")
    rows, cols = Transition.shape if Transition.ndim == 2 else (0, -2)
    if not (
        cols != -2
        and (-1 in (cols, tags) or cols == tags)
        and (-1 in (rows, cols) or rows == cols + 2)
        and (-1 in (rows, tags) or rows == tags + 2)
    ):
        raise ShapeError(
            f"{op}: Transition {list(Transition.shape)} must be [num_tags + 2, num_tags] = "
            f"[{tags + 2 if tags >= 0 else 'D+2'}, {tags if tags >= 0 else 'D'}] for Emission "
            f"{list(Emission.shape)} (rows 0 and 1: start and end weights)"
        )
    if Label is None:
        return
    if Label.dtype not in _INT_DTYPES:
        raise DTypeError(f"{op}: Label must be int32 or int64 tags, got {Label.dtype}")
    rows_steps = Label.shape[:2]
    if not (Label.ndim == 2 or (Label.ndim == 3 and Label.shape[2] in (1, -1))) or any(
        a != b and -1 not in (a, b) for a, b in zip(rows_steps, Emission.shape[:2])
    ):
        raise ShapeError(
            f"{op}: Label {list(Label.shape)} must be [batch, time] or [batch, time, 1] "
            f"matching Emission {list(Emission.shape)}"
        )


def _labels(Label, X, lengths, op: str, xp):
    """Label as int64 [N, T] (0 at padding steps), each valid tag checked against D: a host read
    the op needs, as a device would wrap a bad tag around."""
    n, t, d = X.shape
    if Label.shape[:2] != (n, t) or Label.size != n * t:
        raise ExecutionError(
            f"{op}: Label {list(Label.shape)} does not match Emission {list(X.shape)}: give "
            "[batch, time] or [batch, time, 1] tags"
        )
    labels = Label.reshape(n, t).astype(np.int64)
    valid = xp.arange(t)[None, :] < lengths[:, None]
    bad = ((labels < 0) | (labels >= d)) & valid
    if bool(bad.any()):
        flat = int(xp.flatnonzero(bad.reshape(-1))[0])
        row, step = divmod(flat, t)
        raise ExecutionError(
            f"{op}: Label[{row}, {step}] = {int(labels[row, step])} is not a tag of Emission "
            f"{list(X.shape)} (tags 0..{d - 1})"
        )
    return xp.where(valid, labels, 0), valid


def _logsumexp(a, axis: int, xp):
    top = a.max(axis=axis, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0)
    return xp.log(xp.exp(a - top).sum(axis=axis)) + xp.squeeze(top, axis=axis)


def _log_alpha(X, W, valid, xp):
    """log forward variables [N, T, D] (frozen past each row's end) and log Z [N]."""
    n, t, _ = X.shape
    start, end, trans = W[0], W[1], W[2:]
    log_alpha = xp.empty(X.shape, X.dtype)
    alpha = start[None, :] + X[:, 0]
    log_alpha[:, 0] = alpha
    for step in range(1, t):
        moved = _logsumexp(alpha[:, :, None] + trans[None], 1, xp) + X[:, step]
        alpha = xp.where(valid[:, step, None], moved, alpha)
        log_alpha[:, step] = alpha
    return log_alpha, _logsumexp(alpha + end[None, :], 1, xp)


def _path_score(X, W, labels, valid, lengths, xp):
    """The unnormalised log score of each row's label path [N]."""
    emit = xp.take_along_axis(X, labels[:, :, None], axis=2)[:, :, 0]
    score = xp.where(valid, emit, 0).sum(axis=1) + W[0][labels[:, 0]]
    moves = W[2:][labels[:, :-1], labels[:, 1:]]
    score = score + xp.where(valid[:, 1:], moves, 0).sum(axis=1)
    last = xp.take_along_axis(labels, xp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
    return score + W[1][last]


@register_op
class linear_chain_crf:
    """LogLikelihood[n] = -log p(Label[n] | Emission[n]) under a linear-chain CRF with the
    [D + 2, D] Transition (start, end, then tag-to-tag weights), over each row's first
    Length[n] steps (0 for a row of length 0); see the module docstring for the outputs."""

    inputs = ("Emission", "Transition", "Label", "Length?")
    outputs = ("Alpha", "EmissionExps", "TransitionExps", "LogLikelihood")
    no_grad_inputs = ("Label", "Length")
    grad_no_need_buffer = ("Alpha", "EmissionExps", "TransitionExps", "LogLikelihood")

    def infer(Emission, Transition, Label, Length):
        _check_crf_infos("linear_chain_crf", Emission, Transition, Label, Length)
        dtype = Emission.dtype
        return (
            VarInfo(Emission.shape, dtype),
            VarInfo(Emission.shape, dtype),
            VarInfo(Transition.shape, dtype),
            VarInfo((Emission.shape[0], 1), dtype),
        )

    def forward(Emission, Transition, Label, Length, xp):
        X, W = Emission, Transition
        n, t, _ = X.shape
        lengths = valid_lengths(Length, X, "linear_chain_crf")
        labels, valid = _labels(Label, X, lengths, "linear_chain_crf", xp)
        emission_exps = xp.exp(X - X.max(axis=2, keepdims=True)) if t else xp.zeros_like(X)
        emission_exps = xp.where(valid[:, :, None], emission_exps, 0).astype(X.dtype)
        if t == 0:
            return xp.zeros_like(X), emission_exps, xp.exp(W), xp.zeros((n, 1), X.dtype)
        log_alpha, log_z = _log_alpha(X, W, valid, xp)
        alpha = xp.exp(log_alpha - _logsumexp(log_alpha, 2, xp)[:, :, None])
        alpha = xp.where(valid[:, :, None], alpha, 0).astype(X.dtype)
        nll = xp.where(lengths > 0, log_z - _path_score(X, W, labels, valid, lengths, xp), 0)
        return alpha, emission_exps, xp.exp(W), nll.astype(X.dtype).reshape(n, 1)

    def backward(
        Emission,
        Transition,
        Label,
        Length,
        Alpha,
        EmissionExps,
        TransitionExps,
        LogLikelihood,
        Alpha_grad,
        EmissionExps_grad,
        TransitionExps_grad,
        LogLikelihood_grad,
        xp,
    ):
        # Forward-backward in log space: d(-log p)/d score = marginal - indicator of the path.
        X, W = Emission, Transition
        n, t, d = X.shape
        if LogLikelihood_grad is None or t == 0:
            return xp.zeros_like(X), xp.zeros_like(W), None, None
        lengths = valid_lengths(Length, X, "linear_chain_crf")
        labels, valid = _labels(Label, X, lengths, "linear_chain_crf", xp)
        trans, end = W[2:], W[1]
        log_alpha, log_z = _log_alpha(X, W, valid, xp)
        log_beta = xp.empty(X.shape, X.dtype)
        beta = xp.broadcast_to(end[None, :], (n, d))
        log_beta[:, t - 1] = beta
        for step in range(t - 2, -1, -1):
            moved = _logsumexp(trans[None] + (X[:, step + 1] + beta)[:, None, :], 2, xp)
            beta = xp.where((step < lengths - 1)[:, None], moved, end[None, :])
            log_beta[:, step] = beta
        weight = xp.where(lengths > 0, LogLikelihood_grad.reshape(n), 0).astype(X.dtype)
        marginal = xp.exp(log_alpha + log_beta - log_z[:, None, None])
        marginal = xp.where(valid[:, :, None], marginal, 0)
        path = ((labels[:, :, None] == xp.arange(d)) & valid[:, :, None]).astype(X.dtype)
        d_emission = (marginal - path) * weight[:, None, None]
        d_trans = xp.zeros((d, d), X.dtype)
        for step in range(1, t):
            pair = (
                log_alpha[:, step - 1, :, None]
                + trans[None]
                + (X[:, step] + log_beta[:, step])[:, None, :]
                - log_z[:, None, None]
            )
            live = weight * valid[:, step]
            d_trans = d_trans + (xp.exp(pair) * live[:, None, None]).sum(axis=0)
        seen = (path[:, :-1] * weight[:, None, None]).reshape(-1, d)
        d_trans = d_trans - xp.matmul(seen.T, path[:, 1:].reshape(-1, d))
        d_start = d_emission[:, 0].sum(axis=0)
        last = xp.maximum(lengths - 1, 0)[:, None, None]
        d_end = xp.take_along_axis(d_emission, xp.broadcast_to(last, (n, 1, d)), axis=1)
        d_end = d_end[:, 0].sum(axis=0)
        d_w = xp.concatenate([d_start[None], d_end[None], d_trans]).astype(W.dtype)
        return d_emission.astype(X.dtype), d_w, None, None


@register_op
class crf_decoding:
    """ViterbiPath [N, T] int64: each row's highest-scoring tag path under the CRF (Viterbi;
    0 at padding steps). With Label, Fluid's comparison instead: 1 where the path's tag equals
    the label, 0 elsewhere (and at padding)."""

    inputs = ("Emission", "Transition", "Label?", "Length?")
    outputs = ("ViterbiPath",)

    def infer(Emission, Transition, Label, Length):
        _check_crf_infos("crf_decoding", Emission, Transition, Label, Length)
        return VarInfo(Emission.shape[:2], "int64")

    def forward(Emission, Transition, Label, Length, xp):
        X, W = Emission, Transition
        n, t, d = X.shape
        lengths = valid_lengths(Length, X, "crf_decoding")
        valid = xp.arange(t)[None, :] < lengths[:, None]
        path = xp.zeros((n, t), np.int64)
        if t == 0:
            return path
        trans = W[2:]
        score = W[0][None, :] + X[:, 0]
        pointers = xp.zeros((n, t, d), np.int64)
        for step in range(1, t):
            moved = score[:, :, None] + trans[None]
            best = moved.argmax(axis=1)
            pointers[:, step] = best
            moved = xp.take_along_axis(moved, best[:, None, :], axis=1)[:, 0] + X[:, step]
            score = xp.where(valid[:, step, None], moved, score)
        tag = (score + W[1][None, :]).argmax(axis=1)
        for step in range(t - 1, -1, -1):
            path[:, step] = xp.where(valid[:, step], tag, 0)
            back = xp.take_along_axis(pointers[:, step], tag[:, None], axis=1)[:, 0]
            tag = xp.where(valid[:, step] & (step > 0), back, tag)
        if Label is None:
            return path
        labels, valid = _labels(Label, X, lengths, "crf_decoding", xp)
        return ((path == labels) & valid).astype(np.int64)


def _scheme_tags(scheme: str) -> tuple[int, int, int, int, int]:
    """(tag types, begin, inside, end, single) of a chunk scheme, -1 for a tag it lacks."""
    return {
        "IOB": (2, 0, 1, -1, -1),
        "IOE": (2, -1, 0, 1, -1),
        "IOBES": (4, 0, 1, 2, 3),
        "plain": (1, -1, -1, -1, -1),
    }[scheme]


def chunks(tags: list[int], num_chunk_types: int, scheme: str) -> list[tuple[int, int, int]]:
    """The (first step, last step, type) chunks of one tag sequence, as Fluid's chunk_eval
    reads them (tag = label % tag types, type = label // tag types; num_chunk_types * tag types
    is "outside").

    >>> chunks([0, 1, 4, 2, 2, 3], num_chunk_types=2, scheme="IOB")
    [(0, 1, 0), (3, 3, 1), (4, 5, 1)]
    """
    num_tags, begin, inside, end, single = _scheme_tags(scheme)
    other = num_chunk_types

    def ends(prev_tag, prev_type, tag, kind):
        if prev_type == other:
            return False
        if kind == other or kind != prev_type:
            return True
        if prev_tag in (begin, inside):
            return tag in (begin, single)
        return prev_tag in (end, single)

    def begins(prev_tag, prev_type, tag, kind):
        if prev_type == other:
            return kind != other
        if kind == other:
            return False
        if kind != prev_type or tag in (begin, single):
            return True
        if tag in (inside, end):
            return prev_tag in (end, single)
        return False

    found, first, inside_chunk, tag, kind = [], 0, False, -1, other
    for step, label in enumerate(tags):
        prev_tag, prev_type = tag, kind
        tag, kind = label % num_tags, label // num_tags
        if inside_chunk and ends(prev_tag, prev_type, tag, kind):
            found.append((first, step - 1, prev_type))
            inside_chunk = False
        if begins(prev_tag, prev_type, tag, kind):
            first, inside_chunk = step, True
    if inside_chunk:
        found.append((first, len(tags) - 1, kind))
    return found


@register_op
class chunk_eval:
    """Chunk precision, recall and F1 of Inference against Label (Fluid 1.8's chunk_eval):
    both are [N, T] or [N, T, 1] int tags (the first SeqLength[n] steps of row n count) in
    `chunk_scheme` IOB, IOE, IOBES or plain with `num_chunk_types` types; tag
    num_chunk_types * (tags of the scheme) is "outside". Chunks of `excluded_chunk_types` are
    not counted. Precision/Recall/F1-Score are float32 [1], the counts int64 [1]. Computed on
    the host (a metric: Fluid has only a CPU kernel)."""

    inputs = ("Inference", "Label", "SeqLength?")
    outputs = (
        "Precision",
        "Recall",
        "F1-Score",
        "NumInferChunks",
        "NumLabelChunks",
        "NumCorrectChunks",
    )
    attrs = {"num_chunk_types": Required(int), "chunk_scheme": "IOB", "excluded_chunk_types": []}

    def infer(Inference, Label, SeqLength, num_chunk_types, chunk_scheme, excluded_chunk_types):
        if chunk_scheme not in CHUNK_SCHEMES:
            raise AttrError(
                f"chunk_eval: chunk_scheme must be one of {list(CHUNK_SCHEMES)}, got "
                f"{chunk_scheme!r}"
            )
        if num_chunk_types < 1:
            raise AttrError(f"chunk_eval: num_chunk_types must be >= 1, got {num_chunk_types}")
        for slot, info in (("Inference", Inference), ("Label", Label)):
            if info.dtype not in _INT_DTYPES:
                raise DTypeError(f"chunk_eval: {slot} must be int32 or int64, got {info.dtype}")
            if not (info.ndim == 2 or (info.ndim == 3 and info.shape[2] in (1, -1))):
                raise ShapeError(
                    f"chunk_eval: {slot} {list(info.shape)} must be [batch, time] or "
                    "[batch, time, 1] tags"
                )
        if any(a != b and -1 not in (a, b) for a, b in zip(Inference.shape, Label.shape)):
            raise ShapeError(
                f"chunk_eval: Inference {list(Inference.shape)} and Label "
                f"{list(Label.shape)} must have the same shape"
            )
        _check_length_info(VarInfo(Inference.shape[:2], Inference.dtype), SeqLength, "chunk_eval")
        ratio, count = VarInfo((1,), "float32"), VarInfo((1,), "int64")
        return ratio, ratio, ratio, count, count, count

    def forward(
        Inference, Label, SeqLength, num_chunk_types, chunk_scheme, excluded_chunk_types, device
    ):
        # A host read the op needs: chunks are found by a sequential scan of each row.
        lengths = valid_lengths(SeqLength, Inference, "chunk_eval")
        n, t = Inference.shape[:2]
        if Label.shape[:2] != (n, t) or Label.size != Inference.size:
            raise ExecutionError(
                f"chunk_eval: Label {list(Label.shape)} and Inference {list(Inference.shape)} "
                "must have the same shape"
            )
        inferred = device.to_host(Inference).reshape(n, t).tolist()
        labelled = device.to_host(Label).reshape(n, t).tolist()
        lengths = device.to_host(lengths).tolist()
        top = num_chunk_types * _scheme_tags(chunk_scheme)[0]
        excluded = set(excluded_chunk_types)
        counts = [0, 0, 0]
        for row, length in enumerate(lengths):
            found = []
            for slot, tags in (("Inference", inferred), ("Label", labelled)):
                seq = tags[row][:length]
                bad = [s for s, v in enumerate(seq) if not 0 <= v <= top]
                if bad:
                    raise ExecutionError(
                        f"chunk_eval: {slot}[{row}, {bad[0]}] = {seq[bad[0]]} is outside "
                        f"[0, {top}] ({num_chunk_types} chunk types in scheme {chunk_scheme}; "
                        f"{top} is outside any chunk)"
                    )
                found.append(
                    [c for c in chunks(seq, num_chunk_types, chunk_scheme) if c[2] not in excluded]
                )
            counts[0] += len(found[0])
            counts[1] += len(found[1])
            counts[2] += len(set(found[0]) & set(found[1]))
        infer_n, label_n, correct = counts
        precision = correct / infer_n if infer_n else 0.0
        recall = correct / label_n if label_n else 0.0
        f1 = 2 * precision * recall / (precision + recall) if correct else 0.0
        ratios = [np.array([v], np.float32) for v in (precision, recall, f1)]
        return tuple(
            device.to_device(a) for a in ratios + [np.array([c], np.int64) for c in counts]
        )
