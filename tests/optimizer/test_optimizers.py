"""nf.optimizer SGD / Momentum (Nesterov) / Adam against torch.optim on the same model and data;
optimizer state in the scope; atomic steps; learning rate held in a variable."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import ExecutionError

torch = pytest.importorskip("torch")

L = nf.layers
SHAPES = {"fc1.w": (4, 3), "fc1.b": (3,), "fc2.w": (3, 2), "fc2.b": (2,)}


def _build(opt):
    """tanh MLP regression (float64): loss = mean((fc2(tanh(fc1(x))) - y)^2)."""
    x = L.data("x", [-1, 4], "float64")
    y = L.data("y", [-1, 2], "float64")
    out = L.fc(L.fc(x, 3, act="tanh", name="fc1"), 2, name="fc2")
    loss = L.mean(L.square(L.elementwise_sub(out, y)))
    ops, params_grads = opt.minimize(loss)
    return loss, ops, params_grads


def _start(init):
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    for name, value in init.items():
        scope.find_var(name).get(nf.Tensor).set(value)
    return scope


def _value(scope, name):
    return scope.find_var(name).get(nf.Tensor).numpy()


class _TorchModel:
    def __init__(self, init, make_opt):
        self.params = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
        self.opt = make_opt(list(self.params.values()))

    def step(self, xs, ys):
        p = self.params
        h = torch.tanh(torch.tensor(xs) @ p["fc1.w"] + p["fc1.b"])
        loss = ((h @ p["fc2.w"] + p["fc2.b"] - torch.tensor(ys)) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()


def _batches(rng, steps):
    return [(rng.normal(size=(8, 4)), rng.normal(size=(8, 2))) for _ in range(steps)]


def _init(rng):
    return {n: rng.normal(scale=0.5, size=s) for n, s in SHAPES.items()}


CASES = {
    "sgd": (
        lambda: nf.optimizer.SGD(0.1),
        lambda ps: torch.optim.SGD(ps, lr=0.1),
    ),
    "sgd-wd": (
        lambda: nf.optimizer.SGD(0.1, weight_decay=0.05),
        lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.05),
    ),
    "momentum": (
        lambda: nf.optimizer.Momentum(0.05, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    ),
    "nesterov": (
        lambda: nf.optimizer.Momentum(0.05, momentum=0.8, use_nesterov=True),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
    ),
    "nesterov-wd": (
        lambda: nf.optimizer.Momentum(0.05, momentum=0.8, use_nesterov=True, weight_decay=0.1),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
    ),
    "adam": (
        lambda: nf.optimizer.Adam(0.01),
        lambda ps: torch.optim.Adam(ps, lr=0.01),
    ),
    "adam-custom": (
        lambda: nf.optimizer.Adam(0.02, beta1=0.8, beta2=0.99, epsilon=1e-6),
        lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6),
    ),
    "adam-wd": (
        lambda: nf.optimizer.Adam(0.01, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_twenty_steps_match_torch(case, rng):
    make_nf, make_torch = CASES[case]
    loss, ops, params_grads = _build(make_nf())
    assert len(ops) == 4 and {p.name for p, _ in params_grads} == set(SHAPES)
    init = _init(rng)
    scope = _start(init)
    model = _TorchModel(init, make_torch)
    exe = nf.Executor()
    for xs, ys in _batches(rng, 20):
        (got,) = exe.run(feed={"x": xs, "y": ys}, fetch_list=[loss], scope=scope)
        np.testing.assert_allclose(got, model.step(xs, ys), rtol=1e-10)
    for name in SHAPES:
        ref = model.params[name].detach().numpy()
        assert not np.allclose(ref, init[name])  # the parameters did move
        np.testing.assert_allclose(_value(scope, name), ref, rtol=1e-5, atol=1e-8, err_msg=name)


def test_adam_state_persists_in_the_scope_and_matches_torch(rng):
    _build(nf.optimizer.Adam(0.01))
    init = _init(rng)
    scope = _start(init)
    model = _TorchModel(init, lambda ps: torch.optim.Adam(ps, lr=0.01))
    exe = nf.Executor()
    for step, (xs, ys) in enumerate(_batches(rng, 3), start=1):
        exe.run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
        for name in SHAPES:
            state = model.opt.state[model.params[name]]
            m1 = _value(scope, f"adam_0.{name}.moment1")
            np.testing.assert_allclose(m1, state["exp_avg"].numpy(), rtol=1e-8)
            m2 = _value(scope, f"adam_0.{name}.moment2")
            np.testing.assert_allclose(m2, state["exp_avg_sq"].numpy(), rtol=1e-8)
            # The beta powers are ready for the next step: beta^(t+1).
            np.testing.assert_allclose(
                _value(scope, f"adam_0.{name}.beta1_pow"), [0.9 ** (step + 1)]
            )
            np.testing.assert_allclose(
                _value(scope, f"adam_0.{name}.beta2_pow"), [0.999 ** (step + 1)]
            )


def test_state_is_persistable_and_initialised_by_the_startup_program():
    opt = nf.optimizer.Momentum(0.1)
    _build(opt)
    main = nf.default_main_program().global_block()
    startup = nf.default_startup_program().global_block()
    names = ["momentum_0.learning_rate"] + [f"momentum_0.{n}.velocity" for n in SHAPES]
    inits = {op.output("Out")[0]: op for op in startup.ops if op.type == "fill_constant"}
    for name in names:
        assert main.var(name).persistable and startup.var(name).persistable
        assert name in inits
    assert inits["momentum_0.learning_rate"].attrs["value"] == pytest.approx(0.1)
    assert opt.learning_rate_var.name == "momentum_0.learning_rate"
    # Update ops come after every gradient op.
    types = [op.type for op in main.ops]
    assert max(i for i, t in enumerate(types) if t.endswith("_grad")) < types.index("momentum")


def test_explicit_startup_program_receives_the_state_initialisers():
    other = nf.Program()
    x = L.data("x", [-1, 2], "float64")
    loss = L.mean(L.fc(x, 1, name="fc"))
    nf.optimizer.Adam(0.1).minimize(loss, startup_program=other)
    made = {n for op in other.global_block().ops for n in op.output_names()}
    assert "adam_0.learning_rate" in made and "adam_0.fc.w.moment1" in made
    default_made = {
        n for op in nf.default_startup_program().global_block().ops for n in op.output_names()
    }
    assert "adam_0.learning_rate" not in default_made


@pytest.mark.parametrize("case", ["sgd", "momentum", "adam"])
def test_a_failed_run_leaves_parameters_and_state_unchanged(case, rng):
    """The update ops run, then an op after them fails: nothing reaches the scope."""
    make_nf, make_torch = CASES[case]
    loss, _, _ = _build(make_nf())
    # An op after the updates that fails for mismatched batch sizes.
    z = L.data("z", [-1, 2], "float64")
    late = L.elementwise_add(L.data("y", [-1, 2], "float64"), z)
    init = _init(rng)
    scope = _start(init)
    model = _TorchModel(init, make_torch)
    exe = nf.Executor()
    (xs, ys), (xs2, ys2) = _batches(rng, 2)
    exe.run(feed={"x": xs, "y": ys, "z": ys}, fetch_list=[late], scope=scope)
    model.step(xs, ys)
    persistables = [v.name for v in nf.default_main_program().list_vars() if v.persistable]
    before = {n: _value(scope, n) for n in persistables}
    assert len(before) > 4 or case == "sgd"
    with pytest.raises(ExecutionError, match="elementwise_add"):
        exe.run(feed={"x": xs2, "y": ys2, "z": ys2[:3]}, fetch_list=[late], scope=scope)
    for name, value in before.items():
        np.testing.assert_array_equal(_value(scope, name), value, err_msg=name)
    # Training goes on from the unchanged state exactly as if the failed run never happened.
    exe.run(feed={"x": xs2, "y": ys2, "z": ys2}, fetch_list=[late], scope=scope)
    model.step(xs2, ys2)
    for name in SHAPES:
        ref = model.params[name].detach().numpy()
        np.testing.assert_allclose(_value(scope, name), ref, rtol=1e-10, err_msg=name)


def test_learning_rate_variable_changes_between_steps(rng):
    opt = nf.optimizer.SGD(0.1)
    _build(opt)
    init = _init(rng)
    scope = _start(init)
    model = _TorchModel(init, lambda ps: torch.optim.SGD(ps, lr=0.1))
    exe = nf.Executor()
    for step, (xs, ys) in enumerate(_batches(rng, 4)):
        if step == 2:
            opt.set_learning_rate(0.02, scope)
            for group in model.opt.param_groups:
                group["lr"] = 0.02
        exe.run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
    np.testing.assert_allclose(_value(scope, "sgd_0.learning_rate"), [0.02])
    for name in SHAPES:
        ref = model.params[name].detach().numpy()
        np.testing.assert_allclose(_value(scope, name), ref, rtol=1e-10, err_msg=name)


def test_float32_adam_tracks_torch(rng):
    x = L.data("x", [-1, 3], "float32")
    loss = L.mean(L.square(L.fc(x, 1, name="fc")))
    nf.optimizer.Adam(0.05).minimize(loss)
    init = {"fc.w": rng.normal(size=(3, 1)).astype("float32"), "fc.b": np.ones(1, "float32")}
    scope = _start(init)
    assert _value(scope, "adam_0.learning_rate").dtype == np.float32
    params = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
    opt = torch.optim.Adam(list(params.values()), lr=0.05)
    for _ in range(20):
        xs = rng.normal(size=(6, 3)).astype("float32")
        nf.Executor().run(feed={"x": xs}, scope=scope)
        out = torch.tensor(xs) @ params["fc.w"] + params["fc.b"]
        opt.zero_grad()
        (out**2).mean().backward()
        opt.step()
    for name, p in params.items():
        assert _value(scope, name).dtype == np.float32
        np.testing.assert_allclose(_value(scope, name), p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_bad_optimizer_arguments_are_rejected():
    with pytest.raises(nf.errors.NestflowError, match="learning_rate"):
        nf.optimizer.SGD(-1.0)
    with pytest.raises(nf.errors.NestflowError, match="weight_decay"):
        nf.optimizer.Adam(0.1, weight_decay="l2")


def test_update_ops_check_shapes_at_build_time():
    block = nf.default_main_program().global_block()
    p = block.create_parameter("p", [2, 3], "float64")
    g = block.create_var("g", [3, 2], "float64")
    lr = block.create_var("lr", [1], "float64", persistable=True)
    with pytest.raises(nf.errors.ShapeError, match="Grad"):
        block.append_op("sgd", {"Param": [p], "Grad": [g], "LearningRate": [lr]}, {"ParamOut": [p]})
    bad_lr = block.create_var("lr2", [2], "float64")
    with pytest.raises(nf.errors.ShapeError, match="LearningRate"):
        block.append_op(
            "sgd", {"Param": [p], "Grad": [p], "LearningRate": [bad_lr]}, {"ParamOut": [p]}
        )
