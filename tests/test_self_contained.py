"""The repository stands alone: no file refers to a document outside it (the design notes,
style guide and seed texts it was built from live on as the docs/ pages)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["README.md", "mkdocs.yml", "pyproject.toml", "Makefile"]
CHECKED_DIRS = ["docs", "examples", "nestflow", "tests", "bench"]
# Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile(
    "|".join(
        ["DESIGN" + r"\.md", r"\.\./" + "shared", "shared" + "/", "STYLE" + r"\.md", "seeds" + "/"]
    )
)


def _files():
    for name in CHECKED:
        yield ROOT / name
    for d in CHECKED_DIRS:
        for path in sorted((ROOT / d).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".md", ".yml", ".toml", ".proto", ".txt"}:
                yield path


def test_no_file_refers_to_a_document_outside_the_repository():
    found = []
    for path in _files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_checker_finds_an_outside_reference():
    assert OUTSIDE.search("see " + "DESIGN" + ".md")
    assert OUTSIDE.search("../" + "sha" + "red/x")
    assert not OUTSIDE.search("docs/concepts.md")
