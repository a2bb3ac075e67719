"""WGAN-GP on 2-D toy data (Gulrajani et al. 2017): a gradient penalty through nf.gradients.

A generator MLP maps noise to points meant to look like a ring of 8 Gaussians; a critic MLP
scores points. The critic minimises D(fake) - D(real) + 10 * (||dD/dx(x_hat)|| - 1)^2 at
random interpolates x_hat of real and fake points; the penalty is a gradient of the critic,
so its own gradient is a second derivative: nf.gradients builds the penalty's gradient ops,
and the optimizer's backward pass differentiates them again. The critic's gradient norm at
the interpolates approaches 1, printed as training goes.

    python examples/wgan_gp.py [generator steps]
"""

import sys

import numpy as np

import nestflow as nf

L = nf.layers
NOISE, HIDDEN, BATCH, CRITIC_STEPS, LAMBDA = 2, 64, 64, 5, 10.0


def ring(n, rng):
    """n points from 8 Gaussians (std 0.05) on the unit circle."""
    angles = rng.integers(0, 8, n) * (np.pi / 4)
    centres = np.stack([np.cos(angles), np.sin(angles)], 1)
    return (centres + 0.05 * rng.standard_normal((n, 2))).astype("float32")


def mlp(x, prefix, out):
    for i in range(2):
        x = L.fc(
            x,
            HIDDEN,
            act="relu",
            param_attr=nf.ParamAttr(f"{prefix}.w{i}"),
            bias_attr=nf.ParamAttr(f"{prefix}.b{i}"),
        )
    return L.fc(
        x, out, param_attr=nf.ParamAttr(f"{prefix}.w2"), bias_attr=nf.ParamAttr(f"{prefix}.b2")
    )


def build():
    """The critic's and the generator's programs (sharing parameters by name) and startup."""
    startup = nf.Program()
    critic, generator = nf.Program(), nf.Program()
    with nf.program_guard(critic, startup):
        real = nf.data("real", [-1, 2], "float32")
        z = nf.data("z", [-1, NOISE], "float32")
        alpha = nf.data("alpha", [-1, 1], "float32")
        fake = mlp(z, "g", 2)
        fake.stop_gradient = True  # the critic's step leaves the generator alone
        x_hat = L.elementwise_add(
            L.elementwise_mul(real, alpha), L.elementwise_mul(fake, 1.0 - alpha)
        )
        x_hat.stop_gradient = False
        (grad,) = nf.gradients(mlp(x_hat, "d", 1), x_hat)
        norm = L.sqrt(L.reduce_sum(L.square(grad), dim=[1]) + 1e-12)
        penalty = L.reduce_mean(L.square(norm - 1.0))
        mean_norm = L.reduce_mean(norm)
        wasserstein = L.mean(mlp(fake, "d", 1)) - L.mean(mlp(real, "d", 1))
        loss = wasserstein + LAMBDA * penalty
        d_params = [p for p in critic.all_parameters() if p.name.startswith("d.")]
        nf.optimizer.Adam(1e-3, beta1=0.5, beta2=0.9).minimize(loss, parameter_list=d_params)
    with nf.program_guard(generator, startup):
        z = nf.data("z", [-1, NOISE], "float32")
        g_loss = -L.mean(mlp(mlp(z, "g", 2), "d", 1))
        g_params = [p for p in generator.all_parameters() if p.name.startswith("g.")]
        nf.optimizer.Adam(1e-3, beta1=0.5, beta2=0.9).minimize(g_loss, parameter_list=g_params)
    return startup, critic, generator, (wasserstein, mean_norm), g_loss


def train(steps: int = 300, seed: int = 0, report=print):
    """Train; returns the critic's mean gradient norm at the interpolates per report."""
    rng = np.random.default_rng(seed)
    startup, critic, generator, (wasserstein, mean_norm), g_loss = build()
    exe, scope = nf.Executor(), nf.Scope()
    exe.run(startup, scope=scope)
    norms = []
    for step in range(steps):
        for _ in range(CRITIC_STEPS):
            feed = {
                "real": ring(BATCH, rng),
                "z": rng.standard_normal((BATCH, NOISE)).astype("float32"),
                "alpha": rng.uniform(size=(BATCH, 1)).astype("float32"),
            }
            w, n = exe.run(critic, feed=feed, fetch_list=[wasserstein, mean_norm], scope=scope)
        z = rng.standard_normal((BATCH, NOISE)).astype("float32")
        exe.run(generator, feed={"z": z}, fetch_list=[g_loss], scope=scope)
        if step % max(steps // 10, 1) == 0 or step == steps - 1:
            norms.append(float(n))
            report(
                f"step {step:4d}: critic W estimate {-float(w):.4f}, "
                f"gradient norm at interpolates {float(n):.4f}"
            )
    return norms


if __name__ == "__main__":
    train(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
