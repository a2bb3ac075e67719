"""`nf.Model` and `nf.InputSpec`: train, evaluate, predict, save and resume a network in a few
lines (Paddle 2.0's paddle.Model in static mode, Keras's Model.fit), over Program/Executor.

    def mlp(x):
        return nf.layers.fc(nf.layers.fc(x, 128, act="relu"), 10, act="softmax")

    model = nf.Model(mlp, inputs=[nf.InputSpec([None, 64], "float32", "x")],
                     labels=[nf.InputSpec([None, 1], "int64", "label")])
    model.prepare(nf.optimizer.Adam(1e-3), loss=nf.layers.cross_entropy,
                  metrics=nf.metric.Accuracy())
    model.fit((train_x, train_y), eval_data=(test_x, test_y), batch_size=32, epochs=20)
    model.save("ckpt/last")                       # resumable: ckpt/last.safetensors
    model.save("inference", training=False)       # nf.io.load_inference_model("inference")

What prepare builds (each with its own names from 0, so every Model of one network names its
variables alike, in any process):
- the train program: the network, the loss, backward and the optimizer's update ops;
- the eval program: a `clone(for_test=True)` of the network and loss made before the optimizer
  is added (dropout and batch_norm in inference mode, no schedule step);
- the predict program: the eval program pruned to the network's outputs;
and runs the startup program once in the model's own `scope`.

Random state: the train program gets its own `random_seed` (drawn from nestflow's global
generator at the first prepare, so `nf.seed(n)` fixes it), and dropout draws from that
program's generator; a DataLoader fit makes from a dataset shuffles with a seed drawn the same
way, by (seed, epoch). `save` keeps both with the epoch count, every persistable variable
(parameters, optimizer moments and beta powers, learning rates and the schedule's step counter,
batch_norm running statistics) and the generator's state (bit_generator.state, as JSON in the
safetensors header): `fit(epochs=k)`, `save`, then `load` (into this or a fresh Model of the
same network, in any process) and `fit(epochs=n - k)` equals `fit(epochs=n)` bit for bit.

Departures from Paddle 2.0: `fit` returns the list of epoch logs (Paddle: None); evaluate's
values are means over the samples (Paddle: the last batch's loss); a loss with more than one
element is averaged; a checkpoint is one safetensors file `path.safetensors` (Paddle:
.pdparams + .pdopt pickles); `num_workers` must be 0 (nf.io.DataLoader has one prefetch thread,
no worker processes); the optimizer may be given as a function making it, so that a learning
rate schedule (ops in the program) is built inside the model's program; prepare renames the
optimizer "optimizer" (its state `optimizer.<param>.<what>`) so checkpoints load across
processes.

Data-parallel training (MPI): prepare with `nf.distributed.DistributedOptimizer(optimizer)`
(after nf.distributed.init(), on every rank) and fit as usual. The choice is explicit (a
Model never becomes data-parallel because MPI is initialised): with such an optimizer on
several ranks, fit shards the training data by rank with DistributedBatchSampler (equal batch
sizes on every rank, so averaging the ranks' gradients equals one process on the concatenated
batches for a mean loss), every rank uses rank 0's random and shuffle seeds, rank 0 decides
when to stop (EarlyStopping), only rank 0 writes checkpoints and logs (is_writing_rank), and
load reads the file on rank 0 and broadcasts it to every rank. Logs and metrics are each rank's
own shard's; evaluation and prediction run whole on every rank.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nestflow.core.dtype import dtype_name
from nestflow.core.place import Place
from nestflow.core.scope import Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import (
    AttrError,
    FeedError,
    NanInfError,
    ParameterFileError,
    ShapeError,
    TypeMismatchError,
    UninitializedError,
)
from nestflow.executor import Executor, prune
from nestflow.framework import unique_name
from nestflow.framework.program import Program, VarDesc, program_guard, user_source_line
from nestflow.hapi.callbacks import check_count, config_callbacks, is_writing_rank
from nestflow.ops import random_state

__all__ = ["InputSpec", "Model"]

CHECKPOINT_FORMAT = "nestflow.model_checkpoint"
CHECKPOINT_SUFFIX = ".safetensors"
OPTIMIZER_NAME = "optimizer"


class InputSpec:
    """What a Model is fed: `shape` (None or -1 for a dimension of any size, usually the
    batch), `dtype` and `name` (the variable's and feed's name; None: "input_{i}" for the i-th
    input, "label_{i}" for a label). Bad shapes are a ShapeError, unknown dtypes a DTypeError.

    >>> InputSpec([None, 64], "float32", "x")
    InputSpec(shape=[-1, 64], dtype='float32', name='x')
    """

    def __init__(
        self, shape: Sequence[int | None], dtype: Any = "float32", name: str | None = None
    ):
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise ShapeError(f"InputSpec: shape must be a list of ints or None, got {shape!r}")
        dims = []
        for d in shape:
            if d is None:
                d = -1
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < -1:
                raise ShapeError(
                    f"InputSpec: shape {list(shape)} must hold ints >= 0, -1 or None (any size)"
                )
            dims.append(int(d))
        if name is not None and (not isinstance(name, str) or not name):
            raise AttrError(f"InputSpec: name must be a non-empty str or None, got {name!r}")
        self.shape = dims
        self.dtype = dtype_name(dtype)
        self.name = name

    def __repr__(self) -> str:
        return f"InputSpec(shape={self.shape}, dtype={self.dtype!r}, name={self.name!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InputSpec):
            return NotImplemented
        return (self.shape, self.dtype, self.name) == (other.shape, other.dtype, other.name)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value


def _specs(specs: Any, what: str, default_name: str) -> list[InputSpec]:
    """`specs` (an InputSpec or a list of them) as a list, each with its name."""
    if isinstance(specs, InputSpec):
        specs = [specs]
    if not isinstance(specs, (list, tuple)) or not all(isinstance(s, InputSpec) for s in specs):
        raise TypeMismatchError(f"Model: {what} must be a list of nf.InputSpec, got {specs!r}")
    named = []
    for i, spec in enumerate(specs):
        name = spec.name if spec.name is not None else f"{default_name}_{i}"
        named.append(InputSpec(spec.shape, spec.dtype, name))
    return named


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _check_arguments(what: str, fn: Callable, args: list[Any], given: str) -> None:
    """TypeMismatchError naming `what` and what is `given` when fn cannot take `args` (rather
    than Python's TypeError from inside a training step)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    try:
        signature.bind(*args)
    except TypeError as exc:
        raise TypeMismatchError(f"Model: {what} cannot be called with {given}: {exc}") from None


def _call_checked(what: str, fn: Callable, args: list[Any], given: str) -> Any:
    """fn(*args), after _check_arguments."""
    _check_arguments(f"{what} {getattr(fn, '__name__', fn)!s}", fn, args, given)
    return fn(*args)


def _variables(values: Any, program: Program, what: str) -> list[VarDesc]:
    found = _as_list(values)
    for value in found:
        if not isinstance(value, VarDesc) or value.block.program is not program:
            raise TypeMismatchError(
                f"Model: {what} must return variables of the program it builds (nf.layers "
                f"results), got {type(value).__name__} ({value!r})"
            )
    return found


def _single_value(var: VarDesc) -> bool:
    return all(d >= 0 for d in var.shape) and int(np.prod(var.shape, dtype=np.int64)) == 1


@dataclass
class _Programs:
    """What Model._build makes: the programs and the names to feed and fetch."""

    main: Program  # forward (+ loss (+ backward and updates when there is an optimizer))
    startup: Program
    eval: Program  # the forward and loss in inference mode
    predict: Program  # the forward in inference mode, pruned to the outputs
    outputs: list[str]
    loss: str | None = None
    optimizer: Any = None


class Model:
    """A network with its inputs, labels, programs, scope and training state.

    `network(*inputs)` builds the forward pass from one variable per input spec (nf.data
    variables) and returns the output variable(s); `inputs` and `labels` are InputSpecs (or
    lists of them). The network is built once at construction (so a network that does not fit
    its specs fails here) and again by each `prepare`. `epoch` counts the epochs trained, over
    fits and checkpoints; `stop_training` set by a callback ends fit after the epoch. The
    model runs on `place` (default `nf.default_place()`): a checkpoint saved from one place
    loads on any other.

    Errors: fit/evaluate/predict/save/load before prepare -> UninitializedError; specs that are
    not InputSpecs, a network or loss that cannot take its arguments or returns no variable ->
    TypeMismatchError; batches that do not fit the specs -> FeedError.

    >>> import numpy as np, nestflow as nf
    >>> model = nf.Model(lambda x: nf.layers.fc(x, 2, act="softmax"),
    ...                  inputs=nf.InputSpec([None, 3], name="x"),
    ...                  labels=nf.InputSpec([None, 1], "int64", "y"))
    >>> model.prepare(nf.optimizer.SGD(0.1), loss=nf.layers.cross_entropy)
    >>> x, y = np.ones((4, 3), "float32"), np.zeros((4, 1), "int64")
    >>> history = model.fit((x, y), batch_size=2, epochs=2, verbose=0)
    >>> model.epoch, sorted(history[-1])
    (2, ['loss'])
    >>> model.predict(x, batch_size=4, stack_outputs=True)[0].shape
    (4, 2)
    """

    def __init__(
        self,
        network: Callable[..., Any],
        inputs: InputSpec | Sequence[InputSpec],
        labels: InputSpec | Sequence[InputSpec] | None = None,
        place: Place | None = None,
    ):
        if not callable(network):
            raise TypeMismatchError(f"Model: network must be callable, got {network!r}")
        self.network = network
        self.inputs = _specs(inputs, "inputs", "input")
        self.labels = _specs(labels if labels is not None else [], "labels", "label")
        names = [s.name for s in self.inputs + self.labels]
        if len(set(names)) != len(names):
            raise AttrError(f"Model: the inputs and labels need distinct names, got {names}")
        self.scope = Scope()
        self.epoch = 0
        self.stop_training = False
        self._executor = Executor(place)
        self._forward = self._build()
        self._prepared: _Programs | None = None
        self._metrics: list[Any] = []
        self._random_seed = 0
        self._shuffle_seed = 0

    # ---- building ----

    def _build(self, loss: Callable | None = None, optimizer: Any = None) -> _Programs:
        main, startup = Program(), Program()
        with program_guard(main, startup), unique_name.guard():
            from nestflow.layers import data

            feeds = [data(s.name, s.shape, s.dtype) for s in self.inputs]
            labels = [data(s.name, s.shape, s.dtype) for s in self.labels]
            given = f"{len(feeds)} input variable(s) {[s.name for s in self.inputs]}"
            outputs = _variables(
                _call_checked("network", self.network, feeds, given), main, "the network"
            )
            loss_var = None
            if loss is not None:
                loss_var = self._loss_variable(loss, outputs, labels, main)
            evaluation = main.clone(for_test=True)
            predict = prune(evaluation, [v.name for v in outputs])
            if optimizer is not None:
                optimizer = self._minimize(optimizer, loss_var, main)
        return _Programs(
            main,
            startup,
            evaluation,
            predict,
            [v.name for v in outputs],
            loss_var.name if loss_var is not None else None,
            optimizer,
        )

    def _loss_variable(
        self, loss: Callable, outputs: list[VarDesc], labels: list[VarDesc], main: Program
    ) -> VarDesc:
        from nestflow.layers import mean, sums

        given = f"{len(outputs)} output(s) then {len(labels)} label(s)"
        values = _variables(_call_checked("loss", loss, outputs + labels, given), main, "loss")
        values = [v if _single_value(v) else mean(v) for v in values]
        return values[0] if len(values) == 1 else sums(values)

    @staticmethod
    def _minimize(optimizer: Any, loss: VarDesc, main: Program) -> Any:
        from nestflow.optimizer.optimizer import Optimizer

        if not isinstance(optimizer, Optimizer) and callable(optimizer):
            optimizer = optimizer()  # made here, a schedule joins the model's program
        # nf.distributed.DistributedOptimizer wraps one, and passes its name and state through.
        if not isinstance(getattr(optimizer, "inner_optimizer", optimizer), Optimizer):
            raise TypeMismatchError(
                "Model.prepare: optimizer must be an nf.optimizer optimizer or a function "
                f"returning one, got {type(optimizer).__name__}"
            )
        if optimizer.state_vars:
            raise AttrError(
                f"Model.prepare: the optimizer {optimizer.name} already updates another "
                "program; give prepare a new one (or a function making one)"
            )
        rate = optimizer.learning_rate
        if isinstance(rate, VarDesc) and rate.block.program is not main:
            raise AttrError(
                f"Model.prepare: the learning rate '{rate.name}' was built outside the model's "
                "program; pass a function making the optimizer, e.g. optimizer=lambda: "
                "nf.optimizer.Adam(nf.layers.exponential_decay(1e-3, 100, 0.5))"
            )
        # A fixed name: the state's names then do not depend on how many optimizers the
        # process made before, and checkpoints load into any Model of the network.
        optimizer.name = OPTIMIZER_NAME
        optimizer.minimize(loss)
        return optimizer

    def prepare(
        self,
        optimizer: Any = None,
        loss: Callable[..., Any] | None = None,
        metrics: Any = None,
    ) -> None:
        """Build the train, eval and predict programs and initialise what is new in `scope`.

        `optimizer`: an nf.optimizer optimizer, or a function returning one (needed when its
        learning rate is a schedule, whose ops must be built in the model's program); `loss`:
        `loss(*outputs, *labels) -> variable` (more than one element: averaged; a list:
        summed); `metrics`: nf.metric metrics (or one), each batch's outputs and labels given
        as NumPy arrays to `metric.compute(*outputs, *labels)` and its result to `update`. An
        optimizer needs a loss (AttrError); a loss or metric that cannot take the outputs and
        labels is a TypeMismatchError. Preparing again keeps the parameters
        and the state already in `scope` and initialises only new variables.
        """
        if optimizer is not None and loss is None:
            raise AttrError("Model.prepare: an optimizer needs a loss to minimize (loss=...)")
        if loss is not None and not callable(loss):
            raise TypeMismatchError(f"Model.prepare: loss must be callable, got {loss!r}")
        metrics = [] if metrics is None else _as_list(metrics)
        for metric in metrics:
            if not all(
                callable(getattr(metric, m, None)) for m in ("update", "accumulate", "name")
            ):
                raise TypeMismatchError(
                    f"Model.prepare: metrics must be nf.metric metrics (with update, accumulate, "
                    f"reset and name), got {type(metric).__name__}"
                )
        programs = self._build(loss, optimizer)
        given = f"{len(programs.outputs)} output(s) then {len(self.labels)} label(s)"
        for metric in metrics:
            compute = getattr(metric, "compute", None)
            if compute is not None:
                arguments = [None] * (len(programs.outputs) + len(self.labels))
                _check_arguments(
                    f"metric {type(metric).__name__}.compute", compute, arguments, given
                )
        previous = self._prepared
        if previous is None:
            global_rng = random_state.generator()
            self._random_seed = int(global_rng.integers(1, 2**63 - 1))
            self._shuffle_seed = int(global_rng.integers(0, 2**63 - 1))
        ranks = _data_parallel(programs.optimizer)
        if ranks is not None:  # every rank draws and shuffles as rank 0 does
            seeds = np.array([self._random_seed, self._shuffle_seed], np.int64)
            self._random_seed, self._shuffle_seed = (int(s) for s in ranks.broadcast(seeds))
        programs.main.random_seed = self._random_seed
        if previous is not None:
            # Dropout goes on drawing where the previous train program stopped.
            state = random_state.program_rng(previous.main).bit_generator.state
            random_state.program_rng(programs.main).bit_generator.state = state
        fresh = Scope()
        self._executor.run(programs.startup, scope=fresh)
        for name in fresh.local_var_names():
            mine = self.scope.find_var(name)
            if mine is None or not mine.is_initialized():
                self.scope.var(name).set_value(fresh.find_var(name).get(Tensor))
        self._prepared = programs
        self._metrics = metrics

    # ---- programs (for inspection) ----

    @property
    def train_program(self) -> Program | None:
        """The program fit runs (None before prepare with an optimizer)."""
        p = self._prepared
        return p.main if p is not None and p.optimizer is not None else None

    @property
    def eval_program(self) -> Program | None:
        return self._prepared.eval if self._prepared is not None else None

    @property
    def predict_program(self) -> Program | None:
        return self._prepared.predict if self._prepared is not None else None

    @property
    def startup_program(self) -> Program | None:
        return self._prepared.startup if self._prepared is not None else None

    def _require(self, what: str, optimizer: bool = False, loss: bool = False) -> _Programs:
        p = self._prepared
        if p is None:
            raise UninitializedError(
                f"Model.{what} at {user_source_line()}: the model is not prepared; call "
                "model.prepare(...) first"
            )
        if optimizer and p.optimizer is None:
            raise UninitializedError(
                f"Model.{what} at {user_source_line()}: the model was prepared without an "
                "optimizer; call model.prepare(optimizer, loss) first"
            )
        if loss and p.loss is None and not self._metrics:
            raise UninitializedError(
                f"Model.{what}: nothing to compute; prepare the model with a loss or metrics"
            )
        return p

    # ---- data ----

    def _loader(
        self,
        data: Any,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        what: str,
        shard: bool = False,
    ):
        """`data` as an iterable of batches: a DataLoader (or any iterable that is not a
        dataset) as it is; a Dataset, a tuple of arrays (fields) or an array in a DataLoader.
        With `shard`, under a DistributedOptimizer on several ranks: this rank's batches."""
        from nestflow.io.data import (
            BatchSampler,
            DataLoader,
            DistributedBatchSampler,
            TensorDataset,
        )

        if isinstance(data, DataLoader):
            return data
        if isinstance(data, tuple) or isinstance(data, np.ndarray):
            data = TensorDataset(list(data) if isinstance(data, tuple) else [data])
        seed = self._shuffle_seed if shuffle else None
        ranks = _data_parallel(self._prepared.optimizer) if shard else None
        if ranks is not None and hasattr(data, "__getitem__") and hasattr(data, "__len__"):
            sampler = DistributedBatchSampler(
                data, batch_size, ranks.world_size(), ranks.rank(), shuffle, drop_last, seed or 0
            )
            if type(data) is TensorDataset:
                return _ArrayBatches(data.arrays, sampler)
            return DataLoader(data, batch_sampler=sampler)
        if type(data) is TensorDataset:
            sampler = BatchSampler(data, batch_size, shuffle, drop_last, seed or 0)
            return _ArrayBatches(data.arrays, sampler)
        if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
            return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
        if isinstance(data, Iterable):
            return data
        raise TypeMismatchError(
            f"Model.{what} must be an nf.io Dataset or DataLoader, a tuple of arrays or an "
            f"array, got {type(data).__name__}"
        )

    def _feed(self, batch: Any, with_labels: bool, what: str) -> tuple[dict, list[np.ndarray]]:
        """The feed of one batch (fields in the order inputs then labels, or a dict by name)
        and its labels as arrays."""
        specs = self.inputs + (self.labels if with_labels else [])
        if isinstance(batch, dict):
            missing = [s.name for s in specs if s.name not in batch]
            if missing:
                raise FeedError(
                    f"Model.{what}: a batch (a dict with {sorted(batch)}) lacks {missing}"
                )
            fields = [batch[s.name] for s in specs]
        else:
            fields = list(batch) if isinstance(batch, (tuple, list)) else [batch]
            enough = len(fields) == len(specs) if with_labels else len(fields) >= len(specs)
            if not enough:
                raise FeedError(
                    f"Model.{what}: a batch has {len(fields)} field(s), the model takes "
                    f"{len(self.inputs)} input(s) {[s.name for s in self.inputs]}"
                    + (
                        f" then {len(self.labels)} label(s) {[s.name for s in self.labels]}"
                        if with_labels
                        else ""
                    )
                )
        fields[len(self.inputs) :] = [
            _label_column(s, f)
            for s, f in zip(specs[len(self.inputs) :], fields[len(self.inputs) :])
        ]
        feed = {s.name: f for s, f in zip(specs, fields)}
        labels = [np.asarray(f) for f in fields[len(self.inputs) : len(specs)]]
        return feed, labels

    @staticmethod
    def _set_epoch(loader: Any, epoch: int) -> None:
        sampler = getattr(loader, "batch_sampler", None)
        if hasattr(sampler, "set_epoch") and hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)

    def _log_keys(self) -> list[str]:
        keys = ["loss"] if self._prepared is not None and self._prepared.loss else []
        for metric in self._metrics:
            keys += [str(n) for n in _as_list(metric.name())]
        return keys

    # ---- running ----

    def _run_batches(
        self, mode: str, loader: Any, cbks: Any, what: str, guard: bool = False
    ) -> dict[str, float]:
        """One pass of `mode` ("train" or "eval") over `loader` (`what`: the argument it came
        from, for errors); returns its means. AttrError when it gives no batch; with `guard`,
        NanInfError as soon as a step's loss is NaN or Inf, before any callback sees that
        step."""
        p = self._prepared
        program = p.main if mode == "train" else p.eval
        fetch = ([p.loss] if p.loss else []) + (p.outputs if self._metrics else [])
        for metric in self._metrics:
            metric.reset()
        loss_sum, seen = 0.0, 0
        begin, end = f"on_{mode}_batch_begin", f"on_{mode}_batch_end"
        with _batches(loader) as batches:
            for step, batch in enumerate(batches):
                feed, labels = self._feed(batch, True, "fit" if mode == "train" else "evaluate")
                cbks.call(begin, step, {"step": step})
                values = self._executor.run(program, feed=feed, fetch_list=fetch, scope=self.scope)
                first = np.asarray(next(iter(feed.values())))
                size = int(first.shape[0]) if first.ndim else 1
                if p.loss:
                    loss = float(values[0].item())
                    # The loss is on the host already: checking it costs nothing next to a
                    # step, unlike scanning every parameter.
                    if guard and not math.isfinite(loss):
                        raise _non_finite_loss(loss, self.epoch, step, feed)
                    loss_sum += loss * size
                    values = values[1:]
                seen += size
                for metric in self._metrics:
                    metric.update(*_as_list(metric.compute(*values, *labels)))
                logs = self._means(loss_sum, seen)
                logs.update(step=step, batch_size=size)
                cbks.call(end, step, logs)
        if not seen:
            raise AttrError(
                f"Model.{what} gave no batch ({_describe_data(loader)}), so nothing was "
                "computed; give it at least one sample (with drop_last, at least batch_size)"
            )
        return self._means(loss_sum, seen)

    def _means(self, loss_sum: float, seen: int) -> dict[str, float]:
        logs: dict[str, float] = {}
        if self._prepared.loss:
            logs["loss"] = loss_sum / seen if seen else 0.0
        for metric in self._metrics:
            values = _as_list(metric.accumulate())
            for name, value in zip(_as_list(metric.name()), values):
                logs[str(name)] = float(value)
        return logs

    def fit(
        self,
        train_data: Any,
        eval_data: Any = None,
        batch_size: int = 1,
        epochs: int = 1,
        eval_freq: int = 1,
        log_freq: int = 10,
        save_dir: str | os.PathLike | None = None,
        save_freq: int = 1,
        verbose: int = 1,
        drop_last: bool = False,
        shuffle: bool = True,
        num_workers: int = 0,
        callbacks: Any = None,
        terminate_on_nan: bool = True,
    ) -> list[dict[str, float]]:
        """Train `epochs` more epochs (counted on from `self.epoch`, so a loaded checkpoint's
        run goes on where it stopped); returns each epoch's logs.

        `train_data`/`eval_data`: an nf.io Dataset (batched here by `batch_size`, shuffled by
        (seed, epoch) when `shuffle`, `drop_last`), a DataLoader (used as it is; its
        set_epoch is called with the model's epoch), or a tuple of arrays (the fields: inputs
        then labels). Each batch is the inputs then the labels, or a dict by name; a label of
        shape [N] whose spec is [N, 1] (class ids as scikit-learn gives them) is taken as that
        column, here and in evaluate. After
        each epoch whose index is a multiple of `eval_freq` the eval data is evaluated.
        `verbose`: 0 silent, 1 a progress bar on a terminal and one line per epoch otherwise, 2
        one line per epoch (ProgBarLogger, refreshed every `log_freq` steps). `save_dir`:
        ModelCheckpoint saves every `save_freq` epochs there, and `final`. `callbacks`: see
        nf.callbacks. Before prepare(optimizer, loss): UninitializedError. Data that gives no
        batch (a dataset of length 0): AttrError naming it.

        `terminate_on_nan` (Keras's TerminateOnNaN, on by default): a step whose loss is NaN
        or Inf ends fit with a NanInfError naming the epoch, the step and the batch's
        non-finite inputs, raised before any callback sees that step, so no checkpoint is
        written after it and the last one saved holds finite parameters (the model's own
        parameters have taken that step's update: load the checkpoint to go on).
        nf.set_flags({"check_nan_inf": True}) finds the op that made the first NaN.
        """
        self._require("fit", optimizer=True)
        if not isinstance(terminate_on_nan, bool):
            raise AttrError(
                f"Model.fit: terminate_on_nan must be True or False, got {terminate_on_nan!r}"
            )
        if num_workers != 0:
            raise AttrError(
                f"Model.fit: num_workers={num_workers!r}; nf.io.DataLoader has no worker "
                "processes (it prepares batches on one prefetch thread): use 0"
            )
        epochs = check_count(epochs, "Model.fit: epochs", 0)
        eval_freq = check_count(eval_freq, "Model.fit: eval_freq")
        train_loader = self._loader(
            train_data, batch_size, shuffle, drop_last, "fit: train_data", shard=True
        )
        ranks = _data_parallel(self._prepared.optimizer)
        eval_loader = None
        if eval_data is not None:
            eval_loader = self._loader(eval_data, batch_size, False, False, "fit: eval_data")
        cbks = config_callbacks(
            callbacks,
            self,
            verbose=verbose,
            log_freq=log_freq,
            save_freq=save_freq,
            save_dir=None if save_dir is None else os.fspath(save_dir),
            fitting=True,
            epochs=epochs,
            first_epoch=self.epoch,
            steps=_length(train_loader),
            metrics=self._log_keys(),
            batch_size=batch_size,
            do_eval=eval_loader is not None,
        )
        self.stop_training = False
        history: list[dict[str, float]] = []
        logs: dict[str, float] = {}
        cbks.call("on_train_begin", {})
        for _ in range(epochs):
            epoch = self.epoch
            self._set_epoch(train_loader, epoch)
            cbks.call("on_epoch_begin", epoch, {})
            logs = self._run_batches(
                "train", train_loader, cbks, "fit: train_data", terminate_on_nan
            )
            if eval_loader is not None and epoch % eval_freq == 0:
                evaluated = self._evaluate(eval_loader, cbks, "fit: eval_data")
                logs.update({f"eval_{k}": v for k, v in evaluated.items()})
            self.epoch = epoch + 1
            cbks.call("on_epoch_end", epoch, logs)
            history.append(logs)
            if ranks is not None:  # rank 0 decides: every rank stops after the same epoch
                self.stop_training = bool(ranks.broadcast(np.array([self.stop_training]))[0])
            if self.stop_training:
                break
        cbks.call("on_train_end", logs)
        return history

    def _evaluate(self, loader: Any, cbks: Any, what: str) -> dict[str, float]:
        cbks.call("on_eval_begin", {"steps": _length(loader)})
        logs = self._run_batches("eval", loader, cbks, what)
        cbks.call("on_eval_end", logs)
        return logs

    def evaluate(
        self,
        eval_data: Any,
        batch_size: int = 1,
        log_freq: int = 10,
        verbose: int = 1,
        callbacks: Any = None,
    ) -> dict[str, float]:
        """The loss and metrics over `eval_data` (data as fit takes it, in order), computed
        by the eval program (dropout and batch_norm in inference mode): {"loss": mean over the
        samples, metric name: its accumulated value}. verbose=1 prints one line."""
        self._require("evaluate", loss=True)
        loader = self._loader(eval_data, batch_size, False, False, "evaluate: eval_data")
        cbks = config_callbacks(
            callbacks,
            self,
            verbose=verbose,
            log_freq=log_freq,
            steps=_length(loader),
            metrics=self._log_keys(),
            batch_size=batch_size,
            do_eval=True,
        )
        return self._evaluate(loader, cbks, "evaluate: eval_data")

    def predict(
        self,
        test_data: Any,
        batch_size: int = 1,
        stack_outputs: bool = False,
        callbacks: Any = None,
    ) -> list[Any]:
        """The network's outputs on `test_data` (data as fit takes it; only the first
        len(inputs) fields of each batch are used, so labelled data works too), by the predict
        program: one entry per output, a list of per-batch arrays, or with `stack_outputs`
        one array of every row."""
        p = self._require("predict")
        loader = self._loader(test_data, batch_size, False, False, "predict: test_data")
        cbks = config_callbacks(
            callbacks, self, verbose=0, steps=_length(loader), batch_size=batch_size
        )
        results: list[list[np.ndarray]] = [[] for _ in p.outputs]
        cbks.call("on_predict_begin", {})
        with _batches(loader) as batches:
            for step, batch in enumerate(batches):
                feed, _ = self._feed(batch, False, "predict")
                cbks.call("on_predict_batch_begin", step, {"step": step})
                values = self._executor.run(
                    p.predict, feed=feed, fetch_list=p.outputs, scope=self.scope
                )
                for found, value in zip(results, values):
                    found.append(value)
                cbks.call("on_predict_batch_end", step, {"step": step})
        cbks.call("on_predict_end", {})
        if stack_outputs:
            return [np.concatenate(found) if found else np.empty((0,)) for found in results]
        return results

    # ---- summary ----

    def summary(self, file: Any = None) -> dict[str, int]:
        """Print a table of the forward pass (one row per op of the inference program: its
        output shapes and the parameters it reads, each counted once) and the parameter
        totals; returns {"total_params", "trainable_params"}. Persistable variables that are
        not trainable parameters (batch_norm's running statistics) count in the total only."""
        program = self._forward.predict
        block = program.global_block()
        persistable = {v.name: v for v in program.list_vars() if v.persistable}
        # An op's outputs worth showing: those a later op reads or the model returns (not
        # batch_norm's saved statistics and the like).
        used = {n for op in block.ops for n in _names_read(op)} | set(self._forward.outputs)
        rows, counted = [], set()
        for index, op in enumerate(block.ops):
            outputs = [block.find_var(n) for n in op.output_names() if n in used]
            outputs = [v for v in outputs if v is not None and not v.persistable]
            shown = ", ".join(f"{v.name} {list(v.shape)}" for v in outputs)
            params = [n for n in _names_read(op) if n in persistable]
            fresh = [n for n in dict.fromkeys(params) if n not in counted]
            counted.update(fresh)
            count = sum(_numel(persistable[n]) for n in fresh)
            described = ", ".join(
                f"{n} {list(persistable[n].shape)}" for n in dict.fromkeys(params)
            )
            rows.append((str(index), op.type, shown, described, f"{count:,}"))
        total = sum(_numel(v) for v in persistable.values())
        trainable = sum(_numel(v) for v in persistable.values() if v.is_parameter and v.trainable)
        header = ("#", "op", "outputs", "parameters", "count")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        line = "-" * (sum(widths) + 2 * (len(widths) - 1))

        def text(row: tuple[str, ...]) -> str:
            return "  ".join(
                c.rjust(w) if i in (0, 4) else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip()

        lines = [line, text(header), line, *map(text, rows), line]
        lines += [
            f"Total params: {total:,}",
            f"Trainable params: {trainable:,}",
            f"Non-trainable params: {total - trainable:,}",
            line,
        ]
        print("\n".join(lines), file=file)
        return {"total_params": total, "trainable_params": trainable}

    # ---- saving ----

    def save(self, path: str | os.PathLike, training: bool = True) -> None:
        """training=True: a checkpoint `path.safetensors`: every persistable variable of the
        train program (parameters, optimizer state, schedule step, running statistics) and,
        in its header, the epoch count, the train program's random seed and generator state
        and the shuffle seed; written all or nothing. training=False: an inference model
        directory `path` (nf.io.save_inference_model of the predict program; load it with
        nf.io.load_inference_model). Only the writing rank writes (nf.callbacks
        .is_writing_rank). Parent directories are made. FileWriteError if it cannot write."""
        p = self._require("save")
        if not is_writing_rank():
            return
        path = os.fspath(path)
        if not training:
            from nestflow.io.inference import save_inference_model

            save_inference_model(
                path, [s.name for s in self.inputs], p.outputs, p.predict, self.scope
            )
            return
        from nestflow.io.atomic import write_atomic
        from nestflow.io.params import params_file_bytes

        state = {
            "epoch": self.epoch,
            "random_seed": self._random_seed,
            "generator": random_state.program_rng(p.main).bit_generator.state,
            "shuffle_seed": self._shuffle_seed,
        }
        metadata = {"format": CHECKPOINT_FORMAT, "version": "1", "state": json.dumps(state)}
        data = params_file_bytes(self.scope, p.main, metadata)
        file = checkpoint_file(path)
        os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
        write_atomic(file, data)

    def load(
        self, path: str | os.PathLike, skip_mismatch: bool = False, reset_optimizer: bool = False
    ) -> None:
        """Restore a checkpoint written by save(path): the persistable variables, and the
        epoch count, random state and shuffle seed (a file written by nf.io.save_params gives
        the variables only). With `reset_optimizer` only the model's own state is loaded
        (the predict program's persistables: parameters and running statistics) and the
        epoch and random state stay: a fresh start from trained weights.

        Nothing changes unless everything fits: a ParameterFileError names an unreadable or
        corrupt file and every tensor missing from it, not in the model, or of another shape or
        dtype; with `skip_mismatch` those are skipped with a warning instead."""
        from nestflow.io.params import decode_params, persistable_vars, read_metadata

        p = self._require("load")
        path = os.fspath(path)
        file = checkpoint_file(path)
        if os.path.isdir(path) and not os.path.exists(file):
            raise ParameterFileError(
                f"'{path}' is a directory, not a checkpoint; an inference model saved with "
                "training=False loads with nf.io.load_inference_model"
            )
        ranks = _data_parallel(p.optimizer)
        data, problem = None, None
        if ranks is None or ranks.rank() == 0:
            try:
                with open(file, "rb") as handle:
                    data = handle.read()
            except OSError as exc:
                problem = f"cannot read checkpoint '{file}': {exc}"
        if ranks is not None:  # rank 0 reads it, every rank loads the same bytes
            data = ranks.broadcast_bytes(data)
            problem = problem or (None if data is not None else f"rank 0 cannot read '{file}'")
        if problem is not None:
            raise ParameterFileError(problem)
        tensors = decode_params(data, file)
        state = _checkpoint_state(read_metadata(data), file)
        wanted = {v.name: v for v in persistable_vars(p.main)}
        own = {v.name for v in persistable_vars(p.predict)}
        chosen, problems = {}, []
        for name, var in wanted.items():
            if reset_optimizer and name not in own:
                continue
            array = tensors.get(name)
            if array is None:
                problems.append(f"'{name}' is missing from the file")
            elif (
                array.dtype != np.dtype(var.dtype)
                or len(var.shape) != array.ndim
                or any(d not in (-1, a) for d, a in zip(var.shape, array.shape))
            ):
                problems.append(
                    f"'{name}' is {array.dtype}{list(array.shape)} in the file but "
                    f"{var.dtype}{list(var.shape)} in the model"
                )
            else:
                chosen[name] = array
        extra = sorted(set(tensors) - set(wanted))
        if extra:
            problems.append(f"{extra} are not in the model")
        if problems:
            message = f"checkpoint '{file}' does not fit the model: " + "; ".join(problems)
            if not skip_mismatch:
                raise ParameterFileError(message)
            warnings.warn(message + " (skipped)", stacklevel=2)
        for name, array in chosen.items():
            self.scope.var(name).get_mutable(Tensor).set(array)
        if state is not None and not reset_optimizer:
            self.epoch = state["epoch"]
            self._random_seed = state["random_seed"]
            self._shuffle_seed = state["shuffle_seed"]
            p.main.random_seed = self._random_seed
            random_state.program_rng(p.main).bit_generator.state = state["generator"]


def _label_column(spec: InputSpec, value: Any) -> Any:
    """A label of shape [N] where its spec declares [N, 1] (class ids as scikit-learn, Keras
    and PyTorch keep them) as the column the spec declares; any other value as it is."""
    if len(spec.shape) != 2 or spec.shape[1] != 1:
        return value
    if isinstance(value, (list, tuple)):
        found = np.asarray(value)
        return found.reshape(-1, 1).tolist() if found.ndim == 1 else value
    return value.reshape(-1, 1) if getattr(value, "ndim", None) == 1 else value


def _data_parallel(optimizer: Any) -> Any:
    """nestflow.distributed when `optimizer` is its DistributedOptimizer and the job has
    several ranks; else None."""
    if getattr(optimizer, "inner_optimizer", None) is None:
        return None
    import nestflow.distributed as distributed

    return distributed if distributed.world_size() > 1 else None


def checkpoint_file(path: str) -> str:
    """The file Model.save(path) writes: `path.safetensors` (a path naming it already is
    kept)."""
    return path if path.endswith(CHECKPOINT_SUFFIX) else path + CHECKPOINT_SUFFIX


def _checkpoint_state(metadata: dict[str, str], file: str) -> dict[str, Any] | None:
    """The training state in a checkpoint's header (None for a plain parameter file);
    ParameterFileError when it is there but malformed."""
    if metadata.get("format") != CHECKPOINT_FORMAT:
        return None
    try:
        state = json.loads(metadata["state"])
        checked = {
            "epoch": int(state["epoch"]),
            "random_seed": int(state["random_seed"]),
            "shuffle_seed": int(state["shuffle_seed"]),
            "generator": dict(state["generator"]),
        }
        np.random.PCG64().state = checked["generator"]  # a state the generator takes
    except (KeyError, TypeError, ValueError) as exc:
        raise ParameterFileError(
            f"checkpoint '{file}' has a malformed training state in its header: {exc}"
        ) from None
    return checked


class _ArrayBatches:
    """The batches a DataLoader of a TensorDataset gives (the same seeded BatchSampler, so the
    same order), cut from the arrays with one fancy index each instead of stacking samples
    one by one on a prefetch thread: the data is in memory, there is nothing to prefetch."""

    def __init__(self, arrays: list[np.ndarray], batch_sampler: Any):
        self.arrays = arrays
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        return (tuple(a[indices] for a in self.arrays) for indices in self.batch_sampler)


@contextlib.contextmanager
def _batches(loader: Any) -> Iterator[Iterator[Any]]:
    """An epoch's iterator over `loader`, closed at the end (a DataLoader's prefetch thread
    stops at once when a step fails)."""
    batches = iter(loader)
    try:
        yield batches
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _non_finite_loss(loss: float, epoch: int, step: int, feed: dict[str, Any]) -> NanInfError:
    """fit's error for a step whose loss is `loss` (NaN or Inf): where, and which rows of the
    batch's inputs were not finite (none: the network made the NaN itself)."""
    bad = []
    for name, value in feed.items():
        array = np.asarray(value)
        if array.dtype.kind in "fc" and array.ndim and not np.isfinite(array).all():
            rows = np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(axis=1))
            shown = rows[:10].tolist()
            more = f" and {len(rows) - len(shown)} more" if len(rows) > len(shown) else ""
            bad.append(f"'{name}' at rows {shown}{more}")
    source = (
        "the batch holds NaN or Inf in " + ", ".join(bad)
        if bad
        else "the batch's inputs are all finite: nf.set_flags({'check_nan_inf': True}) names "
        "the op that made the first NaN or Inf"
    )
    return NanInfError(
        f"Model.fit: the loss is {loss} at epoch {epoch}, step {step} (batch {step} of the "
        f"epoch); {source}. Training stopped before any callback saw this step, so no "
        "checkpoint was written after it; the model's parameters have taken its update "
        "(load the last checkpoint to go on, or fit with terminate_on_nan=False)"
    )


def _describe_data(loader: Any) -> str:
    """What `loader` reads, for errors: its dataset's type and length, or its own type."""
    dataset = getattr(loader, "dataset", None)
    if dataset is not None:
        return f"{type(dataset).__name__} of length {len(dataset)}, by {type(loader).__name__}"
    arrays = getattr(loader, "arrays", None)
    if arrays is not None:
        return f"arrays of {len(arrays[0])} samples"
    return type(loader).__name__


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def _names_read(op: Any) -> list[str]:
    """The variables `op` reads, its sub-blocks' reads included."""
    names = list(op.input_names())
    for block in op.sub_blocks():
        for inner in block.ops:
            names += _names_read(inner)
    return names


def _numel(var: VarDesc) -> int:
    return int(np.prod([max(d, 0) for d in var.shape], dtype=np.int64))
