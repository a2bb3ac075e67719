"""nf.Model's friendlier feeds (issue 33, item 3): labels of shape [N] where [N, 1] is declared
train and evaluate exactly as the column would; fit/evaluate/predict before prepare name the
caller's line."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import FeedError, UninitializedError


def _data(rows=40):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")  # labels of shape [N]


def _model():
    nf.seed(0)
    model = nf.Model(
        lambda x: nf.layers.fc(x, 2, act="softmax"),
        inputs=nf.InputSpec([None, 4], "float32", "x"),
        labels=nf.InputSpec([None, 1], "int64", "label"),
    )
    model.prepare(nf.optimizer.Adam(1e-2), nf.layers.cross_entropy, nf.metric.Accuracy())
    return model


def test_labels_of_shape_n_train_and_evaluate_as_the_column():
    x, y = _data()
    flat, column = _model(), _model()
    logs = flat.fit((x, y), eval_data=(x, y), batch_size=8, epochs=3, verbose=0)
    want = column.fit((x, y[:, None]), eval_data=(x, y[:, None]), batch_size=8, epochs=3, verbose=0)
    assert logs == want
    assert flat.evaluate((x, y), batch_size=8, verbose=0) == column.evaluate(
        (x, y[:, None]), batch_size=8, verbose=0
    )


def test_a_batch_dict_and_a_list_of_labels_too():
    x, y = _data(8)
    model = _model()
    model.fit(iter([{"x": x, "label": y}]), epochs=1, verbose=0)  # batches as they come
    model.fit(iter([(x, y.tolist())]), epochs=1, verbose=0)


def test_labels_of_another_shape_are_still_a_feed_error():
    x, y = _data(8)
    with pytest.raises(FeedError, match=r"feed 'label' has shape \[4, 2\]"):
        _model().fit((x, np.stack([y, y], 1)), batch_size=4, verbose=0)


def test_fit_evaluate_predict_before_prepare_name_the_callers_line():
    model = nf.Model(lambda x: nf.layers.fc(x, 2), nf.InputSpec([None, 3]))
    data = np.zeros((4, 3), "float32")
    for call in ("fit", "evaluate", "predict"):
        line = inspect.currentframe().f_lineno + 2
        with pytest.raises(UninitializedError) as info:
            getattr(model, call)((data,))
        message = str(info.value)
        assert f"Model.{call} at {__file__}:{line} in " in message, message
        assert "prepare(" in message
    model.prepare()
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(UninitializedError, match=rf"Model.fit at .*test_model_feeds.py:{line} in "):
        model.fit((data,))
