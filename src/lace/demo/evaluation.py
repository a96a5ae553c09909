"""Stage 6 of the demo: every model on the validation, in-distribution and compositional splits."""

from __future__ import annotations

from pathlib import Path

import torch

from lace.demo.world_data import world_split
from lace.encoders.base import DualEncoder
from lace.eval.benchmarks.retrieval import dataset_embeddings
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.measure import MeasureConfig, MeasuredSplit, measure
from lace.eval.runner import EvalConfig, run_evaluation

EVAL_SPLITS = ("val", "test", "test_comp")


def evaluate_on_world(
    encoder: DualEncoder, name: str, world_dir: Path, vocabulary: str, editor=None, n_edits: int = 4,
    seed: int = 0, k: int = 10, pixels: dict | None = None,
) -> dict[str, dict]:
    """Per split: retrieval, binding in both directions, Winoground-style scores, hubness,
    one-way neighbours, brittleness to rule edits and (with `editor`) to counterfactual
    embeddings, and the N_k occurrence counts of both directions.

    `pixels`: decoded images shared by every model of one architecture (`EmbeddingCache`)."""
    cache = EmbeddingCache(encoder, pixels=pixels)  # each image and caption is embedded once for all splits
    results = {}
    for split in EVAL_SPLITS:
        config = EvalConfig(
            benchmarks=("world", "retrieval"), data=str(Path(world_dir) / "karpathy_coco.json"), split=split,
            world=str(world_dir), world_split=split, vocabulary=vocabulary, seed=seed, k=k,
        )
        figures = run_evaluation(encoder, config, model=name, cache=cache)
        dataset = world_split(world_dir, split, "coco")
        images, texts = dataset_embeddings(cache, dataset)
        measures = ("counterfactual_brittleness", "n_k") if editor is not None else ("n_k",)
        with torch.random.fork_rng(devices=[]):  # the same edits for every model, whatever ran before it
            torch.manual_seed(seed)
            extra = measure(MeasuredSplit(images, texts, dataset.caption_image_index),
                            MeasureConfig(measures, k=k, n_edits=n_edits), editor=editor)
        n_k = {"i2t": extra.pop("nk/i2t"), "t2i": extra.pop("nk/t2i")}
        figures["diagnostics"].update(extra)
        results[split] = {"benchmarks": figures["benchmarks"], "diagnostics": figures["diagnostics"],
                          "seconds": figures["seconds"], "n_k": n_k}
    return results
