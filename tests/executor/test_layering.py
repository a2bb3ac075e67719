"""The executor stays below the frontend: it never imports nestflow.layers (DESIGN's diagram)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nestflow as nf

EXECUTOR = Path(nf.__file__).parent / "executor"

# Loads nestflow.executor without running nestflow/__init__.py, which imports the frontend.
_IMPORT_EXECUTOR_ALONE = """
import importlib.util, sys, types
spec = importlib.util.find_spec("nestflow")
package = types.ModuleType("nestflow")
package.__path__ = list(spec.submodule_search_locations)
sys.modules["nestflow"] = package
import nestflow.executor
net = nestflow.executor.Net.create()
net.add_op("scale", inputs={"X": ["a"]}, outputs={"Out": ["b"]}, attrs={"scale": 2.0})
print(sorted(m for m in sys.modules if m.startswith("nestflow.layers")))
"""


def test_importing_the_executor_imports_no_layers_module():
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_EXECUTOR_ALONE],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout


def _layers_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [
            f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("nestflow.layers")
        ]
    return found


def test_no_executor_module_imports_layers_even_inside_a_function():
    found = [hit for path in sorted(EXECUTOR.rglob("*.py")) for hit in _layers_imports(path)]
    assert found == []


def test_net_builder_is_frontend_and_keeps_its_public_name():
    from nestflow.layers.net_builder import NetBuilder

    assert nf.NetBuilder is NetBuilder
    assert "NetBuilder" in nf.__all__
