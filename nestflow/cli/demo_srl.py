"""`nestflow demo --model srl`: the Fluid book's label_semantic_roles shape (word and predicate
mark embeddings, bidirectional LSTM, linear-chain CRF, Viterbi decoding, chunk_eval F1) on a
synthetic role-tagging task, trained, saved as an inference model and reloaded.

Task (synthetic, generated from a seed, no download): a sentence is 6 to 24 tokens of a
40-word vocabulary: id 0 is padding, 2..13 are nouns, 14..33 other words, 34..39 verbs. Each
sentence holds one or two verbs; the predicate mark (a second input, as in the book) points at
one of them. Its arguments are chunks in IOB tags with three types: A0 is the run of nouns
right before the predicate, A1 the run of nouns right after it, V the predicate itself;
everything else, nouns elsewhere and the other verb included, is O. A word's tag depends on
both sides (is the noun run it sits in next to the marked verb?) and on its neighbours' tags
(B then I), which the BiLSTM and the CRF supply.

    words, mark [N, T] -> embeddings 32 + 8 -> bidirectional LSTM 48+48 (with the lengths)
        -> fc to 7 tag scores -> linear_chain_crf (cost) / crf_decoding (Viterbi path)

Held-out quality is chunk_eval's F1 (IOB, 3 chunk types) of the Viterbi paths against the
labels. The run fails (exit 1) below MIN_ACCURACY (0.95 F1), or if the reloaded inference
model does not decode bit for bit the same paths. With the defaults (3 epochs) seeds 0, 1
and 2 reach held-out F1 above 0.99 in about 20 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

import nestflow as nf
from nestflow.cli.demo_mlp import (
    reloads_identically,
    train_epochs,
    verdict,
)
from nestflow.core.threads import threads_summary

VOCAB = 40
NOUNS, OTHERS, VERBS = range(2, 14), range(14, 34), range(34, 40)
MIN_LENGTH, MAX_LENGTH = 6, 24
CHUNK_TYPES = 3  # A0, A1, V
A0, A1, V = 0, 1, 2
OUTSIDE = 2 * CHUNK_TYPES  # IOB: B-type = 2 * type, I-type = 2 * type + 1
NUM_TAGS = OUTSIDE + 1
WORD_DIM, MARK_DIM, HIDDEN = 32, 8, 48
TRAIN_SIZE, TEST_SIZE = 3000, 500
EPOCHS = 3
BATCH_SIZE = 32
LEARNING_RATE = 1e-2
MIN_ACCURACY = 0.95  # held-out chunk F1


@dataclass
class Sentences:
    words: np.ndarray  # int64 [N, MAX_LENGTH], 0 past each row's length
    mark: np.ndarray  # int64 [N, MAX_LENGTH], 1 at the predicate
    tags: np.ndarray  # int64 [N, MAX_LENGTH], IOB tags (OUTSIDE past each row's length)
    lengths: np.ndarray  # int64 [N]


def _tag_run(tags: np.ndarray, first: int, last: int, kind: int) -> None:
    if first <= last:
        tags[first] = 2 * kind
        tags[first + 1 : last + 1] = 2 * kind + 1


def make_sentences(n: int, rng: np.random.Generator) -> Sentences:
    """`n` sentences with their predicate marks and IOB role tags (see above)."""
    lengths = rng.integers(MIN_LENGTH, MAX_LENGTH + 1, size=n).astype(np.int64)
    words = np.zeros((n, MAX_LENGTH), np.int64)
    mark = np.zeros((n, MAX_LENGTH), np.int64)
    tags = np.full((n, MAX_LENGTH), OUTSIDE, np.int64)
    nouns, others, verbs = np.array(NOUNS), np.array(OTHERS), np.array(VERBS)
    for row, length in enumerate(lengths):
        # noun runs among other words, so a noun's role depends on where its run is
        is_noun = rng.random(length) < 0.45
        sentence = np.where(is_noun, rng.choice(nouns, length), rng.choice(others, length))
        places = rng.choice(length, size=rng.integers(1, 3), replace=False)
        sentence[places] = rng.choice(verbs, len(places))
        predicate = int(places[0])
        words[row, :length], mark[row, predicate] = sentence, 1
        noun = (sentence >= NOUNS.start) & (sentence < NOUNS.stop)
        first = predicate
        while first > 0 and noun[first - 1]:
            first -= 1
        last = predicate
        while last + 1 < length and noun[last + 1]:
            last += 1
        _tag_run(tags[row], first, predicate - 1, A0)
        _tag_run(tags[row], predicate, predicate, V)
        _tag_run(tags[row], predicate + 1, last, A1)
    return Sentences(words, mark, tags, lengths)


@dataclass
class Model:
    main: nf.Program
    startup: nf.Program
    loss: nf.VarDesc
    path: nf.VarDesc


def emissions(words: nf.VarDesc, mark: nf.VarDesc, lengths: nf.VarDesc) -> nf.VarDesc:
    """The book's feature stack, one layer deep: word and mark embeddings, a bidirectional
    LSTM over each row's steps, an fc to the tag scores [N, T, NUM_TAGS]."""
    word_emb = nf.layers.embedding(words, size=[VOCAB, WORD_DIM], name="word_emb")
    mark_emb = nf.layers.embedding(mark, size=[2, MARK_DIM], name="mark_emb")
    features = nf.layers.concat([word_emb, mark_emb], axis=2)
    states, _, _ = nf.layers.lstm(features, HIDDEN, lengths, is_bidirec=True, name="bilstm")
    return nf.layers.fc(states, NUM_TAGS, num_flatten_dims=2, name="emission")


