"""model.json is read field by field, each of the type a save writes (issue 12 item 7): a
wrong one is a ProgramDecodeError naming the field, never a misread (`"feed": "xy"` read as
the feeds ['x', 'y']); nesting is bounded (no RecursionError from a deep document).

Each bad manifest below carries a valid checksum of its own content (re-signed after the
edit), so what refuses it is the check of the field, not the checksum."""

from __future__ import annotations

import json

import pytest

import nestflow as nf
from nestflow.errors import ProgramDecodeError
from nestflow.io.inference import manifest_sha256, parse_manifest

from .two_models import build, which_model


@pytest.fixture(scope="module")
def model():
    return build("small", "relu", 1, hidden=6)


@pytest.fixture
def saved(model, tmp_path):
    model.save(tmp_path / "m")
    return tmp_path / "m", json.loads((tmp_path / "m" / "model.json").read_text())


def _write(directory, meta: dict, sign: bool = True) -> None:
    if sign:
        meta = meta | {"sha256": manifest_sha256(meta)}
    (directory / "model.json").write_text(json.dumps(meta))


def _refused(directory, field_message: str) -> str:
    with pytest.raises(ProgramDecodeError) as info:
        nf.io.load_inference_model(directory)
    message = str(info.value)
    assert "model.json" in message and "not a nestflow model description" in message
    assert field_message in message, message
    return message


BAD_NAMES = ["xy", "", None, 3, {"x": 1}, [1, 2], ["x", 3], [""], [["x"]], True]


@pytest.mark.parametrize("key", ["feed", "fetch"])
@pytest.mark.parametrize("value", BAD_NAMES, ids=[json.dumps(v) for v in BAD_NAMES])
def test_feed_and_fetch_must_be_lists_of_names(saved, key, value):
    directory, meta = saved
    _write(directory, meta | {key: value})
    _refused(directory, f"'{key}' must be a list of variable names")


def test_the_issues_case_a_string_feed_is_not_read_as_its_letters(saved):
    directory, meta = saved
    _write(directory, meta | {"feed": "xy"})
    message = _refused(directory, "'feed' must be a list")
    assert 'string "xy"' in message


@pytest.mark.parametrize(
    "value", [None, "nestflow.params", 1, ["nestflow.inference_model"]], ids=str
)
def test_format_must_be_the_inference_model_format(saved, value):
    directory, meta = saved
    _write(directory, meta | {"format": value})
    _refused(directory, "'format' must be 'nestflow.inference_model'")


@pytest.mark.parametrize("value", [None, "2", 2.0, True, 0, 3, -1, [2]], ids=str)
def test_version_must_be_a_known_integer(saved, value):
    directory, meta = saved
    _write(directory, meta | {"version": value})
    _refused(directory, "'version' must be 1 or 2")


BAD_ENTRIES = [
    (None, "'{role}' must be an object naming a file"),
    ("model.pb", "'{role}' must be an object naming a file"),
    ({"file": "../elsewhere/x.pb"}, "'{role}.file' must be a file name like"),
    ({"file": "/etc/passwd"}, "'{role}.file' must be a file name like"),
    ({"file": 7}, "'{role}.file' must be a file name like"),
    ({"file": "model.json"}, "'{role}.file' must be a file name like"),
    ({"sha256": "ABC"}, "'{role}.sha256' must be 64 hex digits"),
    ({"sha256": "0" * 63}, "'{role}.sha256' must be 64 hex digits"),
    ({"sha256": "A" * 64}, "'{role}.sha256' must be 64 hex digits"),
    ({"sha256": 5}, "'{role}.sha256' must be 64 hex digits"),
    ({"size": -1}, "'{role}.size' must be a byte count"),
    ({"size": "10"}, "'{role}.size' must be a byte count"),
    ({"size": 1.5}, "'{role}.size' must be a byte count"),
    ({"size": True}, "'{role}.size' must be a byte count"),
]


@pytest.mark.parametrize("role", ["program", "params"])
@pytest.mark.parametrize("entry, message", BAD_ENTRIES, ids=[json.dumps(e) for e, _ in BAD_ENTRIES])
def test_each_file_entry_is_checked(saved, role, entry, message):
    directory, meta = saved
    if isinstance(entry, dict):
        entry = meta[role] | entry
    _write(directory, meta | {role: entry})
    _refused(directory, message.format(role=role))


def test_the_other_roles_file_name_is_refused(saved):
    """The program entry naming the parameter file (both names exist in the directory)."""
    directory, meta = saved
    _write(directory, meta | {"program": meta["params"]})
    _refused(directory, "'program.file' must be a file name like")


@pytest.mark.parametrize("document", ["[]", '"model"', "3", "null", "true"])
def test_a_document_that_is_not_an_object(saved, document):
    directory, _ = saved
    (directory / "model.json").write_text(document)
    _refused(directory, "not an object")


def test_a_missing_or_wrong_checksum(saved):
    directory, meta = saved
    _write(directory, {k: v for k, v in meta.items() if k != "sha256"}, sign=False)
    _refused(directory, "its checksum ('sha256') does not match")
    _write(directory, meta | {"sha256": 12}, sign=False)
    _refused(directory, "its checksum ('sha256') does not match")


@pytest.mark.parametrize("depth", [17, 1000, 200_000])
def test_deep_nesting_is_refused_without_recursion_error(saved, depth):
    directory, meta = saved
    deep = "[" * depth + "]" * depth
    text = json.dumps(meta)[:-1] + f', "extra": {deep}}}'
    (directory / "model.json").write_text(text)
    _refused(directory, f"nested {depth + 1} levels deep")


def test_brackets_inside_strings_do_not_count_as_nesting():
    meta = {"format": "nestflow.inference_model", "version": 1}
    meta |= {"feed": ["[" * 100 + '"{' * 50], "fetch": ["y]]"]}
    assert parse_manifest(json.dumps(meta).encode())["feed"] == meta["feed"]


def test_an_oversized_or_undecodable_model_json(saved):
    directory, meta = saved
    (directory / "model.json").write_text(json.dumps(meta | {"pad": " " * (1 << 20)}))
    _refused(directory, "larger than 1048576 bytes")
    (directory / "model.json").write_bytes(b'{"format": "\xff\xfe"}')
    _refused(directory, "not JSON")
    (directory / "model.json").write_text('{"version": 1' + "1" * 5000 + "}")
    _refused(directory, "not JSON")


def test_unknown_fields_are_allowed_when_signed(model, saved):
    """Later versions may add fields: a signed manifest with one more still loads."""
    directory, meta = saved
    _write(directory, meta | {"created_by": {"tool": "nestflow", "notes": [1, 2]}})
    assert which_model(directory, (model,)) == "small"


def test_version_1_manifests_are_checked_the_same_way():
    base = {"format": "nestflow.inference_model", "version": 1, "feed": ["x"], "fetch": ["y"]}
    assert parse_manifest(json.dumps(base).encode())["feed"] == ["x"]
    for field, value, message in [
        ("feed", "xy", "'feed' must be a list"),
        ("fetch", [1], "'fetch' must be a list"),
        ("save_id", 12, "'save_id' must be a string"),
    ]:
        with pytest.raises(ProgramDecodeError, match=message):
            parse_manifest(json.dumps(base | {field: value}).encode())
