"""Programs on a device place (DESIGN Places): the stand-in device runs the device code paths
on the host, its arrays refusing implicit host conversion and NumPy calls as CuPy's do, so a
program that trains or runs on it equal to CPUPlace shows no kernel hides a host transfer.
Where CuPy finds a GPU, the same programs run on CUDAPlace(0) too."""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf
from nestflow.core import StandInPlace
from nestflow.core.standin import StandInArray
from nestflow.errors import FeedError, PlaceError
from tests.ops.harness import DEVICE_PLACES, assert_equal_on_device, draws_on_the_device

L = nf.layers


def _run_on(place, build, feeds, fetch_names=None, steps=1):
    """Build with `build()` (returns the fetch list) in fresh programs, run the startup program
    on the CPU (so every place starts from the same parameters: CUDA draws from CuPy's
    generator) and then the main program once per feed of `feeds` on `place`; the fetches of
    every run, the scope's persistables at the end as NumPy, the scope and the main program."""
    main, startup = nf.Program(), nf.Program()
    main.random_seed = startup.random_seed = 7
    with nf.program_guard(main, startup), nf.unique_name.guard():
        fetch = build()
    exe, scope = nf.Executor(place), nf.Scope()
    nf.Executor(nf.CPUPlace()).run(startup, scope=scope)
    runs = [exe.run(main, feed=feed, fetch_list=fetch, scope=scope) for feed in feeds]
    params = {
        v.name: scope.find_var(v.name).get(nf.Tensor).numpy()
        for v in main.global_block().vars.values()
        if v.persistable and scope.find_var(v.name) is not None and v.type == "lod_tensor"
    }
    return runs, params, scope, main


def _assert_same(build, feeds, place):
    cpu_runs, cpu_params, _, _ = _run_on(nf.CPUPlace(), build, feeds)
    dev_runs, dev_params, scope, main = _run_on(place, build, feeds)
    # CuPy's draws are not the CPU's: a program that draws (dropout) is compared by shape there
    draws = isinstance(place, nf.CUDAPlace) and any(
        draws_on_the_device(op.type, op.attrs) for op in main.global_block().ops
    )
    for step, (want, got) in enumerate(zip(cpu_runs, dev_runs)):
        for i, (w, g) in enumerate(zip(want, got)):
            assert isinstance(g, np.ndarray), f"run {step} fetch {i}: {type(g).__name__}"
            if draws:
                assert g.shape == w.shape and np.isfinite(g).all(), f"run {step} #{i}"
            else:
                assert_equal_on_device(g, w, f"run {step} #{i} on {place}")
    assert cpu_params.keys() == dev_params.keys()
    for name, want in cpu_params.items():
        if draws:
            assert dev_params[name].shape == want.shape, name
        else:
            assert_equal_on_device(dev_params[name], want, f"{name} on {place}")
    return scope


def _mlp():
    x = L.data("x", [-1, 8])
    label = L.data("label", [-1, 1], "int64")
    h = L.fc(x, size=16, act="relu")
    h = L.dropout(h, dropout_prob=0.25)
    logits = L.fc(h, size=3)
    loss = L.mean(L.softmax_with_cross_entropy(logits, label))
    nf.optimizer.Adam(learning_rate=0.01).minimize(loss)
    return [loss]


def _conv():
    image = L.data("image", [-1, 1, 8, 8])
    label = L.data("label", [-1, 1], "int64")
    h = L.conv2d(image, num_filters=4, filter_size=3, padding=1, act="relu")
    h = L.batch_norm(h)
    h = L.pool2d(h, pool_size=2, pool_stride=2)
    logits = L.fc(h, size=3)
    loss = L.mean(L.softmax_with_cross_entropy(logits, label))
    nf.optimizer.Momentum(learning_rate=0.05, momentum=0.9).minimize(loss)
    return [loss, logits]


def _rnn():
    x = L.data("x", [-1, 5, 3])
    lengths = L.data("lengths", [-1], "int64")
    label = L.data("label", [-1, 1], "int64")
    rnn = nf.rnn()
    with rnn.step():
        word = rnn.step_input(x, lengths=lengths)
        prev = rnn.memory(shape=[4], batch_ref=word)
        h = L.tanh(L.fc(word, size=4) + L.fc(prev, size=4, bias_attr=False))
        rnn.update_memory(prev, h)
        rnn.output(h)
    hidden = rnn()
    last = L.reduce_mean(hidden, dim=1)
    loss = L.mean(L.softmax_with_cross_entropy(L.fc(last, size=2), label))
    nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    return [loss, hidden]


