"""Every ```python block of docs/*.md runs as a reader would paste it (issue 33, item 1).

A page's blocks run in page order in one namespace, so a later block may use what an earlier
one defined, as a reader's session would; each page starts from fresh default programs, a fresh
global scope and names from 0 (tests/conftest.py), in a temporary working directory, so files a
page writes ("weights.safetensors") land there and go with it.

A block that cannot run here (an MPI launch, a GPU) says so in the Markdown, on the line right
before its fence, with the reason:

    <!-- docs-test: skip needs an MPI launch (nestflow launch -n 4) -->

Such a block is a skipped test of its own, with its reason, and the run prints the count of
blocks run and skipped (tests/conftest.py's terminal summary). No extra dependency: the pages'
fences are found by one regular expression, and the code compiled with the page's name and line
numbers, so a traceback points into the Markdown.

A tutorial ends with pictures (its program's graph, its loss curve) that its script writes into
the working directory and the page shows from docs/img/ (`![...](img/NAME.svg)`): the run must
write every picture its page shows, so a page cannot show a picture its script no longer makes.
`NESTFLOW_DOCS_PICTURES=1 pytest tests/test_docs_pages.py` copies them into docs/img/, which is
how the pictures there are made.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\s+(?P<reason>.+?)\s*-->")
# A fence opens with ``` and an info string, and closes with ``` alone, at any indentation the
# opening has (blocks inside list items are indented).
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)$")
PICTURE = re.compile(r"!\[[^\]]*\]\(img/(?P<name>[^)\s]+)\)")

# Filled as the pages run, for the terminal summary (tests/conftest.py).
RESULTS: dict[str, int] = {"run": 0, "pages": 0}
SECONDS: dict[str, float] = {}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the first code line
    code: str
    skip: str | None  # the reason, for a block marked as not runnable here


def page_blocks(path: Path) -> list[Block]:
    """The ```python (or ```py) blocks of one Markdown page, in order."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, info = opening["indent"], opening["info"].strip().split()
        start = i + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if info and info[0] in ("python", "py"):
            before = lines[i - 1] if i else ""
            mark = SKIP_MARK.search(before)
            code = "\n".join(line[len(indent) :] for line in lines[start:end])
            blocks.append(Block(path.name, start + 1, code, mark["reason"] if mark else None))
        i = end + 1
    return blocks


PAGES = sorted(DOCS.glob("*.md"))
BLOCKS = {page.name: page_blocks(page) for page in PAGES}
SKIPPED = [b for blocks in BLOCKS.values() for b in blocks if b.skip is not None]


@pytest.fixture
def fresh_page(tmp_path, monkeypatch):
    """A page runs in its own working directory with its own global scope; the flags and the
    default place it sets (as a reader's script may) are put back after it."""
    import nestflow as nf
    from nestflow.core import place
    from nestflow.executor import executor
    from nestflow.flags import FLAGS

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(executor, "_global_scope", nf.Scope())
    np.random.seed(0)
    flags, default_place = dict(FLAGS), list(place._default)
    try:
        yield tmp_path
    finally:
        FLAGS.clear()
        FLAGS.update(flags)
        place._default[:] = default_place


@pytest.mark.parametrize(
    "page", [name for name, blocks in BLOCKS.items() if any(b.skip is None for b in blocks)]
)
def test_page_runs_as_pasted(page, fresh_page):
    namespace: dict = {"__name__": "__main__"}
    started = time.perf_counter()
    for block in BLOCKS[page]:
        if block.skip is not None:
            continue
        # Padding with blank lines makes the traceback's line numbers the page's own.
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, str(DOCS / page), "exec"), namespace)
        RESULTS["run"] += 1
    RESULTS["pages"] += 1
    SECONDS[page] = time.perf_counter() - started
    shown = PICTURE.findall((DOCS / page).read_text(encoding="utf-8"))
    missing = [name for name in shown if not (fresh_page / name).is_file()]
    assert not missing, f"docs/{page} shows img/{missing} that its blocks did not write"
    if os.environ.get("NESTFLOW_DOCS_PICTURES"):
        for name in shown:
            shutil.copyfile(fresh_page / name, DOCS / "img" / name)


@pytest.mark.parametrize("block", SKIPPED, ids=[f"{b.page}:{b.line}" for b in SKIPPED])
def test_marked_block_is_skipped(block):
    pytest.skip(f"docs/{block.page}:{block.line}: {block.skip}")


def test_the_runner_reads_fences_and_marks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n```bash\nls\n```\n\n"
        "<!-- docs-test: skip needs a GPU -->\n```python\nimport cupy\n```\n\n"
        "- item\n\n    ```python\n    y = x + 1\n    ```\n"
    )
    blocks = page_blocks(page)
    assert [(b.line, b.code, b.skip) for b in blocks] == [
        (4, "x = 1", None),
        (13, "import cupy", "needs a GPU"),
        (19, "y = x + 1", None),
    ]


def summary_line() -> str | None:
    """'docs pages: N python blocks run in M pages, K skipped (page:line reason; ...)' once the
    pages have run in this session, else None."""
    if not RESULTS["pages"]:
        return None
    skipped = "; ".join(f"docs/{b.page}:{b.line} {b.skip}" for b in SKIPPED)
    slowest = max(SECONDS, key=SECONDS.get)
    return (
        f"docs pages: {RESULTS['run']} python blocks run in {RESULTS['pages']} pages "
        f"(slowest {slowest}, {SECONDS[slowest]:.1f} s), {len(SKIPPED)} skipped"
        + (f": {skipped}" if skipped else "")
    )
