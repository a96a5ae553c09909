"""LACE-local in training: negatives made inside the towers (`lace.local`), drawn per sample.

The image editor is fitted before the first step, on the first `local.fit_images` training
images and their captions (`lace.local.build_local_editor`; the reader finds objects from the features,
the renderer is never asked), and refitted every `local.refresh_every` steps (`lace.train.local_refresh`). Its random choices (which absent concept a transplant brings) are drawn
per sample from (seed, epoch, image) (`RowGenerators`), so one process and several draw the same
negatives for the same rows. On cached tower-top inputs the editor acts on the cached maps themselves
(`lace.local.maps.MapEditor`) and the trainable top runs on the edited maps.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lace.concepts.vocabulary import Vocabulary
from lace.local.editor import LocalImageEditor, slot_changes
from lace.local.maps import MapEditor
from lace.local.recolour import RecolourRegression
from lace.local.symmetric import real_stand_ins, symmetric_negatives
from lace.local.text import caption_swap_negatives, single_token_ids
from lace.row_random import RowGenerators
from lace.train.pairs import Changes


class LocalImagePass:
    """The image pass of a LACE-local training step, run as the encoder's `encode_images`: (B, 3, H, W) model-input
    pixels -> U (B, d), the unedited embeddings of the editor's one pass through the tower; that pass's edited
    images are kept as `negatives` (B, M, d) unit, with gradient, and `valid` (B, M), and what each slot changed
    as `changes` (`lace.train.pairs.Changes`).

    seeds: one per row (`row_seeds`), which draw each row's transplant targets.
    edit_share: the share of the B rows edited, the first ceil(share B) (`LocalEditConfig.edit_share`); the others
    have no valid slot (zero embeddings, None changes) and cost no editing, upper layers or described captions.
    symmetric: a kind of `lace.local.symmetric` ("none": the real images): each slot's counterpart of the real image,
    made in the same pass, is kept as `counterparts` (B, M, d), and U is each row's stand-in (`real_stand_ins`)
    instead of the real image (every row edited); shade: the nuisance regression that kind needs.
    """

    def __init__(self, editor: LocalImageEditor, clip: torch.nn.Module, n_edits: int, seeds: list[int],
                 edit_share: float = 1.0, symmetric: str = "none", shade: RecolourRegression | None = None):
        self.editor, self.clip, self.n_edits, self.seeds = editor, clip, n_edits, seeds
        self.rows = edited_rows(len(seeds), edit_share)
        self.symmetric, self.shade = symmetric, shade
        self.negatives: Tensor | None = None
        self.valid: Tensor | None = None
        self.changes: Changes | None = None
        self.counterparts: Tensor | None = None

    def __call__(self, pixels: Tensor) -> Tensor:
        if self.symmetric != "none":
            return self._symmetric(pixels)
        rows = self.rows
        made = self.editor.negatives(self.clip, pixels, self.n_edits, generator=RowGenerators(self.seeds[:rows]),
                                     rows=rows if rows < len(self.seeds) else None)
        changes = slot_changes(made.kinds, made.changes, self.editor.concept_names)
        self.negatives, self.valid, self.changes = unedited_rows_added(made.embeddings, made.valid.to(pixels.device),
                                                                       changes, len(self.seeds))
        return made.original

    def _symmetric(self, pixels: Tensor) -> Tensor:
        """Every row's edits and their counterparts in one pass; U is the rows' stand-ins."""
        both = symmetric_negatives(self.editor, self.clip, pixels, self.n_edits, self.symmetric, self.shade,
                                   RowGenerators(self.seeds))
        made, self.counterparts = both.negatives, both.counterparts
        self.negatives, self.valid = made.embeddings, made.valid.to(pixels.device)
        self.changes = slot_changes(made.kinds, made.changes, self.editor.concept_names)
        return real_stand_ins(made.original, self.counterparts, self.valid)


def edited_rows(batch: int, edit_share: float) -> int:
    """How many of a micro-batch's `batch` rows LACE-local edits: ceil(share B), at least one."""
    return max(1, min(batch, math.ceil(edit_share * batch - 1e-9)))