def _ifelse():
    x = L.data("x", [-1, 4])
    x.stop_gradient = False
    cond = L.greater_than(
        L.reduce_sum(x, dim=1, keep_dim=True), L.fill_constant([1], "float32", 0.0)
    )
    ie = nf.ifelse()
    with ie.true_block():
        ie.output(L.fc(ie.input(x), size=2, act="tanh"))
    with ie.false_block():
        ie.output(L.scale(ie.input(x), scale=-1.0)[:, :2])
    (out,) = ie(cond)
    loss = L.mean(out)
    nf.optimizer.SGD(learning_rate=0.1).minimize(loss)
    return [out, loss]


def _while():
    x = L.data("x", [-1, 2])
    w = L.create_parameter([2, 2], "float32", name="w", initializer=nf.initializer.Uniform(-1, 1))
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 3)
    cond = L.less_than(i, n)
    array = L.create_array("float32")
    loop = nf.While(cond)
    with loop.block():
        h = L.tanh(L.matmul(x, w))
        L.assign(h, output=x)
        L.array_write(h, i, array)
        L.increment(i)
        L.less_than(i, n, out=cond)
    return [x, L.array_to_tensor(array), L.array_length(array)]


def _beam_search():
    vocab, hidden = 6, 4
    wx = L.create_parameter([3, hidden], "float32", name="wx")
    wo = L.create_parameter([hidden, vocab], "float32", name="wo")

    def cell(inputs, states):
        h = L.tanh(L.matmul(inputs, wx) + states)
        return h, h

    decoder = L.BeamSearchDecoder(
        cell,
        0,
        1,
        3,
        embedding_fn=lambda ids: L.embedding(ids, [vocab, 3], param_attr=nf.ParamAttr(name="emb")),
        output_fn=lambda h: L.matmul(h, wo),
    )
    h0 = L.data("h0", [-1, hidden])
    ids, final = L.dynamic_decode(decoder, inits=h0, max_step_num=5)
    return [ids, final.log_probs]


_rng = np.random.default_rng(0)
_PROGRAMS = {
    "mlp": (
        _mlp,
        [
            {"x": _rng.normal(size=(6, 8)).astype("float32"), "label": _rng.integers(0, 3, (6, 1))}
            for _ in range(3)
        ],
    ),
    "conv": (
        _conv,
        [
            {
                "image": _rng.normal(size=(4, 1, 8, 8)).astype("float32"),
                "label": _rng.integers(0, 3, (4, 1)),
            }
            for _ in range(2)
        ],
    ),
    "rnn": (
        _rnn,
        [
            {
                "x": _rng.normal(size=(3, 5, 3)).astype("float32"),
                "lengths": np.array([5, 2, 0]),
                "label": _rng.integers(0, 2, (3, 1)),
            }
            for _ in range(2)
        ],
    ),
    "ifelse": (_ifelse, [{"x": _rng.normal(size=(5, 4)).astype("float32")} for _ in range(2)]),
    "while": (_while, [{"x": _rng.normal(size=(3, 2)).astype("float32")}]),
    "beam_search": (_beam_search, [{"h0": _rng.normal(size=(2, 4)).astype("float32")}]),
}


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
@pytest.mark.parametrize("name", list(_PROGRAMS))
def test_program_trains_and_runs_on_the_device_as_on_the_cpu(name, place):
    build, feeds = _PROGRAMS[name]
    scope = _assert_same(build, feeds, place)
    # persistables stay on the device between runs
    held = [
        scope.find_var(n).get(nf.Tensor)
        for n in scope.local_var_names()
        if scope.find_var(n).is_type(nf.Tensor)
    ]
    assert held and all(t.place == place for t in held), [t.place for t in held]


def test_fetch_without_numpy_gives_tensors_on_the_device():
    x = L.data("x", [-1, 2])
    y = L.scale(x, scale=2.0)
    exe = nf.Executor(StandInPlace(0))
    (t,) = exe.run(feed={"x": np.ones((1, 2), "float32")}, fetch_list=[y], return_numpy=False)
    assert isinstance(t, nf.Tensor) and t.place == StandInPlace(0)
    assert isinstance(t.data(), StandInArray)
    assert t.numpy().tolist() == [[2.0, 2.0]]
    assert t.to(nf.CPUPlace()).numpy().tolist() == [[2.0, 2.0]]


def test_a_device_array_fed_to_a_cpu_program_is_a_clear_error():
    x = L.data("x", [-1, 2])
    y = L.scale(x, scale=2.0)
    device_array = nf.device_context(StandInPlace(0)).to_device(np.ones((1, 2), "float32"))
    with pytest.raises(FeedError, match=r"feed 'x' is an array on StandInPlace\(0\).*CPUPlace"):
        nf.Executor().run(feed={"x": device_array}, fetch_list=[y])
    # on its own place it is taken as it is
    (got,) = nf.Executor(StandInPlace(0)).run(feed={"x": device_array}, fetch_list=[y])
    assert got.tolist() == [[2.0, 2.0]]


