"""LACE-local's image edits: binding swaps and transplants made inside the image tower (`lace.local`), text->image
negatives (`local_image_negatives`; `lace.train.local_arm`).

Pixels: the editor is fitted on the first `local.fit_images` training images before the first step (unless one is
passed in), runs as the encoder's image pass, and is kept up with the tower (`LocalEditorUpkeep`: refits, fidelity,
its state in checkpoints). Tower tops: a `lace.local.maps.MapEditor` passed in edits the cached maps, and the
trainable top runs on the edited maps (the maps below the cut are frozen: no refits); with `local.symmetric` its
counterparts are made from the same maps in the same pass of the top (`MapImagePass`), and checkpoints hold the
map editor (its operator, the learnt one included), which a resumed run edits with.
"""

from __future__ import annotations

from typing import Any

import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.errors import LaceInputError
from lace.local import build_local_editor
from lace.local.config import CACHED_TOPS_SERVE
from lace.local.learnt import LearntRecolour
from lace.local.maps import MapEditor
from lace.local.symmetric import build_shade_regression
from lace.train.data import LOCAL_STREAM
from lace.train.local_arm import LocalImagePass, MapImagePass, map_negatives
from lace.train.local_refresh import LocalEditorUpkeep, fidelity_probe
from lace.train.negatives import Negatives
from lace.train.paths.base import EmbedPath, MicroBatch, Run
from lace.train.sources.base import NegativeSource


