"""`nestflow demo --model rnn`: the sequence-sum sign RNN (reduced sizes to stay fast)."""

from __future__ import annotations

import numpy as np

import nestflow as nf
from nestflow.cli import demo_rnn


def test_sequences_have_variable_lengths_zero_padding_and_sum_sign_labels():
    data = demo_rnn.make_sequences(200, np.random.default_rng(0))
    assert data.x.shape == (200, demo_rnn.MAX_LENGTH, 1)
    assert data.lengths.min() >= demo_rnn.MIN_LENGTH and data.lengths.max() <= demo_rnn.MAX_LENGTH
    assert len(set(data.lengths.tolist())) > 5
    padding = np.arange(demo_rnn.MAX_LENGTH)[None, :] >= data.lengths[:, None]
    assert not data.x[padding].any()
    np.testing.assert_array_equal(data.labels.ravel(), data.x.sum(axis=(1, 2)) > 0)


def test_training_lowers_the_loss_and_beats_chance():
    rng = np.random.default_rng(3)
    train, test = demo_rnn.make_sequences(640, rng), demo_rnn.make_sequences(300, rng)
    model = demo_rnn.build_model(learning_rate=1e-2, hidden=8)
    scope = nf.Scope()
    history = demo_rnn.train(model, train, scope, epochs=3, progress=False)
    assert history[-1] < 0.7 * history[0]
    feed = demo_rnn._feed(test, slice(None))
    (probabilities,) = nf.Executor().eval(
        model.main,
        [model.probabilities],
        feed={"x": feed["x"], "lengths": feed["lengths"]},
        scope=scope,
    )
    accuracy = float((probabilities.argmax(axis=1) == test.labels.ravel()).mean())
    assert accuracy > 0.8
    assert scope.kids == []
