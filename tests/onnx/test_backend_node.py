"""ONNX's own node test cases against nestflow.onnx.backend, run by onnx.backend.test.BackendTest.

The cases come from the installed onnx package's case generators (onnx.backend.test.case.node,
in memory: nothing is downloaded or shipped). Every case whose op types the importer claims
(all of them in nestflow.onnx.importers.MAPPERS) runs; the pass rate over those not listed in
tests/onnx/node_exclusions.py must be 100%. `make onnx-node-tests` (pytest -s) prints the
numbers run/passed/excluded.
"""

from __future__ import annotations

import functools
import re
import unittest
import warnings

import pytest

onnx = pytest.importorskip("onnx")

import nestflow.onnx.backend as backend  # noqa: E402
from nestflow.onnx.importer import MAX_OPSET  # noqa: E402
from nestflow.onnx.importers import MAPPERS  # noqa: E402
from tests.onnx.node_exclusions import EXCLUDED  # noqa: E402


def op_types(graph, found: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """(domain, op type) of every node of `graph` and its subgraphs."""
    for node in graph.node:
        found.add((node.domain or "", node.op_type))
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                op_types(attr.g, found)
            for sub in attr.graphs:
                op_types(sub, found)
    return found


def claimed(case) -> bool:
    return all(
        domain in ("", "ai.onnx") and op in MAPPERS
        for domain, op in op_types(case.model.graph, set())
    )


def exclusion(name: str) -> str | None:
    return next((why for pattern, why in EXCLUDED.items() if re.fullmatch(pattern, name)), None)


def newer_than_supported(case) -> bool:
    """A case of an opset newer than the importer knows (a newer onnx package than the one
    nestflow was tested with): it is not claimed."""
    return any(
        o.domain in ("", "ai.onnx") and o.version > MAX_OPSET for o in case.model.opset_import
    )


@functools.lru_cache(maxsize=1)
def suite_and_cases():
    import onnx.backend.test
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators' own numpy warnings
        suite = onnx.backend.test.BackendTest(backend, __name__)
        cases = load_model_tests(kind="node")  # the generators ran once: this is a list
    return suite, cases


def test_claimed_node_cases_pass():
    suite, cases = suite_and_cases()
    mine = [c for c in cases if claimed(c) and not newer_than_supported(c)]
    excluded = [c for c in mine if exclusion(c.name)]
    chosen = [c.name for c in mine if not exclusion(c.name)]
    suite.include("^(" + "|".join(re.escape(n) for n in chosen) + ")_cpu$")
    result = unittest.TestResult()
    node_tests = suite.test_cases["OnnxBackendNodeModelTest"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unittest.TestLoader().loadTestsFromTestCase(node_tests).run(result)
    ran = result.testsRun - len(result.skipped)
    failed = len(result.failures) + len(result.errors)
    print(
        f"\nONNX node cases: {len(cases)} in onnx {onnx.__version__}'s suite, {len(mine)} claimed "
        f"by the importer ({len(MAPPERS)} op types); run {ran}, passed {ran - failed}, failed "
        f"{failed}, excluded {len(excluded)} (tests/onnx/node_exclusions.py)"
    )
    assert ran == len(chosen), f"BackendTest ran {ran} of the {len(chosen)} chosen cases"
    problems = [
        f"{test.id()}: {trace.splitlines()[-1]}" for test, trace in result.failures + result.errors
    ]
    assert not problems, "\n".join(problems)


def as_array(value):
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def test_every_exclusion_still_fails_and_every_pattern_is_used():
    from onnx.backend.test.runner import Runner

    _, cases = suite_and_cases()
    mine = [c for c in cases if claimed(c)]
    used = {p for c in mine for p in EXCLUDED if re.fullmatch(p, c.name)}
    assert used == set(EXCLUDED), f"patterns matching no claimed case: {set(EXCLUDED) - used}"
    passing = []
    for case in mine:
        if not exclusion(case.name):
            continue
        try:
            rep = backend.prepare(case.model)
            for inputs, outputs in case.data_sets:
                got = rep.run([as_array(i) for i in inputs])
                outputs = [as_array(o) for o in outputs]
                Runner.assert_similar_outputs(outputs, got, rtol=case.rtol, atol=case.atol)
        except Exception:  # an excluded case is expected to fail, one way or another
            continue
        passing.append(case.name)
    assert not passing, f"excluded but passing (remove their exclusions): {passing}"
