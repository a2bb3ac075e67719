"""`make bench`: run every workload, print each result, write the table to bench/RESULTS.md.

A workload that fails outright still gets a row ("n/a (reason)") so the table always shows
every workload; numbers are never carried over from an earlier run.

    python bench/run_all.py [--only w1,w2] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from timing import TORCH_THREADS, markdown_table, measured, print_result, row, unavailable

WORKLOADS = {
    "w1": ("w1_mlp", "W1 MLP 784-512-512-10, batch 128, SGD"),
    "w2": ("w2_per_op", "W2 per-op cost of cheap ops, chains of 1000 on shape [4]"),
    "w3": ("w3_rnn", "W3 tanh RNN T=32, batch 32, 64->128, train step, 1 thread"),
    "w4": ("w4_ifelse", "W4 per-row IfElse 1024x64, two fc branches, forward"),
    "w5": ("w5_run_overhead", "W5 one Executor.run (feed, 1 scale op, fetch)"),
    "w6": ("w6_peak_rss", "W6 peak RSS of W1 training"),
    "w7": ("w7_rnn_memory", "W7 RNN example, 1000 train steps"),
    "w8": ("w8_lenet", "W8 LeNet-5 train step, [64, 1, 28, 28], SGD, 1 thread"),
    "w9": ("w9_conv", "W9 conv2d fwd+bwd, 64->64 on [32, 64, 28, 28], 1 and 2 threads"),
    "w10": ("w10_lstm", "W10 LSTM T=32, batch 32, 64->128, 1 layer, train step, 1 thread"),
    "w11": ("w11_resnet50_onnx", "W11 ResNet-50 (light) from ONNX, forward, 1 thread"),
    "w12": ("w12_distributed", "W12 data-parallel MPI, 1 BLAS thread per rank"),
    "w15": ("w15_transformer", "W15 Transformer encoder layer train step, 1 and 2 threads"),
    "w16": ("w16_word2vec", "W16 word2vec step, 100,000-row tables: is_sparse vs dense vs PyTorch"),
    "w17": ("w17_wgan_gp", "W17 WGAN-GP critic step (second-order gradients), 1 and 2 threads"),
    "w13": ("w13_resnet18", "W13 ResNet-18 (CIFAR form) train step, 1 and 2 threads"),
    "w14": ("w14_bn_pool", "W14 batch_norm + 2x2 max-pool fwd+bwd [32, 64, 56, 56], 1, 2 threads"),
    "w19": ("w19_rows", "W19 cross-entropy, layer_norm and Adam on large tensors, 1, 2 threads"),
    "scaling": ("threads_scaling", "W1/W8/W10 train steps at 1 and 2 threads (issue 29)"),
    "import": ("import_time", "import time"),
}

RESULTS = Path(__file__).with_name("RESULTS.md")


def run_workload(key: str) -> dict:
    module_name, title = WORKLOADS[key]

    def run() -> dict:
        try:
            return importlib.import_module(module_name).run()
        except Exception as exc:
            return {"workload": title, "rows": [row("whole workload", "", unavailable(exc))]}

    return measured(run)


def environment() -> str:
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    return (
        f"{datetime.date.today()}; {platform.machine()} {cpu_model()}, {os.cpu_count()} cores; "
        f"Python {platform.python_version()}, NumPy {np.__version__} ({blas()}), "
        f"PyTorch {torch_version} ({TORCH_THREADS} threads)"
    )


def cpu_model() -> str:
    """The CPU's model name and feature level: the figures of two runs compare only on the same
    hardware (the project's VMs have been AMD EPYCs with and without AVX-512)."""
    model, avx512 = "", False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    avx512 = " avx512f" in line
                    break
    except OSError:
        return platform.processor() or "unknown CPU"
    return f"{model or 'unknown CPU'}{' with AVX-512' if avx512 else ''}"


def blas() -> str:
    """NumPy's BLAS and the kernels it chose for this CPU (OpenBLAS's core type)."""
    from threadpoolctl import threadpool_info

    # an environment may force OpenBLAS's kernels (some hosts set OPENBLAS_CORETYPE=Haswell, the
    # AVX2 kernels, for old OpenBLAS builds): the figures depend on it, so the header says so
    forced = os.environ.get("OPENBLAS_CORETYPE")
    for info in threadpool_info():
        if info.get("user_api") == "blas":
            return (
                f"{info.get('internal_api')} {info.get('version')}, "
                f"{info.get('architecture')} kernels"
                + (f" (forced by OPENBLAS_CORETYPE={forced})" if forced else "")
            )
    return "BLAS unknown"


def write_results(results: list[dict], seconds: float) -> None:
    notes = [f"- {r['workload']}: {n}" for r in results for n in r.get("notes", [])]
    text = (
        "# nestflow benchmarks\n\n"
        "Written by `make bench` (bench/run_all.py); do not edit by hand. Each workload runs "
        "nestflow, PyTorch eager and a NumPy-by-hand floor interleaved in one process (medians "
        "of interleaved rounds); peak RSS and import time use one fresh process per sample. "
        "Figures are noisy on a shared 2-core machine: compare ratios within one run.\n\n"
        f"Run: {environment()}; {seconds:.0f} s in all.\n\n"
        + markdown_table(results)
        + ("\nNotes:\n" + "\n".join(notes) + "\n" if notes else "")
    )
    RESULTS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="comma-separated keys: " + ",".join(WORKLOADS))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    keys = args.only.split(",") if args.only else list(WORKLOADS)
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    start = time.perf_counter()
    results = []
    for key in keys:
        result = run_workload(key)
        print_result(result, flush=True)
        results.append(result)
    seconds = time.perf_counter() - start
    print(f"\n{seconds:.0f} s in all")
    if not args.no_write:
        write_results(results, seconds)
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
