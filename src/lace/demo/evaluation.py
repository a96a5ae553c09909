"""Stage 6 of the demo: every model on the validation, in-distribution and compositional splits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lace.data.dataset import ImageTextDataset
from lace.demo.world_data import world_split
from lace.encoders.base import DualEncoder
from lace.eval.benchmarks.retrieval import dataset_embeddings
from lace.eval.benchmarks.winoground import winoground_score_tensor
from lace.eval.benchmarks.world import WorldItems, binding_correct
from lace.eval.brittleness import rule_edits
from lace.eval.embedding_cache import EmbeddingCache, ImageKey, decode_images
from lace.eval.measure import MeasureConfig, MeasuredSplit, measure
from lace.eval.metrics import recall_hits, winoground_correct
from lace.eval.neighbours import cross_neighbours
from lace.eval.reciprocity import one_way_flags
from lace.eval.runner import (
    EvalConfig,
    LoadedBenchmarks,
    load_benchmarks,
    rule_negatives,
    run_evaluation,
)

EVAL_SPLITS = ("val", "test", "test_comp")


@dataclass
class SplitInputs:
    """What every model of one world is measured on in one split, read from the world's files once."""

    config: EvalConfig
    """The evaluation of the split: its binding items and retrieval, with the geometry diagnostics."""
    loaded: LoadedBenchmarks
    """`config`'s benchmarks as `load_benchmarks` read them."""
    dataset: ImageTextDataset
    """The split with its COCO-like captions (retrieval, hubness, one-way neighbours, brittleness)."""
    items: WorldItems
    """The split's binding items and Winoground quadruples, for the scores per item."""


def split_inputs(world_dir: Path, split: str, vocabulary: str, seed: int = 0, k: int = 10) -> SplitInputs:
    """The inputs of `split` of the world at `world_dir`, read from its files."""
    config = EvalConfig(
        benchmarks=("world", "retrieval"), data=str(Path(world_dir) / "karpathy_coco.json"), split=split,
        world=str(world_dir), world_split=split, vocabulary=vocabulary, seed=seed, k=k,
    )
    loaded = load_benchmarks(config)
    return SplitInputs(config, loaded, world_split(world_dir, split, "coco"), loaded["world"][1])


def prepare_world_evaluation(world_dir: Path, vocabulary: str, encoder: DualEncoder, seed: int = 0, k: int = 10,
                             pixels: dict | None = None, inputs: dict | None = None) -> None:
    """What `evaluate_on_world` does first for the first model of an architecture, done ahead: read each split's
    `SplitInputs` into `inputs`, decode every image they name into `pixels` with `encoder.preprocess`, make each
    split's rule-made caption edits and tokenize every caption (both kept per process). Evaluations forked off
    afterwards inherit all of it and only embed and score. `encoder`: any model of the architecture."""
    inputs = {} if inputs is None else inputs
    for split in EVAL_SPLITS:
        if split not in inputs:
            inputs[split] = split_inputs(Path(world_dir), split, vocabulary, seed, k)
        shared = inputs[split]
        if pixels is not None:
            decode_images(split_images(shared), encoder.preprocess, pixels)
        captions = shared.loaded["retrieval"][1].dataset.captions  # the set the diagnostics measure
        negatives = rule_negatives(shared.config)
        edited, _ = rule_edits(negatives, tuple(captions), tuple(negatives.kinds), MeasureConfig().rule_captions,
                               shared.config.seed)
        items = shared.items
        encoder.tokenize([*items.captions, *items.negative_captions,
                          *(caption for pair in items.winoground.captions for caption in pair),
                          *captions, *shared.dataset.captions, *edited])


def split_images(shared: SplitInputs) -> list[ImageKey]:
    """Every image an evaluation of split `shared` embeds: its binding items', its Winoground quadruples' and its
    image-caption set's (retrieval, and the geometry and brittleness measured on it)."""
    items, retrieval = shared.items, shared.loaded["retrieval"][1].dataset
    paths = [*items.images, *items.negative_images, *(path for pair in items.winoground.image_paths for path in pair),
             *(str(record.image_path) for dataset in (retrieval, shared.dataset) for record in dataset.records)]
    return [(path, None) for path in dict.fromkeys(paths)]


