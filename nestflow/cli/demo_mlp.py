"""`nestflow demo`: an MLP on scikit-learn's bundled 8x8 digits with nf.Model, the shortest
correct training script: trained, evaluated, saved as an inference model and reloaded.

The training code a user writes (what `run` does, less its printing and checks):

    import nestflow as nf
    from nestflow.cli.demo_mlp import load_digits
    data = load_digits()  # standardised 8x8 digits, a seeded 80/20 split

    def mlp(x):
        hidden = nf.layers.fc(x, size=128, act="relu", name="hidden")
        return nf.layers.fc(hidden, size=10, act="softmax", name="probabilities")

    model = nf.Model(mlp, inputs=nf.InputSpec([None, 64], "float32", "x"),
                     labels=nf.InputSpec([None, 1], "int64", "label"))
    model.prepare(nf.optimizer.Adam(1e-3), loss=nf.layers.cross_entropy,
                  metrics=nf.metric.Accuracy())
    model.fit((data.train_x, data.train_y), eval_data=(data.test_x, data.test_y),
              batch_size=32, epochs=20)
    model.save("digits", training=False)  # nf.io.load_inference_model("digits")

64 pixels -> 128 relu -> 10 softmax, cross entropy, Adam; nf.seed(seed) fixes the initial
weights and the shuffles, so every run prints the same numbers (98.6% held-out at seed 0; about
3 s of CPU, imports included, more wall time on a busy machine). Progress is one line per epoch (a bar per epoch on a terminal). The inference
model goes to --out, or to a temporary directory removed at exit; it is loaded back and must
predict bit for bit what the trained model predicts.

`train` is the same training written by hand over a Program pair and an Executor (the
Program/Executor style; the conv demo uses it), with the same progress output.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

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


def mlp(x: nf.VarDesc) -> nf.VarDesc:
    """64 pixels -> 128 relu -> 10 class probabilities."""
    hidden = nf.layers.fc(x, size=128, act="relu", name="hidden")
    return nf.layers.fc(hidden, size=10, act="softmax", name="probabilities")


def build_model(learning_rate: float = LEARNING_RATE) -> nf.Model:
    """The digits MLP as an nf.Model, prepared with Adam, cross entropy and accuracy."""
    model = nf.Model(
        mlp,
        inputs=nf.InputSpec([None, 64], "float32", "x"),
        labels=nf.InputSpec([None, 1], "int64", "label"),
    )
    model.prepare(
        nf.optimizer.Adam(learning_rate),
        loss=nf.layers.cross_entropy,
        metrics=nf.metric.Accuracy(),
    )
    return model


def accuracy_of(probabilities: np.ndarray, labels: np.ndarray) -> float:
    return float((probabilities.argmax(axis=1) == labels.ravel()).mean())


def progress_logger(epochs: int, steps: int, shown: bool = True) -> Any:
    """The ProgBarLogger nf.Model.fit uses, for a hand-written loop of `epochs` x `steps`: call
    its on_epoch_begin, on_train_batch_end and on_epoch_end."""
    logger = nf.callbacks.ProgBarLogger(log_freq=1, verbose=1 if shown else 0)
    logger.set_params({"epochs": epochs, "steps": steps})
    return logger


def train_epochs(
    program: nf.Program,
    startup: nf.Program,
    scope: nf.Scope,
    epochs: int,
    batches: Callable[[np.random.Generator], Iterator[np.ndarray]],
    feed_of: Callable[[np.ndarray], dict[str, np.ndarray]],
    fetch: list,
    steps: int,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """The sequence demos' hand-written training loop: `startup` in `scope` (after
    nf.seed(seed)), then each epoch `program` on `feed_of(rows)` for the `rows` of each batch
    `batches(rng)` gives, fetching `fetch` (the loss, and the accuracy where there is one);
    progress as nf.Model.fit shows it. Returns each epoch's mean loss over its rows."""
    exe = nf.Executor()
    nf.seed(seed)
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(seed + 1)
    logger = progress_logger(epochs, steps, progress)
    names = ("loss", "acc")[: len(fetch)]
    history = []
    for epoch in range(epochs):
        logger.on_epoch_begin(epoch)
        seen, sums = 0.0, [0.0] * len(fetch)
        for step, rows in enumerate(batches(rng)):
            values = exe.run(program, feed=feed_of(rows), fetch_list=fetch, scope=scope)
            seen += len(rows)
            sums = [total + float(value) * len(rows) for total, value in zip(sums, values)]
            logger.on_train_batch_end(step, {n: s / seen for n, s in zip(names, sums)})
        logger.on_epoch_end(epoch, {n: s / seen for n, s in zip(names, sums)})
        history.append(sums[0] / seen)
    return history


