"""`nestflow show` lists only the attributes that differ from each op's defaults, and every
attribute with --all-attrs (issue 33, item 4)."""

from __future__ import annotations

import re

import nestflow as nf
from nestflow.cli.listing import op_line, program_listing
from nestflow.cli.main import main


def _conv_program_file(tmp_path):
    x = nf.data("x", [-1, 1, 8, 8])
    y = nf.layers.conv2d(x, num_filters=4, filter_size=3, padding=1, act="relu")
    nf.layers.dropout(y, 0.25)
    path = tmp_path / "conv.pb"
    path.write_bytes(nf.default_main_program().to_bytes())
    return path


def test_show_lists_only_attributes_that_differ_from_the_defaults(tmp_path, capsys):
    assert main(["show", str(_conv_program_file(tmp_path))]) == 0
    text = capsys.readouterr().out
    conv = next(line for line in text.splitlines() if "= conv2d(" in line)
    assert "paddings=[1, 1]" in conv  # set by the user
    assert "strides" not in conv and "workspace_size_MB" not in conv and "fuse_relu" not in conv
    hidden = int(re.search(r"\(\+(\d+) attrs at their defaults\)", conv)[1])
    assert len(conv) < 200 and hidden >= 20
    dropout = next(line for line in text.splitlines() if "= dropout(" in line)
    assert "dropout_prob=0.25" in dropout


def test_show_all_attrs_lists_every_attribute(tmp_path, capsys):
    assert main(["show", str(_conv_program_file(tmp_path)), "--all-attrs"]) == 0
    text = capsys.readouterr().out
    conv = next(line for line in text.splitlines() if "= conv2d(" in line)
    assert "strides=[1, 1]" in conv and "workspace_size_MB=512" in conv
    assert "at their defaults" not in text


def test_the_all_attrs_listing_is_print_programs():
    x = nf.data("x", [-1, 1, 8, 8])
    nf.layers.batch_norm(nf.layers.conv2d(x, num_filters=2, filter_size=3))
    program = nf.default_main_program()
    assert program_listing(program, all_attrs=True) == str(program)


def test_sub_blocks_and_unregistered_attributes_are_always_shown():
    x = nf.data("x", [-1, 1])
    ie = nf.ifelse(nf.layers.greater_than(x, 0.0))
    with ie.true_block():
        ie.output(nf.layers.scale(x, 2.0))
    with ie.false_block():
        ie.output(x)
    ie()
    lines = [op_line(op) for op in nf.default_main_program().global_block().ops]
    assert any("block[" in line for line in lines), lines
