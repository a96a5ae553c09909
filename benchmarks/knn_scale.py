"""Top-k search at scale: lace's exact chunked search against FAISS flat, IVF-Flat and HNSW.

Data: N queries and N gallery items (default N = 1M; d = 512, float32 unit vectors, 2 GB
a side), drawn from one mixture of 1000 Gaussian clusters (a point's cosine to its
cluster centre is about 0.7; --noise 3 makes it about 0.3 and the clusters overlap), so
that approximate indexes meet the structure of real embeddings rather than isotropic
noise, where no index beats brute force.

An exact N x N top-10 costs about 2 N^2 d = 5e14 FLOP, hours on a few cores. So the
searches run on a seeded sample of --sample queries (drawn from the same mixture)
against the full gallery, and their times are extrapolated linearly to all N queries
(search time is linear in the number of queries); fields and rows saying
"extrapolated" are such figures. Index building (FAISS's copy of the gallery, IVF's
k-means, HNSW's graph) is timed in full on the whole gallery. recall@10 of each
approximate index is measured on the sample against the exact lists.

Times: with one thread (the default) the process's CPU time, which on a shared machine
is not inflated by waiting for a core (on an idle one it equals wall time); with more
threads wall time. Wall times are in the JSON as well.

Memory: "extra GB" is the peak resident memory during a method above what was resident
before it (sampled every 20 ms), so the gallery itself is not counted; peak_gb is the
process's peak.

Usage: python benchmarks/knn_scale.py [--n 1000000] [--sample 10000] [--threads 1]
The last printed line is one JSON object. vs_peer_ratio is FAISS flat's search time
over lace's exact search time (both extrapolated to N queries); vs_floor_ratio is lace's exact search
time over the similarity product alone in the same blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time

import torch
import torch.nn.functional as F

from lace.eval.faiss_search import build_index, import_faiss, ivf_lists, search_index
from lace.eval.neighbours import DEFAULT_CHUNK, GALLERY_BLOCK, KnnOptions, topk_neighbours

CLUSTERS = 1000


def mixture(n: int, dim: int, centres: torch.Tensor, generator: torch.Generator, noise: float = 1.0,
            block: int = 65536) -> torch.Tensor:
    """(n, dim) unit vectors: a random centre plus isotropic noise `noise` times the centre's scale, normalised."""
    out = torch.empty(n, dim)
    for start in range(0, n, block):
        m = min(block, n - start)
        which = torch.randint(centres.shape[0], (m,), generator=generator)
        out[start : start + m] = F.normalize(centres[which] + noise * torch.randn(m, dim, generator=generator), dim=1)
    return out


def resident_gb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


class PeakMemory:
    """Peak resident memory above the level at entry, sampled in a thread."""

    def __enter__(self):
        self.start = self.peak = resident_gb()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, resident_gb())
            time.sleep(0.02)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, resident_gb())
        self.extra_gb = self.peak - self.start


