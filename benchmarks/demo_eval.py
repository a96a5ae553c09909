"""What one model's evaluation costs in the demo once another model of the world has been measured: with each split's
benchmarks, captions and binding items read once for every model (`evaluate_on_world(inputs=...)`, as the demo
runs it) against read again for each model (as before); decoded images are shared in both. One thread, CPU seconds.

Usage: python benchmarks/demo_eval.py [--world DIR] [--models N]   (DIR: a demo run's world, default runs/demo/world)
Models are random initialisations of the demo's architecture: the cost does not depend on the weights. The figures
of both ways must be equal (checked). The last printed line is one JSON object: vs_peer_ratio is the shared way's
CPU seconds per model over the per-model way's, vs_floor_ratio the shared way's over the embedding passes alone
(every image and caption of the three splits, and the rule-made edits, through both towers).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.demo.evaluation import EVAL_SPLITS, evaluate_on_world, split_inputs
from lace.edits.captions import RuleNegatives
from lace.encoders import load_encoder
from lace.eval.benchmarks.retrieval import dataset_embeddings
from lace.eval.brittleness import rule_edits
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.measure import MeasureConfig

MODEL = "lace-micro-rn-32"


def _figures(results: dict) -> dict:
    return {split: {key: value for key, value in figures.items() if key != "seconds"}
            for split, figures in results.items()}


def _evaluate(world: Path, seed: int, pixels: dict, inputs: dict | None) -> tuple[dict, float]:
    torch.manual_seed(seed)
    encoder = load_encoder(MODEL)
    start = time.process_time()
    results = evaluate_on_world(encoder, f"model {seed}", world, str(world / "vocabulary.yaml"), pixels=pixels,
                                inputs=inputs)
    return _figures(results), time.process_time() - start


def _embedding_floor(world: Path, seed: int, pixels: dict, inputs: dict) -> float:
    """CPU seconds of the embedding passes one evaluation cannot avoid: each distinct image and caption the splits
    score, and the rule-made caption edits."""
    torch.manual_seed(seed)
    encoder = load_encoder(MODEL)
    cache = EmbeddingCache(encoder, pixels=pixels)
    rules = RuleNegatives(load_vocabulary(str(world / "vocabulary.yaml")))
    start = time.process_time()
    for split in EVAL_SPLITS:
        shared = inputs[split]
        dataset_embeddings(cache, shared.dataset)
        items = shared.items
        cache.images([(path, None) for path in [*items.images, *items.negative_images]])
        cache.texts([*items.captions, *items.negative_captions])
        edited, _ = rule_edits(rules, tuple(shared.dataset.captions), tuple(rules.kinds), MeasureConfig().rule_captions,
                               shared.config.seed)
        cache.texts(edited)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=Path, default=Path("runs/demo/world"))
    parser.add_argument("--models", type=int, default=2, help="models measured each way after the first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pixels: dict = {}
    inputs = {split: split_inputs(args.world, split, str(args.world / "vocabulary.yaml")) for split in EVAL_SPLITS}
    _evaluate(args.world, 0, pixels, inputs)  # the first model decodes every image for all
    rows = []
    for seed in range(1, args.models + 1):
        per_model, per_model_cpu = _evaluate(args.world, seed, pixels, None)
        shared, shared_cpu = _evaluate(args.world, seed, pixels, inputs)
        if per_model != shared:
            raise SystemExit(f"model {seed}: the figures differ between the two ways")
        rows.append((seed, per_model_cpu, shared_cpu))
    floor = _embedding_floor(args.world, 1, pixels, inputs)
    print(f"{'model':>6} {'read per model (CPU s)':>23} {'read once (CPU s)':>18}")
    for seed, per_model_cpu, shared_cpu in rows:
        print(f"{seed:>6} {per_model_cpu:>23.2f} {shared_cpu:>18.2f}")
    per_model_mean = sum(row[1] for row in rows) / len(rows)
    shared_mean = sum(row[2] for row in rows) / len(rows)
    print(f"mean {per_model_mean:.2f} -> {shared_mean:.2f} CPU s per model; embedding passes alone {floor:.2f} CPU s; "
          "figures equal")
    print(json.dumps({
        "benchmark": "demo_eval", "world": str(args.world), "models": len(rows),
        "read_per_model_cpu_s": round(per_model_mean, 2), "read_once_cpu_s": round(shared_mean, 2),
        "embedding_floor_cpu_s": round(floor, 2),
        "vs_peer_ratio": round(shared_mean / per_model_mean, 3),
        "vs_peer_ratio_meaning": "CPU s per model with the splits read once over read per model",
        "vs_floor_ratio": round(shared_mean / floor, 3),
        "vs_floor_ratio_meaning": "CPU s per model over its embedding passes alone",
        "peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}))


if __name__ == "__main__":
    main()
