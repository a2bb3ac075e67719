"""An inference model: a directory with the pruned program, its parameters, and a manifest.

    model.json                  the manifest: what to feed and fetch, and which files hold the
                                model, each with its SHA-256 (and the manifest's own)
    model.<id>.pb               the ProgramDesc pruned to the fetch targets (protobuf bytes)
    params.<id>.safetensors     its persistable tensors

A save is all or nothing at every instant (kill -9 included). It writes the program and the
parameters under names no earlier save used (a fresh <id>), flushes them to disk, then makes
them current with one atomic rename of model.json; only then are the previous save's files
removed. A load reads model.json and only the files it names, and checks every checksum: a
changed byte in any file is a ProgramDecodeError (manifest, program) or a ParameterFileError
(parameters) naming the file.

Rules for who may remove what (so a load never removes files a concurrent save is writing):
- Saves into one directory take turns (atomic.directory_lock). A save first removes the files
  earlier killed saves left (files of the naming scheme above, and write temporaries, that
  model.json does not name), and after switching model.json, the previous save's files.
- A load removes such leftovers only when it gets the directory lock without waiting (no save
  is under way), re-reading model.json under the lock; otherwise it removes nothing.
- A load that finds a named file gone (a save switched model.json and removed the old files
  between the load's reads) reads the new model.json and tries again.

Directories written before this layout (model.json version 1 beside fixed-name model.pb and
params.safetensors) still load; the next save into one replaces them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Sequence
from typing import Any

from nestflow.core.place import Place
from nestflow.core.scope import Scope
from nestflow.errors import FeedError, FileWriteError, ParameterFileError, ProgramDecodeError
from nestflow.executor.plan import BlockPlan
from nestflow.executor.prune import prune, target_names
from nestflow.framework.program import Program, VarDesc
from nestflow.io import atomic
from nestflow.io.params import decode_params, params_file_bytes, read_metadata, set_params

META_FILE = "model.json"
FORMAT = "nestflow.inference_model"
VERSION = 2
# Version 1 (before the manifest named its files): fixed names, replaced in place.
V1_MODEL_FILE = "model.pb"
V1_PARAMS_FILE = "params.safetensors"
V1_SAVE_ID = "save_id"

_ROLES = {"program": ("model.", ".pb"), "params": ("params.", ".safetensors")}
# What a problem with each role's file raises.
_ERROR = {"program": ProgramDecodeError, "params": ParameterFileError}
_ID = r"[0-9a-f]{16}"
_FILE_NAME = {
    role: re.compile(re.escape(head) + _ID + re.escape(tail))
    for role, (head, tail) in _ROLES.items()
}
# Everything a save (of either layout) may leave behind when it is killed.
_LEFTOVER = re.compile(
    "|".join(p.pattern for p in _FILE_NAME.values())
    + "|"
    + "|".join(
        atomic.temp_file_pattern(n).pattern for n in (META_FILE, V1_MODEL_FILE, V1_PARAMS_FILE)
    )
)
_MAX_META_BYTES = 1 << 20
_MAX_META_DEPTH = 16
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LOAD_ATTEMPTS = 8


def save_inference_model(
    dirname: str | os.PathLike,
    feeded_var_names: Sequence[str | VarDesc],
    target_vars: Sequence[VarDesc | str] | VarDesc,
    program: Program,
    scope: Scope,
) -> Program:
    """Prune `program` to `target_vars` (inference behaviour: is_test ops), save it and the
    parameters it reads from `scope` under `dirname` (created if missing); returns the saved
    program. All or nothing: a save cut short at any instant leaves the previous model (or
    none) loadable, whole, or the new one.

    Raises FeedError if the targets need a non-persistable variable not in `feeded_var_names`,
    UninitializedError for a parameter the scope lacks (before anything is written) and
    FileWriteError when the directory cannot be written.

    >>> import tempfile
    >>> x = nf.data("x", [-1, 2])
    >>> y = nf.layers.fc(x, 1)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((1, 2), "float32")}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = nf.io.save_inference_model(d, ["x"], [y], nf.default_main_program(), nf.global_scope())
    ...     program, feeds, fetches, scope = nf.io.load_inference_model(d)
    ...     out = exe.run(program, feed=feed, fetch_list=fetches, scope=scope)
    >>> feeds, fetches
    (['x'], ['fc_0.tmp_1'])
    >>> np.array_equal(out[0], exe.run(feed=feed, fetch_list=[y])[0])
    True
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
    contents = {"program": small.to_bytes(), "params": params_file_bytes(scope, small)}
    dirname = os.fspath(dirname)
    try:
        os.makedirs(dirname, exist_ok=True)
    except OSError as exc:
        raise FileWriteError(f"cannot write '{dirname}': {exc.strerror or exc}") from exc
    with atomic.directory_lock(dirname):
        _remove_leftovers(dirname, _named_files(dirname, default=set()))
        save_id = secrets.token_hex(8)
        files = {role: f"{head}{save_id}{tail}" for role, (head, tail) in _ROLES.items()}
        meta: dict[str, Any] = {"format": FORMAT, "version": VERSION}
        meta |= {"feed": feed_names, "fetch": fetch_names}
        for role, data in contents.items():
            meta[role] = {
                "file": files[role],
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            }
        meta["sha256"] = manifest_sha256(meta)
        try:
            for role, data in contents.items():
                atomic.write_new(os.path.join(dirname, files[role]), data)
            # The new names must be on disk before the manifest naming them is.
            atomic.sync_directory(dirname)
            manifest = json.dumps(meta, indent=2).encode()
            atomic.write_atomic(os.path.join(dirname, META_FILE), manifest, lock=False)
        except BaseException:
            # Whichever model.json now names stays; the rest of this save goes.
            _remove_leftovers(dirname, _named_files(dirname, default=set()), quietly=True)
            raise
        _remove_leftovers(dirname, set(files.values()), replaced=True, quietly=True)
    return small


