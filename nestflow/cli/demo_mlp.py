"""`nestflow demo`: an MLP on scikit-learn's bundled 8x8 digits, trained, saved, reloaded.

64 pixels -> 128 relu -> 10 logits, softmax_with_cross_entropy, Adam; standardised features, a
fixed seed and a seeded 80/20 split, so every run prints the same numbers. The trained model is
saved with nf.io.save_inference_model, loaded back and checked to predict bit for bit the same.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass

import numpy as np

import nestflow as nf
from nestflow.core.threads import threads_summary

EPOCHS = 20
BATCH_SIZE = 32
LEARNING_RATE = 1e-3


@dataclass
class Digits:
    train_x: np.ndarray  # float32 [N, 64], standardised with the training set's statistics
    train_y: np.ndarray  # int64 [N, 1]
    test_x: np.ndarray
    test_y: np.ndarray


def load_digits(seed: int = 0, limit: int | None = None, test_fraction: float = 0.2) -> Digits:
    """The 1797 digits bundled with scikit-learn (no download), shuffled and split."""
    from sklearn.datasets import load_digits as sklearn_digits

    images, labels = sklearn_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(images))
    if limit is not None:
        order = order[:limit]
    n_test = int(round(len(order) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    mean = images[train].mean(axis=0)
    std = images[train].std(axis=0)
    std[std == 0] = 1.0  # pixels that are blank in every training image

    def features(rows):
        return ((images[rows] - mean) / std).astype("float32")

    def targets(rows):
        return labels[rows].astype("int64").reshape(-1, 1)

    return Digits(features(train), targets(train), features(test), targets(test))


@dataclass
class Model:
    main: nf.Program
    startup: nf.Program
    loss: nf.VarDesc
    accuracy: nf.VarDesc
    probabilities: nf.VarDesc


def build_model(learning_rate: float = LEARNING_RATE) -> Model:
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", shape=[-1, 64])
        label = nf.data("label", shape=[-1, 1], dtype="int64")
        hidden = nf.layers.fc(x, size=128, act="relu", name="hidden")
        logits = nf.layers.fc(hidden, size=10, name="logits")
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
        probabilities = nf.layers.softmax(logits, name="probabilities")
        accuracy = nf.layers.accuracy(probabilities, label)
        nf.optimizer.Adam(learning_rate=learning_rate).minimize(loss)
    return Model(main, startup, loss, accuracy, probabilities)


def train(
    model: Model,
    data: Digits,
    scope: nf.Scope,
    epochs: int,
    seed: int = 0,
    progress: bool = True,
) -> None:
    from tqdm import tqdm

    exe = nf.Executor()
    nf.seed(seed)
    exe.run(model.startup, scope=scope)
    rng = np.random.default_rng(seed)
    n = len(data.train_x)
    for epoch in range(epochs):
        order = rng.permutation(n)
        batches = range(0, n, BATCH_SIZE)
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{epochs}", unit="batch", disable=not progress)
        seen = loss_sum = correct = 0.0
        for start in bar:
            rows = order[start : start + BATCH_SIZE]
            feed = {"x": data.train_x[rows], "label": data.train_y[rows]}
            loss, accuracy = exe.run(
                model.main, feed=feed, fetch_list=[model.loss, model.accuracy], scope=scope
            )
            seen += len(rows)
            loss_sum += float(loss) * len(rows)
            correct += float(accuracy) * len(rows)
            bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct / seen:.3f}")


def accuracy_of(probabilities: np.ndarray, labels: np.ndarray) -> float:
    return float((probabilities.argmax(axis=1) == labels.ravel()).mean())


def run(args: argparse.Namespace) -> int:
    """The CLI entry: train, evaluate, save, reload, re-check; 1 if a check fails."""
    epochs = args.epochs if args.epochs is not None else EPOCHS
    data = load_digits(seed=args.seed, limit=args.limit)
    print(threads_summary())
    print(
        f"digits: {len(data.train_x)} training and {len(data.test_x)} held-out 8x8 images; "
        f"MLP 64 -> 128 relu -> 10, Adam lr {LEARNING_RATE}, {epochs} epochs"
    )
    model = build_model()
    scope = nf.Scope()
    train(model, data, scope, epochs, seed=args.seed, progress=not args.no_progress)

    exe = nf.Executor()
    (trained,) = exe.eval(model.main, [model.probabilities], feed={"x": data.test_x}, scope=scope)
    test_accuracy = accuracy_of(trained, data.test_y)
    print(f"test accuracy: {test_accuracy:.2%}")

    out = args.out or tempfile.mkdtemp(prefix="nestflow-digits-")
    nf.io.save_inference_model(out, ["x"], [model.probabilities], model.main, scope)
    program, feeds, fetches, loaded_scope = nf.io.load_inference_model(out)
    (reloaded,) = exe.run(
        program, feed={feeds[0]: data.test_x}, fetch_list=fetches, scope=loaded_scope
    )
    reloaded_accuracy = accuracy_of(reloaded, data.test_y)
    identical = reloaded.dtype == trained.dtype and np.array_equal(reloaded, trained)
    print(f"saved inference model to {out} (show it: nestflow show {out})")
    print(f"reloaded model test accuracy: {reloaded_accuracy:.2%}")
    print(f"reloaded predictions identical bit for bit: {identical}")
    if not identical:
        return 1
    if test_accuracy < args.min_accuracy:
        print(f"test accuracy {test_accuracy:.2%} is below the required {args.min_accuracy:.2%}")
        return 1
    return 0
