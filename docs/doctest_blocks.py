"""Griffe extension for the docs build: the `>>>` examples of docstrings (doctests, run by
`make test`) become fenced Python code blocks, wherever they stand in a docstring."""

from __future__ import annotations

import griffe


def fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines (a `>>>` line up to the next blank line) in a fence."""
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
