"""Diagnostics that need a concept dictionary: counterfactual brittleness and edit retrieval.

Both run on one image-caption set (the diagnostic dataset of `lace eval`):
- counterfactual brittleness: share of (image, caption, counterfactual caption) triples
  where the edited caption embedding scores above the true one, for dictionary edits and
  for the same edits made as a random control and as concept arithmetic (same step sizes);
- edit retrieval: transplant A -> B inside the embeddings of images whose captions name A
  and not B, look up the nearest real images of the set, and count the share that show B
  and the share that keep the source image's other concepts, against a random edit and a
  concept-arithmetic edit of the same size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from lace.concepts.labelled import LabelledDictionary, load_labelled_dictionary
from lace.edits import CounterfactualEditor, EditConfig, build_editor
from lace.edits.spec import parse_pair
from lace.errors import LaceInputError, input_error
from lace.eval.brittleness import counterfactual_brittleness
from lace.eval.edit_retrieval import caption_concepts, edit_retrieval

EDIT_METHODS = {"counterfactual": "counterfactuals", "counterfactual_random": "random_control",
                "counterfactual_arithmetic": "concept_arithmetic"}
RETRIEVAL_FIGURES = tuple(f"{edit}/{share}" for edit in ("transplant", "random", "arithmetic")
                          for share in ("target", "keep"))


def load_dictionary_for_model(path: str | Path, embed_dim: int, model: str) -> LabelledDictionary:
    """Read a `lace dict fit` folder and refuse one fitted in a space of another dimension."""
    labelled = load_labelled_dictionary(path)
    dictionary_dim = int(labelled.dictionary.atoms_.shape[1])
    if dictionary_dim != embed_dim:
        raise LaceInputError(
            f"{path}: dictionary atoms have dimension {dictionary_dim}, but model {model!r} embeds in dimension "
            f"{embed_dim}; fit the dictionary on this model's embeddings (`lace embed`, then `lace dict fit`)"
        )
    return labelled


def owned_concepts(labelled: LabelledDictionary) -> torch.Tensor:
    """(C,) bool: concepts owning at least one aligned atom (only those can be edited)."""
    return labelled.labelling.ownership(len(labelled.directions)).sum(0) > 0


def transplant_editor(labelled: LabelledDictionary, pair: str, config: EditConfig | None = None) -> CounterfactualEditor:
    """The editor of named transplant 'a=b': `config` (default `EditConfig()`) making transplants only."""
    return build_editor(labelled, dataclasses.replace(config or EditConfig(), kinds=("transplant",), target=pair))


def transplant_edits(editor: CounterfactualEditor, z: torch.Tensor, pair: str, seed: int = 0) -> dict:
    """Transplant 'a=b' of each image embedding z (B, d) and its two controls, as `Counterfactuals`
    by name (transplant, random, arithmetic); the random control is seeded with `seed`.

    A named edit is the same whatever the generator; the controls get their own, so that only the
    transplant draws from torch's global generator, as it always has (later stages depend on it)."""
    edit = f"transplant:{pair}"
    return {"transplant": editor.apply(z, "image", edit),
            "random": editor.apply(z, "image", edit, control="random", generator=torch.Generator().manual_seed(seed)),
            "arithmetic": editor.apply(z, "image", edit, control="concept_arithmetic",
                                       generator=torch.Generator().manual_seed(seed))}


def check_transplants(labelled: LabelledDictionary, transplants: Sequence[str], concept_names: Sequence[str]) -> None:
    """Refuse a named transplant 'a=b' the editor cannot make or the captions cannot show."""
    for pair in transplants:
        source, target = parse_pair(pair, "--transplant")
        for name in (source, target):
            if name not in concept_names:
                raise input_error(f"--transplant {pair}", None,
                                  "concepts of the vocabulary the captions are read with (--vocabulary)", name)
        transplant_editor(labelled, pair)  # raises on unknown, mistyped or unowned concepts


