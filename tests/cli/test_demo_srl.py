"""`nestflow demo --model srl` (issue 30): word and predicate-mark embeddings, a bidirectional
LSTM, linear_chain_crf and crf_decoding on synthetic role tagging, scored with chunk_eval F1.
The test runs a reduced variant (1,200 training sentences, 2 epochs) through
`python -m nestflow`, as a user runs it; the full run checks itself (exit 1 below 0.95 F1)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from nestflow.cli import demo_srl
from nestflow.cli.main import main
from nestflow.ops.crf import chunks


@pytest.fixture(scope="module")
def srl_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("srl") / "model"
    args = ["demo", "--model", "srl", "--epochs", "2", "--limit", "1200", "--out", str(out),
            "--no-progress"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "nestflow", *args], capture_output=True, text=True, timeout=300
    )
    return result, out


def test_srl_demo_reaches_the_bar_and_reloads_identically(srl_run):
    result, _ = srl_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1200 training and 500 held-out sentences of 6-24 tokens" in result.stdout
    f1 = float(re.search(r"^test chunk precision .* F1: ([\d.]+)$", result.stdout, re.M).group(1))
    assert f1 >= 0.95
    assert "reloaded paths identical bit for bit: True" in result.stdout


def test_the_saved_model_decodes_with_the_crf(srl_run, capsys):
    _, out = srl_run
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "param crfw: float32[9, 7]" in text
    assert "= crf_decoding(" in text and "linear_chain_crf" not in text
    assert "@GRAD" not in text and "adam" not in text


def test_sentences_tag_the_noun_runs_next_to_the_marked_verb():
    data = demo_srl.make_sentences(400, np.random.default_rng(2))
    assert data.lengths.min() >= 6 and data.lengths.max() <= 24
    assert np.all(data.mark.sum(axis=1) == 1)
    verbs = (data.words >= 34).sum(axis=1)
    assert set(verbs.tolist()) == {1, 2}
    for row in range(len(data.lengths)):
        n = int(data.lengths[row])
        words, tags = data.words[row, :n], data.tags[row, :n].tolist()
        p = int(data.mark[row].argmax())
        found = chunks(tags, demo_srl.CHUNK_TYPES, "IOB")
        assert (p, p, demo_srl.V) in found
        for first, last, kind in found:
            span = words[first : last + 1]
            if kind != demo_srl.V:
                assert np.all((span >= 2) & (span < 14))  # nouns only
                assert (last + 1 == p) if kind == demo_srl.A0 else (first - 1 == p)
        # the run stops at a non-noun: the word past each argument is not a noun
        for first, last, kind in found:
            if kind == demo_srl.A0 and first > 0:
                assert not 2 <= words[first - 1] < 14
            if kind == demo_srl.A1 and last + 1 < n:
                assert not 2 <= words[last + 1] < 14
    assert np.all(data.tags[np.arange(24)[None, :] >= data.lengths[:, None]] == demo_srl.OUTSIDE)
