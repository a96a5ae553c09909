"""Stage 3 and 4 of the demo: the concept dictionary on the base model, and edit retrieval."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from lace.concepts.labelled import (
    LabelledDictionary,
    concept_directions_for_store,
    save_labelled_dictionary,
)
from lace.concepts.vocabulary import load_vocabulary
from lace.data.world.folder import read_scenes
from lace.demo.config import DemoConfig
from lace.demo.embed import embed_pixels
from lace.demo.world_data import world_split
from lace.edits import CounterfactualEditor, build_editor
from lace.edits.captions import RuleNegatives
from lace.edits.report import edit_report
from lace.embeddings import embed_texts
from lace.encoders.base import DualEncoder
from lace.eval.dictionary_diagnostics import owned_concepts, transplant_pair_retrieval
from lace.eval.edit_retrieval import caption_concepts
from lace.experiment.dictionary import (
    DictionaryConfig,
    calibrated_tau_align,
    fit_labelled_dictionary,
)
from lace.experiment.edit_grids import edit_grid_stage
from lace.report.plots import atom_bars

ATOM_BAR_EDITS = ("attenuate:{colour}", "swap:{colour}={other_colour}", "transplant:{shape}={new_shape}")
TRANSPLANTS = ("square=star", "red=blue")
SCENES_TRIED = 100


def fit_dictionary(
    encoder: DualEncoder, pixels: torch.Tensor, captions: list[str], vocabulary: str, config: DemoConfig, out: Path,
) -> tuple[LabelledDictionary, dict]:
    """Fit and label the dictionary on the base model's train embeddings; save it to `out`."""
    images = embed_pixels(encoder, pixels)
    texts = torch.from_numpy(embed_texts(encoder, captions, progress=False))
    directions = concept_directions_for_store(vocabulary, captions, texts.numpy(), encoder.encode_texts,
                                              log=lambda _: None)
    fit_config = dictionary_config(config, vocabulary)
    labelled = fit_labelled_dictionary(images, texts, directions, fit_config, captions=captions, log=lambda _: None)
    data_covariance_tau = calibrated_tau_align(labelled.dictionary, directions, images, texts, "covariance",
                                               config.seed)
    save_labelled_dictionary(labelled, out)
    labelling = labelled.labelling
    aligned = labelling.atom_alignment >= labelling.tau_align
    summary = {
        "quality": labelled.dictionary.quality_,
        "tau_align": float(labelling.tau_align),
        "tau_align_data_covariance": float(data_covariance_tau),
        "aligned_atoms": int(aligned.sum()),
        "atoms": int(labelling.atom_alignment.shape[0]),
        "concepts_with_aligned_atom": int(torch.unique(labelling.atom_concept[aligned]).numel()),
        "concepts": len(directions),
        "mean_alignment": float(labelling.atom_alignment.mean()),
        "binding_compounds": 0 if labelled.bindings is None else len(labelled.bindings),
    }
    return labelled, summary


def dictionary_config(config: DemoConfig, vocabulary: str) -> DictionaryConfig:
    """`config.dictionary` on the world's `vocabulary`, seeded with the demo's seed."""
    return dataclasses.replace(config.dictionary, vocabulary=vocabulary, seed=config.seed)


def make_editor(labelled: LabelledDictionary, config: DemoConfig, **overrides) -> CounterfactualEditor:
    """The editor of the fine-tunes' `config.finetune.negatives.edit`, with `overrides` (EditConfig fields) on top."""
    return build_editor(labelled, dataclasses.replace(config.finetune.negatives.edit, **overrides))


def owned_concept_names(labelled: LabelledDictionary) -> set[str]:
    """Names of the concepts that own at least one aligned atom (`owned_concepts`: only those can be edited)."""
    return {labelled.directions.names[c] for c in owned_concepts(labelled).nonzero().flatten().tolist()}


def _scene_edits(scene: dict, shapes: tuple[str, ...], owned: set[str]) -> list[str] | None:
    """The three edits of the atom-bar figure for a scene, if every concept involved owns an atom."""
    first, second = scene["objects"][0], scene["objects"][1]
    new_shapes = [s for s in shapes if s in owned and s not in {first["shape"], second["shape"]}]
    if not new_shapes or not {first["colour"], second["colour"], first["shape"]} <= owned:
        return None
    return [template.format(colour=first["colour"], other_colour=second["colour"], shape=first["shape"],
                            new_shape=new_shapes[0]) for template in ATOM_BAR_EDITS]


