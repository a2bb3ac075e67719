"""ONNX interop: export nestflow programs to ONNX, import ONNX models (the `onnx` extra).

nf.onnx.export(program, "model.onnx", ["x"], [prediction], scope)
program, feed_names, fetch_vars = nf.onnx.load("model.onnx", scope)

Each function is imported on first use, so `import nestflow` (and even `import nestflow.onnx`)
works without the onnx package installed; only calling one needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nestflow.onnx.exporter import export
    from nestflow.onnx.importer import load

# public name -> submodule that defines it. The exporter is not `export.py`: importing a
# submodule binds its name on the package, which would shadow the function nf.onnx.export.
_LAZY = {"export": "exporter", "load": "importer"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"nestflow.onnx.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nestflow.onnx' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["export", "load"]
