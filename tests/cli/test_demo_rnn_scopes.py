"""Issue 4 acceptance: 1,000 training steps of the RNN example (`nestflow demo --model rnn`'s
model, variable-length batches) leave the number of live scopes where it was (bench/
w7_rnn_memory.py reports the process's RSS over the same loop)."""

from __future__ import annotations

import gc

import numpy as np

import nestflow as nf
from nestflow.cli import demo_rnn
from nestflow.core.scope import live_scope_count


def test_live_scopes_do_not_grow_over_1000_steps_of_the_rnn_demo_model():
    rng = np.random.default_rng(0)
    model = demo_rnn.build_model(learning_rate=1e-2, hidden=4)
    scope, exe = nf.Scope(), nf.Executor()
    exe.run(model.startup, scope=scope)
    batches = []  # short sequences (2-5 steps) keep the 1,000 steps fast
    for steps in (2, 3, 4, 5) * 2:
        lengths = rng.integers(1, steps + 1, size=6).astype(np.int64)
        x = rng.normal(size=(6, steps, 1)).astype(np.float32)
        x[np.arange(steps)[None, :] >= lengths[:, None]] = 0.0
        label = (x.sum(axis=(1, 2)) > 0).astype(np.int64)[:, None]
        batches.append({"x": x, "lengths": lengths, "label": label})
    fetch = [model.loss]
    exe.run(model.main, feed=batches[0], fetch_list=fetch, scope=scope)
    gc.collect()
    before = live_scope_count()
    losses = []
    for step in range(1000):
        batch = batches[step % len(batches)]
        losses.append(float(exe.run(model.main, feed=batch, fetch_list=fetch, scope=scope)[0]))
    gc.collect()
    assert live_scope_count() == before
    assert scope.kids == []
    assert np.mean(losses[-8:]) < np.mean(losses[:8])  # it did train
