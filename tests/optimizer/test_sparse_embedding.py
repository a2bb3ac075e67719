"""Sparse embedding gradients (issue 31): embedding(is_sparse=True) gives the table a
SelectedRows gradient (ids x dim memory), and training with it equals dense training."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.core.place import StandInPlace
from nestflow.errors import AttrError, ShapeError
from nestflow.io.params import read_params

VOCAB, DIM = 50, 4


def _build(is_sparse, optimizer, shared=True, regularization=None, grad_clip=None):
    """ids -> embedding (used twice when `shared`, so its gradients are summed) -> fc -> loss."""
    main, startup = nf.Program(), nf.Program()
    main.random_seed = startup.random_seed = 7
    with nf.program_guard(main, startup):
        ids = nf.data("ids", [-1, 3], "int64")
        other = nf.data("other", [-1, 2], "int64")
        y = nf.data("y", [-1, 1], "float64")
        attr = nf.ParamAttr(name="table")
        emb = nf.layers.embedding(ids, [VOCAB, DIM], is_sparse, param_attr=attr, dtype="float64")
        feats = nf.layers.reshape(emb, [-1, 3 * DIM])
        if shared:
            emb2 = nf.layers.embedding(
                other, [VOCAB, DIM], is_sparse, param_attr=attr, dtype="float64"
            )
            feats = nf.layers.concat([feats, nf.layers.reshape(emb2, [-1, 2 * DIM])], axis=1)
        pred = nf.layers.fc(feats, 1, param_attr=nf.ParamAttr(name="fc.w"), bias_attr=False)
        loss = nf.layers.mean(nf.layers.square_error_cost(pred, y))
        opt = optimizer(regularization=regularization, grad_clip=grad_clip)
        _, params_grads = opt.minimize(loss)
    return main, startup, loss, params_grads


def _batches(steps, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        # a few ids only, some repeated, so most rows get no gradient
        yield {
            "ids": rng.integers(0, 12, (5, 3)),
            "other": rng.integers(5, 15, (5, 2)),
            "y": rng.normal(size=(5, 1)),
        }


def _train(is_sparse, optimizer, steps=6, place=None, **options):
    main, startup, loss, _ = _build(is_sparse, optimizer, **options)
    scope = nf.Scope()
    exe = nf.Executor(place or nf.CPUPlace())
    exe.run(startup, scope=scope)
    for feed in _batches(steps):
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    return {
        n: np.asarray(scope.find_var(n).get(nf.Tensor).numpy()) for n in ("table", "fc.w")
    }, scope


OPTIMIZERS = {
    "sgd": lambda **kw: nf.optimizer.SGD(0.3, **kw),
    "adam": lambda **kw: nf.optimizer.Adam(0.05, **kw),
    "adagrad": lambda **kw: nf.optimizer.Adagrad(0.2, **kw),
    "momentum": lambda **kw: nf.optimizer.Momentum(0.1, momentum=0.9, **kw),
    "rmsprop": lambda **kw: nf.optimizer.RMSProp(0.01, **kw),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_sparse_training_equals_dense(name):
    dense, _ = _train(False, OPTIMIZERS[name])
    sparse, _ = _train(True, OPTIMIZERS[name])
    for key in dense:
        np.testing.assert_allclose(sparse[key], dense[key], rtol=0, atol=1e-12)
    assert not np.allclose(
        dense["table"][:15], _train(False, OPTIMIZERS[name], steps=0)[0]["table"][:15]
    )


@pytest.mark.parametrize(
    "regularization", [nf.regularizer.L2Decay(0.01), nf.regularizer.L1Decay(0.01)], ids=repr
)
def test_sparse_sgd_regularized_decays_only_the_rows_present(regularization):
    """Fluid's rule: the decay term is looked up by the gradient's rows (one per occurrence),
    so rows without a gradient keep their value."""
    opt = OPTIMIZERS["sgd"]
    start, _ = _train(True, opt, steps=0, shared=False)
    one_step, _ = _train(True, opt, steps=1, shared=False, regularization=regularization)
    feed = next(_batches(1))
    ids = feed["ids"].ravel()
    untouched = np.setdiff1d(np.arange(VOCAB), ids)
    np.testing.assert_array_equal(one_step["table"][untouched], start["table"][untouched])
    # the rows present: the data gradient plus the term once per occurrence
    dense_grad = _dense_table_grad(feed, start)
    table = start["table"]
    counts = np.bincount(ids, minlength=VOCAB)[:, None]
    term = np.sign(table) if regularization.l1 else table
    expect = table - 0.3 * (dense_grad + counts * 0.01 * term)
    np.testing.assert_allclose(one_step["table"], expect, rtol=0, atol=1e-12)


def _dense_table_grad(feed, params):
    """The gradient of the one-embedding model's loss with respect to the table, by hand."""
    ids, y = feed["ids"], feed["y"]
    feats = params["table"][ids].reshape(len(ids), -1)
    pred = feats @ params["fc.w"]
    d_pred = 2 * (pred - y) / len(ids)
    d_feats = (d_pred @ params["fc.w"].T).reshape(len(ids), 3, DIM)
    grad = np.zeros_like(params["table"])
    np.add.at(grad, ids.ravel(), d_feats.reshape(-1, DIM))
    return grad


def test_sparse_global_norm_clip_equals_dense():
    clip = nf.clip.GradientClipByGlobalNorm(0.05)
    dense, _ = _train(False, OPTIMIZERS["sgd"], grad_clip=clip)
    sparse, _ = _train(True, OPTIMIZERS["sgd"], grad_clip=clip)
    for key in dense:
        np.testing.assert_allclose(sparse[key], dense[key], rtol=0, atol=1e-12)