def test_the_stand_in_refuses_host_conversion_and_numpy_calls():
    a = nf.device_context(StandInPlace(0)).to_device(np.arange(3.0))
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError, match="np.sum was called on a stand-in"):
        np.sum(a)
    with pytest.raises(TypeError, match="np.maximum was called"):
        np.maximum(a, 0)
    with pytest.raises(TypeError, match="mixed with stand-in device arrays"):
        a + np.ones(3)
    assert (a + 1).get().tolist() == [1.0, 2.0, 3.0]
    assert a.get().tolist() == [0.0, 1.0, 2.0] and float(a.sum()) == 3.0


def test_parameters_made_on_the_device_load_on_the_cpu(tmp_path):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = L.data("x", [-1, 3])
        y = L.fc(x, size=2)
    exe, scope = nf.Executor(StandInPlace(0)), nf.Scope()
    exe.run(startup, scope=scope)
    xs = np.arange(6.0, dtype="float32").reshape(2, 3)
    (want,) = exe.run(main, feed={"x": xs}, fetch_list=[y], scope=scope)
    nf.io.save_inference_model(str(tmp_path), ["x"], [y], main, scope)
    cpu_exe = nf.Executor(nf.CPUPlace())
    program, feeds, fetches, cpu_scope = nf.io.load_inference_model(str(tmp_path))
    (got,) = cpu_exe.run(program, feed={feeds[0]: xs}, fetch_list=fetches, scope=cpu_scope)
    np.testing.assert_array_equal(got, want)
    # and back onto the device, loaded there directly
    program, feeds, fetches, dev_scope = nf.io.load_inference_model(
        str(tmp_path), place=StandInPlace(0)
    )
    assert dev_scope.find_var("fc_0.w").get(nf.Tensor).place == StandInPlace(0)
    (again,) = exe.run(program, feed={feeds[0]: xs}, fetch_list=fetches, scope=dev_scope)
    np.testing.assert_array_equal(again, want)


def test_dlpack_shares_memory_with_pytorch():
    torch = pytest.importorskip("torch")
    source = torch.arange(4.0)
    t = nf.Tensor.from_dlpack(source)
    source[0] = 9.0
    assert t.place == nf.CPUPlace() and t.numpy().tolist() == [9.0, 1.0, 2.0, 3.0]
    back = torch.from_dlpack(t)
    back[1] = 7.0
    assert t.numpy()[1] == 7.0


def test_device_context_pool_gives_one_context_per_place():
    a, b = nf.device_context(StandInPlace(0)), nf.device_context(StandInPlace(0))
    assert a is b and a.xp is StandInPlace(0).array_module
    assert nf.device_context(nf.CPUPlace()).xp is np
    with pytest.raises(PlaceError, match="no device context"):
        nf.device_context(object())


