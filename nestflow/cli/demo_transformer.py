"""`nestflow demo --model transformer`: a Transformer encoder classifier (token and position
embeddings, 2 pre-norm encoder layers over the rows' lengths, max pool, softmax fc) on a
synthetic task that needs attention between neighbouring tokens, trained, saved as an inference
model and reloaded.

Task (synthetic, generated from a seed, no download): a sequence is 8 to 24 tokens of a
16-word vocabulary; id 0 is padding, ids 3..15 are distractors, and every sequence holds
exactly two tokens A (id 1) and two tokens B (id 2) at random positions. The label is 1 when
some A is immediately followed by a B (the bigram "A B" occurs), 0 otherwise (about 63% of
the sequences are positive: always answering 1 scores 63%). Every sequence holds the same tokens A and B in the same numbers, so a bag of words
carries no information: each position has to look at its neighbour, which the model does by
self-attention over its position embeddings.

    ids [N, 24] -> embedding 32 + position embedding [24, 32]
        -> nf.nets.transformer_encoder (2 layers, 4 heads, feed-forward 64, pre-norm, final
           layer_norm, keys past each row's length masked)
        -> sequence_pool max over each row's valid steps -> fc 2 softmax, cross entropy, Adam

The run fails (exit 1) below MIN_ACCURACY (95%) held-out accuracy, or if the reloaded
inference model does not predict bit for bit the same. With the defaults (12 epochs, Adam lr
5e-3) seeds 0, 1 and 2 reached 98.8%, 98.4% and 97.5% held-out accuracy, in 21-35 s of wall
time on a 2-core machine shared with other work.
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

VOCAB, TOKEN_A, TOKEN_B = 16, 1, 2
MIN_LENGTH, MAX_LENGTH = 8, 24
EMBED, HEADS, FEED_FORWARD, LAYERS = 32, 4, 64, 2
TRAIN_SIZE, TEST_SIZE = 4000, 1000
EPOCHS = 12
BATCH_SIZE = 32
LEARNING_RATE = 5e-3
MIN_ACCURACY = 0.95


@dataclass
class Sequences:
    ids: np.ndarray  # int64 [N, MAX_LENGTH], 0 past each row's length
    lengths: np.ndarray  # int64 [N]
    labels: np.ndarray  # int64 [N, 1]: 1 if some A is immediately followed by a B


def has_bigram(ids: np.ndarray) -> np.ndarray:
    """bool [N]: whether a row holds token A immediately followed by token B."""
    return ((ids[:, :-1] == TOKEN_A) & (ids[:, 1:] == TOKEN_B)).any(axis=1)


def make_sequences(n: int, rng: np.random.Generator) -> Sequences:
    """`n` sequences of MIN_LENGTH..MAX_LENGTH tokens with two A's and two B's each; half of
    them are built around an "A B" bigram, the rest place the four at random (see above)."""
    lengths = rng.integers(MIN_LENGTH, MAX_LENGTH + 1, size=n).astype(np.int64)
    ids = rng.integers(TOKEN_B + 1, VOCAB, size=(n, MAX_LENGTH)).astype(np.int64)
    ids[np.arange(MAX_LENGTH)[None, :] >= lengths[:, None]] = 0
    for row, length in enumerate(lengths):
        if row % 2:  # an "A B" at a random place, the other A and B anywhere else
            at = rng.integers(0, length - 1)
            rest = np.setdiff1d(np.arange(length), [at, at + 1])
            a, b = rng.choice(rest, size=2, replace=False)
            ids[row, [at, a]], ids[row, [at + 1, b]] = TOKEN_A, TOKEN_B
        else:
            places = rng.choice(length, size=4, replace=False)
            ids[row, places[:2]], ids[row, places[2:]] = TOKEN_A, TOKEN_B
    labels = has_bigram(ids).astype(np.int64)[:, None]
    return Sequences(ids, lengths, labels)


@dataclass
class Model:
    main: nf.Program
    startup: nf.Program
    loss: nf.VarDesc
    accuracy: nf.VarDesc
    probabilities: nf.VarDesc


def transformer_classifier(ids: nf.VarDesc, lengths: nf.VarDesc, embed: int = EMBED):
    """Token + position embeddings, a pre-norm Transformer encoder, max pool, softmax fc."""
    tokens = nf.layers.embedding(ids, size=[VOCAB, embed], name="embedding")
    positions = nf.layers.create_parameter(
        [MAX_LENGTH, embed], "float32", name="position_embedding",
        initializer=nf.initializer.Normal(0.0, 0.5),
    )  # fmt: skip
    states = nf.nets.transformer_encoder(
        tokens + positions, LAYERS, HEADS, FEED_FORWARD, dropout=0.0, activation="gelu",
        normalize_before=True, src_key_padding_lengths=lengths, final_norm=True, name="encoder",
    )  # fmt: skip
    pooled = nf.layers.sequence_pool(states, "max", lengths)
    return nf.layers.fc(pooled, 2, act="softmax", name="classifier")


def build_model(learning_rate: float = LEARNING_RATE, embed: int = EMBED) -> Model:
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        ids = nf.data("ids", shape=[-1, MAX_LENGTH], dtype="int64")
        lengths = nf.data("lengths", shape=[-1], dtype="int64")
        label = nf.data("label", shape=[-1, 1], dtype="int64")
        probabilities = transformer_classifier(ids, lengths, embed)
        loss = nf.layers.mean(nf.layers.cross_entropy(probabilities, label))
        accuracy = nf.layers.accuracy(probabilities, label)
        nf.optimizer.Adam(learning_rate=learning_rate).minimize(loss)
    return Model(main, startup, loss, accuracy, probabilities)


def feed_of(data: Sequences, rows: np.ndarray | slice) -> dict[str, np.ndarray]:
    return {"ids": data.ids[rows], "lengths": data.lengths[rows], "label": data.labels[rows]}


def batches(data: Sequences, rng: np.random.Generator) -> Iterator[np.ndarray]:
    order = rng.permutation(len(data.lengths))
    for i in range(0, len(order), BATCH_SIZE):
        yield order[i : i + BATCH_SIZE]


def train(
    model: Model, data: Sequences, scope: nf.Scope, epochs: int, seed: int = 0, progress=True
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


def predict(program, feeds, fetches, scope, data: Sequences) -> np.ndarray:
    """Class probabilities [N, 2] of every sequence, through `program` (a model's forward)."""
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
    train_data = make_sequences(limit or TRAIN_SIZE, rng)
    test_data = make_sequences(TEST_SIZE, rng)
    print(threads_summary())
    print(
        f'"A B" bigram sequences: {len(train_data.lengths)} training and '
        f"{len(test_data.lengths)} held-out sequences of {MIN_LENGTH}-{MAX_LENGTH} tokens; "
        f"embedding {EMBED} + positions -> Transformer encoder {LAYERS} layers, {HEADS} heads, "
        f"feed-forward {FEED_FORWARD} -> max pool -> fc 2, Adam lr {LEARNING_RATE}, "
        f"{epochs} epochs"
    )
    model = build_model()
    scope = nf.Scope()
    progress = not getattr(args, "no_progress", False)
    history = train(model, train_data, scope, epochs, seed=seed, progress=progress)
    print("training loss per epoch: " + ", ".join(f"{v:.4f}" for v in history))

    forward = nf.prune(model.main, targets=[model.probabilities])
    trained = predict(forward, ["ids", "lengths"], [model.probabilities.name], scope, test_data)
    test_accuracy = float((trained.argmax(axis=1) == test_data.labels.ravel()).mean())
    print(f"test accuracy: {test_accuracy:.2%}")

    identical = reloads_identically(
        getattr(args, "out", None),
        "nestflow-transformer-",
        ["ids", "lengths"],
        [model.probabilities],
        model.main,
        scope,
        lambda *loaded: predict(*loaded, test_data),
        trained,
    )
    return verdict(identical, test_accuracy, min_accuracy, started)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m nestflow.cli.demo_transformer [--epochs N] [--seed S] [--limit N] [--out DIR]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="training sequences to use")
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--min-accuracy", type=float, default=MIN_ACCURACY)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