def build_model(learning_rate: float = LEARNING_RATE) -> Model:
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        words = nf.data("words", shape=[-1, -1], dtype="int64")
        mark = nf.data("mark", shape=[-1, -1], dtype="int64")
        lengths = nf.data("lengths", shape=[-1], dtype="int64")
        target = nf.data("target", shape=[-1, -1], dtype="int64")
        scores = emissions(words, mark, lengths)
        crf = nf.ParamAttr(name="crfw")
        cost = nf.layers.linear_chain_crf(scores, target, param_attr=crf, length=lengths)
        path = nf.layers.crf_decoding(scores, param_attr=crf, length=lengths)
        loss = nf.layers.mean(cost)
        nf.optimizer.Adam(learning_rate=learning_rate).minimize(loss)
    return Model(main, startup, loss, path)


def feed_of(data: Sentences, rows: np.ndarray | slice) -> dict[str, np.ndarray]:
    """The rows as a feed, trimmed to their longest sentence."""
    lengths = data.lengths[rows]
    steps = int(lengths.max()) if len(lengths) else MIN_LENGTH
    return {
        "words": data.words[rows, :steps],
        "mark": data.mark[rows, :steps],
        "lengths": lengths,
        "target": data.tags[rows, :steps],
    }


def batches(data: Sentences, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Rows in batches of similar lengths (shuffled, sorted by length, cut), in random order."""
    order = rng.permutation(len(data.lengths))
    order = order[np.argsort(data.lengths[order], kind="stable")]
    cuts = [order[i : i + BATCH_SIZE] for i in range(0, len(order), BATCH_SIZE)]
    for index in rng.permutation(len(cuts)):
        yield cuts[index]


def train(
    model: Model, data: Sentences, scope: nf.Scope, epochs: int, seed: int = 0, progress=True
) -> list[float]:
    """Train in place in `scope`; returns the mean training cost of each epoch."""
    return train_epochs(
        model.main,
        model.startup,
        scope,
        epochs,
        lambda rng: batches(data, rng),
        lambda rows: feed_of(data, rows),
        [model.loss],
        steps=-(-len(data.lengths) // BATCH_SIZE),
        seed=seed,
        progress=progress,
    )


def decode(program, feeds, fetches, scope, data: Sentences) -> np.ndarray:
    """The Viterbi tag paths [N, T] of every sentence, through `program` (a model's forward)."""
    feed = feed_of(data, slice(None))
    (path,) = nf.Executor().run(
        program, feed={name: feed[name] for name in feeds}, fetch_list=fetches, scope=scope
    )
    return path


def chunk_f1(path: np.ndarray, data: Sentences) -> tuple[float, float, float]:
    """chunk_eval's (precision, recall, F1) of the decoded paths against the labels."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        inferred = nf.data("inferred", [-1, -1], "int64")
        label = nf.data("label", [-1, -1], "int64")
        lengths = nf.data("lengths", [-1], "int64")
        precision, recall, f1, *_ = nf.layers.chunk_eval(
            inferred, label, "IOB", CHUNK_TYPES, seq_length=lengths
        )
    steps = path.shape[1]
    feed = {"inferred": path, "label": data.tags[:, :steps], "lengths": data.lengths}
    values = nf.Executor().run(main, feed=feed, fetch_list=[precision, recall, f1])
    return tuple(float(v[0]) for v in values)


def run(args: argparse.Namespace) -> int:
    """The CLI entry: train, evaluate, save, reload, re-check; 1 if a check fails."""
    started = time.perf_counter()
    epochs = getattr(args, "epochs", None) or EPOCHS
    seed = getattr(args, "seed", 0) or 0
    limit = getattr(args, "limit", None)
    min_accuracy = getattr(args, "min_accuracy", None)
    min_accuracy = MIN_ACCURACY if min_accuracy is None else min_accuracy
    rng = np.random.default_rng(seed)
    train_data = make_sentences(limit or TRAIN_SIZE, rng)
    test_data = make_sentences(TEST_SIZE, rng)
    print(threads_summary())
    print(
        f"role tagging: {len(train_data.lengths)} training and {len(test_data.lengths)} "
        f"held-out sentences of {MIN_LENGTH}-{MAX_LENGTH} tokens, IOB tags of A0/A1/V; "
        f"embeddings {WORD_DIM}+{MARK_DIM} -> bidirectional LSTM {HIDDEN}+{HIDDEN} -> fc "
        f"{NUM_TAGS} -> linear_chain_crf, Adam lr {LEARNING_RATE}, {epochs} epochs"
    )
    model = build_model()
    scope = nf.Scope()
    progress = not getattr(args, "no_progress", False)
    history = train(model, train_data, scope, epochs, seed=seed, progress=progress)
    print("training cost per epoch: " + ", ".join(f"{v:.4f}" for v in history))

    feeds = ["words", "mark", "lengths"]
    forward = nf.prune(model.main, targets=[model.path])
    trained = decode(forward, feeds, [model.path.name], scope, test_data)
    precision, recall, f1 = chunk_f1(trained, test_data)
    print(f"test chunk precision {precision:.4f}, recall {recall:.4f}, F1: {f1:.4f}")

    identical = reloads_identically(
        getattr(args, "out", None),
        "nestflow-srl-",
        feeds,
        [model.path],
        model.main,
        scope,
        lambda *loaded: decode(*loaded, test_data),
        trained,
    )
    return verdict(identical, f1, min_accuracy, started, reloaded="paths", measure="test F1")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m nestflow.cli.demo_srl [--epochs N] [--seed S] [--limit N] [--out DIR]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="training sentences to use")
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--min-accuracy", type=float, default=MIN_ACCURACY)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
