"""Pictures of programs (issue 16): Program.to_dot nests each sub-block inside the cluster of the
control-flow op that runs it; `nestflow show DIR --graph OUT.svg` renders it with Graphviz."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import nestflow as nf
from nestflow.cli.main import main as cli_main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _seed_program(example: str) -> nf.Program:
    """The main program an examples/seed_*.py script builds (its main() builds into the default
    programs and runs them; the tests' fresh default programs isolate it)."""
    spec = importlib.util.spec_from_file_location(example, EXAMPLES / f"{example}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        module.main()
    return main


def _cluster_body(dot: str, cluster: str) -> str:
    """The text of one cluster, nested clusters included (braces matched)."""
    start = dot.index(f'subgraph "{cluster}" {{')
    depth, i = 0, dot.index("{", start)
    for j in range(i, len(dot)):
        depth += {"{": 1, "}": -1}.get(dot[j], 0)
        if depth == 0:
            return dot[i : j + 1]
    raise AssertionError(f"unbalanced cluster {cluster}")


def test_the_seed_rnn_step_block_is_drawn_inside_the_recurrent_op(capsys):
    program = _seed_program("seed_rnn")
    dot = program.to_dot()
    recurrent = next(i for i, op in enumerate(program.global_block().ops) if op.type == "recurrent")
    op_cluster = _cluster_body(dot, f"cluster_op_0_{recurrent}")
    step = program.global_block().ops[recurrent].sub_blocks()[0]
    assert f'subgraph "cluster_block_{step.idx}"' in op_cluster
    # The step's ops are inside the step block's cluster, and the block inside the op's.
    step_cluster = _cluster_body(dot, f"cluster_block_{step.idx}")
    for index, op in enumerate(step.ops):
        assert f'"op:{step.idx}:{index}" [label="{op.type} #{index}"' in step_cluster
    # Parameters are drawn apart from data: the seed's W and U are filled boxes.
    params = [v.name for v in program.global_block().all_parameters()]
    assert len(params) == 2
    for name in params:
        (line,) = [ln for ln in dot.splitlines() if ln.strip().startswith(f'"var:0:{name}" [')]
        assert 'shape=box, style="filled' in line
    # The step reads the outer parameters: edges cross from block 0 into the step block.
    assert any(f'"var:0:{name}" -> "op:{step.idx}:' in dot for name in params), (
        "no edge from an outer parameter into the step block"
    )


def test_the_seed_ifelse_branches_are_drawn_inside_the_ifelse_op():
    program = _seed_program("seed_ifelse")
    dot = program.to_dot()
    index, op = next((i, o) for i, o in enumerate(program.global_block().ops) if o.type == "ifelse")
    op_cluster = _cluster_body(dot, f"cluster_op_0_{index}")
    branches = op.sub_blocks()
    assert len(branches) == 2
    for branch in branches:
        assert f'subgraph "cluster_block_{branch.idx}"' in op_cluster


def test_show_graph_writes_dot_text_without_graphviz(tmp_path, capsys):
    model = tmp_path / "model"
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup):
        y = nf.layers.fc(nf.data("x", [-1, 3]), size=2, act="relu")
    scope = nf.Scope()
    exe = nf.Executor()
    exe.run(startup, scope=scope)
    nf.io.save_inference_model(str(model), ["x"], [y], main, scope)
    out = tmp_path / "graph.dot"
    assert cli_main(["show", str(model), "--graph", str(out)]) == 0
    text = out.read_text()
    assert text.startswith('digraph "program"') and "fc_0.w" in text
    assert "graph written to" in capsys.readouterr().out
    np.testing.assert_equal(out.exists(), True)


@pytest.mark.skipif(
    shutil.which("dot") is None and not os.environ.get("CI"),
    reason="Graphviz's dot is not installed (.ci/run installs it for CI)",
)
@pytest.mark.parametrize("example", ["seed_rnn", "seed_ifelse"])
def test_the_seed_programs_render_to_svg(tmp_path, example):
    from nestflow.framework.dot import render

    svg = render(_seed_program(example).to_dot(), tmp_path / f"{example}.svg")
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert "cluster_block_1" in text  # Graphviz keeps cluster names as SVG group titles
