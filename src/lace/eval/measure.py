"""One way to measure a model on one image-caption set: named measurements, each one registration.

`measure(split, config, **inputs)` runs the measurements `config.measures` names, in order,
and merges their flat figures. `lace eval`'s diagnostics, the demo's evaluation and the
study's measurements all go through it; benchmarks with their own items register in
`lace.eval.benchmarks` instead (`lace eval --benchmarks`). A new measurement is one function
decorated with `@register("name")`; it receives the split, the config and the keyword inputs
the caller passed (an editor, a rule editor, items), and names what it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lace.errors import input_error
from lace.eval.brittleness import counterfactual_brittleness, rule_edit_brittleness
from lace.eval.diagnostics import GeometryOptions, geometry_diagnostics
from lace.eval.hubness import k_occurrence
from lace.eval.neighbours import EXACT, KnnOptions, cross_neighbours


@dataclass
class MeasuredSplit:
    """What a measurement sees: unit embeddings images (N_img, d) and texts (N_txt, d), the image
    row of each text (N_txt,), the captions, and a text encoder for edited captions (or None)."""

    images: torch.Tensor
    texts: torch.Tensor
    caption_image_index: Sequence[int] | np.ndarray
    captions: Sequence[str] = ()
    text_encoder: object | None = None


@dataclass(frozen=True)
class MeasureConfig:
    """Which measurements run and their shared knobs."""

    measures: tuple[str, ...] = ("geometry", "rule_brittleness")
    """Names in `MEASURES`, run in this order."""
    k: int = 10
    """Neighbourhood size of hubness, mutual k-NN and N_k."""
    baseline: bool = True
    """Geometry also on isotropic random vectors of the same sizes."""
    seed: int = 0
    """Seed of the random baseline and of the rule-made edits."""
    n_edits: int = 4
    """Counterfactual edits per caption (counterfactual brittleness)."""
    rule_captions: int = 5000
    """Captions drawn for rule-made brittleness."""
    knn: KnnOptions = EXACT
    """How geometry and N_k search their top-k lists (exact by default; FAISS for 1M+ items)."""


Measurement = Callable[[MeasuredSplit, MeasureConfig, dict], dict]
MEASURES: dict[str, Measurement] = {}


def register(name: str) -> Callable[[Measurement], Measurement]:
    """Add a measurement to `MEASURES` under `name`."""
    def add(function: Measurement) -> Measurement:
        MEASURES[name] = function
        return function
    return add


def measure(split: MeasuredSplit, config: MeasureConfig, **inputs) -> dict:
    """The flat figures of every measurement `config.measures` names, merged in order."""
    unknown = [name for name in config.measures if name not in MEASURES]
    if unknown:
        raise input_error("measure config", "measures", f"names from {sorted(MEASURES)}", unknown)
    figures: dict = {}
    for name in config.measures:
        figures.update(MEASURES[name](split, config, inputs))
    return figures


def _needs(inputs: dict, name: str, measurement: str):
    if inputs.get(name) is None:
        raise input_error(f"measurement '{measurement}'", name, f"measure(..., {name}=...)")
    return inputs[name]


@register("geometry")
def _geometry(split: MeasuredSplit, config: MeasureConfig, inputs: dict) -> dict:
    """Retrieval recall, hubness, one-way neighbours, mutual k-NN (`geometry_diagnostics`)."""
    options = GeometryOptions(k=config.k, baseline=config.baseline, seed=config.seed, knn=config.knn)
    return dict(geometry_diagnostics(split.images, split.texts, split.caption_image_index, options))


@register("rule_brittleness")
def _rule_brittleness(split: MeasuredSplit, config: MeasureConfig, inputs: dict) -> dict:
    """`brittleness/rule/...` under rule-made caption edits (input `rules`, the split's text encoder)."""
    rates = rule_edit_brittleness(split.text_encoder, split.images, split.captions, split.texts,
                                  split.caption_image_index, _needs(inputs, "rules", "rule_brittleness"),
                                  max_captions=config.rule_captions, seed=config.seed,
                                  progress=inputs.get("progress", False))
    return {f"brittleness/{name}": value for name, value in rates.items()}


@register("counterfactual_brittleness")
def _counterfactual_brittleness(split: MeasuredSplit, config: MeasureConfig, inputs: dict) -> dict:
    """`brittleness/counterfactual/...` under the dictionary edits of input `editor`."""
    editor = _needs(inputs, "editor", "counterfactual_brittleness")
    rates = counterfactual_brittleness(editor, split.images, split.texts, split.caption_image_index,
                                       n_edits=config.n_edits)
    return {f"brittleness/{name}": value for name, value in rates.items()}


@register("n_k")
def _n_k(split: MeasuredSplit, config: MeasureConfig, inputs: dict) -> dict:
    """`nk/i2t`: N_k of each caption among the images' top-k; `nk/t2i`: of each image among the captions'."""
    forward, backward = cross_neighbours(split.images, split.texts, config.k, knn=config.knn)
    return {"nk/i2t": k_occurrence(forward.indices, split.texts.shape[0], config.k).tolist(),
            "nk/t2i": k_occurrence(backward.indices, split.images.shape[0], config.k).tolist()}
