"""Callbacks of `nf.Model.fit` / `evaluate` / `predict` (Paddle 2.0's paddle.callbacks, Keras's
keras.callbacks): plain objects whose `on_...` methods the model calls; no global state.

    model.fit(train, eval_data=test, epochs=20, callbacks=[
        nf.callbacks.EarlyStopping(monitor="loss", patience=2),
        nf.callbacks.CSVLogger("train.csv"),
    ])

Hooks (each `logs` a dict of floats): on_train_begin/end(logs), on_epoch_begin/end(epoch, logs),
on_train_batch_begin/end(step, logs), on_eval_begin/end(logs), on_eval_batch_begin/end(step,
logs), on_predict_begin/end(logs), on_predict_batch_begin/end(step, logs). `epoch` counts every
epoch the model has trained (a resumed fit goes on from the loaded epoch), from 0. Batch logs
hold the running means of the epoch so far ("loss", each metric's name), "step" and
"batch_size"; epoch logs the epoch's means, and after an evaluation the evaluation's values
prefixed "eval_" ("eval_loss", "eval_acc"). Before the first hook the model calls
`set_model(model)` and `set_params(params)` (epochs, steps per epoch or None, verbose, metrics:
the log keys, batch_size, save_dir, save_freq, do_eval).

A callback object defining an `on_...` method that is not one of the hooks (a misspelt
`on_epoch_ends`) is an AttrError naming the closest hooks, not a method that silently never
runs.

Departures from Paddle 2.0: epoch logs are the epoch's means (Paddle's: the last batch's
values) and include the "eval_" values of an evaluation run that epoch (Paddle's evaluation
runs after on_epoch_end); EarlyStopping watches the evaluation's value when fit has eval_data,
else the training value (Paddle watches only evaluations); LRScheduler drives the program's
step counter (nestflow's schedules are ops, see LRScheduler); CSVLogger is Keras's.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from nestflow.errors import AttrError, TypeMismatchError, suggest_names

__all__ = [
    "CSVLogger",
    "Callback",
    "EarlyStopping",
    "LRScheduler",
    "ModelCheckpoint",
    "ProgBarLogger",
    "TensorBoard",
    "is_writing_rank",
]

HOOKS = (
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_eval_begin",
    "on_eval_end",
    "on_eval_batch_begin",
    "on_eval_batch_end",
    "on_predict_begin",
    "on_predict_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
)


def is_writing_rank() -> bool:
    """Whether this process writes checkpoints, logs and progress: rank 0 when nf.distributed
    is in use, else True. The one place this is decided (Model.save, ModelCheckpoint,
    EarlyStopping's best model, CSVLogger and ProgBarLogger ask it).

    >>> nf.callbacks.is_writing_rank()  # one process: it writes
    True
    """
    distributed = sys.modules.get("nestflow.distributed")
    rank = getattr(distributed, "rank", None)
    return rank is None or rank() == 0


class Callback:
    """Base class: every hook does nothing; override the ones you need. `self.model` is the
    nf.Model being run and `self.params` the run's settings (see the module docstring).

    >>> class Losses(Callback):
    ...     def on_epoch_end(self, epoch, logs=None):
    ...         print(epoch, round(logs["loss"], 2))
    """

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict[str, Any] = {}

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    def set_model(self, model: Any) -> None:
        self.model = model

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Before the first epoch of `fit`."""

    def on_train_end(self, logs: dict | None = None) -> None:
        """After the last epoch of `fit` (logs: the last epoch's)."""

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Before epoch `epoch` (counted over the model's life, from 0)."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """After epoch `epoch` and its evaluation, if any (logs: means and eval_ values)."""

    def on_train_batch_begin(self, step: int, logs: dict | None = None) -> None:
        """Before training step `step` of the epoch."""

    def on_train_batch_end(self, step: int, logs: dict | None = None) -> None:
        """After training step `step` (logs: the epoch's running means)."""

    def on_eval_begin(self, logs: dict | None = None) -> None:
        """Before an evaluation (in fit, or by evaluate)."""

    def on_eval_end(self, logs: dict | None = None) -> None:
        """After an evaluation (logs: its loss and metrics, not prefixed)."""

    def on_eval_batch_begin(self, step: int, logs: dict | None = None) -> None:
        """Before evaluation step `step`."""

    def on_eval_batch_end(self, step: int, logs: dict | None = None) -> None:
        """After evaluation step `step` (logs: running means)."""

    def on_predict_begin(self, logs: dict | None = None) -> None:
        """Before `predict`."""

    def on_predict_end(self, logs: dict | None = None) -> None:
        """After `predict`."""

    def on_predict_batch_begin(self, step: int, logs: dict | None = None) -> None:
        """Before prediction step `step`."""

    def on_predict_batch_end(self, step: int, logs: dict | None = None) -> None:
        """After prediction step `step`."""


def check_callback(callback: Any) -> Callback:
    """`callback` if it is a Callback whose `on_...` methods are all hooks; TypeMismatchError or
    AttrError (naming the closest hooks) otherwise."""
    if not isinstance(callback, Callback):
        raise TypeMismatchError(
            f"callbacks must be nf.callbacks.Callback objects, got {type(callback).__name__} "
            f"({callback!r})"
        )
    for name in dir(type(callback)):
        if name.startswith("on_") and name not in HOOKS:
            raise AttrError(
                f"{type(callback).__name__} defines {name}(), which is not a callback hook and "
                f"would never be called{suggest_names(name, HOOKS)}; the hooks: {list(HOOKS)}"
            )
    return callback


class CallbackList:
    """The callbacks of one fit/evaluate/predict call, called in order."""

    def __init__(self, callbacks: Sequence[Callback], model: Any, params: dict[str, Any]):
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            callback.set_model(model)
            callback.set_params(params)

    def call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(*args)


def config_callbacks(
    callbacks: Any,
    model: Any,
    *,
    verbose: int,
    log_freq: int = 10,
    save_freq: int = 1,
    save_dir: str | None = None,
    fitting: bool = False,
    **params: Any,
) -> CallbackList:
    """The user's callbacks (checked), plus a ProgBarLogger (unless one is given or verbose is
    0) and, for fit, a ModelCheckpoint (unless one is given; it writes only with a save_dir)."""
    if callbacks is None:
        callbacks = []
    elif isinstance(callbacks, Callback):
        callbacks = [callbacks]
    elif not isinstance(callbacks, (list, tuple)):
        raise TypeMismatchError(
            f"callbacks must be a list of nf.callbacks.Callback, got {type(callbacks).__name__}"
        )
    callbacks = [check_callback(c) for c in callbacks]
    if verbose and not any(isinstance(c, ProgBarLogger) for c in callbacks):
        callbacks.insert(0, ProgBarLogger(log_freq, verbose=verbose))
    if fitting and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
        callbacks.append(ModelCheckpoint(save_freq, save_dir))
    params = dict(params, verbose=verbose, save_dir=save_dir, save_freq=save_freq)
    return CallbackList(callbacks, model, params)


def check_count(value: Any, what: str, minimum: int = 1) -> int:
    """`value` as an int >= `minimum`; AttrError naming `what` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise AttrError(f"{what} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _format_logs(logs: dict | None) -> str:
    shown = {k: v for k, v in (logs or {}).items() if k not in ("step", "batch_size")}
    return ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items()
    )


class ProgBarLogger(Callback):
    """Progress on stdout. verbose=0: nothing; 1: a tqdm bar per epoch when stdout is a
    terminal (its postfix refreshed every `log_freq` steps), else one line per epoch; 2: one
    line per epoch. The line: `epoch 3/20: loss 0.1234, acc 0.9610, eval_loss ... (45 steps,
    0.21 s)`. A standalone evaluate prints one `eval: ...` line. Only the writing rank prints.

    >>> logger = ProgBarLogger(verbose=2)
    >>> logger.set_params({"epochs": 3})
    >>> logger.on_epoch_begin(0); logger.on_epoch_end(0, {"loss": 0.5})  # doctest: +ELLIPSIS
    epoch 1/3: loss 0.5000 (0 steps, ... s)
    """

    def __init__(self, log_freq: int = 1, verbose: int = 2):
        super().__init__()
        self.log_freq = check_count(log_freq, "ProgBarLogger: log_freq")
        if verbose not in (0, 1, 2):
            raise AttrError(f"ProgBarLogger: verbose must be 0, 1 or 2, got {verbose!r}")
        self.verbose = verbose
        self._bar: Any = None
        self._fitting = False
        self._started = 0.0
        self._steps = 0
        self._samples = 0

    def _shown(self) -> bool:
        return bool(self.verbose) and is_writing_rank()

    def _use_bar(self) -> bool:
        # Under mpiexec a rank's stdout is a pty even when the job's output goes to a file:
        # `nestflow launch` tells in NESTFLOW_TTY whether its own stdout is a terminal.
        launched = os.environ.get("NESTFLOW_TTY")
        if launched is not None:
            return self.verbose == 1 and launched == "1"
        isatty = getattr(sys.stdout, "isatty", None)
        return self.verbose == 1 and isatty is not None and isatty()

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._fitting = True

    def on_train_end(self, logs: dict | None = None) -> None:
        self._fitting = False
        self._close_bar()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._started, self._steps = time.perf_counter(), 0
        if self._shown() and self._use_bar():
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.params.get("steps"),
                desc=self._epoch_title(epoch),
                unit="batch",
                file=sys.stdout,
                leave=True,
                dynamic_ncols=True,
            )

    def _epoch_title(self, epoch: int) -> str:
        epochs = self.params.get("epochs")
        first = self.params.get("first_epoch", 0)
        return f"epoch {epoch + 1}/{first + epochs}" if epochs else f"epoch {epoch + 1}"

    def on_train_batch_end(self, step: int, logs: dict | None = None) -> None:
        self._steps = step + 1
        if self._bar is not None:
            self._bar.update(1)
            if self._steps % self.log_freq == 0:
                self._bar.set_postfix_str(_format_logs(logs), refresh=False)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self._shown():
            return
        if self._bar is not None:
            self._bar.set_postfix_str(_format_logs(logs))
            self._close_bar()
            return
        seconds = time.perf_counter() - self._started
        print(
            f"{self._epoch_title(epoch)}: {_format_logs(logs)} "
            f"({self._steps} steps, {seconds:.2f} s)",
            file=sys.stdout,
            flush=True,
        )

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_eval_begin(self, logs: dict | None = None) -> None:
        if not self._fitting:
            self._started, self._samples = time.perf_counter(), 0

    def on_eval_batch_end(self, step: int, logs: dict | None = None) -> None:
        if not self._fitting:
            self._samples += int((logs or {}).get("batch_size", 0))

    def on_eval_end(self, logs: dict | None = None) -> None:
        # In fit the evaluation's values are part of the epoch's line.
        if self._fitting or not self._shown():
            return
        seconds = time.perf_counter() - self._started
        print(
            f"eval: {_format_logs(logs)} ({self._samples} samples, {seconds:.2f} s)",
            file=sys.stdout,
            flush=True,
        )


class ModelCheckpoint(Callback):
    """Saves the model (model.save, training state included) every `save_freq` epochs to
    `{save_dir}/{epoch}` and after the last epoch to `{save_dir}/final`; `save_dir` defaults to
    fit's. Nothing is written without a save_dir, nor by other ranks than the writing one.
    Paddle's argument order (save_freq, save_dir); a path given first is the save_dir, so
    `ModelCheckpoint("checkpoints", 2)` (the design contract's order) works as well.

    >>> checkpoint = ModelCheckpoint(save_freq=5, save_dir="checkpoints")  # model.fit(callbacks=[...])
    """

    def __init__(self, save_freq: Any = 1, save_dir: Any = None):
        super().__init__()
        if isinstance(save_freq, (str, os.PathLike)):
            save_freq, save_dir = (1 if save_dir is None else save_dir), save_freq
        self.save_freq = check_count(save_freq, "ModelCheckpoint: save_freq")
        self.save_dir = None if save_dir is None else os.fspath(save_dir)

    def _directory(self) -> str | None:
        return self.save_dir if self.save_dir is not None else self.params.get("save_dir")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        directory = self._directory()
        if directory is not None and (epoch + 1) % self.save_freq == 0:
            self.model.save(os.path.join(directory, str(epoch)))

    def on_train_end(self, logs: dict | None = None) -> None:
        directory = self._directory()
        if directory is not None:
            self.model.save(os.path.join(directory, "final"))


class EarlyStopping(Callback):
    """Stops fit when `monitor` stops improving: after `patience` + 1 epochs in a row whose
    value is not better than the best by more than `min_delta` (and not better than
    `baseline`, when given), fit ends after the current epoch.

    `monitor`: a log key ("loss", a metric's name such as "acc"); with eval_data it is read
    from each evaluation, else from the training epoch's means. `mode`: "min", "max" or
    "auto" (max for names containing "acc", else min). With `save_best_model` and fit's
    save_dir, each new best is saved to `{save_dir}/best_model`. A monitor missing from the
    logs is an AttrError naming the keys there are.

    >>> stop = EarlyStopping(monitor="acc", patience=2)  # model.fit(..., callbacks=[stop])
    >>> stop.mode
    'max'
    """

    def __init__(
        self,
        monitor: str = "loss",
        mode: str = "auto",
        patience: int = 0,
        verbose: int = 1,
        min_delta: float = 0,
        baseline: float | None = None,
        save_best_model: bool = True,
    ):
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise AttrError(f"EarlyStopping: mode must be 'auto', 'min' or 'max', got {mode!r}")
        self.monitor = monitor
        self.mode = mode if mode != "auto" else ("max" if "acc" in monitor else "min")
        self.patience = check_count(patience, "EarlyStopping: patience", 0)
        self.verbose = verbose
        self.min_delta = abs(float(min_delta))
        self.baseline = baseline
        self.save_best_model = save_best_model
        self.reset()

    def reset(self) -> None:
        """Forget the best value and the epochs waited (done at each fit's start)."""
        self.wait = 0
        self.stopped_epoch: int | None = None
        worst = math.inf if self.mode == "min" else -math.inf
        self.best = worst if self.baseline is None else float(self.baseline)
        self._epoch = 0

    def _improved(self, value: float) -> bool:
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.reset()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_eval_end(self, logs: dict | None = None) -> None:
        if self.params.get("do_eval"):
            self._watch(logs, "evaluation")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self.params.get("do_eval"):
            self._watch(logs, "training epoch")

    def _watch(self, logs: dict | None, where: str) -> None:
        logs = logs or {}
        if self.monitor not in logs:
            raise AttrError(
                f"EarlyStopping: monitor '{self.monitor}' is not in the {where}'s logs "
                f"{sorted(logs)}{suggest_names(self.monitor, logs)}"
            )
        value = float(logs[self.monitor])
        if self._improved(value):
            self.best, self.wait = value, 0
            directory = self.params.get("save_dir")
            if self.save_best_model and directory is not None:
                self.model.save(os.path.join(directory, "best_model"))
            return
        self.wait += 1
        if self.wait > self.patience:
            self.model.stop_training = True
            self.stopped_epoch = self._epoch
            if self.verbose and is_writing_rank():
                print(
                    f"early stopping after epoch {self._epoch + 1}: {self.monitor} has not "
                    f"improved on {self.best:.4f} for {self.wait} epoch(s)",
                    file=sys.stdout,
                    flush=True,
                )


class LRScheduler(Callback):
    """Drives the step of the model's learning-rate schedule (nf.layers.exponential_decay and
    the others, ops reading the persistable step counter `@LR_DECAY_COUNTER@`).

    by_step=True (the default): the schedule counts training steps. The program's own
    `increment` op already advances the counter each run, so nothing needs doing; the
    callback exists for Paddle parity. by_epoch=True: the schedule counts epochs: before each
    training step the callback sets the counter so the step sees the epoch's index (so
    decay_steps and the like are in epochs). Exactly one of the two must be true (AttrError);
    by_epoch on a model without a schedule is an AttrError when fit starts.

    >>> per_epoch = LRScheduler(by_step=False, by_epoch=True)  # model.fit(callbacks=[...])
    """

    def __init__(self, by_step: bool = True, by_epoch: bool = False):
        super().__init__()
        if bool(by_step) == bool(by_epoch):
            raise AttrError(
                f"LRScheduler: exactly one of by_step and by_epoch must be True, got "
                f"by_step={by_step!r}, by_epoch={by_epoch!r}"
            )
        self.by_step, self.by_epoch = bool(by_step), bool(by_epoch)
        self._epoch = 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.by_epoch and self._counter() is None:
            raise AttrError(
                "LRScheduler(by_epoch=True): the model's optimizer has no learning-rate "
                "schedule (pass a learning_rate made by nf.layers.exponential_decay etc.)"
            )

    def _counter(self):
        from nestflow.layers.learning_rate_scheduler import LR_DECAY_COUNTER

        return self.model.train_program.global_block().find_var(LR_DECAY_COUNTER)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, step: int, logs: dict | None = None) -> None:
        if self.by_epoch:
            from nestflow.core.tensor import Tensor

            counter = self._counter()
            # The program increments the counter before its schedules read it.
            value = np.full(counter.shape, self._epoch - 1, dtype=counter.dtype)
            self.model.scope.var(counter.name).get_mutable(Tensor).set(value)


class CSVLogger(Callback):
    """One row per epoch (the epoch from 0, then the epoch logs: loss, metrics, eval_ values)
    written to `path`; the whole file is rewritten atomically after each epoch, so it is never
    half-written. With `append`, the rows of an existing file with the same columns are kept
    (a resumed fit); other columns are an AttrError. Only the writing rank writes.

    >>> log = CSVLogger("train.csv", append=True)  # model.fit(..., callbacks=[log])
    """

    def __init__(self, path: str | os.PathLike, separator: str = ",", append: bool = False):
        super().__init__()
        self.path = os.fspath(path)
        self.separator = separator
        self.append = append
        self.columns: list[str] = []
        self.rows: list[str] = []

    def on_train_begin(self, logs: dict | None = None) -> None:
        keys = list(self.params.get("metrics", ["loss"]))
        if self.params.get("do_eval"):
            keys += [f"eval_{k}" for k in keys]
        self.columns = ["epoch", *keys]
        self.rows = []
        if self.append and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as file:
                lines = file.read().splitlines()
            if lines:
                if lines[0] != self.separator.join(self.columns):
                    raise AttrError(
                        f"CSVLogger: '{self.path}' has the columns {lines[0]!r}, this fit logs "
                        f"{self.separator.join(self.columns)!r}; use another path or "
                        "append=False"
                    )
                self.rows = lines[1:]

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        values = [str(epoch)] + [
            "" if logs.get(k) is None else format(float(logs[k]), ".8g") for k in self.columns[1:]
        ]
        self.rows.append(self.separator.join(values))
        if is_writing_rank():
            from nestflow.io.atomic import write_atomic

            text = "\n".join([self.separator.join(self.columns), *self.rows]) + "\n"
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            write_atomic(self.path, text.encode("utf-8"))


# At the end: tensorboard.py builds on Callback (and imports tensorboardX only when used).
from nestflow.hapi.tensorboard import TensorBoard  # noqa: E402
