"""Integrity (issue 12 item 8): every file of a saved model is covered by a SHA-256 (the
program and parameter files by model.json's, model.json by its own), so a flipped bit in any
byte of any of them is an error naming the file: ProgramDecodeError for model.json and the
program, ParameterFileError for the parameters. A save_params file carries a checksum of its
tensors in its header: a flip either fails to load or leaves every value as saved."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import nestflow as nf
from nestflow.errors import ParameterFileError, ProgramDecodeError

from .two_models import build, which_model


@pytest.fixture(scope="module")
def small():
    """A small model: each of its files is a few kB, so every byte of each can be flipped."""
    return build("small", "relu", 1, hidden=6), build("other", "tanh", 2, hidden=6)


@pytest.fixture
def saved(small, tmp_path):
    small[0].save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    files = {
        "manifest": ("model.json", ProgramDecodeError),
        "program": (meta["program"]["file"], ProgramDecodeError),
        "params": (meta["params"]["file"], ParameterFileError),
    }
    return tmp_path / "m", files


def _flips(size: int, seed: int) -> list[tuple[int, int]]:
    """One flipped bit (chosen at random, seeded) in every byte."""
    bits = np.random.default_rng(seed).integers(0, 8, size)
    return [(i, 1 << int(bit)) for i, bit in enumerate(bits)]


@pytest.mark.parametrize("role", ["manifest", "program", "params"])
def test_a_flipped_bit_anywhere_in_a_saved_file_is_an_error_naming_it(small, saved, role):
    directory, files = saved
    name, error = files[role]
    path = directory / name
    good = path.read_bytes()
    flips = _flips(len(good), seed=len(good))
    assert len(flips) > 300
    for position, bit in flips:
        flipped = bytearray(good)
        flipped[position] ^= bit
        path.write_bytes(bytes(flipped))
        with pytest.raises(error) as info:
            nf.io.load_inference_model(directory)
        assert name in str(info.value), (position, bit, str(info.value))
    path.write_bytes(good)
    assert which_model(directory, small) == "small"


@pytest.mark.parametrize("role", ["manifest", "program", "params"])
def test_a_truncated_or_emptied_file_is_an_error_naming_it(saved, role):
    directory, files = saved
    name, error = files[role]
    good = (directory / name).read_bytes()
    for cut in (0, 1, len(good) // 2, len(good) - 1):
        (directory / name).write_bytes(good[:cut])
        with pytest.raises(error, match=name.replace(".", r"\.")):
            nf.io.load_inference_model(directory)


def test_a_file_from_another_save_is_refused_naming_it(small, saved, tmp_path):
    """Files that are each valid, but not the ones the model was saved with: the parameters
    (or program) of another save put in their place."""
    directory, files = saved
    small[1].save(tmp_path / "other")
    other = json.loads((tmp_path / "other" / "model.json").read_text())
    for role, error in (("params", ParameterFileError), ("program", ProgramDecodeError)):
        mine = directory / files[role][0]
        good = mine.read_bytes()
        shutil.copyfile(tmp_path / "other" / other[role]["file"], mine)
        with pytest.raises(error, match=f"{files[role][0]}' is corrupt: its SHA-256"):
            nf.io.load_inference_model(directory)
        mine.write_bytes(good)
    assert which_model(directory, small) == "small"


def test_a_hand_edited_model_json_is_refused(saved):
    """model.json's own checksum: a feed or fetch name changed after the save (one bit turns
    'fc2.tmp_1' into 'fc2.tmp_0') would silently fetch another variable."""
    directory, _ = saved
    meta = json.loads((directory / "model.json").read_text())
    meta["fetch"] = [meta["fetch"][0][:-1] + "0"]
    (directory / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ProgramDecodeError, match="model.json.*changed after the save"):
        nf.io.load_inference_model(directory)


def test_save_params_file_a_flip_fails_or_changes_nothing(small, tmp_path):
    """Without a manifest the file's header carries the checksum of its tensors: a flip in
    the tensors' bytes (or their names, dtypes, shapes) is a ParameterFileError naming the
    file; a flip elsewhere in the header either fails to parse or loads the same values."""
    model = small[0]
    path = tmp_path / "p.safetensors"
    model.save_params(path)
    good = path.read_bytes()
    header_end = 8 + int.from_bytes(good[:8], "little")
    failed = 0
    for position, bit in _flips(len(good), seed=7):
        flipped = bytearray(good)
        flipped[position] ^= bit
        path.write_bytes(bytes(flipped))
        scope = nf.Scope()
        try:
            nf.io.load_params(scope, model.main, path)
        except ParameterFileError as exc:
            assert str(path) in str(exc)
            failed += 1
            continue
        assert position < header_end, f"a flip in the tensor bytes at {position} loaded"
        for name, value in model.params.items():
            np.testing.assert_array_equal(scope.find_var(name).get(nf.Tensor).numpy(), value)
    assert failed > 0.9 * len(good)


def test_checksum_mismatch_message_says_what_changed(small, tmp_path):
    model = small[0]
    path = tmp_path / "p.safetensors"
    model.save_params(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(ParameterFileError, match=r"p\.safetensors' is corrupt: its tensors' SHA"):
        nf.io.load_params(nf.Scope(), model.main, path)


def test_parameter_files_without_a_checksum_still_load(small, tmp_path):
    """Files written before the checksum existed (or by other safetensors writers)."""
    import safetensors.numpy

    model = small[0]
    path = tmp_path / "p.safetensors"
    path.write_bytes(safetensors.numpy.save(model.params))
    scope = nf.Scope()
    nf.io.load_params(scope, model.main, path)
    for name, value in model.params.items():
        np.testing.assert_array_equal(scope.find_var(name).get(nf.Tensor).numpy(), value)
