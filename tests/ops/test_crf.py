"""linear_chain_crf, crf_decoding and chunk_eval against brute force: every tag path of each
row enumerated (log-likelihood, Fluid's normalised Alpha, the gradients as expected path counts
minus the label's, the argmax path), and chunks counted span by span from the tag strings."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, DTypeError, ExecutionError, ShapeError
from nestflow.layers.helper import append_op
from nestflow.ops.crf import chunks
from tests.ops.harness import OpCase, case_id

R = np.random.default_rng(30)


def normal(*shape, dtype="float64"):
    return R.standard_normal(shape).astype(dtype)


def tags(n, t, d, dtype="int64"):
    return R.integers(0, d, (n, t)).astype(dtype)


def lengths(*values, dtype="int64"):
    return np.array(values, dtype=dtype)


def path_score(x, w, path):
    """start + emissions + moves + end of one path over one row's valid steps x [L, D]."""
    score = w[0, path[0]] + w[1, path[-1]] + sum(x[s, p] for s, p in enumerate(path))
    return score + sum(w[2 + a, b] for a, b in zip(path, path[1:]))


def all_paths(length, d):
    return list(itertools.product(range(d), repeat=length))


def logsumexp(values):
    values = np.asarray(values, np.float64)
    top = values.max()
    return top + np.log(np.exp(values - top).sum())


def row_lengths(Emission, Length):
    return [Emission.shape[1]] * Emission.shape[0] if Length is None else list(Length)


def crf_ref(Emission, Transition, Label, Length=None):
    """Every quantity from enumerating every path of every row (and every prefix for Alpha)."""
    n, t, d = Emission.shape
    labels = Label.reshape(n, t)
    alpha = np.zeros(Emission.shape, Emission.dtype)
    exps = np.zeros(Emission.shape, Emission.dtype)
    nll = np.zeros((n, 1), Emission.dtype)
    for row, length in enumerate(row_lengths(Emission, Length)):
        x = Emission[row, :length].astype(np.float64)
        if length == 0:
            continue
        exps[row, :length] = np.exp(x - x.max(axis=1, keepdims=True))
        for step in range(length):
            prefix = [
                logsumexp(
                    [
                        path_score(x, Transition, p) - Transition[1, p[-1]]
                        for p in all_paths(step + 1, d)
                        if p[-1] == tag
                    ]
                )
                for tag in range(d)
            ]
            alpha[row, step] = np.exp(np.array(prefix) - logsumexp(prefix))
        log_z = logsumexp([path_score(x, Transition, p) for p in all_paths(length, d)])
        nll[row, 0] = log_z - path_score(x, Transition, list(labels[row, :length]))
    return {
        "Alpha": alpha,
        "EmissionExps": exps,
        "TransitionExps": np.exp(Transition),
        "LogLikelihood": nll,
    }


def crf_grad_ref(Emission, Transition, Label, Length, upstream):
    """d(sum(upstream * nll)) by enumeration: expected counts under p minus the label's."""
    n, t, d = Emission.shape
    labels = Label.reshape(n, t)
    d_x, d_w = np.zeros(Emission.shape), np.zeros(Transition.shape)

    def counts(path, length):
        cx, cw = np.zeros((t, d)), np.zeros(Transition.shape)
        for s, p in enumerate(path):
            cx[s, p] += 1
        cw[0, path[0]] += 1
        cw[1, path[-1]] += 1
        for a, b in zip(path, path[1:]):
            cw[2 + a, b] += 1
        return cx, cw

    for row, length in enumerate(row_lengths(Emission, Length)):
        if length == 0:
            continue
        x = Emission[row, :length]
        paths = all_paths(length, d)
        scores = np.array([path_score(x, Transition, p) for p in paths])
        probs = np.exp(scores - logsumexp(scores))
        for p, prob in zip(paths, probs):
            cx, cw = counts(p, length)
            d_x[row] += upstream[row] * prob * cx
            d_w += upstream[row] * prob * cw
        cx, cw = counts(list(labels[row, :length]), length)
        d_x[row] -= upstream[row] * cx
        d_w -= upstream[row] * cw
    return d_x, d_w


