"""Fidelity of local edits against the truth only the shapes world has: its rendered counterfactuals.

For each benchmark item of a split (validation by default; never the test split) the world holds
the image, the rendered negative image (the same scene with the edit made in pixels) and both
captions. An image-side edit of the image's features at L is compared with the rendered negative:
- direction agreement `cos(u_edit - u, u_rendered - u)`;
- `cos(u_edit, u_rendered)` against `cos(u, u_rendered)`;
- whether the edited image now prefers the edited caption (`u_edit . v_neg > u_edit . v_pos`);
each beside the same-size random step at the same positions; and the AUC of a linear probe telling the binding swaps
from real images on the model measured (`lace.experiment.fidelity_probe`), beside the same probe on the rendered
swaps. Binding swaps are measured on the
`swap_attribute` items, transplants on `replace_attribute` items (the renderer's one-object recolour).
Objects are found from the features (the reader); the renderer's masks only measure that (IoU).
Caption-side swaps are measured against the encoded negative caption. With `pooled`, the pooled-embedding
arms' image-side counterfactuals (paired-caption directions, LACE's dictionary edits, concept arithmetic) are
measured on the same items (`lace.experiment.pooled_fidelity`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms import Normalize

from lace.concepts.labelled import load_labelled_dictionary
from lace.concepts.vocabulary import load_vocabulary
from lace.config import config_to_dict
from lace.data.readers import read_dataset
from lace.data.world.config import PALETTE
from lace.data.world.folder import read_scenes, read_world_config
from lace.data.world.render import object_coverage
from lace.errors import input_error
from lace.experiment.fidelity_probe import (
    ProbeImages,
    edit_probe_auc,
    probe_images,
    rendered_probe_auc,
)
from lace.experiment.pooled_fidelity import DICTIONARY_METHODS, check_pooled, measure_pooled
from lace.local.codes import LocalConceptCodes
from lace.local.config import LearntOperatorConfig
from lace.local.editor import fit_local_editor
from lace.local.edits import binding_swap, transplant
from lace.local.fidelity import benchmark_items, edit_figures, family_data, item_pixels
from lace.local.fidelity_scores import mean_or_none
from lace.local.learnt import LearntRecolour
from lace.local.objects import FoundObjects, mask_iou
from lace.local.recolour import RecolourRegression
from lace.local.text import caption_swap_negatives, single_token_ids
from lace.local.towers import ImageTowerSplit, region_features
from lace.local.transport import GaussianTransport
from lace.report.document import Table, format_cell

METHODS = {
    "mean_shift": {"n_buckets": 1, "window": 1, "covariance": False},
    "bucket_mean_shift": {"n_buckets": 5, "window": 1, "covariance": False},
    "cell_transport": {"n_buckets": 5, "window": 1},
    "window_transport": {"n_buckets": 5, "window": 3},
    "recolour_regression": {"window": 3},
    "learnt_recolour": {"window": 3},
}
"""Edit operators compared: the naive mean difference of the two concepts' features, the same per
coverage bucket, Gaussian optimal transport per bucket on a position or its 3x3 neighbourhood,
the recolouring regression learnt from grey-preserving colour maps of training images, and the learnt
operator on the same self-supervision (`lace.local.learnt`: the ridge's change plus a network trained also
against a real-vs-edited discriminator; knobs in `FidelityConfig.learnt`)."""
RECOLOUR_METHODS = ("recolour_regression", "learnt_recolour")


@dataclass
class FidelityConfig:
    """What to measure."""

    world: str
    """Folder of a shapes world (written by `lace world` or `lace demo`)."""
    layers: tuple[str, ...] = ("stem", "layer1", "layer2")
    """Image-tower layers L to edit at."""
    methods: tuple[str, ...] = tuple(METHODS)
    """Edit operators (keys of METHODS)."""
    text_layers: tuple[str, ...] = ("block0", "block1", "block2")
    """Text-tower layers for caption-side swaps."""
    split: str = "val"
    """Benchmark split measured: val (or train-derived); never test."""
    n_items: int = 400
    """Items per family measured."""
    n_train: int = 3000
    """Training images the reader, codes and transport are fitted on."""
    group: str = "colour"
    """Attribute group the edits exchange."""
    locate_layer: str | None = None
    """Layer whose features the reader reads to find objects (None: each edit layer itself)."""
    renderer_masks: bool = False
    """Also measure, as a diagnostic only, each method placed by the renderer's masks and true colours
    (fitted and applied so): the fidelity the operator reaches when localisation is perfect."""
    pooled: tuple[str, ...] = ()
    """Pooled-embedding arms measured beside the local edits: paired_caption_directions, lace,
    concept_arithmetic (`lace.experiment.pooled_fidelity.POOLED_METHODS`)."""
    dictionary: str | None = None
    """Labelled concept dictionary folder of the same base (`lace dict fit`), for lace and concept_arithmetic."""
    learnt: LearntOperatorConfig = field(default_factory=LearntOperatorConfig)
    """Knobs of the learnt_recolour method (as `lace train --local-learnt-*`)."""
    n_probe: int = 1000
    """Training images after the first n_train (no operator saw them) the provenance probe is fitted on (0: no
    probe)."""
    seed: int = 0
    """Seed of the items drawn, the fitted reader and the random controls."""
    batch_size: int = 200
    """Images per tower pass."""
    extra: dict = field(default_factory=dict)
    """Further settings recorded with the figures (not a flag)."""



def _check(config: FidelityConfig) -> None:
    """Refuse a test split, an unknown method or an impossible pooled setting, naming the field."""
    if config.split.startswith("test"):
        raise input_error("FidelityConfig", "split", "a training or validation split (never test)", config.split)
    unknown = [m for m in config.methods if m not in METHODS]
    if unknown:
        raise input_error("FidelityConfig", "methods", f"names from {list(METHODS)}", unknown)
    check_pooled(config.pooled, config.dictionary)


def _measure_text(encoder, config: FidelityConfig, names: list[str], chosen: list[dict], data: dict, log) -> dict:
    """Per text layer, the caption-side swaps of the `chosen` swap-attribute items against their rendered negatives
    (`data`: the family's `v_pos`, `v_neg`, (N, d))."""
    concept_ids = single_token_ids(encoder.tokenize, names)
    tokens = encoder.tokenize([item["caption"] for item in chosen])
    v_pos, v_neg = data["v_pos"], data["v_neg"]
    figures = {}
    for layer in config.text_layers:
        edited, valid = caption_swap_negatives(encoder.model, tokens, concept_ids, layer)
        edited, valid = edited[:, 0], valid[:, 0]
        figures[layer] = {
            "valid_share": mean_or_none(valid),
            "direction_agreement": mean_or_none(F.cosine_similarity(edited - v_pos, v_neg - v_pos, dim=-1)[valid]),
            "cos_edit_rendered": mean_or_none((edited * v_neg).sum(-1)[valid]),
            "cos_original_rendered": mean_or_none((v_pos * v_neg).sum(-1)[valid]),
        }
        log(f"[text {layer}] {figures[layer]}")
    return figures


def measure_fidelity(encoder, config: FidelityConfig, log=print) -> dict:
    """Every figure of the fidelity tables, as a JSON-ready dict."""
    _check(config)
    # loaded before the long local measurements, so a bad folder fails at once
    labelled = (load_labelled_dictionary(config.dictionary)
                if any(name in DICTIONARY_METHODS for name in config.pooled) else None)
    torch.manual_seed(config.seed)
    world = Path(config.world)
    world_config = read_world_config(world)
    vocabulary = load_vocabulary(world / "vocabulary.yaml")
    clip = encoder.model.eval()
    train = read_dataset(world / "karpathy_coco.json", split="train")
    n_train = min(config.n_train, len(train))
    train_pixels = torch.stack([encoder.preprocess(train.load_image(i)) for i in range(n_train)])
    normalise = encoder.preprocess.transforms[-1]
    if not isinstance(normalise, Normalize):
        raise input_error(encoder.name, "preprocess", "a transform that ends with Normalize", type(normalise).__name__)
    raw_pixels = train_pixels * torch.tensor(normalise.std).view(1, 3, 1, 1) + torch.tensor(normalise.mean).view(1, 3, 1, 1)
    prototypes = torch.tensor([PALETTE[name] for name in vocabulary.groups()[config.group]]).float() / 255.0
    train_captions = [train.records[i].captions for i in range(n_train)]
    train_scenes = None
    if config.renderer_masks:
        by_id = read_scenes(world, "train")
        train_scenes = [by_id[Path(train.records[i].image_path).stem] for i in range(n_train)]
    scenes = read_scenes(world, config.split)
    families = {family: benchmark_items(world, config.split, family, config.n_items)
                for family in ("swap_attribute", "replace_attribute")}
    names = vocabulary.groups()[config.group]
    results = {"config": config_to_dict(config), "n_train": n_train, "image": {}, "text": {}}
    with torch.no_grad():
        data = {family: family_data(encoder, item_pixels(encoder, world, chosen), chosen)
                for family, chosen in families.items()}
        probe = probe_images(encoder, world, train, n_train, config.n_probe) if config.n_probe else None
        results["rendered_probe_auc"] = (rendered_probe_auc(encoder, probe, data["swap_attribute"])
                                         if probe is not None else None)
        log(f"[probe] rendered swaps: AUC {results['rendered_probe_auc']}")
        for layer in config.layers:
            results["image"][layer] = _measure_layer(clip, config, layer, train_pixels, train_captions, vocabulary,
                                                     names, families, data, scenes, world_config, log, train_scenes,
                                                     (raw_pixels, normalise, prototypes), probe)
        results["text"] = _measure_text(encoder, config, names, families["swap_attribute"], data["swap_attribute"], log)
        if config.pooled:
            results["pooled"] = measure_pooled(config.pooled, labelled, families, scenes, data, config.seed, log)
    return results


def _renderer_objects(scene_list, grid, world_config, names) -> FoundObjects:
    """Diagnostic only: the renderer's coverage and true colours of each scene's objects on `grid`."""
    coverage = torch.tensor(np.stack([[object_coverage(obj, world_config) for obj in scene["objects"]]
                                      for scene in scene_list])).float()  # (N, n, H_px, W_px)
    coverage = F.adaptive_avg_pool2d(coverage, grid).flatten(2)
    concept = torch.tensor([[names.index(obj["colour"]) for obj in scene["objects"]] for scene in scene_list])
    return FoundObjects(concept, coverage, torch.ones_like(concept, dtype=torch.bool))


def _measure_layer(clip, config, layer, train_pixels, train_captions, vocabulary, names, families, data, scenes,
                   world_config, log, train_scenes, recolour_inputs, probe: ProbeImages | None = None) -> dict:
    split = ImageTowerSplit(clip, layer)
    out = {"methods": {}, "operator_fit": {}}
    variants = [(method, False) for method in config.methods]
    if config.renderer_masks:
        variants += [(method, True) for method in config.methods]
    operators = _Operators(clip, config, layer, train_pixels, train_captions, vocabulary, recolour_inputs)
    for method, masks in variants:
        if masks and method not in RECOLOUR_METHODS:  # a recolouring operator is fitted as usual, placed by the masks
            train_features, grid = region_features(clip, train_pixels, layer)
            oracle = _renderer_objects(train_scenes, grid, world_config, names)
            transport = GaussianTransport(**METHODS[method]).fit(train_features, grid, oracle.concept,
                                                                 oracle.coverage, len(names))
        else:
            transport = operators.get(method)
        editor = operators.editor
        generator = torch.Generator().manual_seed(config.seed)
        figures = {}
        for kind, family in (("swap", "swap_attribute"), ("transplant", "replace_attribute")):
            d = data[family]
            features = split.regions(split.lower(d["x"]))
            if masks:
                objects = _renderer_objects([scenes[item["scene_id"]] for item in families[family]], split.grid,
                                            world_config, names)
            else:
                objects = editor.locate(clip, d["x"], features, split.grid)
            if kind == "swap":
                step, valid = binding_swap(transport, features, split.grid, objects)
            else:
                step, valid = _replace_item_transplant(transport, features, split.grid, objects, families[family],
                                                       names)
            figures[kind] = edit_figures(split, features, step, valid, d, generator)
            if kind == "swap" and probe is not None and not masks:
                figures[kind]["probe_auc"] = edit_probe_auc(split, transport, partial(_locate, editor, clip, split.grid),
                                                            probe, d["u"], split.upper(features + step), valid)
        name = f"{method} (renderer masks)" if masks else method
        out["methods"][name] = figures
        log(f"[image {layer} {name}] swap {figures['swap']['edit']} control "
            f"{figures['swap']['random_control']['direction_agreement']} probe {figures['swap'].get('probe_auc')}; "
            f"transplant {figures['transplant']['edit']}")
    editor = operators.editor
    out["operator_fit"] = operators.fit_figures
    out["localisation"] = _localisation(clip, editor, split, data["swap_attribute"]["x"], families["swap_attribute"],
                                        scenes, world_config, names)
    out["reader_mention_loss"] = editor.reader.mention_loss_
    out["locate_layer"] = editor.locate_layer
    out["codes"] = _codes_summary(clip, editor.locate_layer, train_pixels, train_captions, vocabulary, config.group,
                                  editor.reader)
    log(f"[image {layer}] localisation {out['localisation']} codes {out['codes']['fvu']:.3f} fvu")
    return out


def _locate(editor, clip, grid, pixels, features) -> FoundObjects:
    return editor.locate(clip, pixels, features, grid)


def _replace_item_transplant(transport, features, grid, objects: FoundObjects, chosen: list[dict], names):
    """The transplant each replace_attribute item names (its object of colour `from` becomes `to`): step (N, P, C)
    and valid (N,)."""
    source = torch.tensor([names.index(item["edit"]["from"]) for item in chosen])
    target = torch.tensor([names.index(item["edit"]["to"]) for item in chosen])
    hit = (objects.concept == source[:, None]) & objects.valid
    which = hit.float().argmax(dim=1)
    step, valid = transplant(transport, features, grid, objects, which, target)
    return step, valid & hit.any(dim=1)


class _Operators:
    """The operators of one layer, fitted on first use: the reader once (`editor`), the ridge regression once (the
    learnt operator's own ridge when it is fitted first), each transport method with the reader."""

    def __init__(self, clip, config, layer, train_pixels, train_captions, vocabulary, recolour_inputs):
        self.clip, self.config, self.layer = clip, config, layer
        self.train_pixels, self.train_captions, self.vocabulary = train_pixels, train_captions, vocabulary
        self.recolour_inputs = recolour_inputs
        self.editor = None
        self.fitted: dict[str, object] = {}
        self.fit_figures: dict[str, dict] = {}

    def _reader_editor(self, transport=None):
        config = self.config
        editor = fit_local_editor(self.clip, self.train_pixels, self.train_captions, self.vocabulary, self.layer,
                                  config.group, transport=transport,
                                  reader=self.editor.reader if self.editor is not None else None, seed=config.seed,
                                  locate_layer=config.locate_layer, fit_reader=self.editor is None)
        self.editor = self.editor or editor
        return editor

    def get(self, method: str):
        """The fitted operator of `method` (a key of METHODS)."""
        if method in self.fitted:
            return self.fitted[method]
        if method not in RECOLOUR_METHODS:
            self.fitted[method] = self._reader_editor(GaussianTransport(**METHODS[method])).transport
            return self.fitted[method]
        if self.editor is None:
            self._reader_editor()
        raw_pixels, normalise, prototypes = self.recolour_inputs
        fit = (self.clip, self.layer, raw_pixels, normalise, self.editor.reader, prototypes, self.editor.locate_layer)
        if method == "learnt_recolour":
            learnt = LearntRecolour(self.config.learnt, seed=self.config.seed, **METHODS[method]).fit(*fit)
            self.fitted[method], self.fit_figures[method] = learnt, learnt.fit_figures_
            self.fitted.setdefault("recolour_regression", learnt.ridge_)
        else:
            self.fitted[method] = RecolourRegression(**METHODS[method]).fit(*fit)
        return self.fitted[method]


def _localisation(clip, editor, split, pixels, items, scenes, world_config, names) -> dict:
    """How well the objects found from features match the renderer's masks (measurement only)."""
    features = split.regions(split.lower(pixels))
    objects = editor.locate(clip, pixels, features, split.grid)
    colour_right, ious = [], []
    for row, item in enumerate(items):
        scene = scenes[item["scene_id"]]
        truth_colours = [names.index(obj["colour"]) for obj in scene["objects"]]
        found = set(objects.concept[row][objects.valid[row]].tolist())
        colour_right.append(found == set(truth_colours))
        for k, obj in enumerate(scene["objects"]):
            coverage = torch.from_numpy(object_coverage(obj, world_config)).float()[None, None]
            truth = F.adaptive_avg_pool2d(coverage, split.grid).flatten() > 0.5
            hit = (objects.concept[row] == truth_colours[k]) & objects.valid[row]
            if hit.any():
                ious.append(float(mask_iou(objects.coverage[row, int(hit.float().argmax())] > 0.5, truth)))
            else:
                ious.append(0.0)
    return {"objects_right_share": float(np.mean(colour_right)), "mask_iou": float(np.mean(ious)),
            "grid": list(split.grid)}


def _codes_summary(clip, layer, train_pixels, train_captions, vocabulary, group, reader) -> dict:
    from lace.local.editor import group_mentions

    features, _ = region_features(clip, train_pixels, layer)
    mentions, names = group_mentions(vocabulary, group, train_captions)
    codes_model = LocalConceptCodes().fit(features.reshape(-1, features.shape[-1]))
    codes = codes_model.transform(features)
    codes_model.label(reader, codes, mentions, names)
    labelled = codes_model.atom_concept_ >= 0
    shuffled = codes_model.alignment_[torch.arange(codes_model.n_atoms),
                                      torch.randint(len(names), (codes_model.n_atoms,),
                                                    generator=torch.Generator().manual_seed(0))]
    return {"fvu": codes_model.fvu(features[:500]), **codes_model.summary(),
            "mean_alignment_random_labels": float(shuffled.mean()),
            "n_atoms": codes_model.n_atoms, "sparsity": codes_model.sparsity,
            "labelled": int(labelled.sum())}


FIGURE_COLUMNS = ("valid", "direction", "control", "cos(u_edit, u_r)", "cos(u, u_r)", "control cos",
                  "prefers edited caption (edit / original / rendered / control)")
"""The columns of one family's figures (`_figure_cells`), in the image-side and the pooled tables."""


def _figure_cells(row: dict) -> list:
    """The cells of one family's figures, from `valid` to the caption preferences."""
    edit, original, control = row["edit"], row["original"], row["random_control"]
    preferences = (edit["prefers_edited_caption"], original["prefers_edited_caption"],
                   row["rendered_prefers_edited_caption"], control["prefers_edited_caption"])
    return [row["valid_share"], edit["direction_agreement"], control["direction_agreement"], edit["cos_edit_rendered"],
            original["cos_original_rendered"], control["cos_edit_rendered"], " / ".join(map(format_cell, preferences))]


def _table(text: str, header: Sequence[str], rows: list[list]) -> str:
    """`text`, then its table (`lace.report.document.Table`: three digits, a dash for a figure not measured)."""
    return f"{text}\n\n{Table(header, rows).markdown()}"


def _pooled_markdown(pooled: dict) -> list[str]:
    """The pooled-embedding arms' table, why their rows were invalid and the colour pairs their editor refused."""
    rows = [(method, kind, row) for method, figures in pooled.items() for kind, row in figures.items()]
    blocks = [_table("Pooled-embedding image-side edits (the non-local arms) on the same items; control = random step "
                     "of the edit's size |u_edit - u| in embedding space, then normalised:",
                     ["method", "edit", *FIGURE_COLUMNS], [[method, kind, *_figure_cells(row)] for method, kind, row in rows])]
    reasons = [[method, kind, row["valid_share"], *(row["invalid_shares"][reason] for reason in
                                                     ("refused_pair", "not_proposed", "failed_effect_check"))]
               for method, kind, row in rows if row["invalid_shares"]]
    if reasons:
        blocks.append(_table("Why dictionary edits are invalid (shares of all rows):", [
            "method", "edit", "valid", "pair refused", "no edit proposed", "failed effect check"], reasons))
    refused = [f"- {method} {kind}: {', '.join(sorted(row['refused_pairs']))}" for method, kind, row in rows
               if row["refused_pairs"]]
    if refused:
        blocks.append("\n".join(["Colour pairs the editor refused (their rows count as invalid):", "", *refused]))
    return blocks


def _probe_markdown(results: dict) -> list[str]:
    """Each operator's binding swaps: direction fidelity, its random control and the provenance probe's AUC, beside
    the probe on the rendered swaps; and the learnt operator's fit."""
    rendered = results.get("rendered_probe_auc")
    blocks = [_table(
        f"Binding swaps, fidelity and provenance: probe AUC real vs edited on this model (fitted on "
        f"{results['config'].get('n_probe', 0)} training images no operator saw, scored on the items; the same probe "
        f"on the rendered swaps: {format_cell(rendered)}):",
        ["layer", "method", "swap direction", "control", "probe AUC", "rendered probe AUC"],
        [[layer, method, figures["swap"]["edit"]["direction_agreement"],
          figures["swap"]["random_control"]["direction_agreement"], figures["swap"].get("probe_auc"), rendered]
         for layer, layer_results in results["image"].items() for method, figures in layer_results["methods"].items()])]
    fits = [[layer, method, fit["ridge_reconstruction"], fit["learnt_reconstruction"], fit["critic_loss"]]
            for layer, layer_results in results["image"].items()
            for method, fit in layer_results.get("operator_fit", {}).items()]
    if fits:
        blocks.append(_table("Learnt operator's fit (relative squared error of the change on its sampled training "
                             "positions):", ["layer", "method", "ridge", "learnt", "discriminator loss"], fits))
    return blocks


def fidelity_markdown(results: dict) -> str:
    """The fidelity tables as markdown."""
    image = results["image"].items()
    blocks = [_table(
        f"Image-side edits on {results['config']['split']} items (fitted on {results['n_train']} training images). "
        "Direction agreement = cos(u_edit - u, u_rendered - u); control = same-size random step at the same positions.",
        ["layer", "method", "edit", *FIGURE_COLUMNS],
        [[layer, method, kind, *_figure_cells(row)] for layer, layer_results in image
         for method, figures in layer_results["methods"].items() for kind, row in figures.items()])]
    blocks += _probe_markdown(results)
    blocks.append(_table(
        "Localisation from features (renderer masks only measure) and local codes:",
        ["layer", "grid", "both objects' concepts right", "mask IoU", "reader loss", "codes FVU", "atoms labelled",
         "mean alignment (labelled)", "mean alignment (random labels)"],
        [[layer, "{}x{}".format(*found["localisation"]["grid"]), found["localisation"]["objects_right_share"],
          found["localisation"]["mask_iou"], found["reader_mention_loss"], found["codes"]["fvu"],
          f"{found['codes']['labelled']}/{found['codes']['n_atoms']}", found["codes"]["mean_alignment_labelled"],
          found["codes"]["mean_alignment_random_labels"]] for layer, found in image]))
    blocks.append(_table(
        "Caption-side binding swaps (token states exchanged at L) against the encoded swapped caption:",
        ["layer", "valid", "direction", "cos(v_edit, v_neg)", "cos(v, v_neg)"],
        [[layer, row["valid_share"], row["direction_agreement"], row["cos_edit_rendered"],
          row["cos_original_rendered"]] for layer, row in results["text"].items()]))
    if "pooled" in results:
        blocks += _pooled_markdown(results["pooled"])
    return "\n\n".join(blocks) + "\n"
