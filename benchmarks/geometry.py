"""Geometry diagnostics at scale: lace against a scikit-learn + numpy pipeline, and the floor.

Workload: hubness (k=10, both directions), one-way neighbours and recall@1/5/10 on N image
queries x N caption gallery at d=512 (synthetic, seeded: captions are noisy copies of their
image, one caption per image).

- lace: `geometry_diagnostics` (one chunked matmul pass yields the top-k of both directions;
  every figure is index arithmetic on those lists), isotropic baseline off.
- peer: `sklearn.neighbors.NearestNeighbors(algorithm="brute", metric="cosine")`, fitted on
  each side and queried with the other, then numpy/scipy for the same figures.
- floor: the bare chunked similarity pass (each (chunk, N) block computed, nothing kept).

Each runs in its own fresh process with the same thread count. Peak memory is the
process's peak resident set (`resource.getrusage(RUSAGE_SELF).ru_maxrss`) minus its
resident set just after the data was made, so it counts everything the method allocates
(numpy, torch and scikit-learn alike), not the shared input arrays. Ratios use process CPU
time (all threads), which a busy shared machine disturbs far less than wall time; wall
times are printed too.

    python benchmarks/geometry.py [--n 50000] [--dim 512] [--threads 1]

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


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_data(n: int, dim: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n, dim), dtype=np.float32)
    images /= np.linalg.norm(images, axis=1, keepdims=True)
    texts = images + 0.09 * rng.standard_normal((n, dim), dtype=np.float32)  # noise norm ~2 per unit signal
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    return images, texts, np.arange(n)


def run_lace(images, texts, owner, chunk: int) -> dict:
    from lace.eval.diagnostics import GeometryOptions, geometry_diagnostics

    return geometry_diagnostics(images, texts, owner, GeometryOptions(k=10, baseline=False, chunk=chunk))


def run_floor(images, texts, owner, chunk: int) -> dict:
    import torch

    gallery = torch.from_numpy(texts)
    queries = torch.from_numpy(images)
    checksum = 0.0
    for start in range(0, queries.shape[0], chunk):
        block = queries[start: start + chunk] @ gallery.T  # (c, N)
        checksum += float(block[0, 0])
    return {"checksum": checksum}


def run_sklearn(images, texts, owner, chunk: int) -> dict:
    import numpy as np
    from scipy import stats
    from sklearn.neighbors import NearestNeighbors

    k = 10
    image_to_text = NearestNeighbors(n_neighbors=k, algorithm="brute", metric="cosine").fit(texts).kneighbors(
        images, return_distance=False)
    text_to_image = NearestNeighbors(n_neighbors=k, algorithm="brute", metric="cosine").fit(images).kneighbors(
        texts, return_distance=False)
    figures = {}
    for ks in (1, 5, 10):
        figures[f"i2t/R@{ks}"] = float((owner[image_to_text[:, :ks]] == np.arange(len(images))[:, None]).any(1).mean())
        figures[f"t2i/R@{ks}"] = float((text_to_image[:, :ks] == owner[:, None]).any(1).mean())
    for name, lists, size in (("i2t", image_to_text, len(texts)), ("t2i", text_to_image, len(images))):
        occurrence = np.bincount(lists.ravel(), minlength=size)
        figures[f"hubness/{name}/skewness"] = float(stats.skew(occurrence))
        figures[f"hubness/{name}/robin_hood"] = 0.5 * float(np.abs(occurrence - occurrence.mean()).sum()) / occurrence.sum()
        figures[f"hubness/{name}/hub_occupancy"] = float(occurrence[occurrence >= 2 * k].sum()) / k / len(lists)
        figures[f"hubness/{name}/antihub_rate"] = float((occurrence == 0).mean())
        figures[f"hubness/{name}/largest_hub_share"] = float(occurrence.max()) / len(lists) / k
    figures["one_way/image"] = float((text_to_image[image_to_text[:, 0], 0] != np.arange(len(images))).mean())
    figures["one_way/text"] = float((owner[image_to_text[text_to_image[:, 0], 0]] != owner).mean())
    return figures


IMPLEMENTATIONS = {"lace": run_lace, "sklearn": run_sklearn, "floor": run_floor}


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    images, texts, owner = make_data(args.n, args.dim, args.seed)
    before = current_rss_bytes()
    start, cpu_start = time.perf_counter(), time.process_time()
    figures = IMPLEMENTATIONS[args.impl](images, texts, owner, args.chunk)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"impl": args.impl, "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_gb": max(peak - before, 0) / 1e9,
                      "figures": figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=50000, help="images = captions")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="threads for torch and BLAS, the same for all")
    parser.add_argument("--chunk", type=int, default=1024, help="query rows per block (lace and floor)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--impl", choices=sorted(IMPLEMENTATIONS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.impl:
        child(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    runs = {}
    for impl in ("floor", "lace", "sklearn"):
        command = [sys.executable, __file__, "--impl", impl, "--n", str(args.n), "--dim", str(args.dim),
                   "--threads", str(args.threads), "--chunk", str(args.chunk), "--seed", str(args.seed)]
        output = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
        runs[impl] = json.loads(output.strip().splitlines()[-1])
    lace, peer, floor = runs["lace"], runs["sklearn"], runs["floor"]
    shared = sorted(set(lace["figures"]) & set(peer["figures"]))
    largest_difference = max(abs(lace["figures"][key] - peer["figures"][key]) for key in shared)
    print(f"geometry diagnostics, {args.n} x {args.n} at d={args.dim}, {args.threads} thread(s)")
    print("| implementation | wall s | CPU s | peak extra memory (GB) |")
    print("|---|---:|---:|---:|")
    for name, run in (("lace geometry_diagnostics", lace), ("sklearn NearestNeighbors brute cosine + numpy", peer),
                      ("floor: bare chunked similarity pass", floor)):
        print(f"| {name} | {run['seconds']:.2f} | {run['cpu_seconds']:.2f} | {run['peak_gb']:.3f} |")
    print(f"figures compared: {len(shared)}; largest |lace - sklearn| = {largest_difference:.2e}")
    print(json.dumps({
        "benchmark": "geometry", "n_queries": args.n, "n_gallery": args.n, "dim": args.dim, "threads": args.threads,
        "lace_seconds": round(lace["seconds"], 3), "sklearn_seconds": round(peer["seconds"], 3),
        "floor_seconds": round(floor["seconds"], 3),
        "lace_cpu_seconds": round(lace["cpu_seconds"], 3), "sklearn_cpu_seconds": round(peer["cpu_seconds"], 3),
        "floor_cpu_seconds": round(floor["cpu_seconds"], 3),
        "vs_peer_ratio": round(peer["cpu_seconds"] / lace["cpu_seconds"], 3),
        "vs_floor_ratio": round(lace["cpu_seconds"] / floor["cpu_seconds"], 3),
        "vs_peer_ratio_wall": round(peer["seconds"] / lace["seconds"], 3),
        "vs_floor_ratio_wall": round(lace["seconds"] / floor["seconds"], 3),
        "peak_gb": round(lace["peak_gb"], 3), "sklearn_peak_gb": round(peer["peak_gb"], 3),
        "max_figure_difference": largest_difference,
    }))


if __name__ == "__main__":
    main()