def evaluate_on_world(
    encoder: DualEncoder, name: str, world_dir: Path, vocabulary: str, editor=None, n_edits: int = 4,
    seed: int = 0, k: int = 10, pixels: dict | None = None, inputs: dict | None = None,
) -> dict[str, dict]:
    """Per split: retrieval, binding in both directions, Winoground-style scores, hubness,
    one-way neighbours, brittleness to rule edits and (with `editor`) to counterfactual
    embeddings, and the N_k occurrence counts of both directions.

    `pixels`: decoded images shared by every model of one architecture (`EmbeddingCache`); `inputs`: each split's
    `SplitInputs` by split, shared by every model measured on this world, read and filled here."""
    cache = EmbeddingCache(encoder, pixels=pixels)  # each image and caption is embedded once for all splits
    inputs = {} if inputs is None else inputs
    results = {}
    for split in EVAL_SPLITS:
        if split not in inputs:
            inputs[split] = split_inputs(Path(world_dir), split, vocabulary, seed, k)
        shared = inputs[split]
        figures = run_evaluation(encoder, shared.config, model=name, cache=cache, loaded=shared.loaded)
        images, texts = dataset_embeddings(cache, shared.dataset)
        measures = ("counterfactual_brittleness", "n_k") if editor is not None else ("n_k",)
        with torch.random.fork_rng(devices=[]):  # the same edits for every model, whatever ran before it
            torch.manual_seed(seed)
            extra = measure(MeasuredSplit(images, texts, shared.dataset.caption_image_index),
                            MeasureConfig(measures, k=k, n_edits=n_edits), editor=editor)
        n_k = {"i2t": extra.pop("nk/i2t"), "t2i": extra.pop("nk/t2i")}
        figures["diagnostics"].update(extra)
        results[split] = {"benchmarks": figures["benchmarks"], "diagnostics": figures["diagnostics"],
                          "seconds": figures["seconds"], "n_k": n_k,
                          "items": item_scores(cache, shared.items, images, texts, shared.dataset)}
    return results


ITEM_RECALLS = ("i2t/R@1", "t2i/R@1", "i2t/R@5", "t2i/R@5")


def item_scores(cache: EmbeddingCache, items: WorldItems, images: torch.Tensor, texts: torch.Tensor,
                dataset) -> dict[str, dict[str, list[int]]]:
    """Per benchmark figure, 1/0 per item (its mean is the figure), for bootstrap intervals over items: every binding
    family both ways and Winoground's scores (`world`), recall at 1 and 5 per query (`retrieval`), and whether each
    image and caption is a one-way neighbour (`diagnostics`). Read from the embeddings the figures were made from
    (`cache`, (N_img, d) `images`, (N_txt, d) `texts`) of the split whose binding `items` and image-caption
    `dataset` they are."""
    i2t, t2i = binding_correct(cache, items)
    families = np.asarray(items.families)
    world = {f"{direction}/{family}": correct[families == family].astype(int).tolist()
             for direction, correct in (("i2t", i2t), ("t2i", t2i)) for family in sorted(set(items.families))}
    if items.winoground.ids:
        correct = winoground_correct(winoground_score_tensor(cache, items.winoground))
        world.update({f"winoground/{name}": right.astype(int).tolist() for name, right in correct.items()})
    forward, backward = cross_neighbours(images, texts, 10)
    hits = recall_hits(forward.indices, backward.indices, dataset.caption_image_index, (1, 5, 10))
    one_way = one_way_flags(forward.indices, backward.indices, dataset.caption_image_index)
    return {"world": world, "retrieval": {name: hits[name].astype(int).tolist() for name in ITEM_RECALLS},
            "diagnostics": {f"one_way/{name}": flags.astype(int).tolist() for name, flags in one_way.items()}}
