"""`nestflow demo --model sentiment` (issue 11 item 6a): the book's understand_sentiment network
(embedding, bidirectional LSTM, max pool over time, fc) on reviews labelled by whether token A
comes before token B. The test runs a reduced variant (1,500 training reviews, 2 epochs: about
15 s on a loaded 2-core machine, where the full default run takes about 40 s) through
`python -m nestflow`, as a user runs it; the full run checks itself (exit 1 below 95%)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from nestflow.cli import demo_sentiment
from nestflow.cli.main import main


@pytest.fixture(scope="module")
def sentiment_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sentiment") / "model"
    args = ["demo", "--model", "sentiment", "--epochs", "2", "--limit", "1500", "--out", str(out),
            "--no-progress"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "nestflow", *args], capture_output=True, text=True, timeout=300
    )
    return result, out


def test_sentiment_demo_reaches_the_bar_and_reloads_identically(sentiment_run):
    result, _ = sentiment_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1500 training and 1000 held-out reviews of 5-40 tokens" in result.stdout
    accuracy = float(re.search(r"^test accuracy: ([\d.]+)%", result.stdout, re.M).group(1))
    far = float(re.search(r"more than 20 tokens apart: ([\d.]+)%", result.stdout).group(1))
    assert accuracy >= 95.0 and far >= 90.0
    assert "reloaded predictions identical bit for bit: True" in result.stdout


def test_the_saved_model_runs_the_lstm_over_lengths_and_pools_max(sentiment_run, capsys):
    _, out = sentiment_run
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "param bilstm.w_ih_l0: float32[128, 16]" in text
    assert "param bilstm.w_hh_l0_reverse: float32[128, 32]" in text
    assert text.count("= recurrent(") == 2 and text.count("= lstm_unit(") == 2
    assert text.count("= sequence_reverse(") == 2  # the backward direction, in and out
    assert "pooltype='MAX'" in text and "@GRAD" not in text and "adam" not in text


def test_reviews_hold_one_a_and_one_b_and_only_their_order_tells_the_label():
    data = demo_sentiment.make_reviews(2000, np.random.default_rng(3))
    valid = np.arange(demo_sentiment.MAX_LENGTH)[None, :] < data.lengths[:, None]
    assert data.lengths.min() >= 5 and data.lengths.max() <= 40
    assert np.all(data.ids[~valid] == 0) and np.all(data.ids[valid] > 0)
    assert np.all((data.ids == 1).sum(axis=1) == 1) and np.all((data.ids == 2).sum(axis=1) == 1)
    where_a, where_b = (data.ids == 1).argmax(axis=1), (data.ids == 2).argmax(axis=1)
    np.testing.assert_array_equal(data.labels.ravel(), (where_a < where_b).astype(np.int64))
    assert 0.45 < data.labels.mean() < 0.55
    # the distractors' counts are independent of the label
    counts = np.stack([(data.ids == v).sum(axis=1) for v in range(3, 20)], axis=1)
    gap = counts[data.labels.ravel() == 1].mean(axis=0) - counts[data.labels.ravel() == 0].mean(
        axis=0
    )
    assert np.abs(gap).max() < 0.15
    assert demo_sentiment.far_apart(data).sum() > 50


def test_batches_cover_every_review_once_with_similar_lengths():
    data = demo_sentiment.make_reviews(500, np.random.default_rng(4))
    cut = list(demo_sentiment.batches(data, np.random.default_rng(5)))
    rows = np.concatenate(cut)
    assert sorted(rows.tolist()) == list(range(500))
    spread = [int(np.ptp(data.lengths[r])) for r in cut]
    assert max(spread) <= 4
    feed = demo_sentiment.feed_of(data, cut[0])
    assert feed["ids"].shape == (len(cut[0]), data.lengths[cut[0]].max())
