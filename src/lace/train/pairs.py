"""The pairs layout: edited images as rows of their own, positive with the caption their edit describes.

TripletCLIP's `negclip(I, T, T') + negclip(I', T', T)` (arXiv 2411.02545) with LACE's edited images as I': each
edited image is a row whose positive is T', the real caption rewritten by the rule editor from what the edit did
(which concepts it exchanged or replaced), and whose hard negative is the real caption T (`lace.losses.pair_loss`).
A row whose caption cannot be written (the caption does not name the changed concepts exactly once) is skipped.
The caption comes from the edit, never from the renderer's scene, so an edit that did not really change what it
says it changed teaches a wrong pair: the rows' count and share are logged.

Every image-side source names its changes: the pooled editor's records (swap and transplant: source -> target;
rebind: the two attributes exchange; attenuate: nothing to write), LACE-local's slots (`EditSlots.changes`), the
rendered ceiling's colour swap, and the paired-caption directions, whose caption is the rule-made caption itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lace.distributed import DistributedContext
from lace.edits.captions import RuleNegatives
from lace.edits.records import EDIT_KINDS, EditRecords
from lace.losses import pair_loss
from lace.provenance import PREFERENCES, provenance_preferences
from lace.train.distributed import gather_with_grad

Changes = list[list["dict[str, str] | None"]]
"""Per row and slot, the concept names an edit changed, {source: target} (None: not describable)."""
Describe = Callable[[Changes], list[list["str | None"]]]
"""Changes of a micro-batch's rows -> the captions they describe (`describe_slots` bound to the batch)."""


@dataclass
class EditedImages:
    """One image-side source's edits as candidate rows: embeddings (B, M, d) unit with gradient, valid (B, M), and
    per row and slot the caption the edit describes (None where it cannot be written); counterparts (B, M, d): per
    slot the image that stands for the real one in the real-image negative (None: the real image itself;
    `lace.local.symmetric`)."""

    embeddings: Tensor
    valid: Tensor
    captions: list[list[str | None]]
    counterparts: Tensor | None = None


@dataclass
class PairRows:
    """The rows of the pairs term: images (B, P, d) edited images, captions (B, P, d) their described captions'
    embeddings (zeros where invalid), valid (B, P) bool; counterparts (B, P, d) the real image's stand-in per row
    where `has_counterpart` (B, P) (None: the real image everywhere)."""

    images: Tensor
    captions: Tensor
    valid: Tensor
    counterparts: Tensor | None = None
    has_counterpart: Tensor | None = None


def describe_slots(rules: RuleNegatives, captions: list[str], changes: Changes) -> list[list[str | None]]:
    """Per row b and slot m, the caption `captions[b]` rewritten with `changes[b][m]` (`RuleNegatives.describe`)."""
    if len(changes) != len(captions):
        raise ValueError(f"changes: expected one row per caption ({len(captions)}), got {len(changes)}")
    return [[rules.describe(caption, change) if change else None for change in row]
            for caption, row in zip(captions, changes)]


def record_changes(records: EditRecords, unit_names: list[str]) -> Changes:
    """The pooled editor's (B, M) records -> per row and slot, what each edit changed: swap and transplant
    {source: target}, rebind {a: b, b: a}, attenuate and empty slots None (an absence has no caption)."""
    rows = []
    for kinds, sources, targets in zip(records.kind.tolist(), records.source.tolist(), records.target.tolist()):
        row = []
        for kind, source, target in zip(kinds, sources, targets):
            name = EDIT_KINDS[kind] if kind >= 0 else None
            if name in ("swap", "transplant") and target >= 0:
                row.append({unit_names[source]: unit_names[target]})
            elif name == "rebind" and target >= 0:
                row.append({unit_names[source]: unit_names[target], unit_names[target]: unit_names[source]})
            else:
                row.append(None)
        rows.append(row)
    return rows


