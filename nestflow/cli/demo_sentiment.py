"""`nestflow demo --model sentiment`: the Fluid book's understand_sentiment network (embedding,
bidirectional LSTM, max pooling over time, softmax fc) on a synthetic task that needs order
remembered over long spans, trained, saved as an inference model and reloaded.

Task (synthetic, generated from a seed, no download): a "review" is 5 to 40 tokens of a
20-word vocabulary; id 0 is padding, ids 3..19 are distractors, and every review holds exactly
one token A (id 1) and one token B (id 2) at random positions, anywhere in it. The label is 1
when A comes before B, 0 when after (balanced by construction). Seen one token at a time the
answer depends on what was read up to 38 steps before, and a bag of words (the counts) carries
no information at all: the model must remember the order.

    ids [N, T] -> embedding 16 -> bidirectional LSTM 32+32 (with the rows' lengths)
        -> sequence_pool max over each row's valid steps -> fc 2 softmax, cross entropy, Adam

Batches hold reviews of similar lengths (sorted, cut, shuffled each epoch) and are trimmed to
their longest row, so few padding steps run. The run fails (exit 1) below MIN_ACCURACY (95%)
held-out accuracy, or if the reloaded inference model does not predict bit for bit the same.
With the defaults (3 epochs) seeds 0, 1 and 2 each reach 100.0% held-out accuracy, also on
the reviews whose A and B lie more than 20 tokens apart, in about 12 s of CPU (about 40 s of
wall time on a 2-core machine at load average 8).
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

VOCAB, TOKEN_A, TOKEN_B = 20, 1, 2
MIN_LENGTH, MAX_LENGTH = 5, 40
EMBED, HIDDEN = 16, 32
TRAIN_SIZE, TEST_SIZE = 4000, 1000
EPOCHS = 3
BATCH_SIZE = 32
LEARNING_RATE = 1e-2
MIN_ACCURACY = 0.95


@dataclass
class Reviews:
    ids: np.ndarray  # int64 [N, MAX_LENGTH], 0 past each row's length
    lengths: np.ndarray  # int64 [N]
    labels: np.ndarray  # int64 [N, 1]: 1 if token A comes before token B


def make_reviews(n: int, rng: np.random.Generator) -> Reviews:
    """`n` reviews of MIN_LENGTH..MAX_LENGTH tokens with one A and one B each (see above)."""
    lengths = rng.integers(MIN_LENGTH, MAX_LENGTH + 1, size=n).astype(np.int64)
    ids = rng.integers(TOKEN_B + 1, VOCAB, size=(n, MAX_LENGTH)).astype(np.int64)
    ids[np.arange(MAX_LENGTH)[None, :] >= lengths[:, None]] = 0
    labels = np.empty((n, 1), np.int64)
    for row, length in enumerate(lengths):
        a, b = rng.choice(length, size=2, replace=False)
        ids[row, a], ids[row, b] = TOKEN_A, TOKEN_B
        labels[row, 0] = int(a < b)
    return Reviews(ids, lengths, labels)


FAR_APART = 20


def far_apart(data: Reviews) -> np.ndarray:
    """bool [N]: the reviews whose A and B lie more than FAR_APART tokens apart."""
    where_a = (data.ids == TOKEN_A).argmax(axis=1)
    where_b = (data.ids == TOKEN_B).argmax(axis=1)
    return np.abs(where_a - where_b) > FAR_APART


@dataclass
class Model:
    main: nf.Program
    startup: nf.Program
    loss: nf.VarDesc
    accuracy: nf.VarDesc
    probabilities: nf.VarDesc


def bilstm_classifier(ids: nf.VarDesc, lengths: nf.VarDesc, hidden: int = HIDDEN) -> nf.VarDesc:
    """The book's shape: embedding, bidirectional LSTM, max pool over time, softmax fc."""
    embedded = nf.layers.embedding(ids, size=[VOCAB, EMBED], name="embedding")
    states, _, _ = nf.layers.lstm(embedded, hidden, lengths, is_bidirec=True, name="bilstm")
    pooled = nf.layers.sequence_pool(states, "max", lengths)
    return nf.layers.fc(pooled, 2, act="softmax", name="classifier")


def build_model(learning_rate: float = LEARNING_RATE, hidden: int = HIDDEN) -> Model:
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        ids = nf.data("ids", shape=[-1, -1], dtype="int64")
        lengths = nf.data("lengths", shape=[-1], dtype="int64")
        label = nf.data("label", shape=[-1, 1], dtype="int64")
        probabilities = bilstm_classifier(ids, lengths, hidden)
        loss = nf.layers.mean(nf.layers.cross_entropy(probabilities, label))
        accuracy = nf.layers.accuracy(probabilities, label)
        nf.optimizer.Adam(learning_rate=learning_rate).minimize(loss)
    return Model(main, startup, loss, accuracy, probabilities)