def crf_case(n, t, d, length=None, label_3d=False, dtype="float64", grad=True, id=""):
    label = tags(n, t, d)
    inputs = {
        "Emission": normal(n, t, d, dtype=dtype),
        "Transition": normal(d + 2, d, dtype=dtype),
        "Label": label[..., None] if label_3d else label,
    }
    if length is not None:
        inputs["Length"] = lengths(*length)
    return OpCase(
        "linear_chain_crf",
        inputs,
        crf_ref,
        grad=("Emission", "Transition") if grad else (),
        grad_outputs=("LogLikelihood",),
        atol=1e-5 if dtype == "float32" else 1e-9,
        grad_atol=1e-6,
        id=f"linear_chain_crf-{id}",
    )


CRF_CASES = [
    crf_case(3, 4, 3, (4, 1, 2), id="lengths"),
    crf_case(2, 3, 2, id="no_length"),
    crf_case(3, 3, 3, (0, 3, 2), label_3d=True, id="empty_row_label_3d"),
    crf_case(1, 1, 1, (1,), id="size1"),
    crf_case(2, 5, 1, (5, 2), id="one_tag"),
    crf_case(0, 3, 2, (), id="empty_batch"),
    crf_case(2, 0, 3, (0, 0), id="no_steps"),
    crf_case(3, 4, 3, (2, 4, 3), dtype="float32", grad=False, id="float32"),
]


# ---- crf_decoding ----


def viterbi_ref(Emission, Transition, Label=None, Length=None):
    n, t, d = Emission.shape
    path = np.zeros((n, t), np.int64)
    for row, length in enumerate(row_lengths(Emission, Length)):
        if length:
            x = Emission[row, :length]
            best = max(all_paths(length, d), key=lambda p: path_score(x, Transition, p))
            path[row, :length] = best
    if Label is not None:
        valid = np.arange(t)[None, :] < np.array(row_lengths(Emission, Length))[:, None]
        path = ((path == Label.reshape(n, t)) & valid).astype(np.int64)
    return {"ViterbiPath": path}


def decode_case(n, t, d, length=None, label=False, id=""):
    inputs = {"Emission": normal(n, t, d), "Transition": normal(d + 2, d)}
    if label:
        inputs["Label"] = tags(n, t, d)
    if length is not None:
        inputs["Length"] = lengths(*length)
    return OpCase("crf_decoding", inputs, viterbi_ref, id=f"crf_decoding-{id}")


DECODE_CASES = [
    decode_case(4, 5, 3, (5, 1, 3, 0), id="lengths"),
    decode_case(3, 4, 4, id="no_length"),
    decode_case(3, 4, 3, (4, 2, 3), label=True, id="with_label"),
    decode_case(1, 1, 1, (1,), id="size1"),
    decode_case(0, 2, 3, (), id="empty_batch"),
    decode_case(2, 0, 2, (0, 0), id="no_steps"),
]


# ---- chunk_eval ----

SCHEME_TAGS = {"IOB": "BI", "IOE": "IE", "IOBES": "BIES", "plain": "I"}