def test_a_model_trained_on_the_device_resumes_on_the_cpu(tmp_path):
    """nf.Model(place=...): a checkpoint saved from the device loads on the CPU, and fit on
    the device equals fit on the CPU."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(16, 5)).astype("float32")
    y = rng.integers(0, 3, (16, 1))

    def model_on(place):
        model = nf.Model(
            lambda v: L.fc(v, 3, act="softmax"),
            inputs=nf.InputSpec([None, 5], name="x"),
            labels=nf.InputSpec([None, 1], "int64", "y"),
            place=place,
        )
        model.prepare(nf.optimizer.Adam(0.05), loss=L.cross_entropy)
        return model

    trained = {}
    for place in (nf.CPUPlace(), StandInPlace(0)):
        with nf.unique_name.guard():
            model = model_on(place)
        nf.seed(0)
        model.fit((x, y), batch_size=4, epochs=2, verbose=0, shuffle=False)
        trained[place] = model.predict(x, batch_size=16, stack_outputs=True)[0]
        if place.is_device:
            model.save(str(tmp_path / "ckpt"))
    np.testing.assert_allclose(trained[StandInPlace(0)], trained[nf.CPUPlace()], rtol=1e-6)
    with nf.unique_name.guard():
        resumed = model_on(nf.CPUPlace())
    resumed.load(str(tmp_path / "ckpt"))
    got = resumed.predict(x, batch_size=16, stack_outputs=True)[0]
    np.testing.assert_array_equal(got, trained[StandInPlace(0)])


@pytest.mark.skipif(
    not nf.cuda.device_count(), reason="no CUDA GPU here (CuPy or a driver missing)"
)
def test_programs_run_on_a_cuda_gpu():
    """On a machine with a GPU, CUDAPlace(0) is among the device places every test of this
    file and of the op harness runs on; here it says so when there is none."""
    assert nf.CUDAPlace(0) in DEVICE_PLACES


def test_cuda_random_draws_come_from_one_cupy_generator_per_host_generator():
    """CUDADeviceContext.random (checked without a GPU through a stand-in for cupy.random):
    a run's host generator gets one CuPy generator, seeded from it, kept while it lives; a
    fresh host generator with the same seed (an op's own seed) gets the same seed again."""
    from types import SimpleNamespace

    from nestflow.core.device_context import CUDADeviceContext

    made = []

    def default_rng(seed):
        made.append(seed)
        return np.random.default_rng(seed)

    ctx = object.__new__(CUDADeviceContext)  # no CuPy here: only random() is exercised
    ctx.xp = SimpleNamespace(random=SimpleNamespace(default_rng=default_rng))
    ctx._generators = {}
    run_generator = np.random.default_rng(5)
    first = ctx.random(run_generator)
    assert ctx.random(run_generator) is first and len(made) == 1
    ctx.random(np.random.default_rng(9))
    ctx.random(np.random.default_rng(9))
    assert made[1] == made[2] != made[0]
    for seed in range(100):  # op seeds make a host generator per call: the memory is bounded
        ctx.random(np.random.default_rng(seed))
    assert len(ctx._generators) <= 64


def test_cuda_normal_draws_come_from_cupys_standard_normal():
    """CuPy's Generator has no `normal` (only `standard_normal`, `random`, `uniform`,
    `integers`...): CUDADeviceContext.random adds it (checked through a stand-in generator
    that has CuPy's methods only)."""
    from types import SimpleNamespace

    from nestflow.core.device_context import CUDADeviceContext

    class CuPyLikeGenerator:  # the draws nestflow's kernels use that cupy.random.Generator has
        def __init__(self, seed):
            self._host = np.random.default_rng(seed)
            self.random, self.uniform = self._host.random, self._host.uniform
            self.standard_normal = self._host.standard_normal

    ctx = object.__new__(CUDADeviceContext)
    ctx.xp = SimpleNamespace(random=SimpleNamespace(default_rng=CuPyLikeGenerator))
    ctx._generators = {}
    draws = ctx.random(np.random.default_rng(3))
    got = draws.normal(2.0, 0.5, size=(4, 3))
    seed = int(np.random.default_rng(3).integers(2**63))
    np.testing.assert_array_equal(
        got, 2.0 + 0.5 * np.random.default_rng(seed).standard_normal((4, 3))
    )
    assert draws.uniform(0, 1, size=2).shape == (2,) and draws.random((2, 2)).shape == (2, 2)


@pytest.mark.parametrize("ufunc", ["add", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("dtype", ["float64", "float16", "int8", "int64"])
def test_scatter_in_rounds_is_numpys_at(ufunc, dtype):
    """The CUDA scatter for what CuPy's atomics lack (multiply, and dtypes such as int8,
    float16, int64): the same values as NumPy's `<ufunc>.at`, repeats combined in order, for
    row indices, element indices (a tuple) and a non-contiguous target, on NumPy and on the
    stand-in device's module."""
    from nestflow.core import standin
    from nestflow.core.device_context import scatter_in_rounds

    rng = np.random.default_rng(0)
    base = rng.integers(1, 4, (5, 3)).astype(dtype)
    rows = rng.integers(0, 5, 12)
    row_values = rng.integers(1, 3, (12, 3)).astype(dtype)
    cells = (rng.integers(0, 5, (4, 2)), rng.integers(0, 3, (1, 2)))
    cell_values = rng.integers(1, 3, (4, 2)).astype(dtype)
    cases = [
        (base, rows, row_values),
        (base, cells, cell_values),
        (base.T, rows[:6] % 3, row_values[:6, :1].T.reshape(6, 1)),
    ]
    for target, index, values in cases:
        want = target.copy()
        getattr(np, ufunc).at(want, index, values)
        got = target.copy(order="K")
        scatter_in_rounds(np, got, index, values, ufunc)
        np.testing.assert_array_equal(got, want)
        wrap = standin.StandInArray
        on_device = wrap(target.copy())
        device_index = tuple(wrap(i) for i in index) if type(index) is tuple else wrap(index)
        scatter_in_rounds(standin.xp, on_device, device_index, wrap(values), ufunc)
        np.testing.assert_array_equal(on_device.get(), want)


def test_cuda_scatter_uses_cupys_kernels_where_they_exist(monkeypatch):
    """CUDADeviceContext.scatter_at: cupyx.scatter_add/max/min for the dtypes CuPy's atomics
    take, the rounds for multiply and the rest (checked through a stand-in cupyx)."""
    import sys
    from types import SimpleNamespace

    from nestflow.core.device_context import CUDADeviceContext

    calls = []

    def kernel(name):
        def scatter(target, index, values):
            calls.append(name)
            getattr(np, {"add": "add", "max": "maximum", "min": "minimum"}[name]).at(
                target, index, values
            )

        return scatter

    monkeypatch.setitem(
        sys.modules,
        "cupyx",
        SimpleNamespace(**{f"scatter_{n}": kernel(n) for n in ("add", "max", "min")}),
    )
    ctx = object.__new__(CUDADeviceContext)
    ctx.xp = np
    index, values = np.array([0, 2, 0]), np.array([3, 4, 5])
    for ufunc, dtype, used in [
        ("add", "float32", ["add"]),
        ("maximum", "float64", ["max"]),
        ("minimum", "int32", ["min"]),
        ("multiply", "float32", []),
        ("add", "int8", []),
        ("maximum", "float16", []),
    ]:
        calls.clear()
        target, want = np.ones(3, dtype), np.ones(3, dtype)
        ctx.scatter_at(target, index, values.astype(dtype), ufunc)
        getattr(np, ufunc).at(want, index, values.astype(dtype))
        np.testing.assert_array_equal(target, want)
        assert calls == used, (ufunc, dtype)
    calls.clear()
    target = np.zeros(3, "float32")
    ctx.scatter_add(target, index, values.astype("float32"))
    assert calls == ["add"] and target.tolist() == [8.0, 0.0, 4.0]


def test_the_harness_compares_random_draws_on_cuda_by_shape_only():
    """On CUDA random ops draw from CuPy's generator (not bit-equal to the CPU's): the op
    harness compares their shapes and dtypes there, everything else exactly."""
    assert draws_on_the_device("uniform_random", {"shape": [2]})
    assert draws_on_the_device("dropout", {"dropout_prob": 0.5})
    assert not draws_on_the_device("dropout", {"dropout_prob": 0.5, "is_test": True})
    assert not draws_on_the_device("dropout", {"dropout_prob": 0.0})
    assert not draws_on_the_device("scaled_dot_product_attention", {})
    assert draws_on_the_device("scaled_dot_product_attention", {"dropout_rate": 0.1})
    assert not draws_on_the_device("relu", {})


def test_an_ops_cuda_kernel_runs_where_the_place_runs_cuda_kernels(monkeypatch):
    """forward_cuda / backward_cuda replace forward / backward on a place whose context runs
    CUDA kernels (CUDAPlace; here the stand-in, told to), with attrs and place args bound as
    for the xp body; NotImplemented hands the inputs to the xp body."""
    from nestflow.ops import registry

    calls = []

    @registry.register_op
    class test_cuda_scaled:
        inputs, outputs = ("X",), ("Out",)
        attrs = {"factor": 2.0}

        def infer(X, factor):
            return X

        def forward(X, factor, xp):
            calls.append("forward")
            return X * factor

        def forward_cuda(X, factor, xp, device):
            calls.append("forward_cuda")
            assert device.place == place
            return NotImplemented if factor < 0 else xp.multiply(X, factor)

        def backward(X, Out, Out_grad, factor):
            calls.append("backward")
            return (Out_grad * factor,)

        def backward_cuda(X, Out, Out_grad, factor, xp):
            calls.append("backward_cuda")
            return (xp.multiply(Out_grad, factor),)

    place = StandInPlace(0)
    try:
        monkeypatch.setattr(type(nf.device_context(place)), "runs_cuda_kernels", True)
        for factor, want in ((3.0, ["forward_cuda", "backward_cuda"]), (-1.0, None)):
            main, startup = nf.Program(), nf.Program()
            with nf.program_guard(main, startup):
                x = nf.data("x", [-1, 2])
                x.stop_gradient = False
                y = nf.layers.helper.append_op("test_cuda_scaled", {"X": x}, {"factor": factor})
                (dx,) = nf.gradients(nf.layers.reduce_sum(y), x)
            calls.clear()
            out, grad = nf.Executor(place).run(main, {"x": np.ones((1, 2))}, [y, dx])
            assert out.tolist() == [[factor, factor]] and grad.tolist() == [[factor, factor]]
            assert calls == (want or ["forward_cuda", "forward", "backward_cuda"])
        calls.clear()
        nf.Executor(nf.CPUPlace()).run(main, {"x": np.ones((1, 2))}, [y, dx])
        assert calls == ["forward", "backward"]
    finally:
        for name in ("test_cuda_scaled", "test_cuda_scaled_grad"):
            registry._REGISTRY.pop(name, None)


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
def test_a_class_id_out_of_range_fails_the_run_on_a_device_and_stores_nothing(place):
    """A device checks the ids without stopping (DeviceContext.check): the run's ops are
    queued, the flags read once, and the error raised before any persistable is written."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4])
        label = nf.data("label", [-1, 1], "int64")
        logits = nf.layers.fc(x, 3)
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
        nf.optimizer.SGD(0.1).minimize(loss)
    exe, scope = nf.Executor(place), nf.Scope()
    exe.run(startup, scope=scope)
    xs = np.ones((3, 4), "float32")
    exe.run(main, {"x": xs, "label": np.array([[0], [1], [2]])}, [loss], scope=scope)
    names = [p.name for p in main.global_block().all_parameters()]
    before = {n: scope.find_var(n).get(nf.Tensor).numpy() for n in names}
    with pytest.raises(nf.errors.ExecutionError, match=r"Label holds 7 at \[1, 0\], outside"):
        exe.run(main, {"x": xs, "label": np.array([[0], [7], [2]])}, [loss], scope=scope)
    for name, want in before.items():
        np.testing.assert_array_equal(scope.find_var(name).get(nf.Tensor).numpy(), want)
    (again,) = exe.run(main, {"x": xs, "label": np.array([[0], [1], [2]])}, [loss], scope=scope)
    assert np.isfinite(again)


CUDA_PLACES = [p for p in DEVICE_PLACES if isinstance(p, nf.CUDAPlace)]


def _mlp_program(dropout: bool = False):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 8])
        label = nf.data("label", [-1, 1], "int64")
        h = nf.layers.fc(x, 16, act="relu")
        if dropout:
            h = nf.layers.dropout(h, 0.5)
        logits = nf.layers.fc(h, 4)
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
        nf.optimizer.Adam(0.01).minimize(loss)
    return main, startup, loss


def _capturable_program(dropout: bool = False):
    """A model with no matrix product: CuPy records no cuBLAS call in a CUDA graph, so a block
    with one (fc, conv) runs uncaptured. Two elementwise layers over 4 features, 4 classes."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4])
        label = nf.data("label", [-1, 1], "int64")
        w1 = nf.layers.create_parameter([4], "float32", name="w1")
        w2 = nf.layers.create_parameter([4], "float32", name="w2")
        b = nf.layers.create_parameter(
            [4], "float32", name="b", initializer=nf.initializer.Constant(0.1)
        )
        h = nf.layers.relu(nf.layers.elementwise_add(nf.layers.elementwise_mul(x, w1), b))
        if dropout:
            h = nf.layers.dropout(h, 0.5)
        logits = nf.layers.elementwise_mul(h, w2)
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
        nf.optimizer.Adam(0.01).minimize(loss)
    return main, startup, loss


def _feeds(rng, count: int, batch: int = 5):
    return [
        {
            "x": rng.standard_normal((batch, 4)).astype("float32"),
            "label": rng.integers(0, 4, (batch, 1)),
        }
        for _ in range(count)
    ]


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
def test_cuda_graph_replays_are_bit_identical_to_uncaptured_runs(place):
    """On CUDA a real capture; on the stand-in an emulated one (its graph runs the block again
    into the arrays the capture made), so the executor's side runs in make test."""
    main, startup, loss = _capturable_program()
    feeds = _feeds(np.random.default_rng(0), 6)
    runs = {}
    for captured in (False, True):
        exe, scope = nf.Executor(place, cuda_graph=captured), nf.Scope()
        nf.seed(7)  # the same initial parameters for both
        nf.Executor(nf.CPUPlace()).run(startup, scope=scope)
        losses = [exe.run(main, f, [loss], scope=scope)[0] for f in feeds]
        params = {
            p.name: scope.find_var(p.name).get(nf.Tensor).numpy()
            for p in main.global_block().all_parameters()
        }
        runs[captured] = (losses, params)
        if captured:
            assert exe.why_not_captured(main) is None
            assert exe._graphs.graphs, "the second run did not capture the block"
            # a parameter set from outside: the next run captures again, from the new value
            name = next(iter(params))
            scope.find_var(name).get(nf.Tensor).set(np.zeros_like(params[name]))
            again = exe.run(main, feeds[0], [loss], scope=scope)[0]
    (plain_losses, plain_params), (graph_losses, graph_params) = runs[False], runs[True]
    for a, b in zip(plain_losses, graph_losses):
        np.testing.assert_array_equal(a, b)
    for name, value in plain_params.items():
        np.testing.assert_array_equal(graph_params[name], value, err_msg=name)
    assert np.isfinite(again)


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
def test_cuda_graph_falls_back_for_random_ops_and_bad_ids_fail_a_replay(place):
    main, startup, loss = _capturable_program(dropout=True)
    exe, scope = nf.Executor(place, cuda_graph=True), nf.Scope()
    exe.run(startup, scope=scope)
    feed = {"x": np.ones((3, 4), "float32"), "label": np.array([[0], [1], [2]])}
    for _ in range(3):
        exe.run(main, feed, [loss], scope=scope)
    assert "dropout" in exe.why_not_captured(main)
    main, startup, loss = _capturable_program()
    exe, scope = nf.Executor(place, cuda_graph=True), nf.Scope()
    exe.run(startup, scope=scope)
    for _ in range(3):
        exe.run(main, feed, [loss], scope=scope)
    assert exe._graphs.graphs
    names = [p.name for p in main.global_block().all_parameters()]
    before = {n: scope.find_var(n).get(nf.Tensor).numpy() for n in names}
    with pytest.raises(nf.errors.ExecutionError, match="outside the 4 classes"):
        exe.run(main, dict(feed, label=np.array([[0], [9], [2]])), [loss], scope=scope)
    for name, want in before.items():
        np.testing.assert_array_equal(scope.find_var(name).get(nf.Tensor).numpy(), want)


def test_a_training_run_on_a_device_waits_for_it_only_to_fetch():
    """Kernels neither read device values on the host nor copy host scalars over (either
    makes the host wait for the GPU and keeps a block from being captured as a CUDA graph):
    a train step of an MLP and of a conv net on the stand-in reads its fetch and the device
    checks' flags, once each, and copies nothing over beyond the feeds."""
    from nestflow.core import standin

    place = StandInPlace(0)
    for build, feed in (
        (_mlp_program, {"x": np.ones((3, 8), "float32"), "label": np.array([[0], [1], [2]])}),
        (_conv_program, {"img": np.ones((2, 1, 8, 8), "float32"), "label": np.array([[0], [1]])}),
    ):
        main, startup, loss = build()
        exe, scope = nf.Executor(place), nf.Scope()
        exe.run(startup, scope=scope)
        exe.run(main, feed, [loss], scope=scope)
        with standin.recording_transfers() as transfers:
            exe.run(main, feed, [loss], scope=scope)
        assert sorted(kind for kind, _ in transfers) == ["read", "read"], transfers


def _conv_program():
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        img = nf.data("img", [-1, 1, 8, 8])
        label = nf.data("label", [-1, 1], "int64")
        h = nf.layers.conv2d(img, 4, 3, padding=1, act="relu")
        h = nf.layers.batch_norm(nf.layers.pool2d(h, 2, "max", 2))
        logits = nf.layers.fc(h, 3)
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
        nf.optimizer.Momentum(0.01, 0.9).minimize(loss)
    return main, startup, loss


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
def test_an_embedding_id_out_of_range_fails_the_run_on_a_device(place):
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        ids = nf.data("ids", [-1, 1], "int64")
        emb = nf.layers.embedding(ids, size=[5, 3])
        picked = nf.layers.gather(emb, nf.data("rows", [-1], "int64"))
    exe, scope = nf.Executor(place), nf.Scope()
    exe.run(startup, scope=scope)
    good = {"ids": np.array([[0], [4]]), "rows": np.array([1, 0])}
    assert exe.run(main, good, [picked], scope=scope)[0].shape == (2, 3)
    with pytest.raises(nf.errors.ExecutionError, match=r"Ids hold \[5\] outside the table"):
        exe.run(main, dict(good, ids=np.array([[0], [5]])), [picked], scope=scope)
    with pytest.raises(nf.errors.ExecutionError, match="gather from X .* index 2 at position"):
        exe.run(main, dict(good, rows=np.array([1, 2])), [picked], scope=scope)


def test_which_blocks_a_cuda_graph_can_capture():
    """Random ops (a replay would repeat their draws) and control flow (sub-blocks in scopes
    of their own, host reads) keep a program uncaptured; dropout at rate 0 or in test mode
    draws nothing."""
    from nestflow.executor.cuda_graph import _block_refusal

    def refusal(program):
        return _block_refusal(nf.Executor._plan(program))

    assert refusal(_mlp_program()[0]) is None
    assert "op 'dropout' draws random numbers" in refusal(_mlp_program(dropout=True)[0])
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        x = nf.data("x", [-1, 4])
        nf.layers.dropout(x, 0.5, is_test=True)
        nf.layers.dropout(x, 0.0)
    assert refusal(main) is None
    main = nf.Program()
    with nf.program_guard(main, nf.Program()):
        i = nf.layers.fill_constant([1], "int64", 0)
        cond = nf.layers.less_than(i, nf.layers.fill_constant([1], "int64", 3))
        loop = nf.layers.While(cond)
        with loop.block():
            nf.layers.increment(i, in_place=True)
            nf.layers.assign(nf.layers.less_than(i, nf.layers.fill_constant([1], "int64", 3)), cond)
    assert "control flow" in refusal(main)
    assert (
        nf.Executor(nf.CPUPlace(), cuda_graph=True)
        .why_not_captured(main)
        .startswith("cuda_graph is off")
    )


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
def test_cuda_graph_replays_feeds_that_are_already_on_the_device(place):
    main, startup, loss = _capturable_program()
    device = nf.device_context(place)
    (host,) = _feeds(np.random.default_rng(1), 1)
    feed = {name: device.to_device(value) for name, value in host.items()}
    runs = []
    for captured in (False, True):
        exe, scope = nf.Executor(place, cuda_graph=captured), nf.Scope()
        nf.seed(3)
        nf.Executor(nf.CPUPlace()).run(startup, scope=scope)
        runs.append([exe.run(main, feed, [loss], scope=scope)[0] for _ in range(4)])
        if captured:
            assert exe._graphs.graphs
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_device_checks_are_each_threads_own():
    """Runs on one place from two threads each read (or drop) their own checks."""
    import threading

    device = nf.device_context(StandInPlace(0))
    flag = device.to_device(np.array(True))
    device.check(flag, lambda: "this thread's bad input")
    seen = []
    other = threading.Thread(target=lambda: seen.append(list(device._pending_checks)))
    other.start()
    other.join()
    assert seen == [[]]
    with pytest.raises(nf.errors.ExecutionError, match="this thread's bad input"):
        device.raise_failed_checks()
    device.raise_failed_checks()  # forgotten once read


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
def test_a_bad_id_fails_a_sparse_update_before_it_writes_rows(place):
    """A sparse SGD update writes the table's rows in place on a device: the deferred id check
    is read first, so the failed run leaves the table as it was."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        ids = nf.data("ids", [-1, 1], "int64")
        emb = nf.layers.embedding(ids, size=[5, 3], is_sparse=True, param_attr="table")
        loss = nf.layers.mean(emb)
        nf.optimizer.SGD(0.5).minimize(loss)
    exe, scope = nf.Executor(place), nf.Scope()
    exe.run(startup, scope=scope)
    exe.run(main, {"ids": np.array([[0], [1]])}, [loss], scope=scope)
    before = scope.find_var("table").get(nf.Tensor).numpy()
    with pytest.raises(nf.errors.ExecutionError, match="outside the table"):
        exe.run(main, {"ids": np.array([[1], [7]])}, [loss], scope=scope)
    np.testing.assert_array_equal(scope.find_var("table").get(nf.Tensor).numpy(), before)


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
def test_cuda_graph_keeps_the_scope_and_fetched_tensors_safe(place):
    """A persistable the block only writes gets a scope array of its own, written after the
    checks pass; a device Tensor fetched earlier is a copy no replay rewrites; a fed
    persistable keeps the program uncaptured."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        x = nf.data("x", [-1, 4])
        label = nf.data("label", [-1, 1], "int64")
        w = nf.layers.create_parameter([3], "float32", name="w")
        b = nf.layers.create_parameter([3], "float32", name="b")
        logits = nf.layers.elementwise_add(nf.layers.elementwise_mul(x[:, :3], w), b)
        loss = nf.layers.mean(nf.layers.softmax_with_cross_entropy(logits, label))
        total = nf.layers.create_parameter([1], "float32", name="total")
        nf.layers.assign(nf.layers.reshape(loss, [1]), total)  # written, never read
        nf.optimizer.SGD(0.1).minimize(loss)
    exe, scope = nf.Executor(place, cuda_graph=True), nf.Scope()
    exe.run(startup, scope=scope)
    good = {"x": np.ones((3, 4), "float32"), "label": np.array([[0], [1], [2]])}
    (early,) = exe.run(main, good, ["w"], scope=scope, return_numpy=False)
    kept = early.numpy()
    for _ in range(3):
        exe.run(main, good, [loss], scope=scope)
    assert exe._graphs.graphs
    np.testing.assert_array_equal(early.numpy(), kept)
    total_before = scope.find_var("total").get(nf.Tensor).numpy()
    with pytest.raises(nf.errors.ExecutionError, match="outside the 3 classes"):
        exe.run(main, dict(good, label=np.array([[0], [5], [2]])), [loss], scope=scope)
    np.testing.assert_array_equal(scope.find_var("total").get(nf.Tensor).numpy(), total_before)
    (value,) = exe.run(main, good, [loss], scope=scope)
    np.testing.assert_allclose(scope.find_var("total").get(nf.Tensor).numpy(), [value], 1e-6)
    fed = dict(good, b=np.zeros(3, "float32"))  # a parameter the block reads
    for _ in range(3):
        exe.run(main, fed, [loss], scope=scope)
    assert list(exe._graphs.refused.values()) == ["a persistable variable is fed"]


@pytest.mark.parametrize("place", DEVICE_PLACES, ids=repr)
def test_a_block_with_a_matrix_product_runs_uncaptured_and_says_why(place):
    """CuPy refuses every cuBLAS call on a capturing stream (the stand-in's emulated capture
    refuses matrix products alike): a block with an fc falls back to uncaptured runs, which
    give what an executor without cuda_graph gives, and why_not_captured names cuBLAS."""
    main, startup, loss = _mlp_program()
    rng = np.random.default_rng(2)
    feeds = [
        {"x": rng.standard_normal((5, 8)).astype("float32"), "label": rng.integers(0, 4, (5, 1))}
        for _ in range(4)
    ]
    runs = []
    for captured in (False, True):
        exe, scope = nf.Executor(place, cuda_graph=captured), nf.Scope()
        nf.seed(5)
        nf.Executor(nf.CPUPlace()).run(startup, scope=scope)
        runs.append([exe.run(main, f, [loss], scope=scope)[0] for f in feeds])
    assert not exe._graphs.graphs
    reason = exe.why_not_captured(main)
    assert "cuBLAS" in reason and "op 'mul'" in reason, reason
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
