"""The demo's provenance stage: does a model tell an edited image from a real one by how it was made?

One fixed instrument measures every model alike: a local editor fitted once on the base, as the trainer fits
LACE-local's (`lace.local.build_local_editor` on the first `local.fit_images` training images), whose binding
swap (two found objects exchange their colours) edits each held-out image inside the tower of the model
measured. With each image's first caption and the caption the swap describes (`RuleNegatives.describe`),
`provenance_preferences` gives the four preferences and the edit cosine on the test split; a linear probe
fitted on the validation split's real and edited image embeddings and scored on the test split's gives the
AUC real vs edited (`real_vs_edited_auc`; 0.5: provenance cannot be read off the image embedding). The world's
own colour swaps of the same scenes, rendered, are the reference: real counterfactual images.

The same probe between the swap and each artefact-symmetric counterpart of the real image (`lace.local.symmetric`:
round trip, nuisance shade, no-op), made in the swap's own pass, gives the probe AUC between positives and negatives
as a symmetric arm shows them to the loss (`probe_auc_<kind>`; `probe_auc` is the arm without symmetry's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from lace.concepts.vocabulary import load_vocabulary
from lace.demo.world_data import world_pairs, world_split
from lace.edits.captions import RuleNegatives
from lace.encoders.base import DualEncoder
from lace.local import LocalEditConfig, build_local_editor
from lace.local.editor import LocalImageEditor, slot_changes
from lace.local.recolour import RecolourRegression
from lace.local.symmetric import SYMMETRIC_KINDS, build_shade_regression, symmetric_negatives
from lace.progress import bar as progress_bar
from lace.provenance import PREFERENCES, provenance_preferences, real_vs_edited_auc
from lace.train import TensorPairs
from lace.train.rendered import rendered_negatives

PROBE_SPLITS = ("val", "test")
"""The probe is fitted on the first split and scored on the second; the preferences are the second's."""
SOURCES = ("local", "rendered")
"""The instrument's binding swaps inside the tower, and the world's rendered colour swaps (the reference)."""
COUNTERPARTS = SYMMETRIC_KINDS[1:]
"""The symmetric counterparts of the real image each swap's probe is also measured against (`probe_auc_<kind>`)."""
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


def fit_instrument_shade(config: LocalEditConfig, encoder: DualEncoder, train: TensorPairs, vocabulary: str,
                         editor: LocalImageEditor) -> RecolourRegression | None:
    """The nuisance counterparts' shade regression (`lace.local.symmetric`) of the instrument `editor`, fitted on the
    images the editor was (None for an operator other than the recolouring); the global random stream is left as
    it was."""
    if config.operator != "recolour":
        return None
    count = min(config.fit_images, len(train))
    with torch.random.fork_rng(devices=[]):
        return build_shade_regression(replace(config, symmetric="nuisance"), editor, encoder.model,
                                      train.pixels[:count].to(encoder.device), encoder.preprocess.transforms[-1],
                                      load_vocabulary(vocabulary))


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
    nor renders). fit: () -> the fitted editor; held_out: split -> its `HeldOut`; fit_shade: the editor -> the
    nuisance counterparts' shade regression (None: no nuisance counterpart is measured)."""

    def __init__(self, fit: Callable[[], LocalImageEditor], held_out: Callable[[str], HeldOut], vocabulary: str,
                 fit_shade: Callable[[LocalImageEditor], RecolourRegression | None] | None = None):
        self.fit, self.held_out, self.vocabulary, self.fit_shade = fit, held_out, vocabulary, fit_shade
        self.editor_: LocalImageEditor | None = None
        self.shade_: RecolourRegression | None = None
        self.splits_: dict[str, HeldOut] = {}
        self.describer_: RuleNegatives | None = None

    def prepare(self) -> ProvenanceInstrument:
        if self.editor_ is None:
            self.editor_ = self.fit()
            self.shade_ = self.fit_shade(self.editor_) if self.fit_shade is not None else None
            self.splits_ = {split: self.held_out(split) for split in PROBE_SPLITS}
            self.describer_ = RuleNegatives(load_vocabulary(self.vocabulary))
        return self


