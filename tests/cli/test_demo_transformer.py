"""`nestflow demo --model transformer` (issue 30 item 3): a Transformer encoder classifier
(token + position embeddings, 2 pre-norm encoder layers over the rows' lengths, max pool, fc)
on sequences labelled by whether the bigram "A B" occurs. The test runs the default
configuration (4,000 sequences, 12 epochs: about 30 s of wall time on 2 idle cores) through
`python -m nestflow`, as a user runs it; the run checks itself (exit 1 below 95%)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from nestflow.cli import demo_transformer
from nestflow.cli.main import main


@pytest.fixture(scope="module")
def transformer_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("transformer") / "model"
    args = ["demo", "--model", "transformer", "--epochs", "12", "--limit", "4000", "--out",
            str(out), "--no-progress"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "nestflow", *args], capture_output=True, text=True, timeout=600
    )
    return result, out


def test_transformer_demo_reaches_the_bar_and_reloads_identically(transformer_run):
    result, _ = transformer_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4000 training and 1000 held-out sequences of 8-24 tokens" in result.stdout
    accuracy = float(re.search(r"^test accuracy: ([\d.]+)%", result.stdout, re.M).group(1))
    assert accuracy >= 95.0
    assert "reloaded predictions identical bit for bit: True" in result.stdout


def test_the_saved_model_runs_fused_attention_without_training_ops(transformer_run, capsys):
    _, out = transformer_run
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "param encoder.layers.0.self_attn.in_proj.w: float32[32, 96]" in text
    assert text.count("= scaled_dot_product_attention(") == 2
    assert "sequence_mask(" in text and "@GRAD" not in text and "adam" not in text


def test_sequences_hold_two_a_and_two_b_and_only_their_adjacency_tells_the_label():
    data = demo_transformer.make_sequences(2000, np.random.default_rng(3))
    valid = np.arange(demo_transformer.MAX_LENGTH)[None, :] < data.lengths[:, None]
    assert data.lengths.min() >= 8 and data.lengths.max() <= 24
    assert np.all(data.ids[~valid] == 0) and np.all(data.ids[valid] > 0)
    assert np.all((data.ids == 1).sum(axis=1) == 2) and np.all((data.ids == 2).sum(axis=1) == 2)
    pairs = (data.ids[:, :-1] == 1) & (data.ids[:, 1:] == 2)
    np.testing.assert_array_equal(data.labels.ravel(), pairs.any(axis=1).astype(np.int64))
    assert 0.5 < data.labels.mean() < 0.75
    counts = np.stack([(data.ids == v).sum(axis=1) for v in range(3, 16)], axis=1)
    labels = data.labels.ravel() == 1
    assert np.abs(counts[labels].mean(axis=0) - counts[~labels].mean(axis=0)).max() < 0.3
