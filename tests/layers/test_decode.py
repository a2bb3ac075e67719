"""BeamSearchDecoder + dynamic_decode on a tiny fixed float64 model: the decoded beams, scores
and lengths equal a NumPy beam search written with explicit hypotheses (no parent pointers, no
gather_tree) and, with a beam wide enough to hold every sequence, an exhaustive search; finished
beams stop and are padded with the end token; beam_size 1 is greedy arg-max decoding."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, ShapeError

L = nf.layers
START, END = 0, 1
KINF = 1e9


class TinyModel:
    """h' = tanh(emb[id] @ wx + h @ wh [+ mean(enc)]); logits = h' @ wo + bias."""

    def __init__(self, vocab=6, hidden=4, embed=3, seed=0, end_bias=0.0):
        rng = np.random.default_rng(seed)
        self.vocab, self.hidden = vocab, hidden
        self.values = {
            "wx": rng.normal(size=(embed, hidden)),
            "wh": rng.normal(size=(hidden, hidden)),
            "wo": rng.normal(size=(hidden, vocab)) * 2.0,
            "emb": rng.normal(size=(vocab, embed)),
        }
        self.bias = np.zeros(vocab)
        self.bias[END] = end_bias
        self.params = {
            k: L.create_parameter(v.shape, "float64", name=k) for k, v in self.values.items()
        }
        self.bias_var = L.assign(self.bias)

    # ---- the nestflow side ----
    def cell(self, inputs, states, enc=None):
        h = L.tanh(L.matmul(inputs, self.params["wx"]) + L.matmul(states, self.params["wh"]))
        if enc is not None:
            h = L.elementwise_add(h, L.reduce_mean(enc, dim=1), axis=0)
        return h, h

    def embed(self, ids):
        return L.embedding(
            ids, [self.vocab, 3], param_attr=nf.ParamAttr(name="emb"), dtype="float64"
        )

    def logits(self, h):
        return L.elementwise_add(L.matmul(h, self.params["wo"]), self.bias_var)

    def decoder(self, beam_size, **overrides):
        args = dict(embedding_fn=self.embed, output_fn=self.logits)
        args.update(overrides)
        return L.BeamSearchDecoder(self.cell, START, END, beam_size, **args)

    def load(self, scope):
        for name, value in self.values.items():
            scope.find_var(name).get(nf.Tensor).set(value)

    # ---- the NumPy side ----
    def step(self, token, h, enc_mean=None):
        """(log-probabilities [vocab], new h) for one hypothesis."""
        v = self.values
        h = np.tanh(v["emb"][token] @ v["wx"] + h @ v["wh"])
        if enc_mean is not None:
            h = h + enc_mean
        logits = h @ v["wo"] + self.bias
        shifted = logits - logits.max()
        return shifted - np.log(np.exp(shifted).sum()), h


def numpy_beam_search(model, h0, beam, max_step_num, enc_means=None):
    """Per row: each hypothesis keeps its own token list, score, finished flag and state; each
    step scores all beam * vocab extensions and keeps the `beam` best (ties: lower index)."""
    rows = []
    steps_run = 0
    for row, h_row in enumerate(h0):
        enc = None if enc_means is None else enc_means[row]
        hyps = [
            {"tokens": [], "score": 0.0 if b == 0 else -KINF, "done": False, "h": h_row, "len": 0}
            for b in range(beam)
        ]
        rows.append((hyps, enc))
    step = 0
    while True:
        for index, (hyps, enc) in enumerate(rows):
            candidates = []
            for hyp in hyps:
                token = hyp["tokens"][-1] if hyp["tokens"] else START
                log_p, h = model.step(token, hyp["h"], enc)
                if hyp["done"]:
                    log_p = np.full(model.vocab, -KINF)
                    log_p[END] = 0.0
                for v in range(model.vocab):
                    candidates.append((hyp["score"] + log_p[v], hyp, v, h))
            order = sorted(range(len(candidates)), key=lambda i: (-candidates[i][0], i))
            new = []
            for i in order[:beam]:
                score, hyp, v, h = candidates[i]
                new.append(
                    {
                        "tokens": hyp["tokens"] + [v],
                        "score": score,
                        "done": hyp["done"] or v == END,
                        "h": h,
                        "len": hyp["len"] + (not hyp["done"]),
                    }
                )
            rows[index] = (new, enc)
        step += 1
        steps_run = step
        all_done = all(h["done"] for hyps, _ in rows for h in hyps)
        if all_done or step > max_step_num:
            break
    ids = np.array([[h["tokens"] for h in hyps] for hyps, _ in rows])  # [N, beam, T]
    scores = np.array([[h["score"] for h in hyps] for hyps, _ in rows])
    lengths = np.array([[h["len"] for h in hyps] for hyps, _ in rows])
    return ids.transpose(0, 2, 1), scores, lengths, steps_run


def _decode(model, beam, max_step_num, h0, **kwargs):
    h0_var = L.data("h0", [-1, model.hidden], "float64")
    decoder = model.decoder(beam)
    ids, final, lengths = L.dynamic_decode(
        decoder, inits=h0_var, max_step_num=max_step_num, return_length=True, **kwargs
    )
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(nf.default_startup_program(), scope=scope)
    model.load(scope)
    return exe, scope, (ids, final, lengths)


def _run(model, beam, max_step_num, h0):
    exe, scope, (ids, final, lengths) = _decode(model, beam, max_step_num, h0)
    fetch = [ids, final.log_probs, lengths, final.finished]
    return exe.run(feed={"h0": h0}, fetch_list=fetch, scope=scope)


@pytest.mark.parametrize(
    "seed,beam,max_step_num,end_bias",
    [(0, 3, 6, 0.0), (1, 4, 8, 1.0), (2, 2, 5, -0.5), (3, 5, 4, 2.0), (4, 6, 3, 0.0)],
)
def test_beams_and_scores_equal_a_numpy_beam_search(seed, beam, max_step_num, end_bias):
    model = TinyModel(seed=seed, end_bias=end_bias)
    h0 = np.random.default_rng(seed + 10).normal(size=(3, model.hidden))
    ids, scores, lengths, finished = _run(model, beam, max_step_num, h0)
    want_ids, want_scores, want_lengths, steps = numpy_beam_search(model, h0, beam, max_step_num)
    assert ids.shape == (3, steps, beam) and ids.dtype == np.int64
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-10)
    np.testing.assert_array_equal(lengths, want_lengths)
    assert np.all(np.diff(scores, axis=1) <= 0)  # best beam first
    np.testing.assert_array_equal(finished, (ids == END).any(axis=1))


def test_finished_beams_stop_and_are_padded_with_the_end_token():
    """With the end token likely, beams finish at different steps: everything after a beam's
    first end token is the end token, its score stops changing and its length counts up to
    the end token; decoding stops early once every beam has finished."""
    model = TinyModel(seed=5, end_bias=3.0)
    h0 = np.random.default_rng(7).normal(size=(4, model.hidden))
    ids, scores, lengths, finished = _run(model, beam=3, max_step_num=30, h0=h0)
    steps = ids.shape[1]
    assert steps < 31 and finished.all()
    first_end = np.argmax(ids == END, axis=1)  # [N, beam]
    assert len(set(first_end.ravel().tolist())) > 1  # beams finished at different steps
    for n, b in itertools.product(range(4), range(3)):
        assert (ids[n, first_end[n, b] :, b] == END).all()
        assert (ids[n, : first_end[n, b], b] != END).all()
    np.testing.assert_array_equal(lengths, first_end + 1)
    want_ids, want_scores, _, _ = numpy_beam_search(model, h0, 3, 30)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-10)


def test_max_step_num_bounds_the_steps_as_in_fluid():
    """Decoding past step max_step_num stops (max_step_num + 1 steps) with unfinished beams."""
    model = TinyModel(seed=6, end_bias=-30.0)
    h0 = np.random.default_rng(8).normal(size=(2, model.hidden))
    ids, _, lengths, finished = _run(model, beam=2, max_step_num=4, h0=h0)
    assert ids.shape == (2, 5, 2) and not finished.any()
    assert (ids != END).all() and (lengths == 5).all()


def _sequence_scores(model, h_row, length):
    """Every sequence of `length` steps that keeps emitting the end token once it has emitted
    it, with its score (summed log-probabilities until the end token)."""
    found = []
    for tokens in itertools.product(range(model.vocab), repeat=length):
        if END in tokens and any(t != END for t in tokens[tokens.index(END) :]):
            continue
        score, h, token = 0.0, h_row, START
        for t in tokens:
            log_p, h = model.step(token, h)
            score += log_p[t]
            token = t
            if t == END:
                break
        found.append((score, tokens))
    return found


def test_a_beam_holding_every_sequence_finds_the_exhaustive_ranking():
    model = TinyModel(vocab=3, seed=9)
    h0 = np.random.default_rng(9).normal(size=(2, model.hidden))
    every = [_sequence_scores(model, h, 3) for h in h0]
    count = len(every[0])  # 1 + 2 + 4 + 8 sequences of 3 steps
    assert count == 15
    ids, scores, _, _ = _run(model, beam=count + 2, max_step_num=2, h0=h0)
    assert ids.shape[1] == 3
    for n in range(2):
        ranked = sorted(every[n], key=lambda item: -item[0])
        np.testing.assert_allclose(scores[n, :count], [s for s, _ in ranked], rtol=1e-10)
        assert [tuple(ids[n, :, b]) for b in range(count)] == [t for _, t in ranked]
        assert (scores[n, count:] < -KINF / 2).all()  # the beams beyond are the -1e9 ones


def numpy_greedy(model, h0, max_step_num):
    tokens, done = [], np.zeros(len(h0), bool)
    token, h = np.full(len(h0), START), h0
    step = 0
    while True:
        chosen, new_h = [], []
        for n in range(len(h0)):
            log_p, h_n = model.step(token[n], h[n])
            chosen.append(END if done[n] else int(np.argmax(log_p)))
            new_h.append(h_n)
        token, h = np.array(chosen), np.array(new_h)
        done |= token == END
        tokens.append(token)
        step += 1
        if done.all() or step > max_step_num:
            return np.stack(tokens, axis=1)


@pytest.mark.parametrize("seed", [0, 11, 12])
def test_beam_size_one_is_greedy_arg_max_decoding(seed):
    model = TinyModel(seed=seed, end_bias=0.5)
    h0 = np.random.default_rng(seed).normal(size=(5, model.hidden))
    ids, _, _, _ = _run(model, beam=1, max_step_num=7, h0=h0)
    np.testing.assert_array_equal(ids[:, :, 0], numpy_greedy(model, h0, 7))


def test_nested_states_kwargs_time_major_and_tiled_batch_values():
    """An LSTM-shaped cell (states [h, c]) reading an encoder output through dynamic_decode's
    kwargs (tiled to the beams), with time-major outputs."""
    model = TinyModel(seed=13)
    h0_var = L.data("h0", [-1, model.hidden], "float64")
    c0_var = L.data("c0", [-1, -1], "float64")  # a state whose size is unknown when built
    enc = L.data("enc", [-1, -1, model.hidden], "float64")
    beam = 3

    def cell(inputs, states, enc=None):
        h, c = states
        out, _ = model.cell(inputs, h, enc=enc)
        return out, [out, L.scale(c, 1.0)]

    decoder = L.BeamSearchDecoder(cell, START, END, beam, model.embed, model.logits)
    tiled = L.BeamSearchDecoder.tile_beam_merge_with_batch(enc, beam)
    assert tiled.shape == (-1, -1, model.hidden)
    ids, final = L.dynamic_decode(
        decoder, inits=[h0_var, c0_var], max_step_num=5, output_time_major=True, enc=tiled
    )
    assert isinstance(final, L.BeamSearchDecoder.StateWrapper)
    assert isinstance(final.cell_states, list) and len(final.cell_states) == 2
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(nf.default_startup_program(), scope=scope)
    model.load(scope)
    rng = np.random.default_rng(13)
    h0, enc_value = rng.normal(size=(2, model.hidden)), rng.normal(size=(2, 5, model.hidden))
    got, tiled_value, c_final = exe.run(
        feed={"h0": h0, "c0": h0 * 2.0, "enc": enc_value},
        fetch_list=[ids, tiled, final.cell_states[1]],
        scope=scope,
    )
    np.testing.assert_array_equal(tiled_value, np.repeat(enc_value, beam, axis=0))
    np.testing.assert_array_equal(c_final, np.repeat(h0[:, None] * 2.0, beam, axis=1))
    want, _, _, _ = numpy_beam_search(model, h0, beam, 5, enc_means=enc_value.mean(axis=1))
    np.testing.assert_array_equal(got, want.transpose(1, 0, 2))  # [T, N, beam]


def test_the_decoder_program_reloads_as_an_inference_model(tmp_path):
    model = TinyModel(seed=14)
    exe, scope, (ids, final, _) = _decode(model, 3, 6, None)
    h0 = np.random.default_rng(14).normal(size=(4, model.hidden))
    (want,) = exe.run(feed={"h0": h0}, fetch_list=[ids], scope=scope)
    main = nf.default_main_program()
    nf.io.save_inference_model(str(tmp_path / "m"), ["h0"], [ids, final.log_probs], main, scope)
    program, feeds, fetches, loaded = nf.io.load_inference_model(str(tmp_path / "m"))
    got, scores = exe.run(program, feed={"h0": h0}, fetch_list=fetches, scope=loaded)
    np.testing.assert_array_equal(got, want)
    assert scores.shape == (4, 3)


def test_decoding_does_not_grow_scopes_over_many_runs():
    from nestflow.core.scope import live_scope_count

    model = TinyModel(seed=15, end_bias=1.0)
    exe, scope, (ids, _, _) = _decode(model, 2, 5, None)
    h0 = np.random.default_rng(15).normal(size=(2, model.hidden))
    exe.run(feed={"h0": h0}, fetch_list=[ids], scope=scope)
    before = live_scope_count()
    for _ in range(50):
        exe.run(feed={"h0": h0}, fetch_list=[ids], scope=scope)
    assert live_scope_count() == before and scope.kids == []


# ---- errors ----


def _raises_here(kind, match, build):
    with pytest.raises(kind, match=match) as info:
        build()
    assert "test_decode.py" in str(info.value)


def test_bad_decoder_arguments_are_errors():
    model = TinyModel()
    _raises_here(AttrError, "beam_size must be at least 1, got 0", lambda: model.decoder(0))
    _raises_here(AttrError, "beam_size must be an int", lambda: model.decoder(2.0))
    _raises_here(
        AttrError, "end_token must be a non-negative int",
        lambda: L.BeamSearchDecoder(model.cell, 0, -1, 2),
    )  # fmt: skip
    _raises_here(AttrError, "cell must be callable", lambda: L.BeamSearchDecoder(3, 0, 1, 2))
    h0 = L.data("h0", [-1, model.hidden], "float64")
    _raises_here(
        AttrError, "max_step_num must be a non-negative int",
        lambda: L.dynamic_decode(model.decoder(2), inits=h0, max_step_num=-1),
    )  # fmt: skip


def test_an_end_token_outside_the_vocabulary_is_a_build_time_error():
    model = TinyModel(vocab=6)
    h0 = L.data("h0", [-1, model.hidden], "float64")
    decoder = L.BeamSearchDecoder(model.cell, START, 6, 2, model.embed, model.logits)
    _raises_here(
        ShapeError,
        r"end_token 6 is outside the vocabulary of 6 tokens",
        lambda: L.dynamic_decode(decoder, inits=h0, max_step_num=3),
    )


def test_logits_of_the_wrong_shape_are_build_time_errors():
    model = TinyModel()
    h0 = L.data("h0", [-1, model.hidden], "float64")
    flat = L.BeamSearchDecoder(
        model.cell, START, END, 2, model.embed, lambda h: L.reshape(model.logits(h), [-1, 6])
    )
    _raises_here(
        ShapeError,
        r"must be \[batch, beam_size=2, vocab\]",
        lambda: L.dynamic_decode(flat, inits=h0),
    )
    unknown = L.BeamSearchDecoder(
        model.cell, START, END, 2, model.embed,
        lambda h: L.concat([model.logits(h), L.data("extra", [-1, 2, -1], "float64")], axis=2),
    )  # fmt: skip
    _raises_here(
        ShapeError, "vocabulary size .* must be known", lambda: L.dynamic_decode(unknown, inits=h0)
    )


class CountDown(L.Decoder):
    """Emits n - 1, n - 2, ...; a row has finished once its count is below 1. It does not
    track its own finished state: dynamic_decode does."""

    def initialize(self, n):
        return n, n, L.less_than(n, L.fill_constant([1], "int64", 1))

    def step(self, time, inputs, states):
        left = states - 1
        return left, left, left, L.less_than(left, L.fill_constant([1], "int64", 1))


@pytest.mark.parametrize("impute", [False, True])
def test_a_decoder_without_its_own_finished_state(impute):
    """dynamic_decode ors `finished` over the steps, counts each row's steps until it has
    finished, and with impute_finished keeps a finished row's states."""
    n = L.data("n", [-1], "int64")
    outputs, final, lengths = L.dynamic_decode(
        CountDown(), inits=n, impute_finished=impute, return_length=True
    )
    got, state, steps = nf.Executor().run(
        feed={"n": np.array([2, 4, 1])}, fetch_list=[outputs, final, lengths]
    )
    if impute:  # a finished row's state stays 0, so its later outputs repeat -1
        assert got.tolist() == [[1, 0, -1, -1], [3, 2, 1, 0], [0, -1, -1, -1]]
        assert state.tolist() == [0, 0, 0]
    else:
        assert got.tolist() == [[1, 0, -1, -2], [3, 2, 1, 0], [0, -1, -2, -3]]
        assert state.tolist() == [-2, 0, -3]
    assert steps.tolist() == [2, 4, 1]
