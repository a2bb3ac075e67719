"""Program-level numeric gradient checks (central differences in float64), shared by the tests
of ops whose gradients need sub-blocks or step scopes (the one-op harness in tests/ops/harness.py
covers the rest)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import nestflow as nf


def numeric_gradient(
    exe: nf.Executor,
    program: nf.Program | None,
    scope: nf.Scope,
    feed: Mapping[str, Any],
    loss: Any,
    name: str,
    eps: float = 1e-6,
) -> np.ndarray:
    """d sum(loss) / d `name` by central differences; `name` is a feed or a variable of
    `scope` (restored afterwards)."""
    feed = dict(feed)
    if name in feed:
        base = np.asarray(feed[name])

        def put(value):
            feed[name] = value
    else:
        tensor = scope.find_var(name).get(nf.Tensor)
        base = tensor.numpy().copy()
        put = tensor.set

    def loss_at(value) -> float:
        put(value)
        return float(np.sum(exe.run(program, feed=feed, fetch_list=[loss], scope=scope)[0]))

    grad = np.zeros_like(base)
    try:
        for index in np.ndindex(base.shape):
            plus, minus = base.copy(), base.copy()
            plus[index] += eps
            minus[index] -= eps
            grad[index] = (loss_at(plus) - loss_at(minus)) / (2 * eps)
    finally:
        put(base)
    return grad


def assert_gradients_match(
    exe: nf.Executor,
    program: nf.Program | None,
    scope: nf.Scope,
    feed: Mapping[str, Any],
    loss: Any,
    names: Sequence[str],
    rtol: float = 1e-6,
    atol: float = 1e-8,
) -> list[np.ndarray]:
    """The analytic gradients `name@GRAD` equal central differences for every name (feeds or
    scope variables); returns the analytic ones."""
    analytic = exe.run(program, feed=feed, fetch_list=[n + "@GRAD" for n in names], scope=scope)
    for name, got in zip(names, analytic):
        want = numeric_gradient(exe, program, scope, feed, loss, name)
        assert np.shape(got) == want.shape, name
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    return analytic