def test_lazy_adam_updates_only_the_rows_present():
    """lazy_mode (Fluid's): the rows of the gradient get Adam's step, every other row and its
    moments stay; checked against a NumPy lazy Adam over the dense gradients."""
    lazy = lambda **kw: nf.optimizer.Adam(0.05, lazy_mode=True, **kw)  # noqa: E731
    start, _ = _train(True, lazy, steps=0, shared=False)
    lr, b1, b2, eps = 0.05, 0.9, 0.999, 1e-8
    table, w = start["table"].copy(), start["fc.w"].copy()
    m, v = np.zeros_like(table), np.zeros_like(table)
    mw, vw = np.zeros_like(w), np.zeros_like(w)
    for t, feed in enumerate(_batches(4), start=1):
        grad = _dense_table_grad(feed, {"table": table, "fc.w": w})
        ids = feed["ids"]
        feats = table[ids].reshape(len(ids), -1)
        d_pred = 2 * (feats @ w - feed["y"]) / len(ids)
        grad_w = feats.T @ d_pred
        rows = np.unique(ids)
        m[rows] = b1 * m[rows] + (1 - b1) * grad[rows]
        v[rows] = b2 * v[rows] + (1 - b2) * grad[rows] ** 2
        denom = np.sqrt(v[rows]) / np.sqrt(1 - b2**t) + eps
        table[rows] -= lr / (1 - b1**t) * m[rows] / denom
        mw = b1 * mw + (1 - b1) * grad_w
        vw = b2 * vw + (1 - b2) * grad_w**2
        w -= lr / (1 - b1**t) * mw / (np.sqrt(vw) / np.sqrt(1 - b2**t) + eps)
    trained, scope = _train(True, lazy, steps=4, shared=False)
    np.testing.assert_allclose(trained["table"], table, rtol=0, atol=1e-12)
    np.testing.assert_allclose(trained["fc.w"], w, rtol=0, atol=1e-12)
    untouched = np.setdiff1d(np.arange(VOCAB), np.arange(12))
    np.testing.assert_array_equal(trained["table"][untouched], start["table"][untouched])
    dense, _ = _train(False, lazy, steps=4, shared=False)  # dense grads: lazy_mode is moot
    assert not np.allclose(dense["table"], trained["table"])


def test_gradient_is_selected_rows_of_ids_by_dim():
    """The table's gradient holds ids x dim values, never the 100,000-row table."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        ids = nf.data("ids", [-1, 1], "int64")
        emb = nf.layers.embedding(ids, [100_000, 16], is_sparse=True)
        loss = nf.layers.mean(nf.layers.fc(emb, 1))
        params_grads = nf.append_backward(loss)
    (grad,) = [g for p, g in params_grads if p.name == emb.block.ops[0].input("W")[0]]
    assert grad.type == "selected_rows"
    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    exe.run(startup, scope=scope)
    feed = {"ids": np.array([[5], [99_999], [5], [7]])}
    (value,) = exe.run(main, feed=feed, fetch_list=[grad], scope=scope)
    assert isinstance(value, nf.SelectedRows)
    assert value.rows.tolist() == [5, 99_999, 5, 7]
    assert value.values.shape == (4, 16) and value.height == 100_000
    assert value.nbytes == 4 * 8 + 4 * 16 * 4  # rows x dim, not 100,000 x 16 x 4 bytes
    dense = value.to_dense()
    assert dense.shape == (100_000, 16)
    np.testing.assert_allclose(dense[5], 2 * value.values[0])


def test_saving_never_stores_the_selected_rows(tmp_path):
    main, startup, loss, params_grads = _build(True, OPTIMIZERS["sgd"])
    scope = nf.Scope()
    exe = nf.Executor(nf.CPUPlace())
    exe.run(startup, scope=scope)
    grad = next(g for p, g in params_grads if p.name == "table")
    exe.run(main, feed=next(_batches(1)), fetch_list=[loss], scope=scope)
    assert isinstance(
        exe.run(main, feed=next(_batches(1)), fetch_list=[grad], scope=scope)[0], nf.SelectedRows
    )
    nf.io.save_params(scope, main, tmp_path / "params.safetensors")
    saved = read_params(tmp_path / "params.safetensors")
    assert "table" in saved and not any("@GRAD" in name for name in saved)
    assert all(type(v) is np.ndarray for v in saved.values())
    assert grad.name not in {v.name for v in nf.io.persistable_vars(main)}


def test_sparse_training_on_the_standin_place():
    """The sparse kernels are written against xp: the stand-in device refuses host arrays."""
    dense, _ = _train(False, OPTIMIZERS["adam"], steps=3)
    sparse, _ = _train(True, OPTIMIZERS["adam"], steps=3, place=StandInPlace(0))
    np.testing.assert_allclose(sparse["table"], dense["table"], rtol=0, atol=1e-12)
    lazy = lambda **kw: nf.optimizer.Adam(0.05, lazy_mode=True, **kw)  # noqa: E731
    host, _ = _train(True, lazy, steps=3)
    stand_in, _ = _train(True, lazy, steps=3, place=StandInPlace(0))
    np.testing.assert_allclose(stand_in["table"], host["table"], rtol=0, atol=1e-12)


def test_selected_rows_checks_its_arguments():
    with pytest.raises(ShapeError, match="one row per row index"):
        nf.SelectedRows([1, 2], np.ones((3, 2)), height=4)
    with pytest.raises(ShapeError, match=r"rows must lie in \[0, 4\)"):
        nf.SelectedRows([1, 4], np.ones((2, 2)), height=4)


def test_is_distributed_is_refused_with_the_reason():
    ids = nf.data("ids", [-1, 1], "int64")
    with pytest.raises(AttrError, match="parameter server"):
        nf.layers.embedding(ids, [10, 2], is_distributed=True)
