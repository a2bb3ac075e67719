"""A missing name in nf or nf.layers says what is close and where to look (issue 16)."""

from __future__ import annotations

import pytest

import nestflow as nf
from nestflow.errors import NestflowError, UnknownNameError


def test_a_misspelt_layer_suggests_the_closest_names():
    with pytest.raises(UnknownNameError, match=r"no layer 'reluu' \(did you mean 'relu'"):
        nf.layers.reluu  # noqa: B018


def test_a_missing_layer_is_a_nestflow_error_and_an_attribute_error():
    with pytest.raises(NestflowError, match="dir\\(nf.layers\\)"):
        nf.layers.no_such_layer_at_all  # noqa: B018
    assert not hasattr(nf.layers, "no_such_layer_at_all")


def test_a_misspelt_top_level_name_suggests_the_closest():
    with pytest.raises(UnknownNameError, match="did you mean 'Executor'"):
        nf.Executr  # noqa: B018
    assert not hasattr(nf, "Executr")
