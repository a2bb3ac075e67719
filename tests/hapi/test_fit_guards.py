"""Issue 32 items 8-10: fit stops on a NaN loss before a checkpoint can keep it, the
check_nan_inf flag names the op making a NaN, data without a batch is an error, and an
interrupt returns promptly whatever the dataset does."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import AttrError, NanInfError
from nestflow.io.data import JOIN_TIMEOUT_S


def _model(network=None) -> nf.Model:
    model = nf.Model(
        network or (lambda x: nf.layers.fc(x, 2, act="softmax")),
        inputs=nf.InputSpec([None, 3], name="x"),
        labels=nf.InputSpec([None, 1], "int64", "y"),
    )
    model.prepare(nf.optimizer.SGD(0.1), loss=nf.layers.cross_entropy)
    return model


def _data(n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype("float32"), rng.integers(0, 2, (n, 1))


def _parameters(model: nf.Model) -> dict[str, np.ndarray]:
    block = model.train_program.global_block()
    return {
        v.name: np.array(model.scope.find_var(v.name).get(nf.Tensor))
        for v in block.vars.values()
        if v.persistable and model.scope.find_var(v.name) is not None
    }


class Steps(nf.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ended = []

    def on_train_batch_end(self, step, logs=None):
        self.ended.append((self.model.epoch, step))


def test_a_nan_sample_stops_fit_before_a_checkpoint_keeps_it(tmp_path):
    """Item 8: the step whose loss is NaN raises NanInfError naming the epoch, the step and
    the batch's rows; no callback sees that step, so ModelCheckpoint writes nothing after it
    and the last checkpoint holds the finite parameters it had."""
    model = _model()
    x, y = _data()
    model.fit((x, y), batch_size=2, epochs=1, verbose=0, save_dir=tmp_path, shuffle=False)
    saved = sorted(os.listdir(tmp_path))
    good = tmp_path / "final.safetensors"
    before = good.read_bytes()
    x[5, 1] = np.nan  # batch 2 of the epoch, its row 1
    steps = Steps()
    with pytest.raises(NanInfError) as info:
        model.fit(
            (x, y), batch_size=2, epochs=2, verbose=0, save_dir=tmp_path, shuffle=False,
            callbacks=[steps],
        )  # fmt: skip
    message = str(info.value)
    assert "loss is nan at epoch 1, step 2" in message
    assert "'x' at rows [1]" in message
    assert steps.ended == [(1, 0), (1, 1)]  # the NaN step reached no callback
    assert sorted(os.listdir(tmp_path)) == saved and good.read_bytes() == before
    restored = _model()
    restored.load(tmp_path / "final")
    assert all(np.isfinite(v).all() for v in _parameters(restored).values())


def test_without_the_guard_fit_goes_on_as_before():
    model = _model()
    x, y = _data()
    x[0, 0] = np.inf
    history = model.fit((x, y), batch_size=4, epochs=1, verbose=0, terminate_on_nan=False)
    assert np.isnan(history[0]["loss"])
    with pytest.raises(AttrError, match="terminate_on_nan must be True or False"):
        model.fit((x, y), terminate_on_nan=1)


def _log_of_x(x):
    return nf.layers.fc(nf.layers.log(x), 2, act="softmax")  # NaN where x < 0


def test_a_nan_the_network_makes_is_named_by_the_check_nan_inf_flag():
    """Item 8: with finite inputs the guard says so and points at the flag; with
    nf.set_flags({"check_nan_inf": True}) the error names the op and the user's line."""
    x, y = _data()
    with pytest.raises(NanInfError, match="inputs are all finite.*check_nan_inf"):
        _model(_log_of_x).fit((x, y), batch_size=8, verbose=0)
    nf.set_flags({"check_nan_inf": True})
    try:
        assert nf.get_flags("check_nan_inf") == {"check_nan_inf": True}
        with pytest.raises(NanInfError) as info:
            _model(_log_of_x).fit((x, y), batch_size=8, verbose=0)
    finally:
        nf.set_flags({"check_nan_inf": False})
    message = str(info.value)
    assert "op 'log'" in message and "contains NaN" in message
    assert "test_fit_guards.py" in message and "_log_of_x" in message


class Empty(nf.io.Dataset):
    def __getitem__(self, index):
        raise IndexError(index)

    def __len__(self):
        return 0


@pytest.mark.parametrize(
    "run",
    [
        lambda m: m.fit(Empty(), verbose=0),
        lambda m: m.fit(_data(), eval_data=Empty(), verbose=0),
        lambda m: m.evaluate(Empty(), verbose=0),
        lambda m: m.fit(_data(3), batch_size=4, drop_last=True, verbose=0),
    ],
)
def test_data_without_a_batch_is_an_error_naming_it(run):
    """Item 9: no silent `loss 0.0` for an epoch that ran no step."""
    model = _model()
    with pytest.raises(AttrError, match=r"gave no batch \((Empty of length 0|arrays of 3)"):
        run(model)


class Blocking(nf.io.Dataset):
    """Sample i of 8; from index `block_at` on, __getitem__ waits for `release`."""

    def __init__(self, block_at: int):
        self.block_at = block_at
        self.release = threading.Event()
        self.entered = threading.Event()

    def __getitem__(self, index):
        if index >= self.block_at:
            self.entered.set()
            self.release.wait()
        return np.full(3, index, "float32"), np.array([index % 2])

    def __len__(self):
        return 8


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nestflow-DataLoader"]


def _interrupted_fit(data: Blocking, callbacks=()) -> float:
    """Seconds fit took to raise KeyboardInterrupt."""
    model = _model()
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        model.fit(data, batch_size=2, shuffle=False, verbose=0, callbacks=list(callbacks))
    return time.perf_counter() - start


def _thread_ends_once_released(data: Blocking) -> None:
    threads = _loader_threads()
    data.release.set()
    for thread in threads:
        thread.join(5)
    assert _loader_threads() == []


def test_an_interrupt_in_a_callback_returns_while_the_loader_is_blocked():
    """Item 10: KeyboardInterrupt at step 0 while the prefetch thread is stuck in
    __getitem__ of a later batch: fit returns within JOIN_TIMEOUT_S, and the thread ends once
    the dataset returns."""

    class Interrupt(nf.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            assert data.entered.wait(5)
            raise KeyboardInterrupt

    data = Blocking(block_at=2)
    assert _interrupted_fit(data, [Interrupt()]) < JOIN_TIMEOUT_S + 2
    _thread_ends_once_released(data)


def test_ctrl_c_while_fit_waits_for_a_blocked_dataset_returns():
    """Item 10: SIGINT while fit waits for the first batch (the dataset blocked in it)."""
    data = Blocking(block_at=0)

    def interrupt():
        data.entered.wait(5)
        time.sleep(0.1)  # fit is waiting on the prefetch queue by now
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        assert _interrupted_fit(data) < JOIN_TIMEOUT_S + 2
    finally:
        sender.join()
    _thread_ends_once_released(data)
