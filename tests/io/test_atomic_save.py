"""Saves are all or nothing at every instant (issue 12 item 3): the directory is copied at
every step of a save (each write, half way through each write, each rename and removal), as a
process killed right there would leave it, and each copy must load as the complete old or the
complete new model; what the killed save left is removed by the next save, or load."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

import nestflow as nf
from nestflow.errors import FileWriteError, ParameterFileError, ProgramDecodeError
from nestflow.io import atomic, inference

from .two_models import model_files, pair, which_model, which_params


@pytest.fixture(scope="module")
def models():
    return pair()


class StopTheWorld:
    """Copies `target` (a directory, or a file's directory) at every step a save takes on
    disk, as a process killed at that instant would leave it."""

    def __init__(self, monkeypatch, target: Path, out: Path):
        self.target, self.out, self.copies = target, out, []
        chunks, replace, remove = atomic.write_chunks, atomic.replace_file, atomic.remove_file

        def write_chunks(file, data):
            self.copy("before a write")
            half = len(data) // 2
            chunks(file, data[:half])
            file.flush()
            self.copy("half way through a write")
            chunks(file, data[half:])
            file.flush()
            self.copy("after a write")

        def replace_file(source, target):
            self.copy("before a rename")
            replace(source, target)
            self.copy("after a rename")

        def remove_file(path):
            self.copy("before a removal")
            remove(path)
            self.copy("after a removal")

        monkeypatch.setattr(atomic, "write_chunks", write_chunks)
        monkeypatch.setattr(atomic, "replace_file", replace_file)
        monkeypatch.setattr(atomic, "remove_file", remove_file)

    def copy(self, step: str) -> None:
        where = self.out / f"{len(self.copies):03d}"
        shutil.copytree(self.target, where)
        self.copies.append((step, where))


def _copy(source: Path, to: Path) -> Path:
    shutil.copytree(source, to)
    return to


def _write_v1(directory: Path, model) -> None:
    """A directory as nestflow wrote inference models before model.json named its files
    (version 1: fixed names, parameters tagged with the save's id)."""
    scratch = directory.parent / (directory.name + "-scratch")
    model.save(scratch)
    meta = json.loads((scratch / "model.json").read_text())
    directory.mkdir()
    (directory / "model.pb").write_bytes((scratch / meta["program"]["file"]).read_bytes())
    tensors = safetensors.numpy.load((scratch / meta["params"]["file"]).read_bytes())
    metadata = {"format": "nestflow.params", "version": "1", "save_id": "ab" * 16}
    (directory / "params.safetensors").write_bytes(safetensors.numpy.save(tensors, metadata))
    v1 = {"format": "nestflow.inference_model", "version": 1, "save_id": "ab" * 16}
    (directory / "model.json").write_text(json.dumps(v1 | {"feed": ["x"], "fetch": meta["fetch"]}))
    shutil.rmtree(scratch)


@pytest.mark.parametrize("start", ["empty", "saved", "version 1"])
def test_every_step_of_a_save_leaves_the_old_or_the_new_model_whole(
    models, tmp_path, monkeypatch, start
):
    old, new = models
    target = tmp_path / "m"
    if start == "saved":
        old.save(target)
    elif start == "version 1":
        _write_v1(target, old)
        assert which_model(target, models) == "old"
    else:
        target.mkdir()
    world = StopTheWorld(monkeypatch, target, tmp_path / "copies")
    new.save(target)
    monkeypatch.undo()
    # 3 writes (3 copies each), the rename of model.json (2), removing the old files (2 each)
    assert len(world.copies) >= (11 if start == "empty" else 15)
    seen = []
    for step, copy in world.copies:
        leftovers = set(os.listdir(copy)) - {"model.json", "model.pb", "params.safetensors"}
        if (copy / "model.json").exists() and json.loads((copy / "model.json").read_text())[
            "version"
        ] == 2:
            leftovers = model_files(copy)[1]
        assert len(leftovers) <= 3, (step, leftovers)  # one unfinished save at most
        if start == "empty" and not seen[-1:] == ["new"]:
            try:
                seen.append(which_model(copy, models))
            except ProgramDecodeError as exc:  # nothing was ever saved there yet
                assert "holds no saved model" in str(exc), step
                seen.append(None)
        else:
            seen.append(which_model(copy, models))
    # Old (or nothing) up to one rename of model.json, new from there on.
    switch = seen.index("new")
    assert set(seen[:switch]) <= {"old", None} and set(seen[switch:]) == {"new"}, seen
    assert world.copies[switch - 1][0] == "before a rename"
    assert world.copies[switch][0] == "after a rename"
    # The save itself ends with exactly the new model's files.
    named, others = model_files(target)
    assert others == set() and len(named) == 3


@pytest.mark.parametrize("start", ["saved", "version 1"])
def test_the_next_save_or_load_removes_what_a_killed_save_left(
    models, tmp_path, monkeypatch, start
):
    """From each state a kill could leave: the next save leaves only its own files; a load
    (no save under way) leaves only the files model.json names; neither loses the model."""
    old, new = models
    target = tmp_path / "m"
    old.save(target) if start == "saved" else _write_v1(target, old)
    world = StopTheWorld(monkeypatch, target, tmp_path / "copies")
    new.save(target)
    monkeypatch.undo()
    for i, (step, copy) in enumerate(world.copies):
        saved_again = _copy(copy, tmp_path / f"save-{i}")
        old.save(saved_again)
        named, others = model_files(saved_again)
        assert others == set() and len(named) == 3, (step, others)
        assert which_model(saved_again, models) == "old"
        loaded = _copy(copy, tmp_path / f"load-{i}")
        got = which_model(loaded, models)
        if json.loads((loaded / "model.json").read_text())["version"] == 2:
            # Version 1's fixed-name files are left to the next save (loads remove only
            # files of the current naming scheme).
            assert model_files(loaded)[1] <= {"model.pb", "params.safetensors"}, step
        else:  # a version 1 model.json is current: its temporaries are left to its saves
            assert got == "old"


WRITES = ["program file", "parameter file", "model.json"]


@pytest.mark.parametrize("failing", range(len(WRITES)), ids=WRITES)
def test_a_failed_write_leaves_the_old_model_and_nothing_else(
    models, tmp_path, monkeypatch, failing
):
    old, new = models
    old.save(tmp_path / "m")
    before = sorted(os.listdir(tmp_path / "m"))
    writes = []
    real = atomic.write_chunks

    def fail_one(file, data):
        writes.append(len(data))
        if len(writes) == failing + 1:
            file.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")
        real(file, data)

    monkeypatch.setattr(atomic, "write_chunks", fail_one)
    with pytest.raises(FileWriteError, match="No space left on device") as info:
        new.save(tmp_path / "m")
    assert isinstance(info.value, OSError)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path / "m")) == before
    assert which_model(tmp_path / "m", models) == "old"