def choose_transplants(
    labelled: LabelledDictionary, shown: torch.Tensor, concept_names: Sequence[str], n_pairs: int,
) -> list[str]:
    """Up to `n_pairs` transplants 'a=b' between same-type concepts that own aligned atoms.

    shown: (N, C') bool, which of `concept_names` each image's captions mention. A pair
    (a, b) scores min(#images showing a and not b, #images showing b): edits need sources,
    and retrieval needs images of the target. The best pair of each type comes first
    (so objects, colours and relations each get one), then the next best overall.
    """
    directions = labelled.directions
    owned = owned_concepts(labelled)
    column = {name: i for i, name in enumerate(concept_names)}
    usable = [name for name in directions.names if name in column and bool(owned[directions.index(name)])]
    scored = []
    for source in usable:
        for target in usable:
            if source == target or directions.groups[directions.index(source)] != directions.groups[directions.index(target)]:
                continue
            a, b = shown[:, column[source]], shown[:, column[target]]
            score = min(int((a & ~b).sum()), int(b.sum()))
            if score > 0:
                scored.append((-score, source, target))
    scored.sort()
    chosen: list[tuple[str, str]] = []
    used_groups: set[str] = set()
    for _, source, target in scored:  # first pass: one pair per type
        group = directions.groups[directions.index(source)]
        if group not in used_groups:
            chosen.append((source, target))
            used_groups.add(group)
    for _, source, target in scored:  # then fill with the next best, skipping reversed pairs
        if (source, target) not in chosen and (target, source) not in chosen:
            chosen.append((source, target))
    return [f"{source}={target}" for source, target in chosen[:n_pairs]]


class _SeededEdits:
    """An editor view whose `counterfactuals` is one of the editor's edit methods, reseeded per call,
    so the dictionary edits and both controls plan the same edits batch by batch."""

    def __init__(self, editor: CounterfactualEditor, method: str, seed: int):
        self.make = getattr(editor, method)
        self.seed = seed
        self.calls = 0

    def counterfactuals(self, z: torch.Tensor, modality: str, n_edits: int):
        generator = torch.Generator(device=z.device).manual_seed(self.seed + self.calls)
        self.calls += 1
        return self.make(z, modality, n_edits, generator=generator)


def counterfactual_brittleness_with_controls(
    editor: CounterfactualEditor, images: torch.Tensor, texts: torch.Tensor, text_image_index: Sequence[int],
    n_edits: int = 4, seed: int = 0,
) -> dict[str, float]:
    """Counterfactual-caption brittleness for dictionary edits and both same-size controls.

    images: (N_img, d), texts: (N_txt, d) unit embeddings; text_image_index: (N_txt,) image row of each text.
    Returns `counterfactual/all`, `counterfactual_random/all`, `counterfactual_arithmetic/all`
    and `counterfactual/n_triples`.
    """
    figures: dict[str, float] = {}
    for name, method in EDIT_METHODS.items():
        rates = counterfactual_brittleness(_SeededEdits(editor, method, seed), images, texts, text_image_index,
                                           n_edits=n_edits)
        figures[f"{name}/all"] = rates["counterfactual/all"]
        if name == "counterfactual":
            figures["counterfactual/n_triples"] = rates["counterfactual/n_triples"]
    return figures