def load_inference_model(
    dirname: str | os.PathLike, scope: Scope | None = None, place: Place | None = None
) -> tuple[Program, list[str], list[str], Scope]:
    """Read a model saved by save_inference_model: (program, feed names, fetch names, scope
    holding its parameters on `place`, default the host; a model saved from any place loads on
    any place). Run it with `Executor(place).run(program, feed=..., fetch_list=fetch,
    scope=scope)`.

    Raises ProgramDecodeError for a directory without a model, a model.json that is malformed
    or changed since the save, or a program file that is missing, changed (checksum) or does
    not decode; ParameterFileError, naming the file, for a parameter file that is missing,
    changed or does not fit the program. Nothing is set in `scope` unless all of it loads.

    >>> import tempfile
    >>> x = nf.data("x", [-1, 2])
    >>> y = nf.layers.fc(x, 1)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> feed = {"x": np.ones((1, 2), "float32")}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = nf.io.save_inference_model(d, ["x"], [y], nf.default_main_program(), nf.global_scope())
    ...     program, feeds, fetches, scope = nf.io.load_inference_model(d)
    ...     out = exe.run(program, feed=feed, fetch_list=fetches, scope=scope)
    >>> feeds, fetches
    (['x'], ['fc_0.tmp_1'])
    >>> np.array_equal(out[0], exe.run(feed=feed, fetch_list=[y])[0])
    True
    """
    dirname = os.fspath(dirname)
    raw, meta = _read_manifest(dirname)
    for attempt in range(_LOAD_ATTEMPTS):
        contents = {role: _read_named(dirname, meta, role) for role in _ROLES}
        missing = [role for role, data in contents.items() if data is None]
        if not missing:
            break
        # A save may have switched model.json and removed the files it named since.
        newer = _read_manifest(dirname)
        if newer[0] == raw or attempt + 1 == _LOAD_ATTEMPTS:
            role = missing[0]
            raise _ERROR[role](
                f"'{os.path.join(dirname, _file_of(meta, role))}', named by "
                f"'{os.path.join(dirname, META_FILE)}', is missing: the model directory is "
                "incomplete"
            )
        raw, meta = newer
    paths = {role: os.path.join(dirname, _file_of(meta, role)) for role in _ROLES}
    if meta["version"] >= 2:
        _check_sha256(meta, contents, paths)
    else:
        _check_v1_save_id(dirname, meta, contents["params"], paths["params"])
    program = Program.from_bytes(contents["program"])
    tensors = decode_params(contents["params"], paths["params"])
    scope = scope if scope is not None else Scope()
    set_params(scope, program, tensors, paths["params"], place=place)
    _remove_leftovers_if_idle(dirname)
    return program, list(meta["feed"]), list(meta["fetch"]), scope


