"""Sparse-encoding speed: lace's batch OMP against the matrix-product floor and scikit-learn.

Data: N = 100k unit vectors in d = 512, each a non-negative combination of 8 random
atoms of a ground-truth dictionary (K = 4096 unit rows; weights uniform in [0.5, 1.5])
plus Gaussian noise of norm ~0.1, normalised. Both coders get that same dictionary and
s = 8. scikit-learn codes ~100 rows/s, so it runs on a subset and its throughput is
scaled; all reconstruction errors are measured on that same subset.

Reported: throughputs, mean relative squared error |x - aD|^2 / |x|^2 of each coder,
lace's time over the floor (one float32 (N, d) x (d, K) product, the faster of 4096-row blocks
and lace's own block size) and where lace's time goes (a per-stage profile of the first
--profile-n rows). lace runs plain OMP (nonnegative=False, the same algorithm as
scikit-learn, codes equal) and its default non-negative OMP. The floor and the lace coders are
timed alternately in one process, each lace run right after a floor run, so that a busy machine
slows them alike; "x floor" is lace's best time over the floor's best, "median" the median over
the repeats of each run over the floor in lace's block size timed just before it. The load average is printed with
the figures. On CPU the times are the process's CPU time (one thread, so on an idle machine the
same as wall time, and on a shared one not inflated by waiting for a core); wall times are in
the JSON too. Times include the Gram matrix D D^T. One thread; everything is run once untimed
first. On CPU lace runs its fused kernel, compiled with numba: its first call (compilation, or a
load from numba's on-disk cache) is timed apart and not in the figures; --kernel torch times the
batched torch kernel instead. On a CPU with AMX lace's fused kernel filters with one bfloat16 product
(`lace.dictionary.bfloat16_filter`) and forms the float32 entries it uses as oneMKL's sgemm does, so its codes are
those of the float32 product: the table adds lace with the float32 product itself ("before the filter") and
counts the rows whose codes differ from it (0 expected).

Which kernels ran is printed under the table and in the JSON's "kernels": the oneMKL and oneDNN
calls (function, thread count) of one block of the floor and of lace, from their verbose output;
torch's oneMKL (version, instruction set, interface and threading layer) and oneDNN; every thread
pool threadpoolctl finds (numpy's and scipy's BLAS: library, version, threading layer,
architecture, used by scikit-learn's peer only; torch's OpenMP; torch's oneMKL is linked into torch
and not visible to threadpoolctl); the CPU numba compiles the fused kernel for; lace's product; and
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as set for the run.

Usage: python benchmarks/dictionary_encode.py [--n 100000] [--peer-n 1000] [--device cpu] [--kernel torch]
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time

import llvmlite.binding
import numba
import torch
from sklearn.decomposition import sparse_encode
from threadpoolctl import threadpool_info, threadpool_limits
from torch.profiler import ProfilerActivity, profile

from lace.dictionary import bfloat16_filter, fused_omp, sparse_coding
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


def support_gap(codes: SparseCodes, reference: SparseCodes) -> dict:
    """How `codes` differ from `reference` codes of the same rows: rows whose atoms (as a set, and in order)
    differ, rows whose values differ in any bit, and the largest difference of the dense codes."""
    same_order = (codes.indices == reference.indices) | ((codes.values == 0) & (reference.values == 0))
    as_sets = torch.sort(torch.where(codes.values != 0, codes.indices, -1), dim=1).values
    reference_sets = torch.sort(torch.where(reference.values != 0, reference.indices, -1), dim=1).values
    dense_gap = 0.0
    for start in range(0, codes.indices.shape[0], 8192):
        part = slice(start, start + 8192)
        dense_gap = max(dense_gap, float((SparseCodes(codes.indices[part], codes.values[part], codes.n_atoms).to_dense()
                                          - SparseCodes(reference.indices[part], reference.values[part],
                                                        reference.n_atoms).to_dense()).abs().max()))
    return {"rows": int(codes.indices.shape[0]), "rows_other_atoms": int((as_sets != reference_sets).any(1).sum()),
            "rows_other_order": int((~same_order).any(1).sum()),
            "rows_other_values": int((codes.values != reference.values).any(1).sum()), "max_code_difference": dense_gap}


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


def verbose_calls(phases: dict) -> dict[str, list[str]]:
    """oneMKL's and oneDNN's verbose lines (they write to the C stdout) while each phase's function runs,
    by phase name; the first phase also gets oneMKL's description of itself ("Product build")."""
    with tempfile.TemporaryFile() as captured:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(captured.fileno(), 1)
        try:
            with (torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON),
                  torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON)):
                for name, function in phases.items():
                    os.write(1, f"@phase {name}\n".encode())
                    function()
                    sys.stdout.flush()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        captured.seek(0)
        lines = captured.read().decode(errors="replace").splitlines()
    calls: dict[str, list[str]] = {}
    phase = None
    for line in lines:
        if line.startswith("@phase "):
            phase = line.removeprefix("@phase ")
            calls[phase] = []
        elif phase is not None and ("MKL_VERBOSE" in line or "onednn_verbose" in line):
            calls[phase].append(line.strip())
    return calls


