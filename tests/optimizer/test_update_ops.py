"""The update, clip and sign ops one at a time against NumPy references (tests/ops/harness.py),
over shapes with size-1 and 0-d parameters, in float64 and float32; build-time errors."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from tests.ops.harness import OpCase, case_id

rng = np.random.default_rng(13)
SHAPES = [(3, 4), (5,), (1,), (), (0, 3)]


def normal(shape, dtype="float64"):
    return np.asarray(rng.standard_normal(shape), dtype)


def positive(shape, dtype="float64"):
    return np.asarray(rng.uniform(0.1, 2.0, shape), dtype)


def one(value, dtype="float64"):
    return np.array([value], dtype)


def like_param(Param, outputs):
    """Param-shaped results in Param's dtype (the references mix in float64 beta powers)."""
    return {
        k: v if k.startswith("Beta") else np.asarray(v, Param.dtype) for k, v in outputs.items()
    }


def ref_adagrad(Param, Grad, Moment, LearningRate, epsilon):
    moment = Moment + Grad**2
    return {
        "ParamOut": Param - LearningRate[0] * Grad / (np.sqrt(moment) + epsilon),
        "MomentOut": moment,
    }


def ref_rmsprop(Param, MeanSquare, LearningRate, Grad, Moment, MeanGrad=None, **attrs):
    rho, eps, mu = attrs["decay"], attrs["epsilon"], attrs["momentum"]
    ms = rho * MeanSquare + (1 - rho) * Grad**2
    out = {"MeanSquareOut": ms}
    if attrs["centered"]:
        mg = rho * MeanGrad + (1 - rho) * Grad
        avg = np.sqrt(ms - mg**2) + eps
        out["MeanGradOut"] = mg
    else:
        avg = np.sqrt(ms) + eps
    moment = mu * Moment + Grad / avg
    return {**out, "MomentOut": moment, "ParamOut": Param - LearningRate[0] * moment}


def ref_adadelta(Param, Grad, AvgSquaredGrad, AvgSquaredUpdate, rho, epsilon, LearningRate=None):
    asg = rho * AvgSquaredGrad + (1 - rho) * Grad**2
    delta = np.sqrt((AvgSquaredUpdate + epsilon) / (asg + epsilon)) * Grad
    lr = 1.0 if LearningRate is None else LearningRate[0]
    return {
        "ParamOut": Param - lr * delta,
        "AvgSquaredGradOut": asg,
        "AvgSquaredUpdateOut": rho * AvgSquaredUpdate + (1 - rho) * delta**2,
    }


def ref_adamax(Param, Grad, LearningRate, Moment, InfNorm, Beta1Pow, beta1, beta2, epsilon):
    m = beta1 * Moment + (1 - beta1) * Grad
    u = np.maximum(beta2 * InfNorm, np.abs(Grad) + epsilon)
    step = LearningRate[0] / (1 - Beta1Pow[0])
    return like_param(
        Param,
        {
            "ParamOut": Param - step * m / u,
            "MomentOut": m,
            "InfNormOut": u,
            "Beta1PowOut": Beta1Pow * beta1,
        },
    )


def _adam(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, beta1, beta2, epsilon):
    m = beta1 * Moment1 + (1 - beta1) * Grad
    v = beta2 * Moment2 + (1 - beta2) * Grad**2
    m_hat, v_hat = m / (1 - Beta1Pow[0]), v / (1 - Beta2Pow[0])
    return m, v, m_hat / (np.sqrt(v_hat) + epsilon)


def ref_adamw(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, coeff, **attrs):
    decayed = Param * (1 - LearningRate[0] * coeff)
    m, v, step = _adam(decayed, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, **attrs)
    return like_param(
        Param,
        {
            "ParamOut": decayed - LearningRate[0] * step,
            "Moment1Out": m,
            "Moment2Out": v,
            "Beta1PowOut": Beta1Pow * attrs["beta1"],
            "Beta2PowOut": Beta2Pow * attrs["beta2"],
        },
    )