def train(
    model: Any,
    data: Digits,
    scope: nf.Scope,
    epochs: int,
    seed: int = 0,
    progress: bool = True,
) -> None:
    """Train `model` (anything with main, startup, loss and accuracy: a Program pair and two
    of its variables) in place in `scope`: the loop nf.Model.fit runs, by hand."""
    exe = nf.Executor()
    nf.seed(seed)
    exe.run(model.startup, scope=scope)
    rng = np.random.default_rng(seed)
    n = len(data.train_x)
    logger = progress_logger(epochs, -(-n // BATCH_SIZE), progress)
    for epoch in range(epochs):
        order = rng.permutation(n)
        logger.on_epoch_begin(epoch)
        seen = loss_sum = correct = 0.0
        logs: dict[str, float] = {}
        for step, start in enumerate(range(0, n, BATCH_SIZE)):
            rows = order[start : start + BATCH_SIZE]
            feed = {"x": data.train_x[rows], "label": data.train_y[rows]}
            loss, accuracy = exe.run(
                model.main, feed=feed, fetch_list=[model.loss, model.accuracy], scope=scope
            )
            seen += len(rows)
            loss_sum += float(loss.item()) * len(rows)
            correct += float(accuracy.item()) * len(rows)
            logs = {"loss": loss_sum / seen, "acc": correct / seen}
            logger.on_train_batch_end(step, logs)
        logger.on_epoch_end(epoch, logs)


@contextlib.contextmanager
def output_directory(out: str | None, prefix: str) -> Iterator[str]:
    """`out`, or a temporary directory (named `prefix`...) removed when the block ends."""
    if out:
        yield out
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as temporary:
        yield temporary


def verdict(
    identical: bool,
    accuracy: float,
    min_accuracy: float,
    started: float,
    *,
    reloaded: str = "predictions",
    measure: str = "test accuracy",
    timing: str = "",
) -> int:
    """A demo's last lines and exit status: whether the reloaded model gave the same results bit
    for bit, the time taken, then 1 if they differ or `accuracy` is below `min_accuracy`."""
    print(f"reloaded {reloaded} identical bit for bit: {identical}")
    print(f"done in {time.perf_counter() - started:.1f} s{timing}")
    if not identical:
        return 1
    if accuracy < min_accuracy:
        print(f"{measure} {accuracy:.2%} is below the required {min_accuracy:.2%}")
        return 1
    return 0


def reloads_identically(
    out: str | None,
    prefix: str,
    feeds: list[str],
    targets: list,
    program: nf.Program,
    scope: nf.Scope,
    predict: Callable[..., np.ndarray],
    trained: np.ndarray,
) -> bool:
    """The demos' last check: save the inference model of `targets` (fed by `feeds`) under
    `out` (a temporary directory named `prefix`... when None), load it back, predict with
    `predict(program, feed_names, fetch_names, scope)`, and say whether that equals `trained`
    bit for bit (dtype included)."""
    with output_directory(out, prefix) as path:
        nf.io.save_inference_model(path, feeds, targets, program, scope)
        loaded, loaded_feeds, fetches, loaded_scope = nf.io.load_inference_model(path)
        reloaded = predict(loaded, loaded_feeds, fetches, loaded_scope)
        print(saved_message(out, path))
    return reloaded.dtype == trained.dtype and np.array_equal(reloaded, trained)


def saved_message(out: str | None, path: str) -> str:
    if out:
        return f"saved inference model to {path} (show it: nestflow show {path})"
    return "saved inference model to a temporary directory, removed at exit (--out DIR keeps it)"


def run(args: argparse.Namespace) -> int:
    """The CLI entry: train, evaluate, save, reload, re-check; 1 if a check fails."""
    started = time.perf_counter()
    epochs = args.epochs if args.epochs is not None else EPOCHS
    data = load_digits(seed=args.seed, limit=args.limit)
    print(threads_summary())
    print(
        f"digits: {len(data.train_x)} training and {len(data.test_x)} held-out 8x8 images; "
        f"MLP 64 -> 128 relu -> 10, Adam lr {LEARNING_RATE}, {epochs} epochs"
    )
    nf.seed(args.seed)
    model = build_model()
    model.fit(
        (data.train_x, data.train_y),
        eval_data=(data.test_x, data.test_y),
        batch_size=BATCH_SIZE,
        epochs=epochs,
        verbose=0 if args.no_progress else 1,
    )
    # The whole held-out set in one batch, as the reloaded model is run below.
    (trained,) = model.predict(data.test_x, batch_size=len(data.test_x), stack_outputs=True)
    test_accuracy = accuracy_of(trained, data.test_y)
    print(f"test accuracy: {test_accuracy:.2%}")

    with output_directory(args.out, "nestflow-digits-") as out:
        model.save(out, training=False)
        program, feeds, fetches, loaded_scope = nf.io.load_inference_model(out)
        (reloaded,) = nf.Executor().run(
            program, feed={feeds[0]: data.test_x}, fetch_list=fetches, scope=loaded_scope
        )
        print(saved_message(args.out, out))
    reloaded_accuracy = accuracy_of(reloaded, data.test_y)
    identical = reloaded.dtype == trained.dtype and np.array_equal(reloaded, trained)
    print(f"reloaded model test accuracy: {reloaded_accuracy:.2%}")
    return verdict(identical, test_accuracy, args.min_accuracy, started)