def call_summary(lines: list[str]) -> list[str]:
    """Distinct kernels of verbose lines: oneMKL function with its thread count ("SGEMM NThr:1"), or the oneDNN
    primitive kind; in order of first call."""
    kinds = []
    for line in lines:
        mkl = re.match(r"MKL_VERBOSE (\w+)\(.*NThr:(\d+)", line)
        onednn = re.match(r"onednn_verbose,(?:[^,]*,){0,3}exec,cpu,(\w+),([^,]*)", line)
        kind = (f"oneMKL {mkl.group(1)} NThr:{mkl.group(2)}" if mkl
                else f"oneDNN {onednn.group(1)} {onednn.group(2)}" if onednn else None)
        if kind and kind not in kinds:
            kinds.append(kind)
    return kinds


def torch_config_line(prefix: str) -> str | None:
    return next((line.strip(" -") for line in torch.__config__.show().splitlines()
                 if line.strip(" -").startswith(prefix)), None)


def kernels(floor_block, lace_block, filtered: bool, dim: int, n_atoms: int) -> dict:
    """Which kernels this run used: the kernels oneMKL and oneDNN report for one block of the floor and of lace
    (their verbose output: function, thread count), torch's oneMKL (version, instruction set, threading layer)
    and oneDNN, every thread pool threadpoolctl finds (numpy's and scipy's BLAS, scikit-learn's peer only;
    torch's OpenMP; torch's oneMKL is linked into torch and invisible to it), numba's target CPU (the fused
    kernel), lace's product (`filtered`: the bfloat16 filter, for (d, K) = `dim`, `n_atoms`) and the OpenBLAS
    overrides in force."""
    calls = verbose_calls({"describe": lambda: torch.ones(8, 8) @ torch.ones(8, 8), "floor": floor_block,
                           "lace": lace_block})
    mkl = next((line.removeprefix("MKL_VERBOSE ").strip() for line in calls.get("describe", [])
                if "Product build" in line), "")
    isa = re.search(r"Intel\(R\) 64 architecture (.*?), Lnx", mkl)
    version = re.search(r"oneMKL (.*?) Product build", mkl)
    layer = re.search(r"GHz (\w+ \w+)$", mkl)
    return {
        "torch_blas": {"library": "oneMKL" if mkl else "not MKL", "version": version.group(1) if version else None,
                       "instructions": isa.group(1) if isa else None,
                       "interface_threading": layer.group(1) if layer else None,
                       "torch_mkl": torch_config_line("Intel(R) oneAPI Math Kernel Library"),
                       "torch_onednn": torch_config_line("Intel(R) MKL-DNN"),
                       "torch_threads": torch.get_num_threads(),
                       "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "floor_calls": call_summary(calls.get("floor", [])),
        "lace_calls": call_summary(calls.get("lace", [])),
        "lace_product": (f"bfloat16 filter (1 product, AMX; {bfloat16_filter.BLOCK_ROWS} rows a call) + candidates' "
                         f"float32 entries as FMA chains in oneMKL sgemm's order (inner blocks of "
                         f"{bfloat16_filter.sgemm_block(dim, n_atoms)})" if filtered else "float32 (oneMKL sgemm)"),
        "threadpools": [{key: pool.get(key) for key in ("user_api", "internal_api", "version", "threading_layer",
                                                         "num_threads", "architecture", "prefix")}
                        for pool in threadpool_info()],
        "numba_cpu": llvmlite.binding.get_host_cpu_name(),
        # the fused kernel is compiled serial (no prange): numba's threading layer is configured but never started
        "numba": {"version": numba.__version__, "threading_layer": numba.config.THREADING_LAYER,
                  "kernel_threads": 1, "gram_updates": "int8 codes of the Gram, near-ties recomputed from float32"},
        "environment": {name: os.environ.get(name) for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
    }


def print_kernels(ran: dict) -> None:
    torch_blas = ran["torch_blas"]
    print(f"kernels: torch's {torch_blas['library']} {torch_blas['version'] or ''} "
          f"({torch_blas['instructions'] or 'instruction set not reported'}; {torch_blas['interface_threading']}); "
          f"torch CPU capability {torch_blas['torch_cpu_capability']}, {torch_blas['torch_threads']} thread(s); "
          f"{torch_blas['torch_onednn']}")
    print(f"         floor block: {', '.join(ran['floor_calls']) or 'no oneMKL / oneDNN call reported'}")
    print(f"         lace block:  {', '.join(ran['lace_calls']) or 'no oneMKL / oneDNN call reported'} "
          f"(product: {ran['lace_product']}); fused OMP compiled by numba {ran['numba']['version']} for "
          f"{ran['numba_cpu']}, serial (threading layer {ran['numba']['threading_layer']} not started), "
          f"Gram updates from {ran['numba']['gram_updates']}")
    for pool in ran["threadpools"]:
        print(f"         threadpoolctl: {pool['user_api']} {pool['internal_api']} {pool['version'] or ''}, "
              f"threading {pool['threading_layer'] or '-'}, {pool['num_threads']} thread(s), "
              f"architecture {pool['architecture'] or '-'} ({pool['prefix']}"
              f"{', scikit-learn peer only' if pool['user_api'] == 'blas' else ''})")
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
    filter_ran = fused and atoms.dtype == torch.float32 and bfloat16_filter.FilterProduct(atoms, 1).usable
    compile_s, compile_source = first_call_seconds(x, atoms, args.sparsity) if fused else (0.0, "")
    block_rows = args.chunk_size or (CPU_BLOCK_ROWS if device.type == "cpu" else DEVICE_BLOCK_ROWS)

    def floor(rows: int):
        def product() -> None:
            for start in range(0, args.n, rows):
                x[start : start + rows] @ atoms.T
        return product

    def lace(nonnegative: bool, filtered: bool = True):
        def run():
            sparse_coding.FILTER_PRODUCT = filtered  # the library's switch; on unless this run is the float32 one
            try:
                return encode(x, atoms, args.sparsity, nonnegative=nonnegative, chunk_size=args.chunk_size,
                              kernel=args.kernel)
            finally:
                sparse_coding.FILTER_PRODUCT = True
        return run

    floor(4096)()  # warm-up, untimed: the floor, and lace on one block
    for nonnegative in (False, True):
        encode(x[:block_rows], atoms, args.sparsity, nonnegative=nonnegative, chunk_size=args.chunk_size,
               kernel=args.kernel)
    times: dict[str, list[float]] = {name: [] for name in ("floor", "plain", "nonnegative", "plain_float32")}
    floor_before: dict[str, list[float]] = {name: [] for name in times}  # the floor timed just before each
    walls: dict[str, list[float]] = {name: [] for name in times}
    runs = [("plain", lace(False)), ("nonnegative", lace(True))]
    runs += [("plain_float32", lace(False, filtered=False))] if filter_ran else []
    results = {}
    for _ in range(args.repeats):  # alternated, so that a busy machine slows them alike
        times["floor"].append(timed(floor(4096), device)[0])  # the floor is the faster of 4096-row blocks
        walls["floor"].append(WALL[-1])
        for name, function in runs:  # and lace's own block size, which each run is paired with
            floor_s = timed(floor(block_rows), device)[0]
            times["floor"].append(floor_s)
            walls["floor"].append(WALL[-1])
            seconds, results[name] = timed(function, device)
            times[name].append(seconds)
            walls[name].append(WALL[-1])
            floor_before[name].append(floor_s)
    codes, nonneg_codes = results["plain"], results["nonnegative"]
    floor_s, lace_s, nonneg_s = min(times["floor"]), min(times["plain"]), min(times["nonnegative"])
    wall_floor_s, wall_lace_s, wall_nonneg_s = min(walls["floor"]), min(walls["plain"]), min(walls["nonnegative"])
    # each run's time over the floor timed just before it, then the median over the repeats
    median_ratio = {name: statistics.median(t / f for t, f in zip(times[name], floor_before[name]))
                    for name in times if times[name] and name != "floor"}
    filter_gap = support_gap(codes, results["plain_float32"]) if filter_ran else None
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
    block = x[:block_rows]
    ran = kernels(lambda: block @ atoms.T, lambda: encode(block, atoms, args.sparsity, kernel=args.kernel),
                  filter_ran, args.dim, args.atoms)
    lace_rate, peer_rate = args.n / lace_s, args.peer_n / peer_s

    timing = "CPU" if device.type == "cpu" else "wall"
    print(f"encode N={args.n} x d={args.dim}, K={args.atoms}, s={args.sparsity}, 1 thread, {device}; {timing} time, "
          f"{args.repeats} repeats alternated; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("x floor: best time over the best floor; median: of each repeat over the floor (lace's block size) "
          "timed just before it")
    print(f"{'coder':<40}{'rows/s':>10}{'rel. error':>12}{'time (s)':>10}{'x floor':>9}{'median':>8}")
    print(f"{'floor: one (N,d)x(d,K) float32 product':<40}{args.n / floor_s:>10.0f}{'':>12}{floor_s:>10.2f}{1:>9.2f}")
    labels = {"plain": ("lace OMP (signs free)", lace_error), "nonnegative": ("lace non-negative OMP", nonneg_error),
              "plain_float32": ("lace OMP, float32 product (no filter)", None)}
    for name, (label, error) in labels.items():
        if times[name]:
            best = min(times[name])
            print(f"{label:<40}{args.n / best:>10.0f}{'' if error is None else f'{error:.5f}':>12}{best:>10.2f}"
                  f"{best / floor_s:>9.2f}{median_ratio[name]:>8.2f}")
    print(f"{'scikit-learn OMP (n=' + str(args.peer_n) + ')':<40}{peer_rate:>10.0f}{peer_error:>12.5f}"
          f"{peer_s:>10.2f}")
    if filter_gap:
        print(f"lace (bfloat16 filter) against lace with the float32 product, signs-free codes of all {filter_gap['rows']}"
              f" rows: {filter_gap['rows_other_atoms']} rows with other atoms, {filter_gap['rows_other_order']} in "
              f"another order, {filter_gap['rows_other_values']} with other values (bits)")
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
        "median_vs_floor_ratio": {name: round(value, 2) for name, value in median_ratio.items()},
        "float32_product_vs_floor_ratio": round(min(times["plain_float32"]) / floor_s, 2) if filter_ran else None,
        "filter_against_float32_product_codes": filter_gap,
        "timing": "process CPU time, best of repeats" if device.type == "cpu" else "wall time, best of repeats",
        "seconds": {name: [round(value, 3) for value in values] for name, values in times.items()},
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
