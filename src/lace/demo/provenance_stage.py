"""The demo's provenance stage: does a model tell an edited image from a real one by how it was made?

One fixed instrument measures every model alike: a local editor fitted once on the base, as the trainer fits
LACE-local's (`lace.local.build_local_editor` on the first `local.fit_images` training images), whose binding
swap (two found objects exchange their colours) edits each held-out image inside the tower of the model
measured. With each image's first caption and the caption the swap describes (`RuleNegatives.describe`),
`provenance_preferences` gives the four preferences and the edit cosine on the test split; a linear probe
fitted on the validation split's real and edited image embeddings and scored on the test split's gives the
AUC real vs edited (`real_vs_edited_auc`; 0.5: provenance cannot be read off the image embedding). The world's
own colour swaps of the same scenes, rendered, are the reference: real counterfactual images.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lace.concepts.vocabulary import load_vocabulary
from lace.demo.world_data import world_pairs, world_split
from lace.edits.captions import RuleNegatives
from lace.encoders.base import DualEncoder
from lace.local import LocalEditConfig, build_local_editor
from lace.local.editor import LocalImageEditor, slot_changes
from lace.progress import bar as progress_bar
from lace.provenance import PREFERENCES, provenance_preferences, real_vs_edited_auc
from lace.train import TensorPairs
from lace.train.rendered import rendered_negatives

PROBE_SPLITS = ("val", "test")
"""The probe is fitted on the first split and scored on the second; the preferences are the second's."""
SOURCES = ("local", "rendered")
"""The instrument's binding swaps inside the tower, and the world's rendered colour swaps (the reference)."""
BATCH = 256


@dataclass
class HeldOut:
    """One held-out split: pixels (N, 3, H, W) in the model's input format and each image's first caption; its
    rendered colour swap, rendered (N, 3, H, W) and rendered_valid (N,) bool, and the colour words the swap
    exchanges (None where the scene has no two colours to swap)."""

    pixels: Tensor
    captions: list[str]
    rendered: Tensor
    rendered_valid: Tensor
    rendered_changes: list[dict[str, str] | None]


def fit_instrument(config: LocalEditConfig, encoder: DualEncoder, train: TensorPairs, vocabulary: str,
                   seed: int) -> LocalImageEditor:
    """The local editor of `config` fitted on `encoder` (the base) and the first `config.fit_images` training images
    with their captions, as the trainer fits LACE-local's; the global random stream is left as it was."""
    count = min(config.fit_images, len(train))
    normalise = encoder.preprocess.transforms[-1]
    with torch.random.fork_rng(devices=[]):
        return build_local_editor(config, encoder.model, train.pixels[:count], [list(c) for c in train.captions[:count]],
                                  normalise, load_vocabulary(vocabulary), seed=seed)


def held_out_split(world_dir: Path, split: str, encoder: DualEncoder, decoded: dict | None = None) -> HeldOut:
    """`split`'s images (decoded once per `decoded`, as `world_pairs` keeps them), first captions and rendered
    colour swaps."""
    pairs = world_pairs(world_dir, split, "coco", encoder, decoded)
    scene_ids = [Path(record.image_path).stem for record in world_split(world_dir, split, "coco").records]
    swaps = rendered_negatives(world_dir, scene_ids, encoder.preprocess)
    return HeldOut(pairs.pixels, [captions[0] for captions in pairs.captions], swaps.pixels, swaps.valid,
                   swaps.changes)


class ProvenanceInstrument:
    """The one instrument of every model's provenance figures: the editor fitted on the base and the held-out
    splits it edits, made on the first `prepare()` (a rerun whose provenance stages are all cached neither fits
    nor renders). fit: () -> the fitted editor; held_out: split -> its `HeldOut`."""

    def __init__(self, fit: Callable[[], LocalImageEditor], held_out: Callable[[str], HeldOut], vocabulary: str):
        self.fit, self.held_out, self.vocabulary = fit, held_out, vocabulary
        self.editor_: LocalImageEditor | None = None
        self.splits_: dict[str, HeldOut] = {}
        self.describer_: RuleNegatives | None = None

    def prepare(self) -> ProvenanceInstrument:
        if self.editor_ is None:
            self.editor_ = self.fit()
            self.splits_ = {split: self.held_out(split) for split in PROBE_SPLITS}
            self.describer_ = RuleNegatives(load_vocabulary(self.vocabulary))
        return self


