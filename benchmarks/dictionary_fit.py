"""Dictionary fitting: lace's online dictionary learning against scikit-learn's
`MiniBatchDictionaryLearning`, at equal wall time.

Data (written to a temporary folder as memory-mapped .npy, 1 GB at the defaults):
N = 500k unit vectors in d = 512, half "image" and half "text". Each is a non-negative
combination of 8 atoms of a ground-truth dictionary (K = 4096 unit rows, weights in
[0.5, 1.5]) plus noise of relative norm 0.1, plus a per-modality offset (a modality
gap), normalised. 10k held-out rows are made the same way.

lace fits `ConceptDictionary(n_atoms=4096, sparsity=8)` streaming from the memory
maps, stopped after `--seconds` of learning; its whole `fit` (including the streaming
mean passes) is timed. scikit-learn then gets exactly that wall time: it reads the
same memory maps in mini-batches of 256, centred and normalised the same way
(per-modality means precomputed for it, not counted), and calls `partial_fit` until the
time is up. Both start from the same K random data rows. scikit-learn minimises an
l1-penalised objective (alpha = 0.1 by default), lace an s-sparse one.

Error: every dictionary codes the held-out centred directions with the same coder,
plain OMP with s = 8 (lace's kernel, signs free), and the mean relative squared
error |c - aD|^2 / |c|^2 is reported; lace's own non-negative coder is reported too.

Usage: python benchmarks/dictionary_fit.py [--n 500000] [--seconds 75]
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.decomposition import MiniBatchDictionaryLearning
from threadpoolctl import threadpool_limits

from lace.dictionary import ConceptDictionary, decode, encode
from lace.dictionary.streaming import Rows, streaming_mean


def write_pool(path: Path, n: int, atoms: torch.Tensor, offset: torch.Tensor, sparsity: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    table = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, atoms.shape[1]))
    for start in range(0, n, 32768):
        table[start : start + 32768] = make_rows(min(32768, n - start), atoms, offset, sparsity, generator).numpy()
    table.flush()
    del table


def make_rows(n: int, atoms: torch.Tensor, offset: torch.Tensor, sparsity: int, generator) -> torch.Tensor:
    support = torch.randint(atoms.shape[0], (n, sparsity), generator=generator)
    weights = 0.5 + torch.rand(n, sparsity, generator=generator)
    x = torch.einsum("ns,nsd->nd", weights, atoms[support])
    x = x + 0.1 * x.norm(dim=1, keepdim=True) / atoms.shape[1] ** 0.5 * torch.randn(x.shape, generator=generator)
    x = torch.nn.functional.normalize(x, dim=1) + offset
    return torch.nn.functional.normalize(x, dim=1)


def centred(rows: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(rows - mean, dim=1)


def relative_error(x: torch.Tensor, atoms: torch.Tensor, sparsity: int, nonnegative: bool = False) -> float:
    atoms = torch.nn.functional.normalize(atoms.float(), dim=1)
    codes = encode(x, atoms, sparsity, nonnegative=nonnegative)
    return float((((x - decode(codes, atoms)) ** 2).sum(1) / (x**2).sum(1)).mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500_000)
    parser.add_argument("--atoms", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--sparsity", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=75.0, help="lace's learning time budget")
    parser.add_argument("--batch-size", type=int, default=8192, help="lace mini-batch")
    parser.add_argument("--peer-batch-size", type=int, default=256)
    parser.add_argument("--alpha", type=float, default=0.1, help="scikit-learn's l1 penalty")
    parser.add_argument("--held-out", type=int, default=10_000)
    args = parser.parse_args()
    torch.set_num_threads(1)

    generator = torch.Generator().manual_seed(0)
    true_atoms = torch.nn.functional.normalize(torch.randn(args.atoms, args.dim, generator=generator), dim=1)
    image_offset = 0.5 * torch.nn.functional.normalize(torch.randn(args.dim, generator=generator), dim=0)
    text_offset = 0.5 * torch.nn.functional.normalize(torch.randn(args.dim, generator=generator), dim=0)

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        started = time.perf_counter()
        write_pool(folder / "image.npy", args.n // 2, true_atoms, image_offset, args.sparsity, seed=1)
        write_pool(folder / "text.npy", args.n - args.n // 2, true_atoms, text_offset, args.sparsity, seed=2)
        print(f"wrote {args.n} x {args.dim} synthetic embeddings in {time.perf_counter() - started:.1f}s")
        held_generator = torch.Generator().manual_seed(3)
        held_image = make_rows(args.held_out // 2, true_atoms, image_offset, args.sparsity, held_generator)
        held_text = make_rows(args.held_out // 2, true_atoms, text_offset, args.sparsity, held_generator)

        started = time.perf_counter()
        lace = ConceptDictionary(n_atoms=args.atoms, sparsity=args.sparsity, batch_size=args.batch_size,
                                 max_seconds=args.seconds, random_state=0)
        lace.fit(folder / "image.npy", folder / "text.npy")
        lace_s = time.perf_counter() - started
        lace_rows = lace.rows_seen_

        images, texts = Rows(folder / "image.npy", "image"), Rows(folder / "text.npy", "text")
        image_mean, text_mean = streaming_mean(images), streaming_mean(texts)
        init_rows = np.random.default_rng(0).choice(images.n_rows, args.atoms, replace=False)
        init = centred(images.take(np.sort(init_rows)), image_mean).numpy()
        peer = MiniBatchDictionaryLearning(
            n_components=args.atoms, alpha=args.alpha, batch_size=args.peer_batch_size, dict_init=init,
            transform_algorithm="omp", transform_n_nonzero_coefs=args.sparsity, random_state=0,
        )
        peer_batches = 0
        half = args.peer_batch_size // 2
        started = time.perf_counter()
        with threadpool_limits(1):
            while time.perf_counter() - started < lace_s:
                start = (peer_batches * half) % (images.n_rows - half)
                batch = torch.cat([centred(images.read(start, start + half), image_mean),
                                   centred(texts.read(start, start + half), text_mean)])
                peer.partial_fit(batch.numpy())
                peer_batches += 1
        peer_s = time.perf_counter() - started
        peer_rows = peer_batches * half * 2

    held = torch.cat([centred(held_image, lace.mean_image_), centred(held_text, lace.mean_text_)])
    lace_error = relative_error(held, lace.atoms_, args.sparsity)
    lace_nonnegative_error = relative_error(held, lace.atoms_, args.sparsity, nonnegative=True)
    peer_error = relative_error(held, torch.from_numpy(peer.components_), args.sparsity)
    truth_error = relative_error(held, true_atoms, args.sparsity)
    init_error = relative_error(held, torch.from_numpy(init), args.sparsity)
    quality = lace.quality(held_image, held_text)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    print(f"fit K={args.atoms}, s={args.sparsity}, d={args.dim} on a {args.n}-row memory-mapped pool, 1 thread")
    print(f"{'dictionary':<42}{'rows seen':>11}{'time (s)':>10}{'held-out rel. error':>21}")
    print(f"{'initial atoms (random data rows)':<42}{'':>11}{'':>10}{init_error:>21.4f}")
    print(f"{'lace online dictionary learning':<42}{lace_rows:>11}{lace_s:>10.1f}{lace_error:>21.4f}")
    print(f"{'  same, its non-negative coder':<42}{'':>11}{'':>10}{lace_nonnegative_error:>21.4f}")
    print(f"{'scikit-learn MiniBatchDictionaryLearning':<42}{peer_rows:>11}{peer_s:>10.1f}{peer_error:>21.4f}")
    print(f"{'ground-truth atoms (reference)':<42}{'':>11}{'':>10}{truth_error:>21.4f}")
    print(f"lace quality on held-out: image FVU {quality['image']['fvu']:.3f}, text FVU {quality['text']['fvu']:.3f}, "
          f"dead atoms {quality['dead_atom_share']:.2%}")
    print(json.dumps({
        "benchmark": "dictionary_fit",
        "n": args.n, "dim": args.dim, "atoms": args.atoms, "sparsity": args.sparsity,
        "lace_seconds": round(lace_s, 1), "lace_rows_seen": lace_rows,
        "lace_relative_error": round(lace_error, 4), "lace_nonnegative_relative_error": round(lace_nonnegative_error, 4),
        "peer": "sklearn.decomposition.MiniBatchDictionaryLearning (partial_fit, same wall time)",
        "peer_seconds": round(peer_s, 1), "peer_rows_seen": peer_rows, "peer_relative_error": round(peer_error, 4),
        "peer_alpha": args.alpha, "initial_relative_error": round(init_error, 4),
        "ground_truth_relative_error": round(truth_error, 4),
        "vs_peer_ratio": round(peer_error / lace_error, 2),
        "vs_peer_ratio_meaning": "peer error / lace error at equal wall time",
        "vs_floor_ratio": round(lace_error / truth_error, 2),
        "vs_floor_ratio_meaning": "lace error / ground-truth dictionary error",
        "peak_gb": round(peak_gb, 2),
        "threads": 1,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
