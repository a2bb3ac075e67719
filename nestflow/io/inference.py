"""An inference model: a directory with the pruned program and its parameters.

    model.pb             the ProgramDesc pruned to the fetch targets (protobuf bytes)
    params.safetensors   its persistable tensors
    model.json           {"feed": [...], "fetch": [...]}: what to feed and what to fetch

Each file is written atomically; model.json is written last, so a directory whose save was cut
short is not mistaken for a complete model. model.json and the parameter file's header carry the
same save id: a save cut short after the parameters were replaced (new parameters beside the old
program) fails to load with a clear error instead of loading a mix of two saves. A parameter
file written by save_params (no save id) is accepted in their place.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence

from nestflow.core.scope import Scope
from nestflow.errors import FeedError, ProgramDecodeError
from nestflow.executor.plan import BlockPlan
from nestflow.executor.prune import prune, target_names
from nestflow.framework.program import Program, VarDesc
from nestflow.io.atomic import write_atomic
from nestflow.io.params import load_params, read_metadata, write_params

MODEL_FILE = "model.pb"
PARAMS_FILE = "params.safetensors"
META_FILE = "model.json"
SAVE_ID = "save_id"


def save_inference_model(
    dirname: str | os.PathLike,
    feeded_var_names: Sequence[str | VarDesc],
    target_vars: Sequence[VarDesc | str] | VarDesc,
    program: Program,
    scope: Scope,
) -> Program:
    """Prune `program` to `target_vars` (inference behaviour: is_test ops), save it and the
    parameters it reads from `scope` under `dirname`; returns the saved program.

    Raises FeedError if the targets need a non-persistable variable not in `feeded_var_names`.
    """
    feed_names = target_names(list(feeded_var_names))
    fetch_names = target_names(target_vars)
    small = prune(program, fetch_names).clone(for_test=True)
    glob = small.global_block()
    for name in feed_names:
        if glob.find_var(name) is None:
            original = program.global_block().find_var(name)
            if original is None:
                raise FeedError(f"feed '{name}' is not a variable of the program")
            # Kept so that feeding it is accepted, although the targets do not read it.
            glob.create_var(name, original.shape, original.dtype, stop_gradient=True)
    for name in BlockPlan(glob).external_inputs:
        var = glob.find_var(name)
        if name not in feed_names and (var is None or not var.persistable):
            raise FeedError(
                f"the targets {fetch_names} need variable '{name}', which is neither fed "
                f"(feeds: {feed_names}) nor a parameter"
            )
    os.makedirs(dirname, exist_ok=True)
    save_id = uuid.uuid4().hex
    write_params(scope, small, os.path.join(dirname, PARAMS_FILE), {SAVE_ID: save_id})
    write_atomic(os.path.join(dirname, MODEL_FILE), small.to_bytes())
    meta = {"format": "nestflow.inference_model", "version": 1, SAVE_ID: save_id}
    meta |= {"feed": feed_names, "fetch": fetch_names}
    write_atomic(os.path.join(dirname, META_FILE), json.dumps(meta, indent=2).encode())
    return small


def load_inference_model(
    dirname: str | os.PathLike, scope: Scope | None = None
) -> tuple[Program, list[str], list[str], Scope]:
    """Read a model saved by save_inference_model: (program, feed names, fetch names, scope
    holding its parameters). Run it with `Executor().run(program, feed=..., fetch_list=fetch,
    scope=scope)`. Raises ProgramDecodeError for a bad directory or model.pb and
    ParameterFileError for a parameter file that does not fit."""
    meta_path = os.path.join(dirname, META_FILE)
    try:
        with open(meta_path, "rb") as file:
            meta = json.loads(file.read())
        feed_names, fetch_names = list(meta["feed"]), list(meta["fetch"])
    except OSError as exc:
        raise ProgramDecodeError(f"'{dirname}' holds no saved model: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ProgramDecodeError(
            f"'{meta_path}' is not a nestflow model description: {exc}"
        ) from None
    try:
        with open(os.path.join(dirname, MODEL_FILE), "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ProgramDecodeError(f"cannot read the model program: {exc}") from None
    params_path = os.path.join(dirname, PARAMS_FILE)
    params_id = read_metadata(params_path).get(SAVE_ID)
    if params_id and meta.get(SAVE_ID) and params_id != meta[SAVE_ID]:
        raise ProgramDecodeError(
            f"'{params_path}' comes from another save than '{meta_path}': a save into "
            f"'{dirname}' was cut short after writing the parameters; save the model again"
        )
    program = Program.from_bytes(data)
    scope = scope if scope is not None else Scope()
    load_params(scope, program, os.path.join(dirname, PARAMS_FILE))
    return program, feed_names, fetch_names, scope


__all__ = ["load_inference_model", "save_inference_model"]
