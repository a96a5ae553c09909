"""Sparse-encoding speed: lace's batch OMP against scikit-learn's `sparse_encode(algorithm="omp")`.

Data: N = 100k unit vectors in d = 512, each a non-negative combination of 8 random
atoms of a ground-truth dictionary (K = 4096 unit rows; weights uniform in [0.5, 1.5])
plus Gaussian noise of norm ~0.1, normalised. Both coders get that same dictionary and
s = 8. scikit-learn codes ~100 rows/s, so it runs on a subset and its throughput is
scaled; both reconstruction errors are measured on that same subset.

Reported: throughputs, speed ratio, mean relative squared error |x - aD|^2 / |x|^2 for
each, and lace's time over the floor (one (N, d) x (d, K) product, chunked the same way).
Both coders' times include computing the Gram matrix D D^T.
lace runs plain OMP (nonnegative=False, the same algorithm as scikit-learn, codes equal);
its default non-negative OMP is timed too. Both use one thread.

Usage: python benchmarks/dictionary_encode.py [--n 100000] [--peer-n 1000]
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch
from sklearn.decomposition import sparse_encode
from threadpoolctl import threadpool_limits

from lace.dictionary.sparse_coding import decode, encode


def synthetic(n: int, n_atoms: int, dim: int, sparsity: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    atoms = torch.nn.functional.normalize(torch.randn(n_atoms, dim, generator=generator), dim=1)
    rows = []
    for start in range(0, n, 16384):
        m = min(16384, n - start)
        support = torch.randint(n_atoms, (m, sparsity), generator=generator)
        weights = 0.5 + torch.rand(m, sparsity, generator=generator)
        x = torch.einsum("ns,nsd->nd", weights, atoms[support])
        x = x + 0.1 * x.norm(dim=1, keepdim=True) / dim**0.5 * torch.randn(m, dim, generator=generator)
        rows.append(torch.nn.functional.normalize(x, dim=1))
    return torch.cat(rows), atoms


def relative_error(x: torch.Tensor, reconstruction: torch.Tensor) -> float:
    return float((((x - reconstruction) ** 2).sum(1) / (x**2).sum(1)).mean())


def timed(function):
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--peer-n", type=int, default=1000)
    parser.add_argument("--atoms", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--sparsity", type=int, default=8)
    parser.add_argument("--chunk-size", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(1)

    x, atoms = synthetic(args.n, args.atoms, args.dim, args.sparsity)
    chunk = args.chunk_size

    def floor():
        for start in range(0, args.n, chunk):
            x[start : start + chunk] @ atoms.T

    floor_s, _ = timed(floor)
    lace_s, codes = timed(lambda: encode(x, atoms, args.sparsity, nonnegative=False, chunk_size=chunk))
    nonneg_s, nonneg_codes = timed(lambda: encode(x, atoms, args.sparsity, chunk_size=chunk))
    subset = x[: args.peer_n]
    with threadpool_limits(1):
        peer_s, peer_codes = timed(
            lambda: sparse_encode(subset.numpy(), atoms.numpy(), algorithm="omp", n_nonzero_coefs=args.sparsity)
        )
    peer_codes = torch.from_numpy(peer_codes)

    lace_rate = args.n / lace_s
    peer_rate = args.peer_n / peer_s
    subset_codes = type(codes)(codes.indices[: args.peer_n], codes.values[: args.peer_n], codes.n_atoms)
    lace_error = relative_error(subset, decode(subset_codes, atoms))
    nonneg_subset = type(codes)(nonneg_codes.indices[: args.peer_n], nonneg_codes.values[: args.peer_n], codes.n_atoms)
    nonneg_error = relative_error(subset, decode(nonneg_subset, atoms))
    peer_error = relative_error(subset, peer_codes @ atoms)
    code_gap = float((subset_codes.to_dense() - peer_codes).abs().max())
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    print(f"encode N={args.n} x d={args.dim}, K={args.atoms}, s={args.sparsity}, 1 thread")
    print(f"{'coder':<34}{'rows/s':>12}{'rel. error':>12}{'time (s)':>10}")
    print(f"{'floor: one (N,d)x(d,K) product':<34}{args.n / floor_s:>12.0f}{'':>12}{floor_s:>10.2f}")
    print(f"{'lace OMP (signs free)':<34}{lace_rate:>12.0f}{lace_error:>12.4f}{lace_s:>10.2f}")
    print(f"{'lace non-negative OMP':<34}{args.n / nonneg_s:>12.0f}{nonneg_error:>12.4f}{nonneg_s:>10.2f}")
    print(f"{'scikit-learn OMP (n=' + str(args.peer_n) + ')':<34}{peer_rate:>12.0f}{peer_error:>12.4f}{peer_s:>10.2f}")
    print(f"largest code difference lace vs scikit-learn on the subset: {code_gap:.2e}")
    print(json.dumps({
        "benchmark": "dictionary_encode",
        "n": args.n, "dim": args.dim, "atoms": args.atoms, "sparsity": args.sparsity,
        "lace_rows_per_s": round(lace_rate, 1), "lace_nonnegative_rows_per_s": round(args.n / nonneg_s, 1),
        "peer": "sklearn.decomposition.sparse_encode(algorithm='omp')",
        "peer_rows_per_s": round(peer_rate, 1), "peer_n": args.peer_n,
        "lace_relative_error": round(lace_error, 5), "lace_nonnegative_relative_error": round(nonneg_error, 5),
        "peer_relative_error": round(peer_error, 5), "max_code_difference": code_gap,
        "vs_peer_ratio": round(lace_rate / peer_rate, 1),
        "vs_floor_ratio": round(lace_s / floor_s, 2),
        "nonnegative_vs_floor_ratio": round(nonneg_s / floor_s, 2),
        "peak_gb": round(peak_gb, 2),
        "threads": 1,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
