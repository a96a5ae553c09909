"""Training-step throughput on a GPU beside open_clip's own step, and sparse coding against its floor.

One model (ViT-B-32, random init: no weights are fetched) at one batch (256) in bf16 autocast, each step
forward, loss, backward and AdamW step, timed interleaved (one step of each kind per round, median of rounds)
so that anything slowing the machine hits all alike:
- plain: lace's encoder and `lace.losses.clip_loss`;
- peer: the same open_clip model called as open_clip trains it, with open_clip's own `ClipLoss`;
- LACE: plus M dictionary edits of every caption and image embedding (the real `CounterfactualEditor` on a
  dictionary fitted on random embeddings, labelled with the world vocabulary: `train_step.make_editor`), per-row
  generators as `lace train` draws them, and the LACE loss;
- caption negatives: plus R rule-made captions per caption (`RuleNegatives`), encoded in the same text pass;
- LACE-local, the shipped arm ("LACE-local pairs + real-image negative"): M local image edits at a tower layer in
  the one image pass (`LocalImagePass`, editor fitted on drawn shapes-world scenes), the column, and each edit a row
  of its own with the caption the rule editor writes for it (`pair_rows`, `pair_term`), as
  `train_step.time_local` times it.
Then sparse coding of N x d rows over K atoms at sparsity s (lace's default non-negative OMP, `encode`) against the
matrix-product floor (the (N, d) x (d, K) product in blocks), as `dictionary_encode.py` times it.
Peak GPU memory of each part (on the CPU: the process's peak resident memory, the same for all).

    PYTHONPATH=src python benchmarks/gpu.py [--device cuda] [--batch 256] [--model ViT-B-32] [--steps 20]
    PYTHONPATH=src python benchmarks/gpu.py --device cpu --small    # a dry run of a minute on a CPU
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from contextlib import nullcontext

import open_clip
import torch
import torch.nn.functional as F
from dictionary_encode import synthetic, timed
from local_negatives import world_batch
from train_step import make_editor

from lace.dictionary.sparse_coding import encode
from lace.distributed import DistributedContext
from lace.edits.captions import RuleNegatives
from lace.encoders import load_encoder
from lace.local import LocalEditConfig, build_local_editor
from lace.losses import clip_loss, lace_loss
from lace.row_random import RowGenerators
from lace.train.local_arm import LocalImagePass
from lace.train.negatives import rule_made_captions
from lace.train.optim import build_optimizer
from lace.train.pairs import EditedImages, describe_slots, pair_rows, pair_term

KINDS = ("plain", "peer", "lace", "caption negatives", "local shipped")
SMALL = {"model": "lace-micro-32", "batch": 32, "steps": 3, "codes": 20_000, "atoms": 512, "fit_images": 48,
         "local_layer": "block1", "locate_layer": "block0"}


def peak_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def model_inputs(encoder, n: int, device: torch.device):
    """n drawn shapes-world scenes as model-input pixels (n, 3, S, S) on `device`, their captions, the vocabulary."""
    raw, captions, vocabulary = world_batch(n)
    size = encoder.model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    if raw.shape[-1] != size:
        raw = F.interpolate(raw, size=(size, size), mode="bilinear", align_corners=False)
    return encoder.preprocess.transforms[-1](raw).to(device), captions, vocabulary


def step_functions(args, encoder, device: torch.device) -> dict:
    """Each kind's step: forward, loss, backward (the optimiser step is the caller's)."""
    batch = args.batch
    pixels, captions, vocabulary = model_inputs(encoder, args.fit_images + batch, device)
    fit_pixels, fit_captions = pixels[:args.fit_images], [[c] for c in captions[:args.fit_images]]
    pixels, captions = pixels[args.fit_images:], captions[args.fit_images:]
    tokens = encoder.tokenize(captions).to(device)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if args.bf16 else nullcontext
    editor = make_editor(encoder, args.dictionary_atoms, args.dictionary_sparsity)
    rules = RuleNegatives(vocabulary)
    config = LocalEditConfig(layer=args.local_layer, locate_layer=args.locate_layer, n_edits=args.local_n_edits,
                             fit_images=args.fit_images)
    started = time.perf_counter()  # fitted on the device, as `lace train` fits it
    failures = {}
    try:
        local_editor = build_local_editor(config, encoder.model, fit_pixels, fit_captions,
                                          encoder.preprocess.transforms[-1], vocabulary)
    except Exception as error:  # noqa: BLE001 - reported with the figures; the other kinds still run
        failures["local shipped"] = f"local editor fit: {error!r}"[:400]
    fit_seconds = time.perf_counter() - started
    log(f"LACE editor and local editor ready; local fit {fit_seconds:.1f} s")
    one_process = DistributedContext(rank=0, world_size=1, local_rank=0, device=device)
    peer_loss = open_clip.ClipLoss()
    seeds = list(range(batch))

    def plain():
        with autocast():
            U, V, scale = encoder(pixels, tokens)
        return clip_loss(U.float(), V.float(), scale.float())

    def peer():  # open_clip's own: the model's forward (normalised features, scale) and ClipLoss
        with autocast():
            image_features, text_features, scale = encoder.model(pixels, tokens)
            return peer_loss(image_features, text_features, scale)

    def lace():
        with autocast():
            U, V, scale = encoder(pixels, tokens)
        U, V = U.float(), V.float()
        made_captions = editor.counterfactuals(V, "text", args.n_edits, generator=RowGenerators(seeds))
        made_images = editor.counterfactuals(U, "image", args.n_edits, generator=RowGenerators(seeds))
        return lace_loss(U, V, scale.float(), made_captions.embeddings, made_captions.valid.to(device),
                         made_images.embeddings, made_images.valid.to(device))

    def caption_negatives():
        keys = [(0, 0, i) for i in range(batch)]
        rule_texts, valid = rule_made_captions(rules, captions, keys, 1)
        with autocast():
            U, texts, scale = encoder(pixels, encoder.tokenize(captions + rule_texts).to(device))
        texts = texts.float()
        return lace_loss(U.float(), texts[:batch], scale.float(), texts[batch:, None], valid.to(device))

    def local_shipped():  # "LACE-local pairs + real-image negative", as train_step.time_local runs it
        image_pass = LocalImagePass(local_editor, encoder.model, args.local_n_edits, seeds)
        with autocast():
            U, V, scale = encoder(pixels, tokens, encode_images=image_pass)
        U, V, scale = U.float(), V.float(), scale.float()
        negatives = image_pass.negatives.float()
        edits = EditedImages(negatives, image_pass.valid, describe_slots(rules, captions, image_pass.changes))

        def encode_texts(texts):
            with autocast():
                return encoder.encode_texts(texts).float()

        rows = pair_rows([edits], encode_texts)
        loss = lace_loss(U, V, scale, image_negatives=negatives, image_valid=image_pass.valid)
        return loss + pair_term(rows, U, V, scale, None, one_process, real_image_negative=True)

    steps = {"plain": plain, "peer": peer, "lace": lace, "caption negatives": caption_negatives,
             "local shipped": local_shipped}
    return steps, fit_seconds, failures


def time_steps(args, device: torch.device) -> dict:
    torch.manual_seed(0)
    encoder = load_encoder(args.model, None, device=str(device))
    encoder.train()
    steps, fit_seconds, failures = step_functions(args, encoder, device)
    optimizer = build_optimizer(encoder, 1e-5, 0.1, (0.9, 0.98), 1e-6)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    peaks: dict[str, float] = {}

    def run(kind: str) -> float:
        synchronise(device)
        start = time.perf_counter()
        steps[kind]().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronise(device)
        return time.perf_counter() - start

    for kind in KINDS:  # warm-up, and each kind's peak memory on its own
        if kind in failures:
            continue
        reset_peak(device)
        try:
            for _ in range(args.warmup):
                run(kind)
        except Exception as error:
            if kind == "plain":
                raise
            failures[kind] = repr(error)[:400]
            optimizer.zero_grad(set_to_none=True)
            continue
        peaks[kind] = peak_gb(device)
        log(f"warmed up: {kind}")
    timed_kinds = [kind for kind in KINDS if kind not in failures]
    for _ in range(args.steps):
        for kind in timed_kinds:
            times[kind].append(run(kind))
    median = {kind: statistics.median(times[kind]) for kind in timed_kinds}
    return {"median_s": median, "peak_gb": peaks, "local_editor_fit_s": fit_seconds, "failures": failures}


def log(message: str) -> None:
    """Progress on stderr, so that a run cut short shows how far it got."""
    print(f"[gpu.py {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_sparse_coding(args, device: torch.device) -> dict:
    """lace's OMP (non-negative, the dictionary's default) over its floor, best of `repeats` alternated."""
    x, atoms = synthetic(args.codes, args.atoms, args.dim, args.sparsity)
    x, atoms = x.to(device), atoms.to(device)

    def floor():
        for start in range(0, args.codes, 8192):
            x[start:start + 8192] @ atoms.T

    encode(x[:1024], atoms, args.sparsity)  # warm-up (and the fused kernel's compilation on a CPU)
    reset_peak(device)
    floors, laces = [], []
    for _ in range(args.repeats):
        floors.append(timed(floor, device)[0])
        laces.append(timed(lambda: encode(x, atoms, args.sparsity), device)[0])
    return {"floor_s": min(floors), "lace_s": min(laces), "peak_gb": peak_gb(device)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    parser.add_argument("--small", action="store_true", help=f"a dry run's sizes: {SMALL}")
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="timed rounds (one step of each kind a round)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None, help="default: bf16 on cuda")
    parser.add_argument("--n-edits", type=int, default=4, help="LACE's edits per embedding")
    parser.add_argument("--local-n-edits", type=int, default=2)
    parser.add_argument("--local-layer", default="block3")
    parser.add_argument("--locate-layer", default="block3")
    parser.add_argument("--fit-images", type=int, default=512, help="scenes the local editor is fitted on")
    parser.add_argument("--dictionary-atoms", type=int, default=512, help="atoms of LACE's editor")
    parser.add_argument("--dictionary-sparsity", type=int, default=8)
    parser.add_argument("--codes", type=int, default=1_000_000, help="rows of the sparse-coding part")
    parser.add_argument("--atoms", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--sparsity", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.small:  # the dry run's sizes, where a flag does not say otherwise
        for name, value in SMALL.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.bf16 = (args.precision or ("bf16" if args.device == "cuda" else "fp32")) == "bf16"
    return args


def ratio_to(median: dict, kind: str, other: str = "plain") -> float | None:
    """median[kind] / median[other], rounded; None where either failed."""
    if kind not in median or other not in median:
        return None
    return round(median[kind] / median[other], 3)


def print_table(args, device: torch.device, steps: dict, coding: dict) -> None:
    median, peaks, failures = steps["median_s"], steps["peak_gb"], steps["failures"]
    print(f"{args.model} random init, batch {args.batch}, {'bf16 autocast' if args.bf16 else 'fp32'}, {device}; "
          f"median of {args.steps} interleaved rounds; local editor at {args.local_layer} "
          f"(fit {steps['local_editor_fit_s']:.1f} s)")
    print(f"{'step':<50}{'ms':>9}{'images/s':>10}{'x plain':>9}{'peak GB':>9}")
    names = {"plain": "plain (lace clip_loss)", "peer": "peer: open_clip forward + ClipLoss",
             "lace": f"LACE (M = {args.n_edits} each side)", "caption negatives": "caption negatives (R = 1)",
             "local shipped": f"LACE-local pairs + real-image negative (M = {args.local_n_edits})"}
    for kind in KINDS:
        if kind in failures:
            print(f"{names[kind]:<50} failed: {failures[kind]}")
            continue
        print(f"{names[kind]:<50}{1e3 * median[kind]:>9.1f}{args.batch / median[kind]:>10.0f}"
              f"{ratio_to(median, kind):>9.3f}{peaks[kind]:>9.2f}")
    print(f"sparse coding {args.codes} x {args.dim}, K = {args.atoms}, s = {args.sparsity}: "
          f"lace {coding['lace_s']:.2f} s, floor {coding['floor_s']:.2f} s, "
          f"x floor {coding['lace_s'] / coding['floor_s']:.2f}, peak {coding['peak_gb']:.2f} GB")


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    steps = time_steps(args, device)
    log("steps timed; sparse coding next")
    coding = time_sparse_coding(args, device)
    print_table(args, device, steps, coding)
    median = steps["median_s"]
    print(json.dumps({
        "benchmark": "gpu", "device": str(device), "model": args.model, "batch": args.batch,
        "precision": "bf16" if args.bf16 else "fp32", "steps": args.steps,
        "images_per_s": {kind: round(args.batch / value, 1) for kind, value in median.items()},
        "step_ms": {kind: round(1e3 * value, 2) for kind, value in median.items()},
        "failed": steps["failures"],
        "lace_over_plain": ratio_to(median, "lace"),
        "caption_negatives_over_plain": ratio_to(median, "caption negatives"),
        "local_shipped_over_plain": ratio_to(median, "local shipped"),
        "vs_peer_ratio": ratio_to(median, "peer"),  # open_clip's step time over lace's plain step time
        "sparse_coding": {"rows": args.codes, "dim": args.dim, "atoms": args.atoms, "sparsity": args.sparsity,
                          "lace_s": round(coding["lace_s"], 3), "floor_s": round(coding["floor_s"], 3)},
        "vs_floor_ratio": round(coding["lace_s"] / coding["floor_s"], 3),
        "peak_gb": {**{kind: round(value, 3) for kind, value in steps["peak_gb"].items()},
                    "sparse_coding": round(coding["peak_gb"], 3)},
        "local_editor_fit_s": round(steps["local_editor_fit_s"], 2),
    }))
    return 1 if steps["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
