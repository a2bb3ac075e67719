"""Issue 32 item 13: `Program.clone(for_test=True)` after minimize is an evaluation program: no
backward, optimizer or schedule op, so running it changes no persistable variable."""

from __future__ import annotations

import numpy as np

import nestflow as nf
from nestflow.framework.program import OpRole, op_role


def _build():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 3])
        y = nf.data("y", [-1, 1], "int64")
        hidden = nf.layers.dropout(nf.layers.fc(x, 4, act="relu"), 0.5)
        probs = nf.layers.fc(nf.layers.batch_norm(hidden), 2, act="softmax")
        loss = nf.layers.mean(nf.layers.cross_entropy(probs, y))
        before = main.clone(for_test=True)
        optimizer = nf.optimizer.Adam(
            nf.layers.exponential_decay(0.1, 10, 0.5),
            grad_clip=nf.clip.GradientClipByGlobalNorm(1.0),
            regularization=nf.regularizer.L2Decay(1e-3),
        )
        optimizer.minimize(loss)
    return main, startup, before, loss


def _feed():
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(4, 3)).astype("float32"), "y": rng.integers(0, 2, (4, 1))}


def _persistables(program, scope) -> dict[str, np.ndarray]:
    return {
        v.name: np.array(scope.find_var(v.name).get(nf.Tensor))
        for v in program.list_vars()
        if v.persistable and scope.find_var(v.name) is not None
    }


def _ops(program):
    return [op for block in program.blocks for op in block.ops]


def test_a_clone_for_test_after_minimize_trains_nothing():
    main, startup, before, loss = _build()
    roles = {op_role(op) for op in _ops(main)}
    assert {OpRole.BACKWARD, OpRole.OPTIMIZE, OpRole.LR_SCHED} <= roles
    test = main.clone(for_test=True)
    assert all(op_role(op) & OpRole.TRAINING == 0 for op in _ops(test))
    assert not any(op.type.endswith("_grad") or op.type == "adam" for op in _ops(test))
    # The same program as a clone made before minimize (what worked already still does).
    assert [op.type for op in _ops(test)] == [op.type for op in _ops(before)]
    for program in (test, before):
        assert all(op.attrs["is_test"] for op in _ops(program) if "is_test" in op.attrs)
    assert not any(name.endswith("@GRAD") for name in test.global_block().vars)
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    start = _persistables(main, scope)
    values = [exe.run(p, feed=_feed(), fetch_list=[loss], scope=scope)[0] for p in (test, before)]
    assert values[0] == values[1]
    after = _persistables(main, scope)
    assert start.keys() == after.keys()
    for name, value in start.items():  # parameters, moments, beta powers, step counter
        assert value.tobytes() == after[name].tobytes(), name
    exe.run(main, feed=_feed(), fetch_list=[loss], scope=scope)  # the train program still trains
    assert any(start[n].tobytes() != v.tobytes() for n, v in _persistables(main, scope).items())


def test_the_roles_survive_serialisation():
    main, _, _, _ = _build()
    again = nf.Program.from_bytes(main.to_bytes())
    assert [op.type for op in _ops(again.clone(for_test=True))] == [
        op.type for op in _ops(main.clone(for_test=True))
    ]


def test_model_evaluate_leaves_every_parameter_as_it_was():
    """The Model's eval program (a clone made before the optimizer is added) has no training
    op either, and evaluate changes nothing in the model's scope."""
    model = nf.Model(
        lambda x: nf.layers.fc(nf.layers.dropout(x, 0.5), 2, act="softmax"),
        inputs=nf.InputSpec([None, 3], name="x"),
        labels=nf.InputSpec([None, 1], "int64", "y"),
    )
    model.prepare(nf.optimizer.Adam(0.1), loss=nf.layers.cross_entropy)
    assert all(op_role(op) == OpRole.FORWARD for op in _ops(model.eval_program))
    feed = _feed()
    model.fit((feed["x"], feed["y"]), batch_size=2, verbose=0)
    start = _persistables(model.train_program, model.scope)
    model.evaluate((feed["x"], feed["y"]), batch_size=2, verbose=0)
    after = _persistables(model.train_program, model.scope)
    assert all(start[n].tobytes() == after[n].tobytes() for n in start)