def test_a_failed_rename_or_an_interrupt_leaves_the_old_model_and_nothing_else(
    models, tmp_path, monkeypatch
):
    old, new = models
    old.save(tmp_path / "m")
    before = sorted(os.listdir(tmp_path / "m"))

    def no_rename(source, target):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic, "replace_file", no_rename)
    with pytest.raises(FileWriteError, match="Input/output error"):
        new.save(tmp_path / "m")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path / "m")) == before

    def interrupted(file, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "write_chunks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        new.save(tmp_path / "m")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path / "m")) == before
    assert which_model(tmp_path / "m", models) == "old"


def test_a_save_whose_cleanup_fails_still_saved_and_the_next_save_cleans_up(
    models, tmp_path, monkeypatch
):
    old, new = models
    old.save(tmp_path / "m")
    old_files = model_files(tmp_path / "m")[0] - {"model.json"}

    def cannot_remove(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(atomic, "remove_file", cannot_remove)
    new.save(tmp_path / "m")
    monkeypatch.undo()
    assert model_files(tmp_path / "m")[1] == old_files
    assert which_model(_copy(tmp_path / "m", tmp_path / "c"), models) == "new"
    old.save(tmp_path / "m")
    assert model_files(tmp_path / "m")[1] == set()
    assert which_model(tmp_path / "m", models) == "old"


def _leftovers(directory: Path) -> set[str]:
    """Files as a killed save would leave them (an unfinished generation, a manifest temp)."""
    names = {"model.0123456789abcdef.pb", "params.0123456789abcdef.safetensors"}
    names.add(".model.json.abcd1234.tmp")
    for name in names:
        (directory / name).write_bytes(b"partial")
    return names


def test_a_load_removes_nothing_while_a_save_holds_the_directory(models, tmp_path):
    """The rule that keeps loads from removing files a concurrent save is writing: a load
    removes leftovers only if it gets the directory lock without waiting."""
    old, _ = models
    old.save(tmp_path / "m")
    left = _leftovers(tmp_path / "m")
    (tmp_path / "m" / "notes.txt").write_text("not nestflow's")
    holding, release = threading.Event(), threading.Event()

    def save_in_progress():
        with atomic.directory_lock(tmp_path / "m"):
            holding.set()
            release.wait(30)

    saver = threading.Thread(target=save_in_progress)
    saver.start()
    try:
        assert holding.wait(30)
        assert which_model(tmp_path / "m", models) == "old"
        assert left <= set(os.listdir(tmp_path / "m"))
    finally:
        release.set()
        saver.join()
    assert which_model(tmp_path / "m", models) == "old"
    assert model_files(tmp_path / "m")[1] == {"notes.txt"}  # only nestflow's leftovers go


def test_a_save_removes_leftovers_before_writing(models, tmp_path, monkeypatch):
    """Killed saves cannot pile up: what one left is gone before the next writes a byte."""
    old, new = models
    old.save(tmp_path / "m")
    left = _leftovers(tmp_path / "m")
    present_at_first_write = []
    real = atomic.write_chunks

    def look(file, data):
        if not present_at_first_write:
            present_at_first_write.append(set(os.listdir(tmp_path / "m")))
        real(file, data)

    monkeypatch.setattr(atomic, "write_chunks", look)
    new.save(tmp_path / "m")
    assert not left & present_at_first_write[0]


def test_a_load_that_races_a_save_reads_the_newer_model(models, tmp_path, monkeypatch):
    """A load that read model.json just before a save switched it and removed the files it
    named reads model.json again, and gets the new model."""
    old, new = models
    old.save(tmp_path / "m")
    stale = inference._read_manifest(os.fspath(tmp_path / "m"))
    new.save(tmp_path / "m")
    real, calls = inference._read_manifest, []

    def first_stale(dirname):
        calls.append(dirname)
        return stale if len(calls) == 1 else real(dirname)

    monkeypatch.setattr(inference, "_read_manifest", first_stale)
    assert which_model(tmp_path / "m", models) == "new"
    assert len(calls) >= 2


def test_a_named_file_that_is_gone_is_an_error_naming_it(models, tmp_path):
    old, _ = models
    old.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    os.unlink(tmp_path / "m" / meta["params"]["file"])
    with pytest.raises(ParameterFileError, match=f"{meta['params']['file']}.* is missing"):
        nf.io.load_inference_model(tmp_path / "m")
    os.unlink(tmp_path / "m" / meta["program"]["file"])
    with pytest.raises(ProgramDecodeError, match=f"{meta['program']['file']}.* is missing"):
        nf.io.load_inference_model(tmp_path / "m")


def test_saves_and_loads_on_threads_at_once_always_see_a_whole_model(models, tmp_path):
    """Two threads saving old and new into one directory (they take turns) while this one
    loads: every load is one model whole, and the directory ends with one model's files."""
    old, new = models
    old.save(tmp_path / "m")
    errors = []

    def saver(model, times):
        try:
            for _ in range(times):
                model.save(tmp_path / "m")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=saver, args=(m, 8)) for m in (old, new)]
    for thread in threads:
        thread.start()
    seen = set()
    while any(t.is_alive() for t in threads):
        seen.add(which_model(tmp_path / "m", models))
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert seen <= {"old", "new"}
    assert model_files(tmp_path / "m")[1] == set()


