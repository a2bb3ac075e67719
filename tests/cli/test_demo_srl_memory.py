"""Issue 30 acceptance: 1,000 training steps of the srl example's model (word and mark
embeddings, bidirectional LSTM over per-row lengths, fc, linear_chain_crf, crf_decoding on the
same transition parameter, Adam) leave the process's resident memory and the number of live
scopes where they were: a fresh child process, its VmRSS and nestflow's live scope count after
step 200 (warm: plans compiled, allocator pools filled) and after step 1,000. Batches of 16
of the shortest sentences keep it quick."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import gc, json
import numpy as np
import nestflow as nf
from nestflow.cli import demo_srl
from nestflow.core.scope import live_scope_count

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0

model = demo_srl.build_model()
data = demo_srl.make_sentences(2000, np.random.default_rng(0))
short = np.argsort(data.lengths, kind="stable")[:160]  # the shortest keep 1,000 steps quick
batches = [demo_srl.feed_of(data, short[i : i + 16]) for i in range(0, 160, 16)]
scope, exe = nf.Scope(), nf.Executor()
nf.seed(0)
exe.run(model.startup, scope=scope)
seen, losses = {}, []
for step in range(1, 1001):
    batch = batches[step % len(batches)]
    losses.append(float(exe.run(model.main, feed=batch, fetch_list=[model.loss], scope=scope)[0]))
    if step in (200, 1000):
        gc.collect()
        seen[step] = {"rss_mib": rss_mib(), "scopes": live_scope_count(), "kids": len(scope.kids)}
seen["first_losses"] = float(np.mean(losses[:10]))
seen["last_losses"] = float(np.mean(losses[-10:]))
print(json.dumps(seen))
"""


def test_rss_and_live_scopes_stay_flat_over_1000_training_steps():
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    warm, last = seen["200"], seen["1000"]
    print(seen)
    assert last["scopes"] == warm["scopes"] and last["kids"] == warm["kids"] == 0
    assert last["rss_mib"] - warm["rss_mib"] <= 2.0, seen  # allocator noise only
    assert seen["last_losses"] < seen["first_losses"]  # it did train