@dataclass
class Embedded:
    """One split through one model: real images and captions U, V (N, d); per source the edited images (N, d), the
    described captions (N, d) (zeros where none), and made (N,) and described (N,) bool."""

    U: Tensor
    V: Tensor
    edited: dict[str, Tensor]
    described: dict[str, Tensor]
    made: dict[str, Tensor]
    written: dict[str, Tensor]


def provenance_figures(encoder: DualEncoder, instrument: ProvenanceInstrument, progress: bool = True) -> dict:
    """Per source (`SOURCES`): the four preferences, the edit cosine and their rows `n` on the test split, and the
    probe's AUC real vs edited (fitted on val, scored on test; None with fewer than two edits in either) with its
    rows per split; and the images per split."""
    instrument.prepare()
    embedded = {split: _embed(encoder, instrument, split, progress) for split in PROBE_SPLITS}
    train, test = (embedded[split] for split in PROBE_SPLITS)
    figures: dict = {"images": {split: len(embedded[split].U) for split in PROBE_SPLITS}}
    for source in SOURCES:
        rows = test.made[source] & test.written[source]
        measured = provenance_preferences(test.U, test.V, test.edited[source], test.described[source], rows)
        made = {split: int(embedded[split].made[source].sum()) for split in PROBE_SPLITS}
        auc = None
        if min(made.values()) >= 2:
            auc = real_vs_edited_auc(train.U[train.made[source]], train.edited[source][train.made[source]],
                                     test.U[test.made[source]], test.edited[source][test.made[source]])
        figures[source] = {**{name: _number(measured[name]) for name in (*PREFERENCES, "edit_cosine")},
                           "n": measured["n"], "probe_auc": auc, "probe_rows": made}
    return figures


def _number(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


@torch.no_grad()
def _embed(encoder: DualEncoder, instrument: ProvenanceInstrument, split: str, progress: bool) -> Embedded:
    """Every image of `split`, its binding swap by the instrument and its rendered swap, and the captions of each,
    through `encoder` in eval mode (batches of `BATCH`)."""
    held, editor, rules = instrument.splits_[split], instrument.editor_, instrument.describer_
    was_training = encoder.training
    encoder.eval()
    parts: dict[str, list[Tensor]] = {}
    texts: dict[str, list[str | None]] = {"local": [], "rendered": []}
    try:
        for start in progress_bar(range(0, len(held.pixels), BATCH), desc=f"provenance ({split})", unit="batch",
                                  enabled=progress):
            pixels = held.pixels[start:start + BATCH].to(encoder.device)
            captions = held.captions[start:start + BATCH]
            made = editor.negatives(encoder.model, pixels, n_edits=1)  # slot 0: the binding swap
            swaps = [row[0] for row in slot_changes(made.kinds, made.changes, editor.concept_names)]
            texts["local"] += [rules.describe(caption, change) for caption, change in zip(captions, swaps)]
            texts["rendered"] += [rules.describe(caption, change) if change else None
                                  for caption, change in zip(captions, held.rendered_changes[start:start + BATCH])]
            for name, value in (("U", made.original), ("V", encoder.encode_texts(captions)),
                                ("local", made.embeddings[:, 0]), ("local made", made.valid[:, 0]),
                                ("rendered", encoder.encode_images(held.rendered[start:start + BATCH])),
                                ("rendered made", held.rendered_valid[start:start + BATCH])):
                parts.setdefault(name, []).append(value.float().cpu() if value.is_floating_point() else value.cpu())
    finally:
        encoder.train(was_training)
    U, V = torch.cat(parts["U"]), torch.cat(parts["V"])
    made = {source: torch.cat(parts[f"{source} made"]).bool() for source in SOURCES}
    written = {source: torch.tensor([text is not None for text in texts[source]], dtype=torch.bool)
               for source in SOURCES}
    described = {source: _encode_written(encoder, texts[source], U.shape[1]) for source in SOURCES}
    return Embedded(U, V, {source: torch.cat(parts[source]) for source in SOURCES}, described, made, written)


def _encode_written(encoder: DualEncoder, texts: list[str | None], dim: int) -> Tensor:
    """(N, d) unit embeddings of the captions that could be written, zeros where none."""
    embedded = torch.zeros(len(texts), dim)
    rows = [i for i, text in enumerate(texts) if text is not None]
    for start in range(0, len(rows), BATCH):
        chunk = rows[start:start + BATCH]
        embedded[chunk] = encoder.encode_texts([texts[i] for i in chunk]).float().cpu()
    return embedded
