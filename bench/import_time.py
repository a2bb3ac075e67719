"""Import time: `import <module>` timed inside a fresh interpreter, median of several children.

The child measures only the import itself (not interpreter start-up), so the three columns
(numpy, torch, nestflow) are directly comparable; nestflow's figure includes numpy's.

numpy and torch are installed wheels, compiled to bytecode when pip installed them; nestflow runs
from the source tree, so its bytecode is compiled first (compileall, as `pip install` does):
otherwise, under PYTHONDONTWRITEBYTECODE=1, every child would compile nestflow's source again
and the figure would time the compiler.
"""

from __future__ import annotations

import compileall
import pathlib
import statistics
import subprocess
import sys

from timing import error_line, main, row, unavailable

CHILD = "import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"


def import_seconds(module: str, repeats: int) -> float | str:
    """Median seconds `import module` takes in a fresh child process, or 'n/a (...)'."""
    values = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(module=module)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return unavailable(RuntimeError(error_line(done.stderr)))
        values.append(float(done.stdout.strip().splitlines()[-1]))
    return statistics.median(values)


def run(rounds: int = 5) -> dict:
    source = pathlib.Path(__file__).resolve().parent.parent / "nestflow"
    compileall.compile_dir(source, quiet=1)
    # Interleave the children too, so drift hits all three alike.
    samples: dict[str, list] = {"numpy": [], "torch": [], "nestflow": []}
    for _ in range(rounds):
        for module in samples:
            samples[module].append(import_seconds(module, 1))

    def median(values):
        failed = [v for v in values if isinstance(v, str)]
        return failed[0] if failed else statistics.median(values)

    got = {module: median(values) for module, values in samples.items()}
    return {
        "workload": "import time",
        "rows": [
            row(
                "import in a fresh process",
                "s",
                got["nestflow"],
                torch=got["torch"],
                numpy=got["numpy"],
                targets=[("abs", 0.3)],
            )
        ],
    }


if __name__ == "__main__":
    main(run)
