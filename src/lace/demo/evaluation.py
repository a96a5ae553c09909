"""Stage 6 of the demo: every model on the validation, in-distribution and compositional splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lace.demo.world_data import world_split
from lace.encoders.base import DualEncoder
from lace.eval.benchmarks.retrieval import dataset_embeddings
from lace.eval.brittleness import counterfactual_brittleness
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.neighbours import cross_neighbours
from lace.eval.runner import EvalConfig, run_evaluation

EVAL_SPLITS = ("val", "test", "test_comp")


def evaluate_on_world(
    encoder: DualEncoder, name: str, world_dir: Path, vocabulary: str, editor=None, n_edits: int = 4,
    seed: int = 0, k: int = 10,
) -> dict[str, dict]:
    """Per split: retrieval, binding in both directions, Winoground-style scores, hubness,
    one-way neighbours, brittleness to rule edits and (with `editor`) to counterfactual
    embeddings, and the N_k occurrence counts of both directions."""
    cache = EmbeddingCache(encoder)  # each image and caption is embedded once for all splits
    results = {}
    for split in EVAL_SPLITS:
        config = EvalConfig(
            benchmarks=("world", "retrieval"), data=str(Path(world_dir) / "karpathy_coco.json"), split=split,
            world=str(world_dir), world_split=split, vocabulary=vocabulary, seed=seed, k=k,
        )
        figures = run_evaluation(encoder, config, model=name, cache=cache)
        dataset = world_split(world_dir, split, "coco")
        images, texts = dataset_embeddings(cache, dataset)
        if editor is not None:
            figures["diagnostics"].update({
                f"brittleness/{key}": value for key, value in counterfactual_brittleness(
                    editor, images, texts, dataset.caption_image_index, n_edits=n_edits).items()
            })
        results[split] = {"benchmarks": figures["benchmarks"], "diagnostics": figures["diagnostics"],
                          "seconds": figures["seconds"], "n_k": occurrence_counts(images, texts, k)}
    return results


def occurrence_counts(images: torch.Tensor, texts: torch.Tensor, k: int) -> dict[str, list[int]]:
    """N_k of each caption among the images' top-k (i2t) and of each image among the captions' (t2i)."""
    forward, backward = cross_neighbours(images, texts, k)
    return {
        "i2t": np.bincount(forward.indices.reshape(-1).numpy(), minlength=texts.shape[0]).tolist(),
        "t2i": np.bincount(backward.indices.reshape(-1).numpy(), minlength=images.shape[0]).tolist(),
    }
