"""`TrainConfig`: every switch of `lace train`, split by what it configures, one docstring each (they become the
CLI help).

    config.run.steps, config.optim.lr, config.arm.caption_negatives, config.negatives.edit.n_edits,
    config.log.log_every

The parts are flat parts (`lace.config`): their fields keep the flags and YAML keys they had before the split
(`--lr`, `lr: 1e-4`, `caption_negatives: true`, `edit: {n_edits: 2}`, `--n-edits`); the nested form (`optim: {lr:
1e-4}`) works too, and `train_config(lr=..., caption_negatives=True)` builds one from flat keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lace.config import with_changes
from lace.errors import input_error
from lace.train.config.arm import COUNTERFACTUAL_SOURCES, ArmConfig
from lace.train.config.log import LogConfig
from lace.train.config.negatives import NegativesConfig
from lace.train.config.optim import OptimConfig
from lace.train.config.run import LOSSES, PRECISIONS, RunConfig


@dataclass
class TrainConfig:
    """Contrastive (fine-)tuning of a dual encoder, with or without LACE negatives."""

    FLAT_PARTS: ClassVar[tuple[str, ...]] = ("run", "optim", "arm", "negatives", "log")
    """Parts whose fields take the flags and YAML keys they had when `TrainConfig` was flat."""
    # M was TrainConfig.n_edits before it moved into the editor's config: its flag and YAML key keep working
    FLAG_NAMES: ClassVar[dict[str, tuple[str, ...]]] = {
        "negatives.edit.n_edits": ("--edit-n-edits", "--n-edits"),
        "run.on_missing_image": ("--missing-images", "--on-missing-image")}

    run: RunConfig = field(default_factory=RunConfig)
    """The model, its data, the run folder, the length of the run, the device and the seed."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimiser and its schedule."""
    arm: ArmConfig = field(default_factory=ArmConfig)
    """Which negatives the arm makes (what a `lace.experiment.variants.VARIANTS` row sets)."""
    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    """How those negatives are made and weighed (the editors among them)."""
    log: LogConfig = field(default_factory=LogConfig)
    """What the run logs."""

    def validate(self) -> TrainConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        where = "train config"
        for part in (self.run, self.optim, self.arm, self.negatives, self.log):
            part.validate(where)
        if self.arm.edited_image_rows and self.run.vocabulary is None:
            raise input_error(where, "vocabulary", "a vocabulary file when edited_image_rows is on (the rule "
                              "editor writes each edit's caption)")
        for name in ("caption_negatives", "paired_caption_directions", "local_image_negatives", "local_caption_swaps"):
            if getattr(self.arm, name) and self.run.vocabulary is None:
                raise input_error(where, "vocabulary", f"a vocabulary file when {name} is on")
        return self


def train_config(**values: Any) -> TrainConfig:
    """A `TrainConfig` from keys as YAML and flags name them (`lr=1e-4`, `caption_negatives=True`,
    `edit=EditConfig(...)`, `n_edits=2`) or from its parts (`optim=OptimConfig(...)`), over the defaults."""
    return with_changes(TrainConfig(), values, "train config")


__all__ = ["COUNTERFACTUAL_SOURCES", "LOSSES", "PRECISIONS", "ArmConfig", "LogConfig", "NegativesConfig",
           "OptimConfig", "RunConfig", "TrainConfig", "train_config"]
