"""Two inference models told apart by program and by every parameter, for the tests of saves
cut short: a load must give one of them whole, never a mix."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import nestflow as nf

INPUT = np.random.default_rng(0).standard_normal((5, 64)).astype("float32")


@dataclass
class SavedModel:
    name: str
    main: nf.Program
    scope: nf.Scope
    fetch: nf.framework.program.VarDesc
    params: dict[str, np.ndarray]
    output: np.ndarray

    def save(self, dirname: str | os.PathLike) -> None:
        nf.io.save_inference_model(dirname, ["x"], [self.fetch], self.main, self.scope)

    def save_params(self, path: str | os.PathLike) -> None:
        nf.io.save_params(self.scope, self.main, path)


def build(name: str, act: str, seed: int, hidden: int = 256) -> SavedModel:
    """x [-1, 64] -> fc(hidden, act) -> fc(4): the same parameter names and shapes whatever
    `act`, so only their values and the program tell two models apart."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        x = nf.data("x", [-1, 64])
        out = nf.layers.fc(nf.layers.fc(x, hidden, act=act, name="fc1"), 4, name="fc2")
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(seed)
    params = {}
    for var in nf.io.persistable_vars(main):
        tensor = scope.find_var(var.name).get(nf.Tensor)
        tensor.set(rng.standard_normal(tensor.shape).astype("float32"))
        params[var.name] = tensor.numpy().copy()
    (output,) = exe.run(main, feed={"x": INPUT}, fetch_list=[out], scope=scope)
    return SavedModel(name, main, scope, out, params, output)


def pair() -> tuple[SavedModel, SavedModel]:
    return build("old", "relu", 1), build("new", "tanh", 2)


def which_model(dirname: str | os.PathLike, models: tuple[SavedModel, ...]) -> str:
    """The name of the model `dirname` loads as, checked whole: every parameter and the
    program's output equal that model's exactly. AssertionError for a mix or anything else."""
    program, feeds, fetches, scope = nf.io.load_inference_model(dirname)
    assert feeds == ["x"] and len(fetches) == 1, (feeds, fetches)
    loaded = {
        var.name: scope.find_var(var.name).get(nf.Tensor).numpy()
        for var in nf.io.persistable_vars(program)
    }
    (output,) = nf.Executor().run(program, feed={"x": INPUT}, fetch_list=fetches, scope=scope)
    for model in models:
        if sorted(loaded) == sorted(model.params) and all(
            np.array_equal(loaded[n], model.params[n]) for n in loaded
        ):
            assert np.array_equal(output, model.output), f"{model.name}'s parameters, other program"
            return model.name
    raise AssertionError(f"'{dirname}' loads as none of {[m.name for m in models]}")


def which_params(path: str | os.PathLike, models: tuple[SavedModel, ...]) -> str:
    """The name of the model whose parameters the file at `path` holds, exactly."""
    scope = nf.Scope()
    nf.io.load_params(scope, models[0].main, path)
    for model in models:
        if all(
            np.array_equal(scope.find_var(n).get(nf.Tensor).numpy(), v)
            for n, v in model.params.items()
        ):
            return model.name
    raise AssertionError(f"'{path}' holds the parameters of none of {[m.name for m in models]}")


def model_files(dirname: str | os.PathLike) -> tuple[set[str], set[str]]:
    """(the files model.json names plus model.json itself, every other file) in `dirname`."""
    names = set(os.listdir(dirname))
    meta = json.loads(Path(dirname, "model.json").read_bytes())
    named = {"model.json", meta["program"]["file"], meta["params"]["file"]}
    return named & names, names - named
