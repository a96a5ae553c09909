"""What a negative source is: the interface every module of `lace.train.sources` implements.

A source is switched on by its config field (`switch`, or its registry name in `TrainConfig.sources`), says which
embed paths it supports (`paths`), refuses a run it cannot serve (`check`), and per micro-batch may add texts to the
pixels path's text pass or run its image pass, then `embed` what it needs through the model and add its `negatives`
(caption columns, image-side edits) in registry order. It may add a term to the loss, sees every process's
embeddings, keeps itself up to date after each optimiser step, and gives its state to each checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from torch import Tensor

from lace.train.config import TrainConfig
from lace.train.negatives import Negatives
from lace.train.paths.base import EmbedPath, MicroBatch, Run


class NegativeSource:
    """One kind of extra negative. Subclasses set `name`, `switch` and `paths`, and override the hooks they use."""

    name: ClassVar[str]
    """Its key in `lace.train.sources.SOURCES`."""
    switch: ClassVar[str | None] = None
    """The field of the arm (`TrainConfig.arm`) that switches it on (None: only by name, in `arm.sources`)."""
    paths: ClassVar[tuple[str, ...]] = ("pixels", "features", "tops")
    """The embed paths (`EmbedPath.name`) it makes negatives on."""
    needs: ClassVar[tuple[str, ...]] = ()
    """Other sources (by name) whose per-batch results it reads; they are switched on whenever it is."""
    order: ClassVar[int] = 0
    """Sources run by (order, registry position): one that reads the others' negatives comes after them."""

    @classmethod
    def switched_on(cls, config: TrainConfig) -> bool:
        """Whether the arm of `config` asks for this source."""
        return bool(cls.switch and getattr(config.arm, cls.switch, False)) or cls.name in config.arm.sources

    @classmethod
    def wanted(cls, config: TrainConfig, path: EmbedPath) -> bool:
        """Whether the run builds it (by default: when switched on)."""
        return cls.switched_on(config)

    @classmethod
    def check(cls, run: Run, path: EmbedPath, given: dict[str, Any]) -> None:
        """Refuse (`LaceInputError`) a run it cannot serve, before anything is built; given: what `train()` was
        passed (editor, local_editor, rendered)."""

    def __init__(self, run: Run, path: EmbedPath, given: dict[str, Any]):
        self.run, self.path, self.config = run, path, run.config

    # ---- per micro-batch, in this order ---------------------------------------------------

    def begin(self, micro: MicroBatch) -> None:
        """Before the model runs."""

    def pass_texts(self, micro: MicroBatch) -> list[str] | None:
        """Texts to encode in the pixels path's one text pass (read back from `micro.pass_texts[self.name]`)."""
        return None

    def image_pass(self, micro: MicroBatch) -> Callable[[Tensor], Tensor] | None:
        """A replacement for the encoder's `encode_images` in the pixels path's pass (one source at most)."""
        return None

    def embed(self, micro: MicroBatch) -> None:
        """After the path's pass: run what this source needs through the model (in registry order)."""

    def negatives(self, micro: MicroBatch, negatives: Negatives) -> None:
        """Add this source's negatives (`Negatives.add_captions`, `Negatives.add_image_edits`)."""

    def loss_term(self, micro: MicroBatch, negatives: Negatives) -> tuple[Tensor | None, dict[str, Any]]:
        """A term added to the micro-batch's loss (None: none) and the figures it adds to the step's stats, by
        name (`lace.train.metrics.MetricWindow`: one of `WINDOW_SUMS`)."""
        return None, {}

    def seen(self, gallery_images: Tensor, gallery_texts: Tensor) -> None:
        """Every process's (G, d) image and caption embeddings of the micro-batch, detached, in global order."""

    # ---- per optimiser step, checkpoint and log ----------------------------------------------

    def after_step(self, step: int) -> bool:
        """After optimiser step `step`; True when the step must write a metrics line."""
        return False

    def metrics(self) -> dict[str, float]:
        """Figures for the next metrics line."""
        return {}

    def state(self) -> dict[str, Tensor | dict]:
        """What a checkpoint keeps of this source (its keys are the checkpoint's own)."""
        return {}

    def restore(self, state: dict) -> None:
        """Take back what `state()` saved (`state` is the whole checkpoint state)."""

    def describe_edits(self, micro: MicroBatch, changes) -> Callable[[], list[list[str | None]]] | None:
        """The captions of this batch's image edits, as `Negatives.add_image_edits` reads them: None when the
        micro-batch writes none (`micro.describe` unset), else a thunk of `micro.describe(changes())`."""
        if micro.describe is None:
            return None
        return lambda: micro.describe(changes())