def pair_rows(edits: list[EditedImages], encode_texts: Callable[[list[str]], Tensor]) -> PairRows | None:
    """Every source's edits as one set of rows: slots side by side, valid where the edit is and its caption could
    be written; the described captions are encoded in one text pass (`encode_texts`: n texts -> (n, d) unit
    embeddings with gradient). None without any source."""
    if not edits:
        return None
    images = torch.cat([edit.embeddings for edit in edits], dim=1)  # (B, P, d)
    captions = [[text for edit in edits for text in edit.captions[b]] for b in range(images.shape[0])]
    written = torch.tensor([[text is not None for text in row] for row in captions], dtype=torch.bool)
    valid = torch.cat([edit.valid for edit in edits], dim=1).to(torch.bool) & written.to(images.device)
    embedded = images.new_zeros(images.shape)
    if valid.any():
        texts = [text for row, keep in zip(captions, valid.tolist()) for text, on in zip(row, keep) if on]
        embedded = embedded.index_put((valid,), encode_texts(texts).to(images.dtype))
    if all(edit.counterparts is None for edit in edits):
        return PairRows(images, embedded, valid)
    counterparts = torch.cat([edit.embeddings.new_zeros(edit.embeddings.shape) if edit.counterparts is None
                              else edit.counterparts for edit in edits], dim=1)
    has = torch.cat([torch.full(edit.valid.shape, edit.counterparts is not None, dtype=torch.bool,
                                device=images.device) for edit in edits], dim=1)
    return PairRows(images, embedded, valid, counterparts, has)


def pair_term(rows: PairRows, U: Tensor, V: Tensor, logit_scale: Tensor, logit_bias: Tensor | None,
              context: DistributedContext, real_image_negative: bool = False) -> Tensor:
    """`pair_loss` of this process's rows against every process's, exact under data parallelism: the divisor is
    the global batch's valid rows over the number of processes, so the mean of the processes' terms is the
    one-process term. U, V (B, d): the real images and captions; each row's real caption is its hard negative, and
    with `real_image_negative` its real image (or the row's counterpart of it, `PairRows.counterparts`) is the hard
    negative of its described caption."""
    images = rows.images.flatten(0, 1)  # (B P, d)
    captions = rows.captions.flatten(0, 1)
    valid = rows.valid.flatten()
    originals = V[:, None].expand(rows.images.shape).flatten(0, 1)
    real_images = None
    if real_image_negative:
        real_images = U[:, None].expand(rows.images.shape)
        if rows.counterparts is not None:
            real_images = torch.where(rows.has_counterpart[..., None], rows.counterparts.to(U.dtype), real_images)
        real_images = real_images.flatten(0, 1)
    gallery_images, offset = gather_with_grad(images, context)
    gallery_texts, _ = gather_with_grad(captions, context)
    gallery_valid, _ = gather_with_grad(valid.to(torch.long), context)
    gallery_valid = gallery_valid.to(torch.bool)
    total = gallery_valid.sum()
    if context.enabled:
        total = total / context.world_size
    return pair_loss(images, captions, originals, valid, logit_scale, logit_bias=logit_bias,
                     gallery_images=gallery_images, gallery_texts=gallery_texts, gallery_valid=gallery_valid,
                     row_offset=offset, rows=total.clamp_min(1), real_images=real_images)


PROVENANCE_FIGURES = (*PREFERENCES, "edit_cosine")


def provenance_sums(U: Tensor, V: Tensor, rows: PairRows) -> dict[str, float]:
    """The provenance figures (`lace.provenance`) of a micro-batch's rows with a describable edit, the first
    such slot of each, as sums over those rows (and their count "n"), so that windows and processes add up."""
    valid = rows.valid  # (B, P)
    first = valid.float().argmax(dim=1)  # (B,) the first valid slot (0 where none, masked below)
    picked = torch.arange(len(first), device=first.device)
    figures = provenance_preferences(U, V, rows.images[picked, first], rows.captions[picked, first], valid.any(dim=1))
    count = figures["n"]
    return {**{name: figures[name] * count if count else 0.0 for name in PROVENANCE_FIGURES}, "n": count}


__all__ = ["PROVENANCE_FIGURES", "EditedImages", "PairRows", "describe_slots", "pair_rows", "pair_term",
           "provenance_sums", "record_changes"]
