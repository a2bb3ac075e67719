"""nf.io: parameters as safetensors, inference models as protobuf + safetensors, atomic writes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

import nestflow as nf
from nestflow.io import atomic


def build_classifier():
    x = nf.data("x", shape=[-1, 6])
    label = nf.data("label", shape=[-1, 1], dtype="int64")
    h = nf.layers.fc(x, size=5, act="relu", name="fc1")
    p = nf.layers.fc(h, size=3, act="softmax", name="fc2")
    return x, label, p


@pytest.fixture
def trained():
    x, label, p = build_classifier()
    scope = nf.Scope()
    nf.Executor().run(nf.default_startup_program(), scope=scope)
    return nf.default_main_program(), scope, p


def value(scope, name):
    return scope.find_var(name).get(nf.Tensor).numpy()


def test_save_and_load_params_round_trip(trained, tmp_path):
    main, scope, _ = trained
    path = tmp_path / "params.safetensors"
    nf.io.save_params(scope, main, path)
    stored = safetensors.numpy.load(path.read_bytes())
    assert sorted(stored) == ["fc1.b", "fc1.w", "fc2.b", "fc2.w"]
    fresh = nf.Scope()
    nf.io.load_params(fresh, main, path)
    for name in stored:
        np.testing.assert_array_equal(value(fresh, name), value(scope, name))
        assert value(fresh, name).dtype == np.float32


def test_save_params_names_uninitialised_variables(tmp_path):
    build_classifier()
    with pytest.raises(nf.errors.UninitializedError, match="fc1.w"):
        nf.io.save_params(nf.Scope(), nf.default_main_program(), tmp_path / "p.safetensors")
    assert not (tmp_path / "p.safetensors").exists()


def write_tensors(path, tensors):
    path.write_bytes(safetensors.numpy.save(tensors))


def good_tensors(scope):
    return {n: value(scope, n) for n in ("fc1.w", "fc1.b", "fc2.w", "fc2.b")}


def test_load_reports_missing_tensors(trained, tmp_path):
    main, scope, _ = trained
    tensors = good_tensors(scope)
    del tensors["fc2.b"]
    write_tensors(tmp_path / "p.safetensors", tensors)
    with pytest.raises(nf.errors.ParameterFileError, match=r"missing from the file: \['fc2.b'\]"):
        nf.io.load_params(nf.Scope(), main, tmp_path / "p.safetensors")


def test_load_reports_extra_tensors_unless_not_strict(trained, tmp_path):
    main, scope, _ = trained
    tensors = good_tensors(scope) | {"stray": np.zeros(2, "float32")}
    write_tensors(tmp_path / "p.safetensors", tensors)
    with pytest.raises(nf.errors.ParameterFileError, match=r"not in the program: \['stray'\]"):
        nf.io.load_params(nf.Scope(), main, tmp_path / "p.safetensors")
    fresh = nf.Scope()
    nf.io.load_params(fresh, main, tmp_path / "p.safetensors", strict=False)
    np.testing.assert_array_equal(value(fresh, "fc1.w"), tensors["fc1.w"])


def test_load_reports_misshaped_and_mistyped_tensors_and_sets_nothing(trained, tmp_path):
    main, scope, _ = trained
    tensors = good_tensors(scope)
    tensors["fc1.w"] = np.zeros((5, 6), "float32")
    tensors["fc2.b"] = np.zeros(3, "float64")
    write_tensors(tmp_path / "p.safetensors", tensors)
    fresh = nf.Scope()
    with pytest.raises(nf.errors.ParameterFileError) as info:
        nf.io.load_params(fresh, main, tmp_path / "p.safetensors")
    message = str(info.value)
    assert "'fc1.w' is float32[5, 6] in the file but float32[6, 5]" in message
    assert "'fc2.b' is float64[3] in the file but float32[3]" in message
    assert fresh.find_var("fc1.b") is None  # the load is all or nothing


@pytest.mark.parametrize(
    "content", [b"", b"not a safetensors file at all", b"\xff" * 8 + b"{}", b"\x10\x00"]
)
def test_corrupt_parameter_file_is_a_parameter_file_error(trained, tmp_path, content):
    main, _, _ = trained
    (tmp_path / "p.safetensors").write_bytes(content)
    with pytest.raises(nf.errors.ParameterFileError, match="not a valid safetensors file"):
        nf.io.load_params(nf.Scope(), main, tmp_path / "p.safetensors")


def test_truncated_parameter_file_is_a_parameter_file_error(trained, tmp_path):
    main, scope, _ = trained
    path = tmp_path / "p.safetensors"
    nf.io.save_params(scope, main, path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(nf.errors.ParameterFileError, match="not a valid safetensors file"):
        nf.io.load_params(nf.Scope(), main, path)


def test_missing_parameter_file_is_a_parameter_file_error(trained, tmp_path):
    main, _, _ = trained
    with pytest.raises(nf.errors.ParameterFileError, match="cannot read"):
        nf.io.load_params(nf.Scope(), main, tmp_path / "absent.safetensors")


def test_crash_mid_save_keeps_the_old_file(trained, tmp_path, monkeypatch):
    main, scope, _ = trained
    path = tmp_path / "p.safetensors"
    nf.io.save_params(scope, main, path)
    good = path.read_bytes()
    scope.find_var("fc1.w").get(nf.Tensor).set(np.ones((6, 5), "float32"))

    def crash_half_way(file, data):
        file.write(data[: len(data) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(atomic, "write_chunks", crash_half_way)
    with pytest.raises(nf.errors.FileWriteError, match="disk full"):
        nf.io.save_params(scope, main, path)
    assert path.read_bytes() == good
    assert os.listdir(tmp_path) == ["p.safetensors"]  # no temporary file left behind


def test_failed_rename_keeps_the_old_file(trained, tmp_path, monkeypatch):
    main, scope, _ = trained
    path = tmp_path / "p.safetensors"
    nf.io.save_params(scope, main, path)
    good = path.read_bytes()
    scope.find_var("fc1.w").get(nf.Tensor).set(np.ones((6, 5), "float32"))

    def no_rename(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(atomic.os, "replace", no_rename)
    with pytest.raises(nf.errors.FileWriteError, match="rename failed"):
        nf.io.save_params(scope, main, path)
    assert path.read_bytes() == good
    assert os.listdir(tmp_path) == ["p.safetensors"]


def test_saving_into_a_missing_directory_is_a_file_write_error(trained, tmp_path):
    main, scope, _ = trained
    path = tmp_path / "absent" / "p.safetensors"
    with pytest.raises(nf.errors.FileWriteError, match="cannot write .*absent") as info:
        nf.io.save_params(scope, main, path)
    assert isinstance(info.value, OSError)  # still an OSError for code that catches those
    assert not (tmp_path / "absent").exists()


def test_inference_model_round_trip_in_process(trained, tmp_path):
    main, scope, p = trained
    saved = nf.io.save_inference_model(tmp_path / "m", ["x"], [p], main, scope)
    assert "label" not in saved.global_block().vars
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["feed"] == ["x"] and meta["fetch"] == [p.name]
    files = [meta["program"]["file"], meta["params"]["file"]]
    assert sorted(os.listdir(tmp_path / "m")) == sorted(["model.json", *files])
    assert (tmp_path / "m" / files[0]).read_bytes() == saved.to_bytes()
    program, feeds, fetches, loaded = nf.io.load_inference_model(tmp_path / "m")
    xs = np.random.default_rng(3).standard_normal((4, 6)).astype("float32")
    exe = nf.Executor()
    (want,) = exe.run(main, feed={"x": xs}, fetch_list=[p], scope=scope)
    (got,) = exe.run(program, feed={feeds[0]: xs}, fetch_list=fetches, scope=loaded)
    np.testing.assert_array_equal(got, want)


def test_inference_model_loads_in_a_fresh_process(trained, tmp_path):
    main, scope, p = trained
    nf.io.save_inference_model(tmp_path / "m", ["x"], [p], main, scope)
    xs = np.random.default_rng(4).standard_normal((3, 6)).astype("float32")
    np.save(tmp_path / "x.npy", xs)
    (want,) = nf.Executor().run(main, feed={"x": xs}, fetch_list=[p], scope=scope)
    script = f"""
