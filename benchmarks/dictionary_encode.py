"""Sparse-encoding speed: lace's batch OMP against the matrix-product floor and scikit-learn.

Data: N = 100k unit vectors in d = 512, each a non-negative combination of 8 random
atoms of a ground-truth dictionary (K = 4096 unit rows; weights uniform in [0.5, 1.5])
plus Gaussian noise of norm ~0.1, normalised. Both coders get that same dictionary and
s = 8. scikit-learn codes ~100 rows/s, so it runs on a subset and its throughput is
scaled; all reconstruction errors are measured on that same subset.

Reported: throughputs, mean relative squared error |x - aD|^2 / |x|^2 of each coder,
lace's time over the floor (one (N, d) x (d, K) product, the faster of 4096-row blocks
and lace's own block size) and where lace's time goes (a per-stage profile of the first
--profile-n rows). lace runs plain OMP (nonnegative=False, the same algorithm as
scikit-learn, codes equal) and its default non-negative OMP. The floor and the two lace
coders are timed alternately in one process, best of --repeats, so that a busy machine
slows them alike; the load average is printed with the figures. On CPU the times are the
process's CPU time (one thread, so on an idle machine the same as wall time, and on a
shared one not inflated by waiting for a core); wall times are in the JSON too. Times
include the Gram matrix D D^T. One thread. On CPU lace runs its fused kernel, compiled
with numba: its first call (compilation, or a load from numba's on-disk cache) is timed
apart and not in the figures; --kernel torch times the batched torch kernel instead.

Which kernels ran is printed under the table and in the JSON's "kernels": torch's BLAS for the
product, the floor and the Gram (oneMKL's own verbose line: version and instruction set), numpy's
BLAS, which only scikit-learn uses (threadpoolctl: library, version, architecture), the CPU numba
compiles the fused kernel for, and OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as set for the run.

Usage: python benchmarks/dictionary_encode.py [--n 100000] [--peer-n 1000] [--device cpu] [--kernel torch]
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import tempfile
import time

import llvmlite.binding
import torch
from sklearn.decomposition import sparse_encode
from threadpoolctl import threadpool_info, threadpool_limits
from torch.profiler import ProfilerActivity, profile

from lace.dictionary import fused_omp
from lace.dictionary.sparse_coding import (
    CPU_BLOCK_ROWS,
    DEVICE_BLOCK_ROWS,
    SparseCodes,
    decode,
    encode,
)

WALL: list[float] = []  # wall time of every `timed` call, in order

STAGES = {  # profiler label -> row of the stage table; rows of the kernel not run stay out
    "encode/gram": "Gram D D^T (once)",
    "omp/tile_maxima": "tile maxima of the Gram (once)",
    "omp/product": "product X D^T",
    "omp/fused_rows": "fused per-row OMP (compiled)",
    "omp/argmax": "arg-max scans over (B, K)",
    "omp/cholesky": "Cholesky update, coefficients (B, s, s)",
    "omp/correlation_update": "Gram update of correlations (B, K)",
    "omp/refit": "non-negative refit",
}


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


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function, device: torch.device):
    """(seconds, result): CPU time of this process on CPU, wall time on an accelerator."""
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    synchronise(device)
    start, wall_start = clock(), time.perf_counter()
    result = function()
    synchronise(device)
    WALL.append(time.perf_counter() - wall_start)
    return clock() - start, result


def stage_profile(x: torch.Tensor, atoms: torch.Tensor, sparsity: int, nonnegative: bool,
                  chunk: int | None, kernel: str | None) -> dict[str, float]:
    """Seconds per stage of encoding `x` (CPU time of each labelled stage; 'other' is the rest)."""
    encode(x[:256], atoms, sparsity, nonnegative=nonnegative, chunk_size=chunk, kernel=kernel)  # warm up
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        encode(x, atoms, sparsity, nonnegative=nonnegative, chunk_size=chunk, kernel=kernel)
        total = time.perf_counter() - start
    seconds = {name: 0.0 for name in STAGES}
    for event in profiler.key_averages():
        if event.key in seconds:
            seconds[event.key] = event.cpu_time_total / 1e6
    seconds["other"] = max(total - sum(seconds.values()), 0.0)  # Python, allocation, concatenation
    return seconds


def first_call_seconds(x: torch.Tensor, atoms: torch.Tensor, sparsity: int) -> tuple[float, str]:
    """Wall seconds of the first OMP calls (both selection rules) on a few rows: numba's compilation
    of the fused kernel, or its load from the on-disk cache; and which of the two it was."""
    start = time.perf_counter()
    for nonnegative in (False, True):
        encode(x[:4], atoms[:64], min(sparsity, 64), nonnegative=nonnegative)
    seconds = time.perf_counter() - start
    hits = sum(fused_omp._omp_rows.stats.cache_hits.values())
    return seconds, "loaded from cache" if hits else "compiled"


def mkl_verbose_line() -> str:
    """oneMKL's description of itself (version, instruction set it dispatches to), from its verbose output
    of one small product; empty when torch does not use MKL."""
    if not torch.backends.mkl.is_available():
        return ""
    with tempfile.TemporaryFile() as captured:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(captured.fileno(), 1)  # MKL writes to the C stdout
        try:
            with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
                torch.ones(8, 8) @ torch.ones(8, 8)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        captured.seek(0)
        lines = captured.read().decode(errors="replace").splitlines()
    return next((line.removeprefix("MKL_VERBOSE ").strip() for line in lines if "Product build" in line), "")


def kernels() -> dict:
    """Which kernels this run used: torch's BLAS (product, floor, Gram), numpy's BLAS (scikit-learn's peer,
    through threadpoolctl), numba's target CPU (the fused kernel) and the OpenBLAS overrides in force."""
    mkl = mkl_verbose_line()
    isa = re.search(r"Intel\(R\) 64 architecture (.*?), Lnx", mkl)
    version = re.search(r"oneMKL (.*?) Product build", mkl)
    return {
        "torch_blas": {"library": "oneMKL" if mkl else "not MKL", "version": version.group(1) if version else None,
                       "instructions": isa.group(1) if isa else None,
                       "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "numpy_blas": [{key: pool.get(key) for key in ("internal_api", "version", "architecture", "prefix")}
                       for pool in threadpool_info() if pool["user_api"] == "blas"],
        "numba_cpu": llvmlite.binding.get_host_cpu_name(),
        "environment": {name: os.environ.get(name) for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
    }


def print_kernels(ran: dict) -> None:
    torch_blas = ran["torch_blas"]
    print(f"kernels: product, floor and Gram in torch's {torch_blas['library']} {torch_blas['version'] or ''} "
          f"({torch_blas['instructions'] or 'instruction set not reported'}; torch CPU capability "
          f"{torch_blas['torch_cpu_capability']}); fused OMP compiled by numba for {ran['numba_cpu']}")
    for pool in ran["numpy_blas"]:
        print(f"         BLAS of numpy / scipy (scikit-learn's peer only): {pool['internal_api']} {pool['version']}, "
              f"architecture {pool['architecture']}")
    print("         " + ", ".join(f"{name}={value if value is not None else 'unset'}"
                                 for name, value in ran["environment"].items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--peer-n", type=int, default=1000)
    parser.add_argument("--atoms", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--sparsity", type=int, default=8)
    parser.add_argument("--chunk-size", type=int, default=None, help="lace's rows per block (default: lace's)")
    parser.add_argument("--repeats", type=int, default=3, help="alternated timings; the best of each is kept")
    parser.add_argument("--profile-n", type=int, default=16384, help="rows of the per-stage profile")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kernel", choices=("fused", "torch"), default=None,
                        help="lace's OMP kernel (default: fused on CPU, torch elsewhere)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)

    x, atoms = synthetic(args.n, args.atoms, args.dim, args.sparsity)
    x, atoms = x.to(device), atoms.to(device)
    fused = device.type == "cpu" and args.kernel != "torch"
    compile_s, compile_source = first_call_seconds(x, atoms, args.sparsity) if fused else (0.0, "")
    block_rows = args.chunk_size or (CPU_BLOCK_ROWS if device.type == "cpu" else DEVICE_BLOCK_ROWS)

    def floor(rows: int):
        def product() -> None:
            for start in range(0, args.n, rows):
                x[start : start + rows] @ atoms.T
        return product

    def lace(nonnegative: bool):
        return lambda: encode(x, atoms, args.sparsity, nonnegative=nonnegative, chunk_size=args.chunk_size,
                              kernel=args.kernel)

    floors, plains, nonnegs = [], [], []
    wall_floors, wall_plains, wall_nonnegs = [], [], []
    for _ in range(args.repeats):
        floors.append(min(timed(floor(4096), device)[0], timed(floor(block_rows), device)[0]))
        wall_floors.append(min(WALL[-2:]))
        plain_s, codes = timed(lace(False), device)
        wall_plains.append(WALL[-1])
        floors.append(timed(floor(4096), device)[0])
        wall_floors.append(WALL[-1])
        nonneg_s, nonneg_codes = timed(lace(True), device)
        wall_nonnegs.append(WALL[-1])
        plains.append(plain_s)
        nonnegs.append(nonneg_s)
    floor_s, lace_s, nonneg_s = min(floors), min(plains), min(nonnegs)
    wall_floor_s, wall_lace_s, wall_nonneg_s = min(wall_floors), min(wall_plains), min(wall_nonnegs)
    load = os.getloadavg()

    subset = x[: args.peer_n].cpu()
    with threadpool_limits(1):
        peer_s, peer_codes = timed(
            lambda: sparse_encode(subset.numpy(), atoms.cpu().numpy(), algorithm="omp",
                                  n_nonzero_coefs=args.sparsity), torch.device("cpu"))
    peer_codes = torch.from_numpy(peer_codes)

    def subset_error(sparse: SparseCodes) -> tuple[float, SparseCodes]:
        head = SparseCodes(sparse.indices[: args.peer_n].cpu(), sparse.values[: args.peer_n].cpu(), args.atoms)
        return relative_error(subset, decode(head, atoms.cpu())), head

    lace_error, head = subset_error(codes)
    nonneg_error, _ = subset_error(nonneg_codes)
    peer_error = relative_error(subset, peer_codes @ atoms.cpu())
    code_gap = float((head.to_dense() - peer_codes).abs().max())
    stages = {}
    if device.type == "cpu":
        profiled = x[: args.profile_n]
        stages = {kind: stage_profile(profiled, atoms, args.sparsity, kind == "nonnegative", args.chunk_size,
                                      args.kernel)
                  for kind in ("plain", "nonnegative")}
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    ran = kernels()
    lace_rate, peer_rate = args.n / lace_s, args.peer_n / peer_s

    print(f"encode N={args.n} x d={args.dim}, K={args.atoms}, s={args.sparsity}, 1 thread, {device}; "
          f"{'CPU' if device.type == 'cpu' else 'wall'} time, best of {args.repeats} alternated; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'coder':<34}{'rows/s':>12}{'rel. error':>12}{'time (s)':>10}{'x floor':>9}")
    print(f"{'floor: one (N,d)x(d,K) product':<34}{args.n / floor_s:>12.0f}{'':>12}{floor_s:>10.2f}{1:>9.2f}")
    print(f"{'lace OMP (signs free)':<34}{lace_rate:>12.0f}{lace_error:>12.5f}{lace_s:>10.2f}"
          f"{lace_s / floor_s:>9.2f}")
    print(f"{'lace non-negative OMP':<34}{args.n / nonneg_s:>12.0f}{nonneg_error:>12.5f}{nonneg_s:>10.2f}"
          f"{nonneg_s / floor_s:>9.2f}")
    print(f"{'scikit-learn OMP (n=' + str(args.peer_n) + ')':<34}{peer_rate:>12.0f}{peer_error:>12.5f}"
          f"{peer_s:>10.2f}")
    print(f"largest code difference lace vs scikit-learn on the subset: {code_gap:.2e}")
    print_kernels(ran)
    if compile_s:
        print(f"fused kernel's first call (not in the times above): {compile_s:.2f} s, {compile_source}")
    if stages:
        print(f"\nwhere the time goes (profile of the first {args.profile_n} rows; ms per 1k rows, share)")
        print(f"{'stage':<40}{'plain':>16}{'non-negative':>18}")
        for key in (*STAGES, "other"):
            if not any(stages[kind][key] for kind in stages):
                continue  # a stage of the kernel that did not run
            cells = ""
            for kind in ("plain", "nonnegative"):
                total = sum(stages[kind].values())
                value = stages[kind][key]
                cells += f"{1e6 * value / args.profile_n:>10.2f} {100 * value / total:>4.0f}%"
                cells += "  " if kind == "plain" else ""
            print(f"{STAGES.get(key, 'other (Python, allocation, copies)'):<40}{cells}")
    print(json.dumps({
        "benchmark": "dictionary_encode", "kernel": "fused" if fused else "torch",
        "n": args.n, "dim": args.dim, "atoms": args.atoms, "sparsity": args.sparsity, "device": str(device),
        "floor_rows_per_s": round(args.n / floor_s, 1),
        "lace_rows_per_s": round(lace_rate, 1), "lace_nonnegative_rows_per_s": round(args.n / nonneg_s, 1),
        "peer": "sklearn.decomposition.sparse_encode(algorithm='omp')",
        "peer_rows_per_s": round(peer_rate, 1), "peer_n": args.peer_n,
        "lace_relative_error": round(lace_error, 5), "lace_nonnegative_relative_error": round(nonneg_error, 5),
        "peer_relative_error": round(peer_error, 5), "max_code_difference": code_gap,
        "vs_peer_ratio": round(lace_rate / peer_rate, 1),
        "vs_floor_ratio": round(lace_s / floor_s, 2),
        "nonnegative_vs_floor_ratio": round(nonneg_s / floor_s, 2),
        "timing": "process CPU time, best of repeats" if device.type == "cpu" else "wall time, best of repeats",
        "wall_s": {"floor": round(wall_floor_s, 2), "lace": round(wall_lace_s, 2),
                   "lace_nonnegative": round(wall_nonneg_s, 2)},
        "wall_vs_floor_ratio": round(wall_lace_s / wall_floor_s, 2),
        "wall_nonnegative_vs_floor_ratio": round(wall_nonneg_s / wall_floor_s, 2),
        "compile_s": round(compile_s, 2), "compile_source": compile_source,
        "stage_ms_per_1k_rows": {kind: {key: round(1e6 * value / args.profile_n, 3) for key, value in figures.items()}
                                 for kind, figures in stages.items()},
        "repeats": args.repeats, "load_average": [round(value, 2) for value in load],
        "peak_gb": round(peak_gb, 2),
        "threads": 1, "kernels": ran,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