class LocalImageEdits(NegativeSource):
    name = "local image edits"
    switch = "local_image_negatives"
    paths = ("pixels", "tops")

    @classmethod
    def check(cls, run: Run, path: EmbedPath, given: dict[str, Any]) -> None:
        if path.name != "tops":
            return
        if given.get("local_editor") is None:
            raise LaceInputError(f"{path.where}: field 'local_image_negatives': expected a fitted "
                                 "lace.local.maps.MapEditor passed in as local_editor (the maps' objects are found on "
                                 "the cached maps)")
        local = run.config.negatives.local
        kinds = ("none", *CACHED_TOPS_SERVE["symmetric"])
        if local.symmetric not in kinds:
            raise LaceInputError(f"{path.where}: field 'local.symmetric': expected {', '.join(kinds[:-1])} or "
                                 f"{kinds[-1]} on cached tower tops (the nuisance shade is a recolouring fitted on "
                                 "pixels to the shapes world's palette, lace.local.build.recolour_prototypes; "
                                 "photographs' colour words have no such palette, and their commonest colours, black, "
                                 "white and gray, no lighter shade a grey-preserving colour map can make)")
        learnt = isinstance(getattr(given["local_editor"], "operator", None), LearntRecolour)
        if (local.operator == "learnt") != learnt:
            expected = ("a MapEditor fitted with the learnt operator (fit_map_editor(..., operator_fit="
                        "lace.local.cut_recolour.fit_cut_operator)) passed in as local_editor" if not learnt else
                        "learnt for the MapEditor passed in, whose operator is the learnt recolouring")
            raise LaceInputError(f"{path.where}: field 'local.operator': expected {expected} (got {local.operator!r})")
        upkeep = [f"local.{name}" for name in ("refresh_every", "fidelity_every") if getattr(local, name)]
        if upkeep:
            raise LaceInputError(f"{path.where}: fields {upkeep}: expected 0 (the maps below the cut are frozen, so a "
                                 "refit of the reader and operator, learnt or not, would give the same MapEditor; the "
                                 "fidelity needs the pixels)")

    def __init__(self, run: Run, path: EmbedPath, given: dict[str, Any]):
        super().__init__(run, path, given)
        self.editor = given.get("local_editor")
        if self.editor is None:
            self.editor = self._fit()
        self.shade = self._fit_shade() if path.name == "pixels" else None  # the nuisance counterparts' regression
        self.upkeep = None  # refits and fidelity of the editor (pixels only: the cached maps are frozen)
        if path.name == "pixels":
            self.upkeep = LocalEditorUpkeep(self.config.negatives.local, self._fit,
                                            fidelity_probe(self.config, run.encoder, run.context.is_main))
        self.image_pass_made: LocalImagePass | None = None

    def _fit(self):
        """An editor fitted on the first training images through the tower as it is; the run's random stream is
        left as it was."""
        config, encoder = self.config, self.run.encoder
        pixels, captions = self.path.first_images(config.negatives.local.fit_images)
        normalise = encoder.preprocess.transforms[-1]
        with torch.random.fork_rng(devices=[]):
            return build_local_editor(config.negatives.local, encoder.model, pixels.to(self.run.device), captions, normalise,
                                      load_vocabulary(config.run.vocabulary), seed=config.run.seed)

    def _fit_shade(self):
        """`local.symmetric` nuisance's shade regression (None for the other kinds), fitted with the editor's reader
        on the editor's training images; the run's random stream is left as it was."""
        config, encoder = self.config, self.run.encoder
        if config.negatives.local.symmetric != "nuisance":
            return None
        pixels, _ = self.path.first_images(config.negatives.local.fit_images)
        with torch.random.fork_rng(devices=[]):
            return build_shade_regression(config.negatives.local, self.editor, encoder.model, pixels.to(self.run.device),
                                          encoder.preprocess.transforms[-1], load_vocabulary(config.run.vocabulary))

    def image_pass(self, micro: MicroBatch) -> LocalImagePass | MapImagePass | None:
        # U and the local negatives come from one pass of the image tower (with local.symmetric, U is the real
        # images' stand-ins and each edit's counterpart is made in the same pass); on tower tops only with
        # local.symmetric (without it the top runs on the valid edits alone, after the path's pass)
        local = self.config.negatives.local
        seeds = micro.row_seeds(self.config.run.seed, LOCAL_STREAM)
        if self.path.name == "tops":
            top = self.run.encoder
            self.image_pass_made = None if local.symmetric == "none" else MapImagePass(
                top.encode_image_states, top.embed_dim, self.editor, local.n_edits, seeds, local.symmetric)
            return self.image_pass_made
        self.image_pass_made = LocalImagePass(self.editor, self.run.encoder.model, local.n_edits,
                                              seeds, local.edit_share, local.symmetric, self.shade)
        return self.image_pass_made

    def embed(self, micro: MicroBatch) -> None:
        if self.image_pass_made is not None:
            made = self.image_pass_made
            counterparts = None if made.counterparts is None else made.counterparts.float()
            self.edits = (made.negatives.float(), made.valid, made.changes, counterparts)
        else:
            top = self.run.encoder
            local = self.config.negatives.local
            self.edits = (*map_negatives(top.encode_image_states, top.embed_dim, self.editor, micro.maps,
                                         local.n_edits, micro.row_seeds(self.config.run.seed, LOCAL_STREAM),
                                         local.edit_share), None)

    def negatives(self, micro: MicroBatch, negatives: Negatives) -> None:
        embeddings, valid, changes, counterparts = self.edits
        negatives.add_image_edits(embeddings, valid, self.config.arm.edited_image_columns,
                                  self.describe_edits(micro, lambda: changes), counterparts)

    def after_step(self, step: int) -> bool:
        """Refit the editor when due (`LocalEditorUpkeep`); True when the step's fidelity is due."""
        if self.upkeep is None:
            return False
        self.editor, fidelity_due = self.upkeep.after_step(step, self.editor)
        return fidelity_due

    def metrics(self) -> dict[str, float]:
        return self.upkeep.metrics() if self.upkeep is not None else {}

    def state(self) -> dict:
        if self.upkeep is not None:
            return {"local_editor": self.upkeep.state(self.editor)}
        return {"local_map_editor": self.editor.state_dict()}  # tower tops: the map editor the run edits with

    def restore(self, state: dict) -> None:
        if self.upkeep is not None:  # the editor in use at the checkpoint, refitted since or not
            self.editor = self.upkeep.restore(state.get("local_editor"), self.editor)
        elif state.get("local_map_editor"):  # a checkpoint written before tops saved theirs keeps the one passed in
            self.editor = MapEditor.from_state(state["local_map_editor"])