import numpy as np, nestflow as nf, pathlib
d = pathlib.Path({str(tmp_path)!r})
program, feeds, fetches, scope = nf.io.load_inference_model(d / "m")
out, = nf.Executor().run(program, feed={{feeds[0]: np.load(d / "x.npy")}}, fetch_list=fetches,
                         scope=scope)
np.save(d / "out.npy", out)
"""
    subprocess.run([sys.executable, "-c", script], check=True)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)


def test_inference_model_needs_every_non_parameter_input_fed(trained, tmp_path):
    main, scope, p = trained
    with pytest.raises(nf.errors.FeedError, match="'x', which is neither fed"):
        nf.io.save_inference_model(tmp_path / "m", [], [p], main, scope)
    assert not (tmp_path / "m" / "model.json").exists()


def test_inference_model_keeps_a_declared_feed_the_targets_do_not_read(trained, tmp_path):
    main, scope, p = trained
    nf.io.save_inference_model(tmp_path / "m", ["x", "label"], [p], main, scope)
    program, feeds, fetches, loaded = nf.io.load_inference_model(tmp_path / "m")
    assert feeds == ["x", "label"]
    feed = {"x": np.zeros((2, 6), "float32"), "label": np.zeros((2, 1), "int64")}
    (out,) = nf.Executor().run(program, feed=feed, fetch_list=fetches, scope=loaded)
    assert out.shape == (2, 3)


def test_loading_a_directory_without_a_model_is_a_clear_error(tmp_path):
    with pytest.raises(nf.errors.ProgramDecodeError, match="holds no saved model"):
        nf.io.load_inference_model(tmp_path)
    (tmp_path / "model.json").write_text("{not json")
    with pytest.raises(nf.errors.ProgramDecodeError, match="not a nestflow model description"):
        nf.io.load_inference_model(tmp_path)


def test_corrupt_model_program_is_a_program_decode_error(trained, tmp_path):
    main, scope, p = trained
    nf.io.save_inference_model(tmp_path / "m", ["x"], [p], main, scope)
    name = json.loads((tmp_path / "m" / "model.json").read_text())["program"]["file"]
    (tmp_path / "m" / name).write_bytes(b"\x0a\xff\xff garbage")
    with pytest.raises(nf.errors.ProgramDecodeError, match=f"program file .*{name}.* corrupt"):
        nf.io.load_inference_model(tmp_path / "m")
