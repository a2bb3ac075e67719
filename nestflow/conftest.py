"""Doctest setup: every docstring example runs with `nf` and `np` imported, in fresh default
programs and a fresh global scope, with names and random streams starting from 0.

`make test` runs the examples through pytest's `--doctest-modules` over this package
(pyproject's [tool.pytest.ini_options]). Modules that need optional libraries (onnx, mpi4py,
the command line's demos) are not imported for doctest collection: their examples are run by
their own tests.
"""

from __future__ import annotations

import numpy as np
import pytest

import nestflow as nf

collect_ignore = ["onnx", "distributed", "cli", "__main__.py"]


@pytest.fixture(autouse=True)
def _doctest_env(doctest_namespace, monkeypatch):
    from nestflow.executor import executor

    doctest_namespace["nf"] = nf
    doctest_namespace["np"] = np
    main, startup = nf.Program(), nf.Program()
    monkeypatch.setattr(executor, "_global_scope", nf.Scope())
    with nf.program_guard(main, startup), nf.unique_name.guard():
        nf.seed(0)
        np.random.seed(0)
        yield