def spans(labels, num_types, scheme):
    """Chunks read off the tag strings, CoNLL style: each token is (letter, type) or O; a
    chunk is a maximal run its scheme's letters allow."""
    letters = SCHEME_TAGS[scheme]
    outside = num_types * len(letters)
    tokens = [None if v == outside else (letters[v % len(letters)], v // len(letters))
              for v in labels]  # fmt: skip
    found, start = [], None
    for i, token in enumerate(tokens):
        prev = tokens[i - 1] if i else None
        if token is None:
            if start is not None:
                found.append((start, i - 1, prev[1]))
            start = None
            continue
        letter, kind = token
        new = (
            start is None
            or prev[1] != kind
            or letter in "BS"
            or (letter in "IE" and prev[0] in "ES")
        )
        if new:
            if start is not None:
                found.append((start, i - 1, prev[1]))
            start = i
    if start is not None:
        found.append((start, len(tokens) - 1, tokens[-1][1]))
    return found


def chunk_ref(Inference, Label, SeqLength=None, num_chunk_types=1, chunk_scheme="IOB",
              excluded_chunk_types=()):  # fmt: skip
    n, t = Inference.shape[:2]
    lens = [t] * n if SeqLength is None else list(SeqLength)
    inferred = labelled = correct = 0
    for row, length in enumerate(lens):
        a = [c for c in spans(Inference.reshape(n, t)[row, :length], num_chunk_types,
                              chunk_scheme) if c[2] not in excluded_chunk_types]  # fmt: skip
        b = [c for c in spans(Label.reshape(n, t)[row, :length], num_chunk_types,
                              chunk_scheme) if c[2] not in excluded_chunk_types]  # fmt: skip
        inferred, labelled, correct = (
            inferred + len(a),
            labelled + len(b),
            correct + len(set(a) & set(b)),
        )
    p = correct / inferred if inferred else 0.0
    r = correct / labelled if labelled else 0.0
    f = 2 * p * r / (p + r) if correct else 0.0
    return {
        "Precision": np.array([p], np.float32),
        "Recall": np.array([r], np.float32),
        "F1-Score": np.array([f], np.float32),
        "NumInferChunks": np.array([inferred]),
        "NumLabelChunks": np.array([labelled]),
        "NumCorrectChunks": np.array([correct]),
    }


def chunk_case(scheme, types, n, t, length=None, excluded=(), shape3=False, id=""):
    top = types * len(SCHEME_TAGS[scheme])
    label = R.integers(0, top + 1, (n, t))
    inference = np.where(R.random((n, t)) < 0.7, label, R.integers(0, top + 1, (n, t)))
    if shape3:
        label, inference = label[..., None], inference[..., None]
    inputs = {"Inference": inference, "Label": label}
    if length is not None:
        inputs["SeqLength"] = lengths(*length)
    attrs = {"num_chunk_types": types, "chunk_scheme": scheme,
             "excluded_chunk_types": list(excluded)}  # fmt: skip
    return OpCase("chunk_eval", inputs, chunk_ref, attrs=attrs, id=f"chunk_eval-{id}")


CHUNK_CASES = [
    chunk_case("IOB", 3, 6, 12, (12, 5, 0, 9, 12, 1), id="IOB"),
    chunk_case("IOE", 2, 5, 10, id="IOE"),
    chunk_case("IOBES", 3, 6, 12, (12, 7, 3, 12, 11, 2), id="IOBES"),
    chunk_case("plain", 3, 4, 9, (9, 4, 9, 1), id="plain"),
    chunk_case("IOB", 3, 5, 10, excluded=(1,), shape3=True, id="IOB-excluded-3d"),
    chunk_case("IOBES", 2, 1, 1, (1,), id="size1"),
    chunk_case("IOB", 2, 0, 4, (), id="empty_batch"),
]


@pytest.mark.parametrize("case", CRF_CASES + DECODE_CASES + CHUNK_CASES, ids=case_id)
def test_op(case):
    case.check()


def test_the_spans_reference_reads_known_strings():
    # IOB, 2 types: B-0=0 I-0=1 B-1=2 I-1=3 O=4
    assert spans([0, 1, 4, 2, 3, 3, 1], 2, "IOB") == [(0, 1, 0), (3, 5, 1), (6, 6, 0)]
    assert chunks([0, 1, 4, 2, 3, 3, 1], 2, "IOB") == [(0, 1, 0), (3, 5, 1), (6, 6, 0)]
    # IOE, 1 type: I=0 E=1 O=2
    assert chunks([0, 1, 1, 0, 0, 2, 0], 1, "IOE") == [(0, 1, 0), (2, 2, 0), (3, 4, 0), (6, 6, 0)]
    # IOBES, 1 type: B=0 I=1 E=2 S=3 O=4
    assert chunks([3, 0, 1, 2, 4, 1, 3], 1, "IOBES") == [(0, 0, 0), (1, 3, 0), (5, 5, 0),
                                                          (6, 6, 0)]  # fmt: skip


def test_many_random_sequences_match_the_reference_count():
    rng = np.random.default_rng(5)
    for scheme in SCHEME_TAGS:
        top = 3 * len(SCHEME_TAGS[scheme])
        for _ in range(200):
            seq = list(rng.integers(0, top + 1, rng.integers(0, 12)))
            assert chunks(seq, 3, scheme) == spans(seq, 3, scheme), (scheme, seq)


def test_crf_gradients_equal_enumerated_expected_counts():
    n, t, d = 3, 4, 3
    x, w, label = normal(n, t, d), normal(d + 2, d), tags(n, t, d)
    length = lengths(4, 2, 0)
    upstream = R.standard_normal(n)
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        xv = nf.data("x", [-1, t, d], "float64", stop_gradient=False)
        wv = nf.data("w", [d + 2, d], "float64", stop_gradient=False)
        lv, nv = nf.data("label", [-1, t], "int64"), nf.data("n", [-1], "int64")
        up = nf.data("up", [-1, 1], "float64")
        cost = append_op("linear_chain_crf", {"Emission": xv, "Transition": wv, "Label": lv,
                         "Length": nv}, outputs=CRF_OUTS)[-1]  # fmt: skip
        dx, dw = nf.gradients(nf.layers.reduce_sum(cost * up), [xv, wv])
    feed = {"x": x, "w": w, "label": label, "n": length, "up": upstream[:, None]}
    got_cost, got_dx, got_dw = nf.Executor().run(main, feed=feed, fetch_list=[cost, dx, dw])
    want_dx, want_dw = crf_grad_ref(x, w, label, length, upstream)
    np.testing.assert_allclose(got_cost, crf_ref(x, w, label, length)["LogLikelihood"], atol=1e-10)
    np.testing.assert_allclose(got_dx, want_dx, atol=1e-10)
    np.testing.assert_allclose(got_dw, want_dw, atol=1e-10)


# ---- errors ----


def _append(op_type, feeds, attrs=None, outputs=()):
    block = nf.Program().global_block()
    inputs = {s: [block.create_var(f"in_{s}", shape, dtype)] for s, (shape, dtype) in feeds.items()}
    outs = {slot: [block.create_var(f"out_{slot}")] for slot in outputs}
    block.append_op(op_type, inputs, outs, attrs or {})


CRF_OUTS = ("Alpha", "EmissionExps", "TransitionExps", "LogLikelihood")


def test_build_time_errors_name_the_op_and_shapes():
    ok = {"Emission": ([-1, 4, 3], "float64"), "Transition": ([5, 3], "float64"),
          "Label": ([-1, 4], "int64")}  # fmt: skip
    _append("linear_chain_crf", ok, outputs=CRF_OUTS)
    with pytest.raises(ShapeError, match=r"linear_chain_crf: Transition \[3, 3\] must be "):
        _append("linear_chain_crf", {**ok, "Transition": ([3, 3], "float64")}, outputs=CRF_OUTS)
    with pytest.raises(ShapeError, match=r"Emission \[-1, 3\] must be a padded"):
        _append("linear_chain_crf", {**ok, "Emission": ([-1, 3], "float64")}, outputs=CRF_OUTS)
    with pytest.raises(DTypeError, match="Label must be int32 or int64"):
        _append("crf_decoding", {**ok, "Label": ([-1, 4], "float32")}, outputs=("ViterbiPath",))
    with pytest.raises(ShapeError, match=r"Label \[-1, 5\] must be \[batch, time\]"):
        _append("linear_chain_crf", {**ok, "Label": ([-1, 5], "int64")}, outputs=CRF_OUTS)
    chunk = {"Inference": ([-1, 4], "int64"), "Label": ([-1, 4], "int64")}
    outs = ("Precision", "Recall", "F1-Score", "NumInferChunks", "NumLabelChunks",
            "NumCorrectChunks")  # fmt: skip
    with pytest.raises(AttrError, match="chunk_scheme must be one of"):
        _append("chunk_eval", chunk, {"num_chunk_types": 2, "chunk_scheme": "BIO"}, outs)
    with pytest.raises(AttrError, match="'num_chunk_types' is required"):
        _append("chunk_eval", chunk, {}, outs)


def test_run_time_errors_name_the_bad_tag():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3, 2], "float64")
        label = nf.data("label", [-1, 3], "int64")
        cost = nf.layers.linear_chain_crf(x, label)
    nf.Executor().run(startup)
    feed = {"x": normal(2, 3, 2), "label": np.array([[0, 1, 0], [1, 2, 0]])}
    with pytest.raises(ExecutionError, match=r"Label\[1, 1\] = 2 is not a tag"):
        nf.Executor().run(main, feed=feed, fetch_list=[cost])
    main = nf.Program()
    with nf.program_guard(main, startup):
        label = nf.data("label", [-1, 3], "int64")
        p, n = nf.data("p", [-1, 3], "int64"), nf.data("n", [-1], "int64")
        outs = nf.layers.chunk_eval(p, label, "IOB", num_chunk_types=1, seq_length=n)
    feed = {"p": np.array([[0, 1, 2]]), "label": np.array([[0, 5, 0]]), "n": lengths(3)}
    with pytest.raises(ExecutionError, match=r"chunk_eval: Label\[0, 1\] = 5 is outside \[0, 2\]"):
        nf.Executor().run(main, feed=feed, fetch_list=[outs[0]])
