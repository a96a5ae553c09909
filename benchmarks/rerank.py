"""Hubness fixes at scale: memory and time of each `--rerank` fix against the plain geometry pass.

Workload: the data of benchmarks/geometry.py (N image queries, N captions, d dimensions,
seeded) and a bank of N more images and captions drawn the same way. Each run is a fresh
process computing `reranked_geometry` for one fix (the plain figures for `plain`), so its
peak resident set minus its resident set after making the data is what the fix allocates.

    python benchmarks/rerank.py [--n 50000] [--dim 512] [--threads 1]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from geometry import current_rss_bytes, make_data

FIXES = ("plain", "csls", "qbnorm", "dn")


def child(args: argparse.Namespace) -> None:
    import torch

    from lace.eval.diagnostics import GeometryOptions, geometry_diagnostics, reranked_geometry
    from lace.eval.rerank import QueryBank

    torch.set_num_threads(args.threads)
    images, texts, owner = make_data(args.n, args.dim, args.seed)
    bank_images, bank_texts, _ = make_data(args.n, args.dim, args.seed + 1)
    bank = QueryBank(torch.from_numpy(bank_images), torch.from_numpy(bank_texts))
    options = GeometryOptions(k=10, baseline=False, chunk=args.chunk)
    before = current_rss_bytes()
    start, cpu_start = time.perf_counter(), time.process_time()
    if args.fix == "plain":
        figures = geometry_diagnostics(images, texts, owner, options)
    else:
        figures = reranked_geometry(images, texts, owner, [args.fix], bank, options)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"fix": args.fix, "seconds": seconds, "cpu_seconds": cpu_seconds,
                      "peak_gb": max(peak - before, 0) / 1e9, "figures": figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=50000, help="images = captions = bank images = bank captions")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=1024, help="query rows per block")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fix", choices=FIXES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fix:
        child(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    runs = {}
    for fix in FIXES:
        command = [sys.executable, __file__, "--fix", fix, "--n", str(args.n), "--dim", str(args.dim),
                   "--threads", str(args.threads), "--chunk", str(args.chunk), "--seed", str(args.seed)]
        output = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
        runs[fix] = json.loads(output.strip().splitlines()[-1])
    print(f"hubness fixes, {args.n} x {args.n} with a bank of {args.n} per modality at d={args.dim}, "
          f"{args.threads} thread(s)")
    print("| fix | wall s | CPU s | CPU vs plain | peak extra memory (GB) | i2t R@1 | N_10 skewness i2t |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    plain_cpu = runs["plain"]["cpu_seconds"]
    for fix, run in runs.items():
        prefix = "" if fix == "plain" else f"rerank/{fix}/"
        print(f"| {fix} | {run['seconds']:.1f} | {run['cpu_seconds']:.1f} | {run['cpu_seconds'] / plain_cpu:.2f} | "
              f"{run['peak_gb']:.3f} | {run['figures'][prefix + 'i2t/R@1']:.3f} | "
              f"{run['figures'][prefix + 'hubness/i2t/skewness']:.2f} |")
    print(json.dumps({
        "benchmark": "rerank", "n": args.n, "dim": args.dim, "threads": args.threads,
        **{f"{fix}_cpu_seconds": round(run["cpu_seconds"], 3) for fix, run in runs.items()},
        **{f"{fix}_peak_gb": round(run["peak_gb"], 3) for fix, run in runs.items()},
        "max_peak_gb": round(max(run["peak_gb"] for run in runs.values()), 3),
    }))


if __name__ == "__main__":
    main()
