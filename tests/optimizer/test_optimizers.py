"""nf.optimizer state and behaviour around the update ops: state in the scope, persistable and
initialised by the startup program, atomic steps, the learning rate held in a variable, bad
arguments. (Update rules against torch.optim: test_optimizers_torch.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import ExecutionError
from tests.optimizer.mlp import SHAPES, TorchModel, batches, build, init_params, start, value

torch = pytest.importorskip("torch")

L = nf.layers
CASES = {
    "sgd": (lambda: nf.optimizer.SGD(0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "momentum": (
        lambda: nf.optimizer.Momentum(0.05, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    ),
    "adam": (lambda: nf.optimizer.Adam(0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)),
}


def test_adam_state_persists_in_the_scope_and_matches_torch(rng):
    build(nf.optimizer.Adam(0.01))
    init = init_params(rng)
    scope = start(init)
    model = TorchModel(init, lambda ps: torch.optim.Adam(ps, lr=0.01))
    exe = nf.Executor()
    for step, (xs, ys) in enumerate(batches(rng, 3), start=1):
        exe.run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
        for name in SHAPES:
            state = model.opt.state[model.params[name]]
            m1 = value(scope, f"adam_0.{name}.moment1")
            np.testing.assert_allclose(m1, state["exp_avg"].numpy(), rtol=1e-8)
            m2 = value(scope, f"adam_0.{name}.moment2")
            np.testing.assert_allclose(m2, state["exp_avg_sq"].numpy(), rtol=1e-8)
            # The beta powers are ready for the next step: beta^(t+1).
            np.testing.assert_allclose(
                value(scope, f"adam_0.{name}.beta1_pow"), [0.9 ** (step + 1)]
            )
            np.testing.assert_allclose(
                value(scope, f"adam_0.{name}.beta2_pow"), [0.999 ** (step + 1)]
            )


def test_state_is_persistable_and_initialised_by_the_startup_program():
    opt = nf.optimizer.Momentum(0.1)
    build(opt)
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
    loss, _, _ = build(make_nf())
    # An op after the updates that fails for mismatched batch sizes.
    z = L.data("z", [-1, 2], "float64")
    late = L.elementwise_add(L.data("y", [-1, 2], "float64"), z)
    init = init_params(rng)
    scope = start(init)
    model = TorchModel(init, make_torch)
    exe = nf.Executor()
    (xs, ys), (xs2, ys2) = batches(rng, 2)
    exe.run(feed={"x": xs, "y": ys, "z": ys}, fetch_list=[late], scope=scope)
    model.step(xs, ys)
    persistables = [v.name for v in nf.default_main_program().list_vars() if v.persistable]
    before = {n: value(scope, n) for n in persistables}
    assert len(before) > 4 or case == "sgd"
    with pytest.raises(ExecutionError, match="elementwise_add"):
        exe.run(feed={"x": xs2, "y": ys2, "z": ys2[:3]}, fetch_list=[late], scope=scope)
    for name, kept in before.items():
        np.testing.assert_array_equal(value(scope, name), kept, err_msg=name)
    # Training goes on from the unchanged state exactly as if the failed run never happened.
    exe.run(feed={"x": xs2, "y": ys2, "z": ys2}, fetch_list=[late], scope=scope)
    model.step(xs2, ys2)
    for name in SHAPES:
        ref = model.numpy(name)
        np.testing.assert_allclose(value(scope, name), ref, rtol=1e-10, err_msg=name)


def test_learning_rate_variable_changes_between_steps(rng):
    opt = nf.optimizer.SGD(0.1)
    build(opt)
    init = init_params(rng)
    scope = start(init)
    model = TorchModel(init, lambda ps: torch.optim.SGD(ps, lr=0.1))
    exe = nf.Executor()
    for step, (xs, ys) in enumerate(batches(rng, 4)):
        if step == 2:
            opt.set_learning_rate(0.02, scope)
            for group in model.opt.param_groups:
                group["lr"] = 0.02
        exe.run(feed={"x": xs, "y": ys}, scope=scope)
        model.step(xs, ys)
    np.testing.assert_allclose(value(scope, "sgd_0.learning_rate"), [0.02])
    for name in SHAPES:
        ref = model.numpy(name)
        np.testing.assert_allclose(value(scope, name), ref, rtol=1e-10, err_msg=name)


def test_float32_adam_tracks_torch(rng):
    x = L.data("x", [-1, 3], "float32")
    loss = L.mean(L.square(L.fc(x, 1, name="fc")))
    nf.optimizer.Adam(0.05).minimize(loss)
    init = {"fc.w": rng.normal(size=(3, 1)).astype("float32"), "fc.b": np.ones(1, "float32")}
    scope = start(init)
    assert value(scope, "adam_0.learning_rate").dtype == np.float32
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
        assert value(scope, name).dtype == np.float32
        np.testing.assert_allclose(value(scope, name), p.detach().numpy(), rtol=1e-5, atol=1e-6)


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


ALL = {
    "SGD": {},
    "Momentum": {"momentum": 0.9, "use_nesterov": True},
    "Adagrad": {"initial_accumulator_value": 0.1},
    "Adam": {},
    "Adamax": {},
    "RMSProp": {"momentum": 0.5, "centered": True},
    "Adadelta": {},
    "AdamW": {},
    "Lamb": {},
}
STATE = {
    "SGD": [],
    "Momentum": ["velocity"],
    "Adagrad": ["moment"],
    "Adam": ["moment1", "moment2", "beta1_pow", "beta2_pow"],
    "Adamax": ["moment", "inf_norm", "beta1_pow"],
    "RMSProp": ["mean_square", "moment", "mean_grad"],
    "Adadelta": ["avg_squared_grad", "avg_squared_update"],
    "AdamW": ["moment1", "moment2", "beta1_pow", "beta2_pow"],
    "Lamb": ["moment1", "moment2", "beta1_pow", "beta2_pow"],
}


@pytest.mark.parametrize("kind", list(ALL))
def test_state_is_persistable_listed_and_initialised_by_the_startup_program(kind):
    opt = getattr(nf.optimizer, kind)(0.01, **ALL[kind])
    _, ops, _ = build(opt)
    prefix = f"{kind.lower()}_0"
    names = [f"{prefix}.learning_rate"] + [
        f"{prefix}.{p}.{what}" for p in SHAPES for what in STATE[kind]
    ]
    assert sorted(v.name for v in opt.state_vars) == sorted(names)
    main = nf.default_main_program().global_block()
    startup = nf.default_startup_program().global_block()
    inits = {op.output("Out")[0]: op for op in startup.ops if op.type == "fill_constant"}
    for name in names:
        assert main.var(name).persistable and startup.var(name).persistable, name
        assert name in inits, name
    assert {op.type for op in ops} == {kind.lower()}
    if kind == "Adagrad":
        assert inits[f"{prefix}.fc1.w.moment"].attrs["value"] == pytest.approx(0.1)


@pytest.mark.parametrize("kind", list(ALL))
def test_saved_and_reloaded_state_resumes_bit_for_bit(kind, rng, tmp_path):
    """Train 4 steps, save the persistables, load them into a fresh scope, train 4 more: the
    same parameters as 8 steps in one go (optimizer state and the schedule's step included)."""
    lr = nf.layers.exponential_decay(0.02, decay_steps=3, decay_rate=0.7, dtype="float64")
    loss, _, _ = build(getattr(nf.optimizer, kind)(lr, **ALL[kind]))
    main = nf.default_main_program()
    init = init_params(rng)
    data = batches(rng, 8)
    exe = nf.Executor()
    straight = start(init)
    for xs, ys in data:
        exe.run(main, feed={"x": xs, "y": ys}, scope=straight)
    first = start(init)
    for xs, ys in data[:4]:
        exe.run(main, feed={"x": xs, "y": ys}, scope=first)
    nf.io.save_params(first, main, tmp_path / "state.safetensors")
    resumed = start({n: np.zeros(s) for n, s in SHAPES.items()})
    nf.io.load_params(resumed, main, tmp_path / "state.safetensors")
    for xs, ys in data[4:]:
        exe.run(main, feed={"x": xs, "y": ys}, scope=resumed)
    for var in nf.io.persistable_vars(main):
        np.testing.assert_array_equal(value(resumed, var.name), value(straight, var.name))
    assert value(resumed, "@LR_DECAY_COUNTER@")[0] == 7


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: nf.optimizer.Adam(0.1, betas=(0.9, 0.99)), r"Adam: unknown option \['betas'\]"),
        (lambda: nf.optimizer.Adagrad(0.1, momentum=0.9), r"unknown option \['momentum'\]"),
        (lambda: nf.optimizer.RMSProp(0.1, centred=True), r"unknown option \['centred'\]"),
        (lambda: nf.optimizer.Lamb(weight_decay=0.1), r"unknown option \['weight_decay'\]"),
        (lambda: nf.optimizer.SGD(), "learning_rate"),
        (lambda: nf.optimizer.Adadelta(), "learning_rate"),
        (lambda: nf.optimizer.Adam(0.1, beta1=1.0), r"beta1 must be in \[0, 1\)"),
        (lambda: nf.optimizer.RMSProp(0.1, centered="yes"), "centered must be a bool"),
        (lambda: nf.optimizer.Adagrad(0.1, epsilon=-1.0), "epsilon must be a number >= 0"),
        (lambda: nf.optimizer.SGD(0.1, regularization=0.01), "nf.regularizer"),
        (lambda: nf.optimizer.SGD(0.1, grad_clip=1.0), "nf.clip"),
        (
            lambda: nf.optimizer.SGD(
                0.1, weight_decay=0.1, regularization=nf.regularizer.L2Decay(1)
            ),
            "not both",
        ),
        (lambda: nf.optimizer.Lamb(exclude_from_weight_decay_fn=3), "function of the parameter"),
    ],
)
def test_bad_options_are_attr_errors_naming_them(make, message):
    with pytest.raises(nf.errors.AttrError, match=message):
        make()