def _file_of(meta: dict, role: str) -> str:
    if meta["version"] >= 2:
        return meta[role]["file"]
    return V1_MODEL_FILE if role == "program" else V1_PARAMS_FILE


def _read_named(dirname: str, meta: dict, role: str) -> bytes | None:
    """The content of the file model.json names for `role`; None if there is no such file."""
    path = os.path.join(dirname, _file_of(meta, role))
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _ERROR[role](f"cannot read '{path}': {exc.strerror or exc}") from None


def _check_sha256(meta: dict, contents: dict[str, bytes], paths: dict[str, str]) -> None:
    for role, data in contents.items():
        want, size = meta[role]["sha256"], meta[role]["size"]
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            what = "program" if role == "program" else "parameter"
            sizes = "" if len(data) == size else f"; it has {len(data)} bytes, not {size}"
            raise _ERROR[role](
                f"{what} file '{paths[role]}' is corrupt: its SHA-256 is {got}, but model.json "
                f"recorded {want} when the model was saved{sizes}"
            )


def _check_v1_save_id(dirname: str, meta: dict, params: bytes, params_path: str) -> None:
    """Version 1 wrote its files in place: parameters from another save than model.json's mean
    a save was cut short in between (a parameter file without an id came from save_params)."""
    params_id = read_metadata(params).get(V1_SAVE_ID)
    if params_id and meta.get(V1_SAVE_ID) and params_id != meta[V1_SAVE_ID]:
        raise ProgramDecodeError(
            f"'{params_path}' comes from another save than "
            f"'{os.path.join(dirname, META_FILE)}': a save into '{dirname}' was cut short "
            "after writing the parameters; save the model again"
        )


# The manifest


def manifest_sha256(meta: dict) -> str:
    """SHA-256 of the manifest's fields other than its own checksum, in a canonical form."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    return hashlib.sha256(
        json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def _read_manifest(dirname: str) -> tuple[bytes, dict]:
    """model.json's bytes and its fields, checked; ProgramDecodeError if absent or bad."""
    path = os.path.join(dirname, META_FILE)
    try:
        with open(path, "rb") as file:
            raw = file.read(_MAX_META_BYTES + 1)
    except OSError as exc:
        raise ProgramDecodeError(
            f"'{dirname}' holds no saved model: cannot read {META_FILE} ({exc.strerror or exc})"
        ) from None
    return raw, parse_manifest(raw, path)


