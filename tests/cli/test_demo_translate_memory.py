"""Issue 11 acceptance: 1,000 training steps of the translation example's model (bidirectional
GRU encoder, attention decoder under `nf.layers.rnn`, Adam), then 1,000 runs of its beam-search
program (`dynamic_decode` on While), leave the process's resident memory and the number of live
scopes where they were. Measured as bench/w7_rnn_memory.py does for the RNN example: a fresh
child process, its VmRSS and nestflow's live scope count after run 200 of each phase (warm:
plans compiled, allocator pools filled) and after run 1,000. Batches of 8 strings of 3-5 digits
keep it quick."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads VmRSS from /proc/self/status"
)

CHILD = r"""
import gc, json
import numpy as np
import nestflow as nf
from nestflow.cli import demo_translate as dt
from nestflow.core.scope import live_scope_count

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0

data = dt.make_pairs(2000, np.random.default_rng(0))
short = np.flatnonzero(data.src_len <= 5)
cuts = [short[i : i + 8] for i in range(0, 80, 8)]
assert all(len(rows) == 8 for rows in cuts)
batches = [dt._feed(data, rows) for rows in cuts]
model = dt.build_training()
decoding = dt.build_decoding(dt.BEAM_SIZE)
scope, exe = nf.Scope(), nf.Executor()
nf.seed(0)
exe.run(model.startup, scope=scope)
seen, losses = {}, []

def mark(phase, step):
    if step in (200, 1000):
        gc.collect()
        seen[f"{phase}{step}"] = {
            "rss_mib": rss_mib(), "scopes": live_scope_count(), "kids": len(scope.kids)
        }

for step in range(1, 1001):
    batch = batches[step % len(batches)]
    fetched = exe.run(model.main, feed=batch, fetch_list=[model.loss], scope=scope)
    losses.append(float(fetched[0]))
    mark("train", step)
for step in range(1, 1001):
    batch = batches[step % len(batches)]
    feed = {"src": batch["src"], "src_len": batch["src_len"]}
    ids, = exe.run(decoding.program, feed=feed, fetch_list=[decoding.ids], scope=scope)
    assert ids.shape[0] == 8 and ids.shape[2] == dt.BEAM_SIZE
    mark("decode", step)
seen["first_losses"] = float(np.mean(losses[:10]))
seen["last_losses"] = float(np.mean(losses[-10:]))
print(json.dumps(seen))
"""


def test_rss_and_live_scopes_stay_flat_over_1000_training_and_decoding_runs():
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    print(seen)
    for phase in ("train", "decode"):
        warm, last = seen[f"{phase}200"], seen[f"{phase}1000"]
        assert last["scopes"] == warm["scopes"] and last["kids"] == warm["kids"] == 0, seen
        assert last["rss_mib"] - warm["rss_mib"] <= 2.0, seen  # allocator noise only
    assert seen["last_losses"] < seen["first_losses"]  # it did train