@dataclass
class Embedded:
    """One split through one model: real images and captions U, V (N, d); per source the edited images (N, d), the
    described captions (N, d) (zeros where none), and made (N,) and described (N,) bool; counterparts: per kind
    of `COUNTERPARTS` measured, the (N, d) symmetric counterpart of each real image for its local swap."""

    U: Tensor
    V: Tensor
    edited: dict[str, Tensor]
    described: dict[str, Tensor]
    made: dict[str, Tensor]
    written: dict[str, Tensor]
    counterparts: dict[str, Tensor]


def provenance_figures(encoder: DualEncoder, instrument: ProvenanceInstrument, progress: bool = True) -> dict:
    """Per source (`SOURCES`): the four preferences, the edit cosine and their rows `n` on the test split, and the
    probe's AUC real vs edited (fitted on val, scored on test; None with fewer than two edits in either) with its
    rows per split; for the local swaps also the probe's AUC between each symmetric counterpart and the swap
    (`probe_auc_<kind>`); and the images per split."""
    instrument.prepare()
    embedded = {split: _embed(encoder, instrument, split, progress) for split in PROBE_SPLITS}
    train, test = (embedded[split] for split in PROBE_SPLITS)
    figures: dict = {"images": {split: len(embedded[split].U) for split in PROBE_SPLITS}}
    for source in SOURCES:
        rows = test.made[source] & test.written[source]
        measured = provenance_preferences(test.U, test.V, test.edited[source], test.described[source], rows)
        made = {split: int(embedded[split].made[source].sum()) for split in PROBE_SPLITS}
        probed = min(made.values()) >= 2
        auc = _probe(train, test, source, train.U, test.U) if probed else None
        figures[source] = {**{name: _number(measured[name]) for name in (*PREFERENCES, "edit_cosine")},
                           "n": measured["n"], "probe_auc": auc, "probe_rows": made}
        if source == "local":
            figures[source].update({f"probe_auc_{kind}": _probe(train, test, source, train.counterparts[kind],
                                                                test.counterparts[kind]) if probed else None
                                    for kind in train.counterparts})
    return figures


def _probe(train: Embedded, test: Embedded, source: str, train_real: Tensor, test_real: Tensor) -> float:
    """`real_vs_edited_auc` of `source`'s edits against `*_real` (N, d) (the real images or a stand-in of them) on
    the rows where the edit was made."""
    rows, held = train.made[source], test.made[source]
    return real_vs_edited_auc(train_real[rows], train.edited[source][rows], test_real[held], test.edited[source][held])


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
            for kind in COUNTERPARTS:
                if kind != "nuisance" or instrument.shade_ is not None:  # the same swap, with its counterpart
                    counterpart = symmetric_negatives(editor, encoder.model, pixels, 1, kind, instrument.shade_)
                    parts.setdefault(f"counterpart {kind}", []).append(counterpart.counterparts[:, 0].float().cpu())
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
    counterparts = {kind: torch.cat(parts[f"counterpart {kind}"]) for kind in COUNTERPARTS
                    if f"counterpart {kind}" in parts}
    return Embedded(U, V, {source: torch.cat(parts[source]) for source in SOURCES}, described, made, written,
                    counterparts)


def _encode_written(encoder: DualEncoder, texts: list[str | None], dim: int) -> Tensor:
    """(N, d) unit embeddings of the captions that could be written, zeros where none."""
    embedded = torch.zeros(len(texts), dim)
    rows = [i for i, text in enumerate(texts) if text is not None]
    for start in range(0, len(rows), BATCH):
        chunk = rows[start:start + BATCH]
        embedded[chunk] = encoder.encode_texts([texts[i] for i in chunk]).float().cpu()
    return embedded
