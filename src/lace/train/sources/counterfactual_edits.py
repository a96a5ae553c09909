"""LACE's counterfactual edits: M edits of each caption embedding (image->text columns) and of each image
embedding (an image-side source), made by the pooled `CounterfactualEditor` from the frozen dictionary.

Each row draws its edits from its own generator, seeded by (seed, epoch, image): a row gets the same edits whatever
other rows share its batch, so W processes draw what one process draws. With `refresh_dictionary_every`, every
process pools the whole global batch's embeddings, in global order, and the dictionary is refitted on the pool
every R steps (`lace.train.editor.refresh_editor`); a checkpoint keeps the pool and the refit's embeddings.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import Tensor

from lace.row_random import RowGenerators
from lace.train.data import EDIT_STREAM
from lace.train.editor import refresh_editor, run_editor
from lace.train.negatives import Negatives, check_editor_dimension, counterfactual_negatives
from lace.train.pairs import record_changes
from lace.train.paths.base import EmbedPath, MicroBatch, Run
from lace.train.sources.base import NegativeSource


class CounterfactualEdits(NegativeSource):
    name = "counterfactual edits"
    switch = "counterfactual_captions"

    @classmethod
    def switched_on(cls, config) -> bool:
        return config.arm.uses_counterfactuals or super().switched_on(config)

    def __init__(self, run: Run, path: EmbedPath, given: dict[str, Any]):
        super().__init__(run, path, given)
        editor = given.get("editor")
        self.editor = editor if editor is not None else run_editor(self.config, run.encoder)
        check_editor_dimension(self.editor, run.encoder.embed_dim, self.config.run.dictionary or "editor")
        self.refresh_every = self.config.negatives.refresh_dictionary_every
        self.pool_images: deque[Tensor] = deque()
        self.pool_texts: deque[Tensor] = deque()
        self.refit_images: Tensor | None = None
        self.refit_texts: Tensor | None = None

    def negatives(self, micro: MicroBatch, negatives: Negatives) -> None:
        config = self.config
        generators = RowGenerators(micro.row_seeds(config.run.seed, EDIT_STREAM))  # CPU: tiny draws per row
        made = counterfactual_negatives(self.editor, micro.U, micro.V, config.negatives.edit.n_edits,
                                        config.arm.counterfactual_captions, config.arm.counterfactual_images,
                                        config.arm.counterfactual_source, generators)
        if made.caption_negatives is not None:
            negatives.add_captions(made.caption_negatives, made.caption_valid)
        if made.image_negatives is not None:
            records, editor = made.image_records, self.editor  # unit names read only when the edits are described
            negatives.add_image_edits(made.image_negatives, made.image_valid, config.arm.edited_image_columns,
                                      self.describe_edits(micro, lambda: record_changes(records, editor.unit_names)))

    def seen(self, gallery_images: Tensor, gallery_texts: Tensor) -> None:
        # the whole global batch in its global order: the refit sees the rows one process would
        if self.refresh_every:
            self.pool_images.append(gallery_images)
            self.pool_texts.append(gallery_texts)
            _trim(self.pool_images, self.config.negatives.refresh_pool_size)
            _trim(self.pool_texts, self.config.negatives.refresh_pool_size)

    def after_step(self, step: int) -> bool:
        if self.refresh_every and step % self.refresh_every == 0:
            self.refit_images = torch.cat(list(self.pool_images)).cpu()
            self.refit_texts = torch.cat(list(self.pool_texts)).cpu()
            self.editor = refresh_editor(self.editor, self.refit_images, self.refit_texts)
            check_editor_dimension(self.editor, self.run.encoder.embed_dim, "refreshed dictionary")
        return False

    def state(self) -> dict[str, Tensor]:
        empty = torch.zeros(0)
        return {
            "pool_images": torch.cat(list(self.pool_images)).cpu() if self.pool_images else empty,
            "pool_texts": torch.cat(list(self.pool_texts)).cpu() if self.pool_texts else empty,
            # the pool's micro-batches, so that a resumed run trims it as the uninterrupted run does
            "pool_sizes": torch.tensor([t.shape[0] for t in self.pool_images], dtype=torch.long),
            "refit_images": self.refit_images if self.refit_images is not None else empty,
            "refit_texts": self.refit_texts if self.refit_texts is not None else empty,
        }

    def restore(self, state: dict) -> None:
        device = self.run.device
        if state.get("pool_images") is not None and state["pool_images"].numel():
            sizes = state["pool_sizes"].tolist() if "pool_sizes" in state else [state["pool_images"].shape[0]]
            self.pool_images.extend(state["pool_images"].to(device).split(sizes))
            self.pool_texts.extend(state["pool_texts"].to(device).split(sizes))
        if state.get("refit_images") is not None and state["refit_images"].numel():
            # Refitting on the saved pool rebuilds the dictionary the run was using.
            self.refit_images, self.refit_texts = state["refit_images"], state["refit_texts"]
            self.editor = refresh_editor(self.editor, self.refit_images, self.refit_texts)


def _trim(pool: deque, size: int) -> None:
    while sum(t.shape[0] for t in pool) - pool[0].shape[0] >= size:
        pool.popleft()
