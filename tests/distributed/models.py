"""Models the distributed tests train on several MPI ranks and, for reference, in one process on
the concatenated batches: an MLP, a per-row IfElse, an RNN over sequences with lengths and a
While loop applying one weight three times, in float64, each with another optimizer (and clip, regularization) so that their state and the
gradient transforms after averaging are exercised too.

Imported by the MPI worker (tests/distributed/worker.py, as `models`) and by the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import nestflow as nf

L = nf.layers
STEPS = 20
MODELS = ("mlp", "ifelse", "rnn", "while")
T, FEATURES = 5, 3


@dataclass
class Built:
    main: nf.Program
    startup: nf.Program
    loss: nf.VarDesc
    optimizer: object
    batch: Callable[[int, int], dict[str, np.ndarray]]  # (step, rows) -> the global batch


def _mlp():
    x = nf.data("x", [-1, 6], "float64")
    y = nf.data("y", [-1, 1], "int64")
    h = L.fc(x, 8, act="tanh", name="mlp.h")
    p = L.fc(h, 3, act="softmax", name="mlp.p")
    loss = L.mean(L.cross_entropy(p, y))

    def batch(step: int, rows: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(100 + step)
        return {"x": rng.normal(size=(rows, 6)), "y": rng.integers(0, 3, size=(rows, 1))}

    return loss, nf.optimizer.SGD(0.5), batch


def _ifelse():
    x = nf.data("x", [-1, 4], "float64")
    y = nf.data("y", [-1, 1], "float64")
    cond = L.greater_than(L.slice(x, axes=[1], starts=[0], ends=[1]), 0.0)
    ie = nf.ifelse(cond)
    with ie.true_block():
        ie.output(L.fc(x, 5, act="tanh", name="ie.a"))
    with ie.false_block():
        ie.output(L.fc(x, 5, act="sigmoid", name="ie.b"))
    (merged,) = ie()
    pred = L.fc(merged, 1, name="ie.p")
    loss = L.mean(L.square(pred - y))
    clip = nf.clip.GradientClipByGlobalNorm(0.5)

    def batch(step: int, rows: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(200 + step)
        return {"x": rng.normal(size=(rows, 4)), "y": rng.normal(size=(rows, 1))}

    return loss, nf.optimizer.Adam(0.05, grad_clip=clip), batch


def _rnn():
    x = nf.data("x", [-1, T, FEATURES], "float64")
    lengths = nf.data("lengths", [-1], "int64")
    y = nf.data("y", [-1, 2], "float64")
    rnn = nf.rnn()
    with rnn.step():
        xt = rnn.step_input(x, lengths=lengths)
        h = rnn.memory(shape=[4], value=0.0, batch_ref=x, dtype="float64")
        z = L.fc(xt, 4, name="rnn.in") + L.fc(
            rnn.previous_memory(h), 4, bias_attr=False, name="rnn.rec"
        )
        new = L.tanh(z)
        rnn.update_memory(h, new)
        rnn.output(new)
    rnn()
    pred = L.fc(rnn.final_memory(h), 2, name="rnn.p")
    loss = L.mean(L.square(pred - y))
    optimizer = nf.optimizer.Momentum(0.2, 0.9, regularization=nf.regularizer.L2Decay(1e-3))

    def batch(step: int, rows: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(300 + step)
        return {
            "x": rng.normal(size=(rows, T, FEATURES)),
            "lengths": rng.integers(1, T + 1, size=rows),
            "y": rng.normal(size=(rows, 2)),
        }

    return loss, optimizer, batch


def _while():
    x = nf.data("x", [-1, 3], "float64")
    y = nf.data("y", [-1, 3], "float64")
    h = L.fc(x, 3, act="tanh", name="wl.in")
    w = L.create_parameter([3, 3], "float64", name="wl.w", initializer=nf.initializer.Uniform())
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 3)
    cond = L.less_than(i, n)
    loop = nf.While(cond)
    with loop.block():  # h = tanh(h @ w), three times, with the same w
        L.assign(L.tanh(L.matmul(h, w)), output=h)
        L.increment(i)
        L.less_than(i, n, out=cond)
    loss = L.mean(L.square(h - y))

    def batch(step: int, rows: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(400 + step)
        return {"x": rng.normal(size=(rows, 3)), "y": rng.uniform(-0.5, 0.5, size=(rows, 3))}

    return loss, nf.optimizer.Adagrad(0.3), batch


BUILDERS = {"mlp": _mlp, "ifelse": _ifelse, "rnn": _rnn, "while": _while}


def build(
    model: str,
    distributed: bool,
    batch_var: str | None = None,
    bucket_size_mb: float = 0.00005,
) -> Built:
    """The model's programs: with `distributed`, its optimizer wrapped in a
    DistributedOptimizer (weighting by `batch_var`'s rows when given); names from 0."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        loss, optimizer, batch = BUILDERS[model]()
        if distributed:
            optimizer = nf.distributed.DistributedOptimizer(
                optimizer, bucket_size_mb=bucket_size_mb, batch_var=batch_var
            )
        optimizer.minimize(loss)
    return Built(main, startup, loss, optimizer, batch)


def shard(feed: dict[str, np.ndarray], sizes: list[int], rank: int) -> dict[str, np.ndarray]:
    """Rank `rank`'s rows of a global batch cut into consecutive shards of `sizes` rows."""
    start = sum(sizes[:rank])
    return {k: v[start : start + sizes[rank]] for k, v in feed.items()}


def parameters(built: Built, scope: nf.Scope) -> dict[str, np.ndarray]:
    return {
        p.name: np.array(scope.find_var(p.name).get(nf.Tensor).numpy())
        for p in built.main.all_parameters()
    }


def train_reference(model: str, initial: dict[str, np.ndarray], rows: int) -> dict:
    """One process, the plain optimizer, the concatenated batches of `rows` rows, from the
    parameters `initial`: the parameters after STEPS steps."""
    built = build(model, distributed=False)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(built.startup, scope=scope)
    for name, value in initial.items():
        scope.find_var(name).get_mutable(nf.Tensor).set(value.copy())
    for step in range(STEPS):
        exe.run(built.main, feed=built.batch(step, rows), fetch_list=[built.loss], scope=scope)
    return parameters(built, scope)
