"""nf.callbacks: the hooks fit/evaluate/predict call, and each callback's effect."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, TypeMismatchError
from nestflow.layers.learning_rate_scheduler import LR_DECAY_COUNTER


def data(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64").reshape(-1, 1)


def classifier(learning_rate=0.05, metrics=True) -> nf.Model:
    model = nf.Model(
        lambda x: nf.layers.fc(x, 2, act="softmax"),
        nf.InputSpec([None, 4], name="x"),
        nf.InputSpec([None, 1], "int64", "y"),
    )
    model.prepare(
        nf.optimizer.SGD(learning_rate),
        nf.layers.cross_entropy,
        nf.metric.Accuracy() if metrics else None,
    )
    return model


class Recorder(nf.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            calls = object.__getattribute__(self, "calls")
            return lambda *args: calls.append((name, *args))
        return object.__getattribute__(self, name)


def test_hooks_are_called_in_order_with_logs():
    recorder = Recorder()
    model = classifier()
    model.fit(data(), eval_data=data(10), batch_size=20, epochs=2, verbose=0, callbacks=[recorder])
    names = [c[0] for c in recorder.calls]
    epoch = [
        "on_epoch_begin",
        "on_train_batch_begin",
        "on_train_batch_end",
        "on_train_batch_begin",
        "on_train_batch_end",
        "on_eval_begin",
        "on_eval_batch_begin",
        "on_eval_batch_end",
        "on_eval_end",
        "on_epoch_end",
    ]
    assert names == ["on_train_begin", *epoch, *epoch, "on_train_end"]
    assert recorder.model is model
    assert recorder.params["epochs"] == 2 and recorder.params["steps"] == 2
    assert recorder.params["metrics"] == ["loss", "acc"] and recorder.params["do_eval"]
    batch_end = next(c for c in recorder.calls if c[0] == "on_train_batch_end")
    assert batch_end[1] == 0 and set(batch_end[2]) == {"loss", "acc", "step", "batch_size"}
    epoch_ends = [c for c in recorder.calls if c[0] == "on_epoch_end"]
    assert [c[1] for c in epoch_ends] == [0, 1]
    assert set(epoch_ends[0][2]) == {"loss", "acc", "eval_loss", "eval_acc"}

    recorder.calls.clear()
    model.evaluate(data(10), batch_size=10, verbose=0, callbacks=recorder)
    assert [c[0] for c in recorder.calls] == [
        "on_eval_begin",
        "on_eval_batch_begin",
        "on_eval_batch_end",
        "on_eval_end",
    ]
    recorder.calls.clear()
    model.predict(data(10)[0], batch_size=10, callbacks=[recorder])
    assert [c[0] for c in recorder.calls] == [
        "on_predict_begin",
        "on_predict_batch_begin",
        "on_predict_batch_end",
        "on_predict_end",
    ]


def test_a_misspelt_hook_or_a_non_callback_is_an_error():
    class Typo(nf.callbacks.Callback):
        def on_epoch_ends(self, epoch, logs=None):
            pass

    model = classifier()
    with pytest.raises(AttrError, match="on_epoch_ends.*did you mean 'on_epoch_end'"):
        model.fit(data(), verbose=0, callbacks=[Typo()])
    with pytest.raises(TypeMismatchError, match="Callback objects"):
        model.fit(data(), verbose=0, callbacks=[lambda logs: None])
    with pytest.raises(TypeMismatchError, match="list of nf.callbacks.Callback"):
        model.evaluate(data(), verbose=0, callbacks="csv")
    assert model.epoch == 0


def test_progress_off_a_terminal_is_one_line_per_epoch(capsys):
    model = classifier()
    model.fit(data(), eval_data=data(10), batch_size=8, epochs=3, log_freq=1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for number, line in enumerate(lines, start=1):
        assert line.startswith(f"epoch {number}/3: loss ")
        assert ", acc " in line and ", eval_loss " in line and line.endswith(" s)")
        assert "(5 steps, " in line
    model.fit(data(), batch_size=8, epochs=1, verbose=0)
    assert capsys.readouterr().out == ""
    model.evaluate(data(10), batch_size=4)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("eval: loss ") and "(10 samples, " in line
    # verbose=2 is one line per epoch anywhere; a resumed count goes on from the model's epoch.
    model.fit(data(), batch_size=8, epochs=1, callbacks=[nf.callbacks.ProgBarLogger(verbose=2)])
    assert capsys.readouterr().out.startswith("epoch 5/5: loss ")


def test_progress_on_a_terminal_is_a_bar(capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    model = classifier()
    model.fit(data(), batch_size=8, epochs=2)
    out = capsys.readouterr().out
    assert "epoch 1/2" in out and "epoch 2/2" in out and "batch" in out and "\r" in out
    assert "loss" in out and "acc" in out


def test_progress_logger_arguments_are_checked():
    with pytest.raises(AttrError, match="verbose"):
        nf.callbacks.ProgBarLogger(verbose=3)
    with pytest.raises(AttrError, match="log_freq"):
        nf.callbacks.ProgBarLogger(log_freq=0)


def test_early_stopping_stops_when_the_monitor_stops_improving():
    model = classifier()
    # No training loss reaches the baseline 0: no epoch improves, so patience 1 ends the fit
    # after the second epoch.
    stop = nf.callbacks.EarlyStopping(monitor="loss", patience=1, baseline=0.0, verbose=0)
    history = model.fit(data(), batch_size=8, epochs=10, verbose=0, callbacks=[stop])
    assert len(history) == 2 and model.epoch == 2 and stop.stopped_epoch == 1
    # Accuracy improving on held-out data (mode auto: max) does not stop it.
    keep = nf.callbacks.EarlyStopping(monitor="acc", patience=0, verbose=0)
    history = model.fit(
        data(), eval_data=data(), batch_size=8, epochs=3, verbose=0, callbacks=[keep]
    )
    assert len(history) == 3 and keep.stopped_epoch is None and keep.best > 0.5


def test_early_stopping_counts_epochs_without_improvement(tmp_path, capsys):
    model = classifier()
    stop = nf.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=0.05)
    stop.set_model(model)
    stop.set_params({"do_eval": True, "save_dir": str(tmp_path)})
    stop.on_train_begin()
    for epoch, value in enumerate([1.0, 0.9, 0.88, 0.7, 0.69, 0.68]):
        stop.on_epoch_begin(epoch)
        stop.on_eval_end({"loss": value})
        if model.stop_training:
            break
    # 0.88 is not 0.05 better than 0.9 (wait 1), 0.7 is (best), 0.69 and 0.68 are not: stop.
    assert stop.best == 0.7 and stop.stopped_epoch == 5
    assert "early stopping after epoch 6" in capsys.readouterr().out
    assert (tmp_path / "best_model.safetensors").exists()
    with pytest.raises(AttrError, match="'los' is not in the evaluation's logs.*'loss'"):
        bad = nf.callbacks.EarlyStopping(monitor="los")
        bad.set_params({"do_eval": True})
        bad.on_eval_end({"loss": 1.0})
    with pytest.raises(AttrError, match="mode"):
        nf.callbacks.EarlyStopping(mode="up")


def test_model_checkpoint_writes_every_save_freq_epochs_and_the_final(tmp_path):
    model = classifier()
    model.fit(data(), batch_size=20, epochs=4, verbose=0, save_dir=tmp_path / "a", save_freq=2)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "1.safetensors",
        "3.safetensors",
        "final.safetensors",
    ]
    fresh = classifier()
    fresh.load(tmp_path / "a" / "1")
    assert fresh.epoch == 2
    design = nf.callbacks.ModelCheckpoint(
        "c", 3
    )  # the design contract's order (save_dir, save_freq)
    paddle = nf.callbacks.ModelCheckpoint(3, "c")  # Paddle's
    assert (design.save_dir, design.save_freq) == (paddle.save_dir, paddle.save_freq) == ("c", 3)
    checkpoint = nf.callbacks.ModelCheckpoint(tmp_path / "b")
    model.fit(data(), batch_size=20, epochs=1, verbose=0, callbacks=[checkpoint])
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "4.safetensors",
        "final.safetensors",
    ]
    model.fit(data(), batch_size=20, epochs=1, verbose=0)  # no save_dir: nothing written
    assert len(list(tmp_path.iterdir())) == 2


def test_csv_logger_writes_one_row_per_epoch_and_appends_on_resume(tmp_path):
    path = tmp_path / "logs" / "train.csv"
    model = classifier()
    history = model.fit(
        data(),
        eval_data=data(10),
        batch_size=20,
        epochs=2,
        verbose=0,
        callbacks=[nf.callbacks.CSVLogger(path)],
    )
    lines = path.read_text().splitlines()
    assert lines[0] == "epoch,loss,acc,eval_loss,eval_acc"
    assert len(lines) == 3
    for epoch, (line, logs) in enumerate(zip(lines[1:], history)):
        cells = line.split(",")
        assert cells[0] == str(epoch)
        expected = [logs[k] for k in ("loss", "acc", "eval_loss", "eval_acc")]
        np.testing.assert_allclose([float(c) for c in cells[1:]], expected, rtol=1e-7)
    model.fit(
        data(),
        eval_data=data(10),
        batch_size=20,
        epochs=1,
        verbose=0,
        callbacks=[nf.callbacks.CSVLogger(path, append=True)],
    )
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and lines[3].startswith("2,")
    with pytest.raises(AttrError, match="columns"):  # no eval: other columns
        model.fit(
            data(), epochs=1, verbose=0, callbacks=[nf.callbacks.CSVLogger(path, append=True)]
        )


def test_lr_scheduler_by_epoch_holds_the_schedule_step_at_the_epoch():
    steps: list[int] = []

    class Steps(nf.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            counter = self.model.scope.find_var(LR_DECAY_COUNTER).get(nf.Tensor).numpy()
            steps.append(int(counter[0]))

    def model():
        made = nf.Model(
            lambda x: nf.layers.fc(x, 2, act="softmax"),
            nf.InputSpec([None, 4]),
            nf.InputSpec([None, 1], "int64"),
        )
        made.prepare(
            lambda: nf.optimizer.SGD(nf.layers.exponential_decay(0.1, 1, 0.5)),
            nf.layers.cross_entropy,
        )
        return made

    by_step = model()
    by_step.fit(data(), batch_size=10, epochs=2, verbose=0, callbacks=[Steps()])
    assert steps == list(range(8))  # the program's own counter: one per step
    steps.clear()
    by_epoch = model()
    by_epoch.fit(
        data(),
        batch_size=10,
        epochs=2,
        verbose=0,
        callbacks=[Steps(), nf.callbacks.LRScheduler(by_step=False, by_epoch=True)],
    )
    assert steps == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(AttrError, match="exactly one"):
        nf.callbacks.LRScheduler(by_step=True, by_epoch=True)
    with pytest.raises(AttrError, match="no learning-rate schedule"):
        classifier().fit(
            data(), verbose=0, callbacks=[nf.callbacks.LRScheduler(by_step=False, by_epoch=True)]
        )


def test_only_the_writing_rank_writes(tmp_path, capsys, monkeypatch):
    """Under MPI (nf.distributed loaded) only rank 0 saves, logs and prints progress."""
    fake = types.ModuleType("nestflow.distributed")
    fake.rank = lambda: 1
    monkeypatch.setitem(sys.modules, "nestflow.distributed", fake)
    assert not nf.callbacks.is_writing_rank()
    model = classifier()
    model.fit(
        data(),
        batch_size=20,
        epochs=2,
        save_dir=tmp_path / "ckpt",
        callbacks=[nf.callbacks.CSVLogger(tmp_path / "log.csv")],
    )
    model.save(tmp_path / "explicit")
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().out == ""
    fake.rank = lambda: 0
    assert nf.callbacks.is_writing_rank()
    model.save(tmp_path / "explicit")
    assert (tmp_path / "explicit.safetensors").exists()