def feed_of(data: Reviews, rows: np.ndarray | slice) -> dict[str, np.ndarray]:
    """The rows as a feed, trimmed to their longest review: no step runs on padding alone."""
    lengths = data.lengths[rows]
    steps = int(lengths.max()) if len(lengths) else MIN_LENGTH
    return {"ids": data.ids[rows, :steps], "lengths": lengths, "label": data.labels[rows]}


def batches(data: Reviews, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Rows in batches of similar lengths (shuffled, sorted by length, cut), in random order."""
    order = rng.permutation(len(data.lengths))
    order = order[np.argsort(data.lengths[order], kind="stable")]
    cuts = [order[i : i + BATCH_SIZE] for i in range(0, len(order), BATCH_SIZE)]
    for index in rng.permutation(len(cuts)):
        yield cuts[index]


def train(
    model: Model, data: Reviews, scope: nf.Scope, epochs: int, seed: int = 0, progress=True
) -> list[float]:
    """Train in place in `scope`; returns the mean training loss of each epoch."""
    return train_epochs(
        model.main,
        model.startup,
        scope,
        epochs,
        lambda rng: batches(data, rng),
        lambda rows: feed_of(data, rows),
        [model.loss, model.accuracy],
        steps=-(-len(data.lengths) // BATCH_SIZE),
        seed=seed,
        progress=progress,
    )


def predict(program, feeds, fetches, scope, data: Reviews) -> np.ndarray:
    """Class probabilities [N, 2] of every review, through `program` (a model's forward)."""
    feed = feed_of(data, slice(None))
    (probabilities,) = nf.Executor().run(
        program, feed={name: feed[name] for name in feeds}, fetch_list=fetches, scope=scope
    )
    return probabilities


def run(args: argparse.Namespace) -> int:
    """The CLI entry: train, evaluate, save, reload, re-check; 1 if a check fails."""
    started = time.perf_counter()
    epochs = getattr(args, "epochs", None) or EPOCHS
    seed = getattr(args, "seed", 0) or 0
    limit = getattr(args, "limit", None)
    min_accuracy = getattr(args, "min_accuracy", None)
    min_accuracy = MIN_ACCURACY if min_accuracy is None else min_accuracy
    rng = np.random.default_rng(seed)
    train_data = make_reviews(limit or TRAIN_SIZE, rng)
    test_data = make_reviews(TEST_SIZE, rng)
    print(threads_summary())
    print(
        f"A-before-B reviews: {len(train_data.lengths)} training and {len(test_data.lengths)} "
        f"held-out reviews of {MIN_LENGTH}-{MAX_LENGTH} tokens; embedding {EMBED} -> "
        f"bidirectional LSTM {HIDDEN}+{HIDDEN} -> max pool -> fc 2, Adam lr {LEARNING_RATE}, "
        f"{epochs} epochs"
    )
    model = build_model()
    scope = nf.Scope()
    progress = not getattr(args, "no_progress", False)
    history = train(model, train_data, scope, epochs, seed=seed, progress=progress)
    print("training loss per epoch: " + ", ".join(f"{v:.4f}" for v in history))

    forward = nf.prune(model.main, targets=[model.probabilities])
    trained = predict(forward, ["ids", "lengths"], [model.probabilities.name], scope, test_data)
    right = trained.argmax(axis=1) == test_data.labels.ravel()
    test_accuracy = float(right.mean())
    apart = far_apart(test_data)
    print(f"test accuracy: {test_accuracy:.2%}")
    print(
        f"test accuracy on the {int(apart.sum())} reviews with A and B more than "
        f"{FAR_APART} tokens apart: {float(right[apart].mean()):.2%}"
    )

    identical = reloads_identically(
        getattr(args, "out", None),
        "nestflow-sentiment-",
        ["ids", "lengths"],
        [model.probabilities],
        model.main,
        scope,
        lambda *loaded: predict(*loaded, test_data),
        trained,
    )
    return verdict(identical, test_accuracy, min_accuracy, started)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m nestflow.cli.demo_sentiment [--epochs N] [--seed S] [--limit N] [--out DIR]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="training reviews to use")
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--min-accuracy", type=float, default=MIN_ACCURACY)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