def atom_bar_figure(
    labelled: LabelledDictionary, encoder: DualEncoder, world_dir: Path, config: DemoConfig, path: Path,
) -> dict:
    """Active atoms of one validation image before and after each of the three edits."""
    dataset = world_split(world_dir, "val", "coco")
    scenes = read_scenes(world_dir, "val")
    shapes = tuple(c.name for c in load_vocabulary(str(world_dir / "vocabulary.yaml")).of_kind("object"))
    owned = owned_concept_names(labelled)
    editor = make_editor(labelled, config, effect_check=False)
    dictionary = labelled.dictionary
    for row, record in enumerate(dataset.records[:SCENES_TRIED]):
        edits = _scene_edits(scenes[record.image_path.stem], shapes, owned)
        if edits is None:
            continue
        z = embed_pixels(encoder, encoder.preprocess(dataset.load_image(row))[None])
        results = [editor.apply(z, "image", edit) for edit in edits]
        if all(bool(result.valid[0, 0]) for result in results):
            break
    else:
        return {"skipped": f"none of the first {SCENES_TRIED} validation images admits all three edits"}
    panels = [("original", dictionary.transform(z, "image", dense=True)[0].numpy())]
    records = []
    for edit, result in zip(edits, results):
        panels.append((edit, dictionary.transform(result.embeddings[:, 0], "image", dense=True)[0].numpy()))
        records.append({"edit": edit, "cosine_to_original": float((result.embeddings[0, 0] * z[0]).sum())})
    names = labelled.directions.names
    atom_names = [names[c] for c in labelled.labelling.atom_concept.tolist()]
    caption = dataset.records[row].captions[0]
    atom_bars(panels, atom_names, path, title=f"active atoms (codes of the rebuilt image embedding): {caption}")
    return {"image": dataset.records[row].image_path.stem, "caption": caption, "edits": records}


def edit_retrieval_stage(
    labelled: LabelledDictionary, encoder: DualEncoder, world_dir: Path, vocabulary: str, config: DemoConfig,
) -> dict:
    """Transplants inside real test-image embeddings, looked up among real test images."""
    dataset = world_split(world_dir, "test", "coco")
    pixels = torch.stack([encoder.preprocess(dataset.load_image(i)) for i in range(len(dataset))])
    gallery = embed_pixels(encoder, pixels)
    rules = RuleNegatives(load_vocabulary(vocabulary))
    shown, concept_names = caption_concepts([r.captions for r in dataset.records], rules)
    results: dict[str, dict] = {}
    owned = owned_concept_names(labelled)
    for pair in TRANSPLANTS:
        source, target = pair.split("=")
        if not {source, target} <= owned:
            results[pair] = {"skipped": f"{source} or {target} owns no aligned atom"}
            continue
        figures = transplant_pair_retrieval(labelled, gallery, shown, concept_names, pair, config.finetune.negatives.edit, k=10,
                                       seed=config.seed)
        if not figures["edited"]:
            results[pair] = {"skipped": f"no valid transplant among {int(figures['candidates'])} images showing {source}"}
            continue
        counts = {key: int(figures[key]) for key in ("candidates", "proposed", "edited")}
        results[pair] = {**_finite(figures), **counts}
    texts = torch.from_numpy(embed_texts(encoder, dataset.captions, progress=False))
    editor = make_editor(labelled, config)
    report = edit_report(editor, gallery, "image", texts, n_edits=config.finetune.negatives.edit.n_edits, seed=config.seed)
    return {"transplants": results, "edit_kinds": {k: _finite(v) for k, v in report.items()}}


def edit_grids_stage(labelled: LabelledDictionary, encoder: DualEncoder, world_dir: Path, config: DemoConfig,
                     figures: Path, pairs: tuple[str, ...] = TRANSPLANTS, n_sources: int = 4, k: int = 6) -> dict:
    """Per transplant of `pairs` ("source=target") whose concepts own atoms: the neighbour grid over the test images
    (`lace.experiment.edit_grids`) of the first `n_sources` sources by id, at the strength the edit
    figures use and at four times it."""
    dataset = world_split(world_dir, "test", "coco")
    pixels = torch.stack([encoder.preprocess(dataset.load_image(i)) for i in range(len(dataset))])
    gallery = embed_pixels(encoder, pixels)
    owned = owned_concept_names(labelled)
    strengths = (config.finetune.negatives.edit.strength, 4 * config.finetune.negatives.edit.strength)
    grids = {}
    for pair in pairs:
        source, target = pair.split("=")
        if not {source, target} <= owned:
            grids[pair] = {"skipped": f"{source} or {target} owns no aligned atom"}
            continue
        grids[pair] = edit_grid_stage(
            labelled, gallery, dataset.captions, dataset.caption_image_index, f"transplant:{pair}",
            dataset.load_image, figures / f"edit_grid_{source}_{target}.png", strengths, n_sources=n_sources, k=k,
            seed=config.seed, config=dataclasses.replace(config.finetune.negatives.edit, kinds=("transplant",), target=pair),
            image_names=[Path(record.image_path).name for record in dataset.records])
    return grids


def _finite(values: dict) -> dict:
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in values.items()}