def transplant_pair_retrieval(
    labelled: LabelledDictionary, gallery: torch.Tensor, shown: torch.Tensor, concept_names: Sequence[str],
    pair: str, config: EditConfig | None = None, k: int = 10, seed: int = 0,
) -> dict[str, float]:
    """Edit retrieval of one transplant 'a=b' inside the gallery's own image embeddings.

    gallery: (N, d) unit image embeddings; shown: (N, C') bool concepts each image's captions
    mention (columns `concept_names`). Sources are the images showing a and not b; an edit
    counts when it was proposed (a is present in the code) and passed the effect check.
    Returns the shares of `edit_retrieval` (NaN when no edit counts) plus `candidates`,
    `proposed` and `edited` (counts of source images).
    """
    source, target = parse_pair(pair, "--transplant")
    column = {name: i for i, name in enumerate(concept_names)}
    rows = (shown[:, column[source]] & ~shown[:, column[target]]).nonzero().flatten()
    figures = {"candidates": float(len(rows)), "proposed": 0.0, "edited": 0.0, "angle_degrees": float("nan")}
    figures.update({name: float("nan") for name in RETRIEVAL_FIGURES})
    if len(rows) == 0:
        return figures
    edits = transplant_edits(transplant_editor(labelled, pair, config), gallery[rows], pair, seed)
    valid = edits["transplant"].valid[:, 0]
    figures["proposed"] = float(edits["transplant"].records.proposed[:, 0].sum())
    figures["edited"] = float(valid.sum())
    if not valid.any():
        return figures
    keep = shown[rows][valid].clone()
    keep[:, column[source]] = False
    n_edited = int(valid.sum())
    figures.update(edit_retrieval(
        gallery[rows][valid], {name: made.embeddings[valid, 0].detach() for name, made in edits.items()},
        gallery, shown, torch.full((n_edited,), column[target]), keep=keep, source_rows=rows[valid], k=k,
    ))
    return figures


def dictionary_diagnostics(
    labelled: LabelledDictionary,
    images: torch.Tensor,
    texts: torch.Tensor,
    text_image_index: Sequence[int],
    captions_per_image: Sequence[Sequence[str]],
    rule_negatives,
    transplants: Sequence[str] = (),
    auto_transplants: int = 3,
    config: EditConfig | None = None,
    n_edits: int = 4,
    k: int = 10,
    seed: int = 0,
) -> dict[str, float]:
    """Counterfactual brittleness and edit retrieval on one image-caption set.

    images: (N_img, d) and texts: (N_txt, d) unit embeddings of the set; text_image_index:
    (N_txt,) image row of each caption; captions_per_image: the captions of each image,
    read for concepts with `rule_negatives` (a `RuleNegatives`). `transplants` names the
    pairs 'a=b' (default: `auto_transplants` chosen by `choose_transplants`; those of them that edit no image
    are left out and counted in `edit_retrieval/auto_pairs_left_out`, present when some are).

    Returns flat figures: `brittleness/counterfactual*/...`, per pair
    `edit_retrieval/<a=b>/<edit>/<share>` (edit: transplant, random, arithmetic; share:
    target, keep) with `candidates`, `proposed`, `edited`, `angle_degrees`, and
    `edit_retrieval/mean/<edit>/<share>` over the pairs with edits.
    """
    images, texts = torch.as_tensor(images).float(), torch.as_tensor(texts).float()
    shown, concept_names = caption_concepts(captions_per_image, rule_negatives)  # (N_img, C')
    if transplants:
        check_transplants(labelled, transplants, concept_names)
    editor = build_editor(labelled, config)
    figures = {f"brittleness/{key}": value for key, value in counterfactual_brittleness_with_controls(
        editor, images, texts, text_image_index, n_edits=n_edits, seed=seed).items()}
    named = bool(transplants)
    if not named:
        transplants = choose_transplants(labelled, shown, concept_names, auto_transplants)
    per_pair, left_out = [], 0
    for pair in transplants:
        pair_figures = transplant_pair_retrieval(labelled, images, shown, concept_names, pair, config, k, seed)
        if not named and pair_figures["edited"] == 0:  # a pair chosen here that edits nothing says nothing
            left_out += 1
            continue
        figures.update({f"edit_retrieval/{pair}/{key}": value for key, value in pair_figures.items()})
        if pair_figures["edited"] > 0:
            per_pair.append(pair_figures)
    figures["edit_retrieval/pairs"] = float(len(transplants) - left_out)
    if left_out:
        figures["edit_retrieval/auto_pairs_left_out"] = float(left_out)
    for name in RETRIEVAL_FIGURES:
        values = [p[name] for p in per_pair if np.isfinite(p[name])]
        figures[f"edit_retrieval/mean/{name}"] = float(np.mean(values)) if values else float("nan")
    return figures
