"""W16: one word2vec train step with a 100,000-row table (issue 31): skip-gram with negative
sampling, batch 512 centres, 1 context word + 5 negatives each, dim 64, two tables (input and
output embeddings), Adam.

nestflow: embedding(is_sparse=True) x2 (the tables' gradients are SelectedRows), the score
sum(centre * word), sigmoid cross-entropy, mean, optimizer.Adam(lazy_mode=True), one
Executor.run per step; the same with is_sparse=False (dense gradients, dense Adam: every row
of both tables every step). PyTorch: nn.Embedding(sparse=True) x2 and optim.SparseAdam (lazy,
as lazy_mode). All start from the same tables and see the same batch; the first losses are
checked to agree. Targets: sparse >= 5x faster than dense in nestflow, <= 1.0x PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
from timing import interleaved, main, row, setup_torch, unavailable

VOCAB, DIM, BATCH, WORDS = 100_000, 64, 512, 6  # WORDS: 1 context + 5 negatives
LR = 1e-3


def batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    centre = rng.integers(0, VOCAB, (BATCH, 1)).astype("int64")
    words = rng.integers(0, VOCAB, (BATCH, WORDS)).astype("int64")
    labels = np.zeros((BATCH, WORDS), "float32")
    labels[:, 0] = 1.0
    return centre, words, labels


def make_nestflow_step(data, is_sparse: bool) -> tuple[Callable[[], float], dict]:
    import nestflow as nf

    centre, words, labels = data
    main_p, startup = nf.Program(), nf.Program()
    startup.random_seed = 1
    with nf.program_guard(main_p, startup):
        c = nf.data("centre", [-1, 1], "int64")
        w = nf.data("words", [-1, WORDS], "int64")
        y = nf.data("labels", [-1, WORDS])
        c_emb = nf.layers.embedding(c, [VOCAB, DIM], is_sparse, param_attr="w2v.in")
        w_emb = nf.layers.embedding(w, [VOCAB, DIM], is_sparse, param_attr="w2v.out")
        score = nf.layers.reduce_sum(w_emb * nf.layers.reshape(c_emb, [-1, 1, DIM]), dim=-1)
        loss = nf.layers.mean(nf.layers.sigmoid_cross_entropy_with_logits(score, y))
        nf.optimizer.Adam(LR, lazy_mode=True).minimize(loss)
    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    exe.run(startup, scope=scope)
    tables = {n: scope.find_var(n).get(nf.Tensor).numpy() for n in ("w2v.in", "w2v.out")}
    feed = {"centre": centre, "words": words, "labels": labels}

    def step() -> float:
        (value,) = exe.run(main_p, feed=feed, fetch_list=[loss], scope=scope)
        return float(value)

    return step, tables


def make_torch_step(data, tables, torch) -> Callable[[], float]:
    centre, words, labels = (torch.from_numpy(a) for a in data)
    emb_in = torch.nn.Embedding(VOCAB, DIM, sparse=True)
    emb_out = torch.nn.Embedding(VOCAB, DIM, sparse=True)
    with torch.no_grad():
        emb_in.weight.copy_(torch.from_numpy(tables["w2v.in"]))
        emb_out.weight.copy_(torch.from_numpy(tables["w2v.out"]))
    opt = torch.optim.SparseAdam([emb_in.weight, emb_out.weight], lr=LR)
    bce = torch.nn.functional.binary_cross_entropy_with_logits

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        score = (emb_out(words) * emb_in(centre)).sum(-1)
        loss = bce(score, labels)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


@contextmanager
def _threads(n: int, torch):
    """n threads for nestflow, NumPy's BLAS and PyTorch inside the block."""
    from threadpoolctl import threadpool_limits

    import nestflow as nf

    before = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=n):
        nf.set_num_threads(n)
        if torch is not None:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(before)


def run(rounds: int = 5) -> dict:
    torch = setup_torch()
    data = batch()
    cases: dict[str, Callable[[], float]] = {}
    entries: dict[str, str] = {}
    tables = None
    for name, sparse in (("sparse", True), ("dense", False)):
        try:
            cases[name], tables = make_nestflow_step(data, sparse)
        except Exception as exc:  # report it, never fake a number
            entries[name] = unavailable(exc)
    if torch is not None and tables is not None:
        cases["torch"] = make_torch_step(data, tables, torch)
    notes = []
    first = {name: fn() for name, fn in cases.items()}
    if len(set(np.round(list(first.values()), 5))) > 1:
        notes.append(f"first losses differ: {first}")
    rows = []
    for n in (1, 2):
        with _threads(n, torch):
            times = interleaved(cases, rounds=rounds, budget_s=0.3)
        ms = {name: t * 1e3 for name, t in times.items()}
        threads = f"{n} thread{'s' if n > 1 else ''}"
        rows.append(
            row(
                f"is_sparse=True step, {threads}",
                "ms",
                ms.get("sparse", entries.get("sparse")),
                torch=ms.get("torch", "n/a (torch not installed)"),
                targets=[("torch", 1.0)],
            )
        )
        rows.append(
            row(
                f"is_sparse=False (dense) step, {threads}",
                "ms",
                ms.get("dense", entries.get("dense")),
            )
        )
        if "sparse" in ms and "dense" in ms:
            speedup = ms["dense"] / ms["sparse"]
            verdict = "met" if speedup >= 5 else "MISSED"
            notes.append(f"{threads}: dense / sparse = {speedup:.1f}x (target >= 5x: {verdict})")
    return {
        "workload": "W16 word2vec skip-gram step, 2 tables 100,000 x 64, batch 512 x 6, Adam",
        "rows": rows,
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
