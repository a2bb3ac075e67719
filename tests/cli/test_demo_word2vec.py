"""`nestflow demo --model word2vec` (issue 31): skip-gram with negative sampling over a
100,000-word vocabulary with embedding(is_sparse=True) and lazy Adam, on synthetic text. A
quick run (1 epoch of 100,000 pairs, a few seconds) through `python -m nestflow`, as a user
runs it, with a bar that run reaches; the full run's bar is the demo's MIN_ACCURACY."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np

from nestflow.cli import demo_word2vec


def test_quick_word2vec_demo_learns_and_reloads_identically(tmp_path):
    args = ["demo", "--model", "word2vec", "--epochs", "1", "--limit", "100000",
            "--min-accuracy", "0.55", "--out", str(tmp_path / "model"), "--no-progress"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "nestflow", *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    accuracy = float(re.search(r"held-out pair accuracy: ([\d.]+)%", result.stdout).group(1))
    assert accuracy >= 55.0
    assert "reloaded scores identical bit for bit: True" in result.stdout
    assert (tmp_path / "model").is_dir()


def test_pairs_are_words_of_one_topic():
    centre, context = demo_word2vec.make_pairs(1000, np.random.default_rng(0))
    per_topic = demo_word2vec.VOCAB // demo_word2vec.TOPICS
    assert centre.shape == context.shape == (1000,)
    np.testing.assert_array_equal(centre // per_topic, context // per_topic)
    assert centre.max() < demo_word2vec.VOCAB and centre.dtype == np.int64