def ref_lamb(
    Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, weight_decay, **attrs
):
    m, v, step = _adam(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, **attrs)
    r = step + weight_decay * Param
    p_norm, r_norm = np.linalg.norm(Param), np.linalg.norm(r)
    ratio = p_norm / r_norm if p_norm > 0 and r_norm > 0 else 1.0
    return like_param(
        Param,
        {
            "ParamOut": Param - LearningRate[0] * ratio * r,
            "Moment1Out": m,
            "Moment2Out": v,
            "Beta1PowOut": Beta1Pow * attrs["beta1"],
            "Beta2PowOut": Beta2Pow * attrs["beta2"],
        },
    )


def update_cases():
    cases = []
    for dtype in ("float64", "float32"):
        tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == "float64" else {"rtol": 2e-5, "atol": 1e-6}
        for shape in SHAPES:
            tag = f"{dtype}-{shape}"

            def common(**state):
                return {
                    "Param": normal(shape, dtype),
                    "Grad": normal(shape, dtype),
                    "LearningRate": one(0.05, dtype),
                    **state,
                }

            cases += [
                OpCase(
                    "adagrad",
                    common(Moment=positive(shape, dtype)),
                    ref_adagrad,
                    {"epsilon": 1e-6},
                    id=f"adagrad-{tag}",
                    **tol,
                ),
                OpCase(
                    "rmsprop",
                    common(MeanSquare=positive(shape, dtype) + 1, Moment=normal(shape, dtype)),
                    ref_rmsprop,
                    {"decay": 0.9, "epsilon": 1e-6, "momentum": 0.7, "centered": False},
                    outputs=("ParamOut", "MomentOut", "MeanSquareOut"),
                    id=f"rmsprop-{tag}",
                    **tol,
                ),
                OpCase(
                    "rmsprop",
                    common(
                        MeanSquare=positive(shape, dtype) + 1,
                        Moment=normal(shape, dtype),
                        MeanGrad=normal(shape, dtype) * 0.1,
                    ),
                    ref_rmsprop,
                    {"decay": 0.95, "epsilon": 1e-6, "momentum": 0.0, "centered": True},
                    id=f"rmsprop-centered-{tag}",
                    **tol,
                ),
                OpCase(
                    "adadelta",
                    common(
                        AvgSquaredGrad=positive(shape, dtype),
                        AvgSquaredUpdate=positive(shape, dtype),
                    ),
                    ref_adadelta,
                    {"rho": 0.9, "epsilon": 1e-6},
                    id=f"adadelta-{tag}",
                    **tol,
                ),
                OpCase(
                    "adamax",
                    common(
                        Moment=normal(shape, dtype),
                        InfNorm=positive(shape, dtype),
                        Beta1Pow=one(0.9**3),
                    ),
                    ref_adamax,
                    {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
                    id=f"adamax-{tag}",
                    **tol,
                ),
            ]
            adam_state = {
                "Moment1": normal(shape, dtype),
                "Moment2": positive(shape, dtype),
                "Beta1Pow": one(0.9**2),
                "Beta2Pow": one(0.999**2),
            }
            betas = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
            cases += [
                OpCase(
                    "adamw",
                    common(**adam_state),
                    ref_adamw,
                    {**betas, "coeff": 0.1},
                    id=f"adamw-{tag}",
                    **tol,
                ),
                OpCase(
                    "lamb",
                    common(**adam_state),
                    ref_lamb,
                    {**betas, "epsilon": 1e-6, "weight_decay": 0.01},
                    id=f"lamb-{tag}",
                    **tol,
                ),
            ]
    return cases


UPDATES = update_cases()

# Fluid's adadelta has no learning rate: without the input the rule is Fluid's (lr = 1).
FLUID_ADADELTA = OpCase(
    "adadelta",
    {
        "Param": normal((4, 3)),
        "Grad": normal((4, 3)),
        "AvgSquaredGrad": positive((4, 3)),
        "AvgSquaredUpdate": positive((4, 3)),
    },
    ref_adadelta,
    {"rho": 0.95, "epsilon": 1e-6},
    id="adadelta-fluid-no-learning-rate",
    rtol=1e-12,
)

# A zero parameter: lamb's trust ratio is 1, so it still moves.
ZERO_LAMB = OpCase(
    "lamb",
    {
        "Param": np.zeros((2, 3)),
        "Grad": normal((2, 3)),
        "LearningRate": one(0.1),
        "Moment1": np.zeros((2, 3)),
        "Moment2": np.zeros((2, 3)),
        "Beta1Pow": one(0.9),
        "Beta2Pow": one(0.999),
    },
    ref_lamb,
    {"weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6},
    id="lamb-zero-param",
    rtol=1e-12,
)


def ref_clip_by_norm(X, max_norm):
    norm = np.sqrt(np.sum(X**2))
    return {"Out": X * (max_norm / norm) if norm > max_norm else X}


def ref_global(X, max_global_norm):
    norm = np.sqrt(sum(np.sum(x**2) for x in X))
    return {"Out": [x * (max_global_norm / max(norm, max_global_norm)) for x in X]}


CLIPS = [
    OpCase(
        "clip_by_norm",
        {"X": normal((3, 4))},
        ref_clip_by_norm,
        {"max_norm": 1.0},
        id="clip_by_norm-clipped",
        rtol=1e-12,
    ),
    OpCase(
        "clip_by_norm",
        {"X": normal((3, 4))},
        ref_clip_by_norm,
        {"max_norm": 100.0},
        id="clip_by_norm-kept",
        rtol=1e-12,
    ),
    OpCase(
        "clip_by_norm",
        {"X": normal((), "float32")},
        ref_clip_by_norm,
        {"max_norm": 0.1},
        id="clip_by_norm-0d-float32",
    ),
    OpCase(
        "clip_by_norm",
        {"X": np.zeros((0, 3))},
        ref_clip_by_norm,
        {"max_norm": 1.0},
        id="clip_by_norm-empty",
    ),
    OpCase(
        "clip_by_global_norm",
        {"X": [normal((3, 2)), normal((5,)), normal(())]},
        ref_global,
        {"max_global_norm": 1.0},
        id="clip_by_global_norm-clipped",
        rtol=1e-12,
    ),
    OpCase(
        "clip_by_global_norm",
        {"X": [normal((3, 2)), normal((1,))]},
        ref_global,
        {"max_global_norm": 50.0},
        id="clip_by_global_norm-kept",
        rtol=1e-12,
    ),
    OpCase(
        "clip_by_global_norm",
        {"X": [normal((2, 2), "float32")]},
        ref_global,
        {"max_global_norm": 0.5},
        id="clip_by_global_norm-float32",
    ),
    OpCase(
        "sign",
        {"X": np.array([[-2.0, 0.0, 3.0], [0.5, -0.0, -1e-300]])},
        lambda X: {"Out": np.sign(X)},
        id="sign",
    ),
    OpCase("sign", {"X": normal((), "float32")}, lambda X: {"Out": np.sign(X)}, id="sign-0d"),
]


def ref_sgd(Param, Grad, LearningRate):
    return {"ParamOut": Param - LearningRate[0] * Grad}


def ref_momentum(Param, Grad, Velocity, LearningRate, mu, use_nesterov):
    velocity = mu * Velocity + Grad
    step = Grad + mu * velocity if use_nesterov else velocity
    return {"ParamOut": Param - LearningRate[0] * step, "VelocityOut": velocity}


def ref_adam(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, **attrs):
    b1, b2, eps = attrs["beta1"], attrs["beta2"], attrs["epsilon"]
    m1 = b1 * Moment1 + (1 - b1) * Grad
    m2 = b2 * Moment2 + (1 - b2) * Grad**2
    lr = LearningRate[0] * np.sqrt(1 - Beta2Pow[0]) / (1 - Beta1Pow[0])
    return {
        "ParamOut": Param - lr * m1 / (np.sqrt(m2) + eps * np.sqrt(1 - Beta2Pow[0])),
        "Moment1Out": m1,
        "Moment2Out": m2,
        "Beta1PowOut": Beta1Pow * b1,
        "Beta2PowOut": Beta2Pow * b2,
    }


# The plain updates, on every place of the harness (their fused multi-parameter forms are
# checked in tests/optimizer/test_optimizers.py).
PLAIN = (
    [
        OpCase(
            "sgd",
            {"Param": normal(shape), "Grad": normal(shape), "LearningRate": one(0.1)},
            ref_sgd,
            id=f"sgd-{shape}",
            rtol=1e-12,
        )
        for shape in SHAPES
    ]
    + [
        OpCase(
            "momentum",
            {
                "Param": normal(shape),
                "Grad": normal(shape),
                "Velocity": normal(shape),
                "LearningRate": one(0.1),
            },
            ref_momentum,
            {"mu": 0.9, "use_nesterov": nesterov},
            id=f"momentum-{shape}-{'nesterov' if nesterov else 'plain'}",
            rtol=1e-12,
        )
        for shape in SHAPES
        for nesterov in (False, True)
    ]
    + [
        OpCase(
            "adam",
            {
                "Param": normal(shape),
                "Grad": normal(shape),
                "LearningRate": one(0.01),
                "Moment1": normal(shape),
                "Moment2": positive(shape),
                "Beta1Pow": one(0.9**3),
                "Beta2Pow": one(0.999**3),
            },
            lambda **kw: like_param(kw["Param"], ref_adam(**kw)),
            {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
            id=f"adam-{shape}",
            rtol=1e-10,
            check_dtype=False,
        )
        for shape in SHAPES
    ]
)


@pytest.mark.parametrize("case", UPDATES + PLAIN + [FLUID_ADADELTA, ZERO_LAMB] + CLIPS, ids=case_id)
def test_op_matches_numpy(case):
    case.check()


def _block_with(**shapes):
    block = nf.default_main_program().global_block()
    return block, {n: block.create_var(n, s, "float64") for n, s in shapes.items()}


def test_centered_rmsprop_without_mean_grad_is_a_build_error():
    block, v = _block_with(p=[3], g=[3], ms=[3], m=[3], lr=[1])
    with pytest.raises(nf.errors.ShapeError, match="MeanGrad"):
        block.append_op(
            "rmsprop",
            {
                "Param": v["p"],
                "Grad": v["g"],
                "MeanSquare": v["ms"],
                "Moment": v["m"],
                "LearningRate": v["lr"],
            },
            {"ParamOut": v["p"], "MomentOut": v["m"], "MeanSquareOut": v["ms"]},
            {"centered": True},
        )


def test_update_state_must_have_the_parameter_shape():
    block, v = _block_with(p=[3, 2], g=[3, 2], moment=[2, 3], lr=[1])
    with pytest.raises(nf.errors.ShapeError, match=r"Moment \[2, 3\] must have Param's shape"):
        block.append_op(
            "adagrad",
            {"Param": v["p"], "Grad": v["g"], "Moment": v["moment"], "LearningRate": v["lr"]},
            {"ParamOut": v["p"], "MomentOut": v["moment"]},
        )


def test_clip_ops_reject_bad_norms_and_integer_gradients():
    block = nf.default_main_program().global_block()
    x = block.create_var("x", [3], "float64")
    with pytest.raises(nf.errors.AttrError, match="max_norm must be > 0"):
        block.append_op("clip_by_norm", {"X": x}, {"Out": "y"}, {"max_norm": 0.0})
    ints = block.create_var("ints", [3], "int64")
    with pytest.raises(nf.errors.DTypeError, match="floating point"):
        block.append_op(
            "clip_by_global_norm", {"X": [ints]}, {"Out": ["z"]}, {"max_global_norm": 1.0}
        )
