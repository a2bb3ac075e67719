"""Every public name of nf, nf.layers, nf.optimizer, nf.io, nf.metric, nf.clip, nf.regularizer
and nf.callbacks has a docstring with a runnable `>>>` example.

The examples themselves run as doctests (pytest --doctest-modules over the nestflow package, see
nestflow/conftest.py); this test makes sure none is missing.
"""

from __future__ import annotations

import inspect

import pytest

import nestflow as nf

MODULES = ["", "layers", "optimizer", "io", "metric", "clip", "regularizer", "callbacks"]


def _module(name: str):
    return nf if not name else getattr(nf, name)


def public_names(name: str) -> list[tuple[str, object]]:
    mod = _module(name)
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in dir(mod) if not n.startswith("_")]
        if mod is nf:
            names += ["Model", "InputSpec"]  # imported on first use
    out = []
    for n in sorted(set(names)):
        obj = getattr(mod, n)
        if inspect.ismodule(obj) or not callable(obj):
            continue
        out.append((f"nf.{name}.{n}" if name else f"nf.{n}", obj))
    return out


ALL = [item for m in MODULES for item in public_names(m)]


def test_the_public_api_is_listed():
    listed = {n for n, _ in ALL}
    for name in ["nf.Program", "nf.layers.fc", "nf.optimizer.Adam", "nf.io.save_inference_model"]:
        assert name in listed
    assert len(ALL) > 200


@pytest.mark.parametrize("name,obj", ALL, ids=[n for n, _ in ALL])
def test_public_name_has_docstring_with_example(name, obj):
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    assert ">>> " in doc, f"{name}'s docstring has no runnable example"