def test_version_1_directories_still_load_and_a_save_replaces_their_files(models, tmp_path):
    old, new = models
    _write_v1(tmp_path / "m", old)
    assert which_model(tmp_path / "m", models) == "old"
    new.save(tmp_path / "m")
    named, others = model_files(tmp_path / "m")
    assert others == set() and "model.pb" not in named
    assert which_model(tmp_path / "m", models) == "new"


def test_a_version_1_save_cut_short_is_still_refused(models, tmp_path):
    """Version 1's guard stays: its parameters from another save than its model.json."""
    old, _ = models
    _write_v1(tmp_path / "m", old)
    data = (tmp_path / "m" / "params.safetensors").read_bytes()
    tensors = safetensors.numpy.load(data)
    meta = {"format": "nestflow.params", "version": "1", "save_id": "cd" * 16}
    (tmp_path / "m" / "params.safetensors").write_bytes(safetensors.numpy.save(tensors, meta))
    with pytest.raises(ProgramDecodeError, match="cut short"):
        nf.io.load_inference_model(tmp_path / "m")


# save_params: one file, replaced by one rename


def test_every_step_of_save_params_leaves_the_old_or_the_new_file(models, tmp_path, monkeypatch):
    old, new = models
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "p.safetensors"
    old.save_params(path)
    world = StopTheWorld(monkeypatch, tmp_path / "d", tmp_path / "copies")
    new.save_params(path)
    monkeypatch.undo()
    seen = [which_params(copy / "p.safetensors", models) for _, copy in world.copies]
    switch = seen.index("new")
    assert set(seen[:switch]) == {"old"} and set(seen[switch:]) == {"new"}
    assert world.copies[switch][0] == "after a rename"
    for i, (_, copy) in enumerate(world.copies):
        assert len(os.listdir(copy)) <= 2
        old.save_params(copy / "p.safetensors")  # removes what the killed write left
        assert os.listdir(copy) == ["p.safetensors"], i
    assert os.listdir(tmp_path / "d") == ["p.safetensors"]


