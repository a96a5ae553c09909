"""Brittleness: how often changing one thing in a caption makes it score above the truth.

Counted over (image, caption, single edit) triples: the caption is a true caption of
the image, the edit changes one attribute, object or relation. Two sources of edits:
rule-made text edits (`lace.edits.captions`), encoded as real captions, and
counterfactual caption embeddings from a `CounterfactualEditor`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch

from lace.embeddings import embed_texts
from lace.encoders.base import DualEncoder


def brittleness_rate(
    image_embeddings: torch.Tensor, caption_embeddings: torch.Tensor,
    edited_embeddings: torch.Tensor, valid: torch.Tensor | None = None,
) -> float:
    """Share of valid (image, caption, edit) triples where the edited caption scores above the caption.

    Args:
        image_embeddings: (B, d) the image of each caption.
        caption_embeddings: (B, d) its true caption.
        edited_embeddings: (B, M, d) M single edits of each caption.
        valid: (B, M) bool, which edits exist (default: all).
    """
    image_embeddings, caption_embeddings = torch.as_tensor(image_embeddings).float(), torch.as_tensor(caption_embeddings).float()
    edited_embeddings = torch.as_tensor(edited_embeddings).float()
    true_scores = (image_embeddings * caption_embeddings).sum(-1)  # (B,)
    edited_scores = torch.einsum("bd,bmd->bm", image_embeddings, edited_embeddings)  # (B, M)
    valid = torch.ones_like(edited_scores, dtype=torch.bool) if valid is None else torch.as_tensor(valid).bool()
    if not valid.any():
        return float("nan")
    return float((edited_scores > true_scores[:, None])[valid].float().mean())


RULE_EDIT_SETS = 8
"""Edit sets kept per process by `rule_edits`."""
_rule_edit_sets: dict[tuple, tuple[list[str], list[tuple[int, str]]]] = {}


def rule_edits(rule_negatives, captions: tuple[str, ...], kinds: tuple[str, ...], max_captions: int,
               seed: int) -> tuple[list[str], list[tuple[int, str]]]:
    """The edited captions and their (caption row, kind) of `rule_edit_brittleness`: one edit per caption and kind
    where it applies, from a `random.Random(seed)`, over at most `max_captions` captions (a seeded draw).

    They depend only on the arguments, so they are made once per process when `rule_negatives` says what it
    depends on (`RuleNegatives.key`): every model evaluated on the same captions is measured on the same edits,
    and processes forked later inherit them.
    """
    key = (getattr(rule_negatives, "key", None), captions, kinds, max_captions, seed)
    if key[0] is not None and key in _rule_edit_sets:
        return _rule_edit_sets[key]
    rng = random.Random(seed)
    rows = list(range(len(captions)))
    if len(rows) > max_captions:
        rows = sorted(rng.sample(rows, max_captions))
    edited_texts, triples = [], []  # triples: (caption row, kind)
    for row in rows:
        for kind in kinds:
            negative = rule_negatives.make(captions[row], kind, rng)
            if negative is not None and negative != captions[row]:
                edited_texts.append(negative)
                triples.append((row, kind))
    made = edited_texts, triples
    if key[0] is not None:
        if len(_rule_edit_sets) >= RULE_EDIT_SETS:
            del _rule_edit_sets[next(iter(_rule_edit_sets))]
        _rule_edit_sets[key] = made
    return made


def rule_edit_brittleness(
    encoder: DualEncoder,
    image_embeddings: np.ndarray | torch.Tensor,
    captions: Sequence[str],
    text_embeddings: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
    rule_negatives,
    kinds: Sequence[str] | None = None,
    max_captions: int = 5000,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Brittleness under rule-made edits, overall and per edit kind.

    `rule_negatives` is a `lace.edits.captions.RuleNegatives`; for every kind, one
    edit per caption (where the kind applies) is drawn with a seeded rng and encoded as a
    caption. At most `max_captions` captions (seeded draw) are used.

    Returns `rule/<kind>` rates, `rule/all` over all triples and `rule/n_triples`.
    """
    kinds = tuple(kinds if kinds is not None else rule_negatives.kinds)
    edited_texts, triples = rule_edits(rule_negatives, tuple(captions), kinds, max_captions, seed)
    figures: dict[str, float] = {"rule/n_triples": float(len(triples))}
    if not triples:
        return figures
    edited = torch.from_numpy(embed_texts(encoder, edited_texts, progress=progress))  # (n, d)
    caption_rows = torch.tensor([row for row, _ in triples])
    owner = torch.as_tensor(np.asarray(text_image_index, dtype=np.int64))[caption_rows]
    images = torch.as_tensor(np.asarray(image_embeddings)).float()[owner]
    texts = torch.as_tensor(np.asarray(text_embeddings)).float()[caption_rows]
    wins = (images * edited).sum(-1) > (images * texts).sum(-1)  # (n,)
    labels = np.array([kind for _, kind in triples])
    figures["rule/all"] = float(wins.float().mean())
    for kind in kinds:
        mask = torch.from_numpy(labels == kind)
        if mask.any():
            figures[f"rule/{kind}"] = float(wins[mask].float().mean())
    return figures


@torch.no_grad()
def counterfactual_brittleness(
    editor,
    image_embeddings: np.ndarray | torch.Tensor,
    text_embeddings: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
    n_edits: int = 4,
    batch_size: int = 1024,
) -> dict[str, float]:
    """Brittleness under counterfactual caption embeddings from `editor.counterfactuals(z, "text", n_edits)`.

    Returns `counterfactual/all` (over valid edits) and `counterfactual/n_triples`.
    """
    images = torch.as_tensor(np.asarray(image_embeddings)).float()
    texts = torch.as_tensor(np.asarray(text_embeddings)).float()
    owner = torch.as_tensor(np.asarray(text_image_index, dtype=np.int64))
    wins, total = 0.0, 0
    for start in range(0, texts.shape[0], batch_size):
        batch = texts[start: start + batch_size]  # (B, d)
        counterfactuals = editor.counterfactuals(batch, "text", n_edits)
        edited = counterfactuals.embeddings.float().cpu()  # (B, M, d)
        valid = counterfactuals.valid.cpu()  # (B, M)
        n_valid = int(valid.sum())
        if n_valid:
            wins += brittleness_rate(images[owner[start: start + batch_size]], batch, edited, valid) * n_valid
            total += n_valid
    return {"counterfactual/all": wins / total if total else float("nan"), "counterfactual/n_triples": float(total)}