def test_learning_rate_variable_must_hold_one_float():
    rates = L.fill_constant([2], "float64", 0.1)
    with pytest.raises(nf.errors.AttrError, match="one value"):
        nf.optimizer.SGD(rates)
    steps = L.fill_constant([1], "int64", 3)
    with pytest.raises(nf.errors.AttrError, match="floating point"):
        nf.optimizer.SGD(steps)


def test_a_schedule_learning_rate_cannot_be_set():
    lr = nf.layers.piecewise_decay([2], [0.1, 0.01])
    opt = nf.optimizer.SGD(lr)
    build(opt)
    assert opt.learning_rate_var is lr and opt.state_vars == []
    with pytest.raises(nf.errors.NestflowError, match="schedule"):
        opt.set_learning_rate(0.5, nf.Scope())


def test_net_add_optimizer_ops_takes_every_rule_with_clip_and_regularization():
    net = nf.Net.create()
    with net.building():
        x = nf.data("x", shape=[-1, 3], dtype="float64")
        loss = L.mean(L.fc(x, size=2, name="fc"))
    net.add_backward_ops(loss)
    clip = nf.clip.GradientClipByGlobalNorm(1.0)
    l1 = nf.regularizer.L1Decay(0.01)
    options = {"learning_rate": 0.1, "centered": True, "grad_clip": clip, "regularization": l1}
    net.add_optimizer_ops({"type": "rmsprop", **options})
    types = [op.type for op in net.program.global_block().ops]
    assert types.index("clip_by_global_norm") < types.index("sign") < types.index("rmsprop")
    assert types.count("rmsprop") == 2
    scope = nf.Scope()
    scope.var("x").get_mutable(nf.Tensor).set(np.ones((4, 3)))
    net.run(scope)
    before = value(scope, "fc.w").copy()
    net.run(scope)
    assert np.abs(value(scope, "fc.w") - before).max() > 1e-3