def unedited_rows_added(embeddings: Tensor, valid: Tensor, changes: Changes,
                        batch: int) -> tuple[Tensor, Tensor, Changes]:
    """The edits of the first R rows, (R, M, d), (R, M) and R rows of changes, as B rows: the rows after them have
    zero embeddings, no valid slot and None changes (nothing to describe). Returned as they are when R = B."""
    count, n_edits = valid.shape
    if count == batch:
        return embeddings, valid, changes
    missing = batch - count
    embeddings = torch.cat([embeddings, embeddings.new_zeros(missing, *embeddings.shape[1:])])
    valid = torch.cat([valid, valid.new_zeros(missing, n_edits)])
    return embeddings, valid, changes + [[None] * n_edits for _ in range(missing)]


def map_negatives(encode_maps, embed_dim: int, editor: MapEditor, maps: Tensor, n_edits: int,
                  seeds: list[int], edit_share: float = 1.0) -> tuple[Tensor, Tensor, Changes]:
    """LACE-local on cached maps: (B, C, H, W) maps entering the trainable image top -> (B, M, d) unit embeddings
    of their local edits through `encode_maps` (with gradient; zeros where the edit is not valid, which the
    loss masks), (B, M) valid, and what each slot changed (`lace.train.pairs.Changes`). seeds: one per row, and
    edit_share, as `LocalImagePass` takes them."""
    rows = edited_rows(len(seeds), edit_share)
    edits = editor.edit(maps[:rows], n_edits, generator=RowGenerators(seeds[:rows]))
    valid = edits.valid.to(maps.device)
    embeddings = maps.new_zeros(*valid.shape, embed_dim)
    if valid.any():
        embeddings = embeddings.index_put((valid,), encode_maps(edits.maps[edits.valid]))
    return unedited_rows_added(embeddings, valid, slot_changes(edits.kinds, edits.changes, editor.concept_names),
                               len(seeds))


class MapImagePass:
    """The image pass of a LACE-local step on cached tower-top maps with artefact-symmetric counterparts
    (`lace.local.symmetric`), run as the top's `encode_image_states`: (B, C, H, W) maps -> U (B, d), each row's
    stand-in (`real_stand_ins`: the counterpart of its first valid slot, the real map where none is valid).

    The maps are edited once (`MapEditor.edit(..., symmetric=kind)`) and the trainable top runs once on the B real
    maps, the valid edits and their counterparts together, so edit and counterpart share the cut, the operator, the
    objects and the upper pass. Kept: `negatives` (B, M, d) unit (zeros where not valid), `valid` (B, M),
    `changes` (`lace.train.pairs.Changes`) and `counterparts` (B, M, d) unit (zeros where not valid).

    encode_maps: the top's (n, C, H, W) -> (n, d); seeds: one per row, as `LocalImagePass` takes them.
    """

    def __init__(self, encode_maps, embed_dim: int, editor: MapEditor, n_edits: int, seeds: list[int],
                 symmetric: str):
        self.encode_maps, self.embed_dim, self.editor = encode_maps, embed_dim, editor
        self.n_edits, self.seeds, self.symmetric = n_edits, seeds, symmetric
        self.negatives: Tensor | None = None
        self.valid: Tensor | None = None
        self.changes: Changes | None = None
        self.counterparts: Tensor | None = None

    def __call__(self, maps: Tensor) -> Tensor:
        edits = self.editor.edit(maps, self.n_edits, generator=RowGenerators(self.seeds), symmetric=self.symmetric)
        valid = edits.valid.to(maps.device)
        batch, count = maps.shape[0], int(valid.sum())
        embedded = self.encode_maps(torch.cat([maps, edits.maps[valid].to(maps.dtype),
                                               edits.counterparts[valid].to(maps.dtype)]))  # (B + 2 count, d)
        empty = embedded.new_zeros(*valid.shape, self.embed_dim)
        self.negatives = empty.index_put((valid,), embedded[batch:batch + count])
        self.counterparts = empty.index_put((valid,), embedded[batch + count:])
        self.valid = valid
        self.changes = slot_changes(edits.kinds, edits.changes, self.editor.concept_names)
        return real_stand_ins(embedded[:batch], self.counterparts, valid)


def group_token_ids(tokenize, vocabulary: Vocabulary, group: str) -> Tensor:
    """(G,) token ids of the group's concept names (-1 for names the tokenizer splits)."""
    return single_token_ids(tokenize, list(vocabulary.groups().get(group, [])))


def local_caption_negatives(clip: torch.nn.Module, tokens: Tensor, concept_ids: Tensor,
                            layer: str) -> tuple[Tensor, Tensor]:
    """(B, T) caption tokens -> (B, 1, d) caption-side binding swaps at `layer` and (B, 1) validity."""
    return caption_swap_negatives(clip, tokens, concept_ids, layer)