def parse_manifest(raw: bytes, path: str = META_FILE) -> dict:
    """The fields of a model.json, each of the type and form a save writes (or version 1's);
    ProgramDecodeError naming `path` and the field otherwise."""

    def bad(why: str) -> ProgramDecodeError:
        return ProgramDecodeError(f"'{path}' is not a nestflow model description: {why}")

    if len(raw) > _MAX_META_BYTES:
        raise bad(f"larger than {_MAX_META_BYTES} bytes")
    depth = _json_depth(raw)
    if depth > _MAX_META_DEPTH:
        raise bad(f"nested {depth} levels deep (at most {_MAX_META_DEPTH})")
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise bad(f"a {_json_type(meta)}, not an object")
    if meta.get("format") != FORMAT:
        raise bad(f"'format' must be {FORMAT!r}, got {_shown(meta.get('format'))}")
    version = meta.get("version")
    if type(version) is not int or version not in (1, VERSION):
        raise bad(f"'version' must be 1 or {VERSION}, got {_shown(version)}")
    for key in ("feed", "fetch"):
        names = meta.get(key)
        if not isinstance(names, list) or not all(type(n) is str and n for n in names):
            raise bad(
                f"'{key}' must be a list of variable names (non-empty strings), got {_shown(names)}"
            )
    if version == 1:
        if V1_SAVE_ID in meta and type(meta[V1_SAVE_ID]) is not str:
            raise bad(f"'{V1_SAVE_ID}' must be a string, got {_shown(meta[V1_SAVE_ID])}")
        return meta
    for role, pattern in _FILE_NAME.items():
        entry = meta.get(role)
        if not isinstance(entry, dict):
            raise bad(f"'{role}' must be an object naming a file, got {_shown(entry)}")
        name, digest, size = entry.get("file"), entry.get("sha256"), entry.get("size")
        if type(name) is not str or not pattern.fullmatch(name):
            raise bad(
                f"'{role}.file' must be a file name like {pattern.pattern!r} in the "
                f"model's directory, got {_shown(name)}"
            )
        if type(digest) is not str or not _SHA256.fullmatch(digest):
            raise bad(f"'{role}.sha256' must be 64 hex digits, got {_shown(digest)}")
        if type(size) is not int or size < 0:
            raise bad(f"'{role}.size' must be a byte count, got {_shown(size)}")
    recorded = meta.get("sha256")
    if recorded != manifest_sha256(meta):
        raise bad(
            "its checksum ('sha256') does not match its content: it was changed after the "
            "save (a damaged or hand-edited file); save the model again"
        )
    return meta


def _json_depth(raw: bytes) -> int:
    """How deeply brackets nest in JSON text (outside strings), without parsing it: json's
    parser recurses per level and a deep enough document exhausts the stack."""
    text = re.sub(rb'"(?:[^"\\]|\\.)*"', b"", raw)
    depth = deepest = 0
    for byte in re.sub(rb"[^\[\]{}]", b"", text):
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _json_type(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, (int, float)) else "null"
    )


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return f"{_json_type(value)} {text if len(text) <= 60 else text[:57] + '...'}"


# What earlier saves left behind


def _named_files(dirname: str, default: set[str] | None, min_version: int = 1) -> set[str] | None:
    """The files the current model.json names; `default` when there is no readable one (or
    one of a version below `min_version`)."""
    try:
        _, meta = _read_manifest(dirname)
    except ProgramDecodeError:
        return default
    if meta["version"] < min_version:
        return default
    return {_file_of(meta, role) for role in _ROLES}


def _remove_leftovers(
    dirname: str, keep: set[str], replaced: bool = False, quietly: bool = False
) -> None:
    """Remove the files saves leave behind that are not in `keep` (the caller holds the
    directory lock); `replaced`: also version 1's fixed-name files, once a newer model.json
    no longer names them."""
    try:
        names = os.listdir(dirname)
    except OSError:
        return
    for name in names:
        if name in keep:
            continue
        if _LEFTOVER.fullmatch(name) or (replaced and name in (V1_MODEL_FILE, V1_PARAMS_FILE)):
            try:
                atomic.remove_file(os.path.join(dirname, name))
            except OSError:
                if not quietly:
                    raise


def _remove_leftovers_if_idle(dirname: str) -> None:
    """After a load: remove what killed saves left, if no save is under way (the lock is
    free) and model.json (of this layout: writers of version 1 took no lock) names its files;
    never an error (a read-only directory keeps them)."""
    try:
        with atomic.directory_lock(dirname, blocking=False) as held:
            keep = _named_files(dirname, default=None, min_version=VERSION) if held else None
            if keep is not None:
                _remove_leftovers(dirname, keep, quietly=True)
    except OSError:
        pass


__all__ = [
    "load_inference_model",
    "manifest_sha256",
    "parse_manifest",
    "save_inference_model",
]
