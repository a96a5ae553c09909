"""Extra negatives of one training batch, as the sources (`lace.train.sources`) add them, and the kernels they use:
counterfactual embeddings, rule-made captions and paired-caption directions.

Counterfactuals come from a `CounterfactualEditor` (`lace.edits`): codes are computed
without gradient with the frozen dictionary, the edit step is a constant, and the
rebuilt negative keeps its gradient through the embedding it was made from.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from lace.edits.captions import RuleNegatives
from lace.edits.records import EditRecords
from lace.errors import LaceInputError
from lace.train.pairs import EditedImages


@dataclass
class Negatives:
    """caption_* extend image->text rows, image_* text->image rows; (B, M, d) and (B, M).

    image_records: the pooled editor's records of image_negatives (`counterfactual_negatives`); edited: the
    image-side edits the pairs layout makes rows of (`lace.train.pairs`), with the captions they describe.
    """

    caption_negatives: Tensor | None = None
    caption_valid: Tensor | None = None
    image_negatives: Tensor | None = None
    image_valid: Tensor | None = None
    image_records: EditRecords | None = None
    edited: list[EditedImages] = field(default_factory=list)
    rule_collisions: int = 0
    """Rows whose edit's described caption is also one of the row's rule-made caption negatives: one text both
    pushed from the real image and pulled to its edit."""

    def add_captions(self, negatives: Tensor, valid: Tensor) -> None:
        if self.caption_negatives is None:
            self.caption_negatives, self.caption_valid = negatives, valid
        else:
            self.caption_negatives = torch.cat([self.caption_negatives, negatives], dim=1)
            self.caption_valid = torch.cat([self.caption_valid, valid], dim=1)

    def add_images(self, negatives: Tensor, valid: Tensor) -> None:
        if self.image_negatives is None:
            self.image_negatives, self.image_valid = negatives, valid
        else:
            self.image_negatives = torch.cat([self.image_negatives, negatives], dim=1)
            self.image_valid = torch.cat([self.image_valid, valid], dim=1)

    def add_image_edits(self, embeddings: Tensor, valid: Tensor, columns: bool,
                        captions: Callable[[], list[list[str | None]]] | None,
                        counterparts: Tensor | None = None) -> None:
        """One image-side source's (B, M, d) edits and (B, M) validity: text->image columns of the real caption
        (`columns`, `edited_image_columns`) and, when the micro-batch writes the captions of its edits (`captions`:
        their per row and slot texts), candidate rows of their own (`edited`: the pairs layout, provenance), with
        the (B, M, d) stand-ins of the real image per slot where the source makes them (`lace.local.symmetric`)."""
        if columns:
            self.add_images(embeddings, valid)
        if captions is not None:
            self.edited.append(EditedImages(embeddings, valid, captions(), counterparts))


def rule_collisions(edited: list[EditedImages], rule_strings: list[list[str]]) -> int:
    """How many rows have a valid edit whose described caption is one of the row's rule-made negatives."""
    count = 0
    for b, rules in enumerate(rule_strings):
        described = {text for edit in edited for text, ok in zip(edit.captions[b], edit.valid[b].tolist())
                     if ok and text is not None}
        count += bool(described & set(rules))
    return count


def valid_rows(valid: Tensor | None) -> Tensor | float:
    """How many rows of a (B, M) validity have at least one valid slot (0 for None)."""
    return valid.any(dim=1).sum() if valid is not None else 0.0


def dictionary_dim(editor) -> int | None:
    """Dimension of the atoms of the editor's dictionary, when it exposes one."""
    dictionary = getattr(editor, "dictionary", None)
    for name in ("atoms_", "components_"):
        atoms = getattr(dictionary, name, None)
        if atoms is not None:
            return int(atoms.shape[1])
    return None


def check_editor_dimension(editor, embed_dim: int, where: str) -> None:
    """Refuse a dictionary whose atoms do not live in the encoder's space (before any step)."""
    dim = dictionary_dim(editor)
    if dim is not None and dim != embed_dim:
        raise LaceInputError(
            f"{where}: dictionary atoms have dimension {dim}, but the model embeds in dimension {embed_dim}; "
            "fit the dictionary on embeddings of this model (lace dictionary)"
        )


def counterfactual_negatives(
    editor, U: Tensor, V: Tensor, n_edits: int, captions: bool = True, images: bool = True,
    source: str = "dictionary", generator: torch.Generator | None = None,
) -> Negatives:
    """Counterfactual negatives of a batch: edits of V[i] for row i (captions), of U[j] for row j (images).

    U, V: (B, d) unit embeddings with gradient; source: "dictionary" (LACE's edits of sparse codes) or
    "concept_arithmetic" (the same edits along plain concept directions); generator: the draws of the
    edits (None: the global generator). Runs in float32 outside autocast, since
    sparse coding in bf16 would pick different atoms.
    """
    make = editor.counterfactuals if source == "dictionary" else editor.concept_arithmetic
    negatives = Negatives()
    with torch.autocast(U.device.type, enabled=False):
        if captions:
            edited = make(V.float(), "text", n_edits, generator=generator)
            negatives.caption_negatives, negatives.caption_valid = edited.embeddings, edited.valid
        if images:
            edited = make(U.float(), "image", n_edits, generator=generator)
            negatives.image_negatives, negatives.image_valid = edited.embeddings, edited.valid
            negatives.image_records = edited.records
    return negatives


def paired_caption_directions(U: Tensor, V: Tensor, rule_texts: Tensor) -> Tensor:
    """AHNPL-style image-side negatives: normalise(u_i + v(t'_ir) - v(t_i)), (B, R, d).

    U, V: (B, d) unit embeddings of images and their captions; rule_texts (B, R, d) unit embeddings of
    each caption's rule-made negatives. The caption's change, moved onto its image; gradient through all three.
    """
    return F.normalize(U[:, None] + rule_texts - V[:, None], dim=-1)


def rule_made_captions(
    rules: RuleNegatives, captions: list[str], keys: list[tuple[int, int, int]], per_caption: int
) -> tuple[list[str], Tensor]:
    """`per_caption` rule-made negatives per caption, drawn per sample (key = seed, epoch, image).

    Returns B * per_caption texts (a caption with no applicable rule repeats itself
    there and is marked invalid) and a (B, per_caption) validity mask. Seeding per sample
    makes the negatives independent of how the batch is split over processes.
    """
    texts, valid = [], []
    for caption, key in zip(captions, keys):
        rng = random.Random("-".join(map(str, key)))
        for _ in range(per_caption):
            made = rules.make(caption, None, rng)
            texts.append(made if made is not None else caption)
            valid.append(made is not None)
    return texts, torch.tensor(valid, dtype=torch.bool).view(len(captions), per_caption)