class Clock:
    """Seconds of CPU time (one thread) or wall time (several), and the wall time beside them."""

    def __init__(self, threads: int):
        self.clock = time.process_time if threads == 1 else time.perf_counter

    def __enter__(self):
        self.start, self.wall_start = self.clock(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = self.clock() - self.start
        self.wall = time.perf_counter() - self.wall_start


def recall_at(found: torch.Tensor, exact: torch.Tensor) -> float:
    """Mean share of each row's exact top-k that the found top-k holds."""
    hits = (found.unsqueeze(2) == exact.unsqueeze(1)).any(dim=2).sum()
    return float(hits) / exact.numel()


def product_floor(queries: torch.Tensor, gallery: torch.Tensor, chunk: int) -> None:
    """The (S, d) x (d, N) similarity product alone, in the exact search's blocks, nothing kept: the floor
    of any exact top-k."""
    out = torch.empty(min(chunk, queries.shape[0]), min(GALLERY_BLOCK, gallery.shape[0]))
    for start in range(0, queries.shape[0], chunk):
        block = queries[start : start + chunk]
        for first in range(0, gallery.shape[0], GALLERY_BLOCK):
            columns = gallery[first : first + GALLERY_BLOCK]
            torch.mm(block, columns.T, out=out[: block.shape[0], : columns.shape[0]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="gallery items (and the query set's size)")
    parser.add_argument("--sample", type=int, default=10_000, help="queries searched; times extrapolated to --n")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="lace's query rows per block")
    parser.add_argument("--approximate", default="ivf",
                        help="approximate indexes to time, comma-separated: ivf, hnsw (HNSW's build is slow at 1M)")
    parser.add_argument("--nlist", type=int, default=0, help="IVF lists (0: 4 sqrt(n))")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=80)
    parser.add_argument("--ef-search", type=int, default=128)
    parser.add_argument("--noise", type=float, default=1.0, help="cluster noise over centre scale")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    faiss = import_faiss()
    faiss.omp_set_num_threads(args.threads)

    generator = torch.Generator().manual_seed(args.seed)
    centres = torch.randn(CLUSTERS, args.dim, generator=generator)
    gallery = mixture(args.n, args.dim, centres, generator, args.noise)  # (N, d)
    sample = min(args.sample, args.n)
    queries = mixture(sample, args.dim, centres, generator, args.noise)  # (S, d): a seeded sample of the query set
    scale = args.n / sample

    rows = {}
    with PeakMemory() as memory, Clock(args.threads) as search:
        exact = topk_neighbours(queries, gallery, args.k, chunk=args.chunk)
    rows["lace exact (chunked)"] = {"build_s": 0.0, "search_s": search.seconds, "extra_gb": memory.extra_gb,
                                    "recall": 1.0, "wall_s": round(search.wall, 2)}
    with Clock(args.threads) as floor:
        product_floor(queries, gallery, args.chunk)

    indexes = ["flat"] + [name for name in args.approximate.split(",") if name]
    for name in indexes:
        options = KnnOptions(backend="faiss", index=name, nlist=args.nlist, nprobe=args.nprobe, hnsw_m=args.hnsw_m,
                             ef_construction=args.ef_construction, ef_search=args.ef_search, seed=args.seed)
        with PeakMemory() as memory:
            with Clock(args.threads) as build:
                index = build_index(gallery, options)
            with Clock(args.threads) as search:
                _, found = search_index(index, queries, args.k, options)
            del index
        label = {"flat": "FAISS IndexFlatIP (exact)",
                 "ivf": f"FAISS IVF-Flat nlist={ivf_lists(args.n, options)} nprobe={args.nprobe}",
                 "hnsw": f"FAISS HNSW M={args.hnsw_m} efSearch={args.ef_search}"}[name]
        rows[label] = {"build_s": build.seconds, "search_s": search.seconds, "extra_gb": memory.extra_gb,
                       "recall": recall_at(torch.from_numpy(found).long(), exact.indices), "index": name,
                       "wall_s": round(build.wall + search.wall, 2)}

    load = os.getloadavg()
    print(f"top-{args.k} of {args.n} queries among {args.n} items, d={args.dim}, noise {args.noise}, "
          f"{args.threads} thread(s); "
          f"{'CPU' if args.threads == 1 else 'wall'} time; searches timed on {sample} sampled queries and extrapolated x{scale:.0f}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'method':<40}{'build (s)':>10}{'search (s)':>12}{'search, all N':>15}{'total, all N':>14}"
          f"{'extra GB':>10}{'recall@' + str(args.k):>11}")
    for label, row in rows.items():
        print(f"{label:<40}{row['build_s']:>10.1f}{row['search_s']:>12.1f}{row['search_s'] * scale:>15.0f}"
              f"{row['build_s'] + row['search_s'] * scale:>14.0f}{row['extra_gb']:>10.2f}{row['recall']:>11.4f}")
    print(f"{'floor: the similarity product alone':<40}{0.0:>10.1f}{floor.seconds:>12.1f}{floor.seconds * scale:>15.0f}"
          f"{floor.seconds * scale:>14.0f}{'':>10}{'':>11}")
    print("(search, all N and total, all N are extrapolated from the sample, in seconds)")

    lace_row = rows["lace exact (chunked)"]
    flat_row = next(row for row in rows.values() if row.get("index") == "flat")
    figures = {
        "benchmark": "knn_scale", "n": args.n, "dim": args.dim, "k": args.k, "threads": args.threads,
        "noise": args.noise,
        "sample_queries": sample, "extrapolation_factor": round(scale, 3),
        "exact_s_measured": round(lace_row["search_s"], 2),
        "exact_s_extrapolated": round(lace_row["search_s"] * scale, 1),
        "exact_extra_gb": round(lace_row["extra_gb"], 2), "exact_wall_s_measured": lace_row["wall_s"],
        "timing": "process CPU time" if args.threads == 1 else "wall time",
        "peer": "faiss.IndexFlatIP",
        "floor_s_measured": round(floor.seconds, 2),
    }
    for row in rows.values():
        if "index" in row:
            name = f"faiss_{row['index']}"
            figures.update({f"{name}_build_s": round(row["build_s"], 1),
                            f"{name}_search_s_measured": round(row["search_s"], 2),
                            f"{name}_search_s_extrapolated": round(row["search_s"] * scale, 1),
                            f"{name}_extra_gb": round(row["extra_gb"], 2),
                            f"{name}_recall_at_{args.k}": round(row["recall"], 4),
                            f"{name}_wall_s_measured": row["wall_s"]})
    figures.update({
        "nlist": ivf_lists(args.n, KnnOptions(nlist=args.nlist)), "nprobe": args.nprobe, "hnsw_m": args.hnsw_m,
        "ef_construction": args.ef_construction, "ef_search": args.ef_search,
        "vs_peer_ratio": round(flat_row["search_s"] / lace_row["search_s"], 3),
        "vs_floor_ratio": round(lace_row["search_s"] / floor.seconds, 3),
        "load_average": [round(value, 2) for value in load],
        "peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    })
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
