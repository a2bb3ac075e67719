"""A forward MLP built with layers matches a NumPy reference and survives protobuf round trips."""

import subprocess
import sys

import numpy as np

import nestflow as nf


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def build_mlp():
    x = nf.data("x", shape=[-1, 784], dtype="float32")
    h = nf.layers.fc(x, size=512, act="relu", name="fc1")
    p = nf.layers.fc(h, size=10, act="softmax", name="fc2")
    return x, p


def test_mlp_forward_matches_numpy(rng):
    x, p = build_mlp()
    scope = nf.Scope()
    exe = nf.Executor(nf.CPUPlace())
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.standard_normal((8, 784)).astype("float32")
    (out,) = exe.run(nf.default_main_program(), feed={"x": xs}, fetch_list=[p], scope=scope)

    def param(name):
        return scope.find_var(name).get(nf.Tensor).numpy().astype("float64")

    hidden = np.maximum(xs @ param("fc1.w") + param("fc1.b"), 0)
    ref = _softmax(hidden @ param("fc2.w") + param("fc2.b"))
    assert out.shape == (8, 10)
    np.testing.assert_allclose(out, ref, atol=1e-6)


def test_mlp_runs_identically_after_from_bytes_in_fresh_process(tmp_path, rng):
    _, p = build_mlp()
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(nf.default_startup_program(), scope=scope)
    xs = rng.standard_normal((5, 784)).astype("float32")
    (out,) = exe.run(nf.default_main_program(), feed={"x": xs}, fetch_list=[p], scope=scope)
    (tmp_path / "main.pb").write_bytes(nf.default_main_program().to_bytes())
    for name in ("fc1.w", "fc1.b", "fc2.w", "fc2.b"):
        np.save(tmp_path / f"{name}.npy", scope.find_var(name).get(nf.Tensor).numpy())
    np.save(tmp_path / "x.npy", xs)
    script = f"""
import numpy as np, nestflow as nf, pathlib
d = pathlib.Path({str(tmp_path)!r})
prog = nf.Program.from_bytes((d / "main.pb").read_bytes())
scope = nf.Scope()
for name in ("fc1.w", "fc1.b", "fc2.w", "fc2.b"):
    scope.var(name).get_mutable(nf.Tensor).set(np.load(d / f"{{name}}.npy", allow_pickle=False))
out, = nf.Executor().run(prog, feed={{"x": np.load(d / "x.npy")}}, fetch_list=[{p.name!r}],
                         scope=scope)
np.save(d / "out.npy", out)
"""
    subprocess.run([sys.executable, "-c", script], check=True)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), out)