def test_save_params_removes_only_its_own_files_leftovers(models, tmp_path):
    old, _ = models
    mine, theirs = (
        tmp_path / ".p.safetensors.k3j_x9a2.tmp",
        tmp_path / ".q.safetensors.abcdefgh.tmp",
    )
    for path in (mine, theirs, tmp_path / ".p.safetensors.tmp"):
        path.write_bytes(b"partial")
    old.save_params(tmp_path / "p.safetensors")
    assert sorted(os.listdir(tmp_path)) == [
        ".p.safetensors.tmp",  # not a name write_atomic gives: not ours
        ".q.safetensors.abcdefgh.tmp",
        "p.safetensors",
    ]
    scope = nf.Scope()
    nf.io.load_params(scope, old.main, tmp_path / "p.safetensors")
    np.testing.assert_array_equal(
        scope.find_var("fc1.w").get(nf.Tensor).numpy(), old.params["fc1.w"]
    )


def test_a_directory_that_cannot_be_read_is_still_written_all_or_nothing(
    models, tmp_path, monkeypatch
):
    """A directory one may write but not list (mode -wx): no lock and no leftover removal,
    the file is still replaced by one rename."""
    old, new = models
    path = tmp_path / "p.safetensors"
    old.save_params(path)
    real_open = os.open

    def no_read(file, flags, *args, **kwargs):
        if os.fspath(file) == os.fspath(tmp_path) and flags == os.O_RDONLY:
            raise PermissionError(13, "Permission denied", file)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_read)
    new.save_params(path)
    monkeypatch.undo()
    assert which_params(path, models) == "new"
    assert os.listdir(tmp_path) == ["p.safetensors"]
