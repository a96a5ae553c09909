"""`DemoConfig`: every knob of `lace demo`, one docstring each (they become the CLI help)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import ClassVar

from lace.config import refuse_set_fields
from lace.edits.config import EDIT_KINDS, EditConfig
from lace.errors import input_error
from lace.experiment.dictionary_config import DictionaryConfig
from lace.experiment.variants import CHOSEN_BEST, ROLES, check_variants, with_caption_negatives
from lace.local.config import LocalEditConfig
from lace.train.config import LogConfig, NegativesConfig, OptimConfig, RunConfig, TrainConfig

CORE_VARIANTS = (*ROLES["plain"], *ROLES["text_only"], *ROLES["as_specified"], CHOSEN_BEST,
                 with_caption_negatives(CHOSEN_BEST))
"""The default demo's arms, by role: plain, the text-only baseline, LACE as the method specifies it, the best LACE
arm as validation chose it and that arm with caption negatives."""
FULL_VARIANTS = ("LACE + caption negatives", "LACE captions only", "LACE images only", "LACE without rebind", "concept-arithmetic negatives",
                 "paired-caption directions", "LACE-local", "LACE-local + caption negatives",
                 "ceiling (rendered swaps)", "LACE-local pairs", "LACE-local pairs + column",
                 "LACE-local pairs + caption negatives", "LACE-local image-side pairs",
                 "LACE-local image-side pairs + caption negatives", "ceiling pairs")

# CLIP ViT-B/32 on SugarCrepe (Hsieh et al., 2023, table 2): the failure the base should match.
CLIP_SUGARCREPE = {
    "swap_attribute": 0.64,
    "swap_object": 0.61,
    "replace_attribute": 0.80,
    "replace_relation": 0.69,
}
CALIBRATION_TOLERANCE = 0.10
DEMO_LOSSES = ("clip", "sigmoid")
SIGMOID_TWINS = {"lace-micro-rn-32": "lace-micro-rn-sigmoid-32", "lace-micro-32": "lace-micro-sigmoid-32"}
"""The lace-tiny architectures with a learned logit bias (SigLIP's `init_logit_bias`), by their CLIP twin."""

# World knobs chosen on the validation split so that the base fails like CLIP (see
# docs/calibration.md for every setting tried and what it measured). Small splits
# beside train keep evaluation cheap: 5% each of val, test and test_comp.
CALIBRATED_WORLD = {
    "split_fractions": (0.85, 0.05, 0.05, 0.05),
    "small_extent": 0.30,
    "large_extent": 0.42,
    "cooccurrence_skew": 0.2,
    "web_colour_prob": 0.7,
    "web_colour_noise": 0.35,
    "web_relation_prob": 0.6,
}


DEMO_DICTIONARY = DictionaryConfig(atoms=128, sparsity=6, epochs=4, batch_size=2048, calibration="isotropic")
"""The demo's dictionary: K = 128, s = 6, four passes; tau_align against isotropic random directions, since
random directions shaped by the data's covariance (the library default) are themselves mixtures of the few
concepts that span a tiny model's space, which left most concepts of the world without an atom."""
SET_BY_THE_DEMO = ("vocabulary", "seed")
"""Dictionary fields the demo sets itself: its world's vocabulary and its --seed."""
DEMO_WARMUP = "a tenth of the fine-tune's steps, at least 1, at most 50"


@dataclass
class DemoFinetune:
    """The parts of each fine-tune a demo user sets: its length, its optimiser (but the warm-up), how its negatives
    are made and what it logs. The demo sets the run (model, data, batch size, seeds, folders) and each variant sets
    its arm's switches (`lace.experiment.variants`)."""

    FLAT_PARTS: ClassVar[tuple[str, ...]] = ("optim", "negatives", "log")
    FLAG_NAMES: ClassVar[dict[str, tuple[str, ...]]] = {
        **{f"negatives.edit.{f.name}": (f"--edit-{f.name.replace('_', '-')}",) for f in fields(EditConfig)},
        "negatives.edit.n_edits": ("--n-edits", "--edit-n-edits"),
        **{f"negatives.local.{f.name}": (f"--local-{f.name.replace('_', '-')}",) for f in fields(LocalEditConfig)},
        "negatives.counterfactual_weight": ("--counterfactual-weight",),
        "negatives.refresh_dictionary_every": ("--refresh-dictionary-every",),
        "optim.warmup_steps": ()}
    """The flags from before the fine-tune was nested (`--n-edits`, `--edit-*`, `--local-*`); the warm-up is the
    demo's."""
    SET_ELSEWHERE: ClassVar[tuple[type, str, str]] = (
        TrainConfig, "the demo", "its world, model, batch size, seeds and each arm's switches")
    """A fine-tune key this part does not hold is the demo's (or its variants')."""

    steps: int = 250
    """Optimiser steps of each fine-tune (`RunConfig.steps`)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-4))
    """The optimiser: peak learning rate 5e-4 (`--finetune-lr`, `--finetune-<knob>`); the warm-up is the demo's (a
    tenth of the steps, at most 50)."""
    negatives: NegativesConfig = field(default_factory=lambda: NegativesConfig(edit=EditConfig(kinds=EDIT_KINDS)))
    """How the negatives are made: METHOD.md's three edit kinds plus rebind (`--n-edits`, `--edit-*`, `--local-*`,
    `--counterfactual-weight`, `--refresh-dictionary-every`, `--finetune-<knob>`); its `edit` is also the editor of
    edit retrieval and the edit grids."""
    log: LogConfig = field(default_factory=lambda: LogConfig(log_every=25))
    """What each fine-tune logs (`--finetune-log-every`, `--finetune-tensorboard`)."""

    def __post_init__(self):
        refuse_set_fields("DemoConfig", "finetune", self.optim, OptimConfig(), ("warmup_steps",), "the demo",
                          DEMO_WARMUP)

    def train_config(self, **run: object) -> TrainConfig:
        """The `TrainConfig` of one fine-tune: `run` (`RunConfig` fields the demo sets) with these parts."""
        own = {"steps": self.steps, "device": "cpu", "overwrite": True, "checkpoint_every": 0}
        return TrainConfig(run=RunConfig(**{**own, **run}), optim=self.optim, negatives=self.negatives, log=self.log)


DEMO_FINETUNE = DemoFinetune()
"""The demo's fine-tune: 250 steps at peak learning rate 5e-4, METHOD.md's three edit kinds plus rebind, on the
CPU, one checkpoint at the end."""


@dataclass
class DemoConfig:
    """The whole LACE story on the shapes world, sized for a 2-core CPU."""

    seed: int = 0
    """Seed of the world, the base model (unless --base-seed) and the first fine-tuning seed."""
    seeds: int = 1
    """Fine-tuning seeds per variant; tables report mean ± std when more than one."""
    base_seed: int | None = None
    """Seed of the base's pretraining; None: --seed. One world, several bases: run the demo with --base-seed K
    into one folder per draw (`--reuse` one draw's folder to share its world), then `lace demo-draws` over the
    folders."""
    full: bool = False
    """Also run LACE + caption negatives, the ablations (LACE on captions only, on images only, without the rebind
    edit) and the binding arms: concept-arithmetic negatives, paired-caption directions, LACE-local (alone and with
    caption negatives), the ceiling of rendered colour swaps, and the pairs layout (each edited image a row of its
    own, positive with the caption its edit describes): LACE-local pairs (alone, with the edits as columns too, with
    caption negatives), its image side only (alone and with caption negatives) and the ceiling pairs; measure
    every model's provenance when some arm edits the images; and mix plain and LACE back into the base at five
    alphas (WiSE-FT: zero-shot against binding). The default runs plain, caption negatives, LACE, the
    pairs arm validation chose (with the real image as a hard negative of the edit's caption) and that arm with
    caption negatives."""
    threads: int = 0
    """Torch CPU threads; 0 uses every core (fastest on an idle machine; use 1 when other jobs share the cores).
    The dictionary fit repeats bit for bit at a given number of threads; its figures at another number differ by
    float rounding."""
    jobs: int = 0
    """Worker processes, one CPU thread each, for the stages after the dictionary that do not depend on each other
    (the fine-tunes, their evaluations, the edit grids, WiSE-FT); 0: one per core the demo uses (--threads, or
    every core). 1 runs every stage in this process with --threads threads. A stage's figures depend on the
    threads it ran with only through float rounding."""
    world_images: int = 8000
    """Images in the world over all splits (85% train, 5% each of val, test and compositional test)."""
    image_size: int = 32
    """Canvas side in pixels."""
    model: str = "lace-micro-rn-32"
    """lace-tiny architecture trained from scratch (its image size must match image_size); the default's
    convolutional image tower learns shapes and positions within the demo's budget, the ViTs' do not."""
    loss: str = "clip"
    """Contrastive loss of the base and every fine-tune: clip (softmax) or sigmoid (SigLIP's; the model becomes
    its twin with a learned logit bias, lace-micro-rn-sigmoid-32 for the default)."""
    softmax_run: str | None = None
    """With loss sigmoid: the folder of a softmax demo run on the same world, whose figures the report puts
    beside the sigmoid ones."""
    batch_size: int = 128
    """Pairs per contrastive batch."""
    base_steps: int = 800
    """Steps of plain pretraining on web-like captions (the base that does not bind)."""
    base_lr: float = 2e-3
    """Peak learning rate of pretraining."""
    dictionary: DictionaryConfig = field(default_factory=lambda: replace(DEMO_DICTIONARY))
    """The concept dictionary fitted on the base (`--atoms` K, `--sparsity` s, `--dictionary-*`); it is fitted
    on the world's vocabulary with --seed."""
    finetune: DemoFinetune = field(default_factory=DemoFinetune)
    """The parts of each fine-tune on COCO-like captions a user sets (`--finetune-steps`, `--finetune-lr`,
    `--n-edits`, `--counterfactual-weight`, `--edit-*`, `--local-*`, `--refresh-dictionary-every`, and
    `--finetune-<knob>` for any other); the model, batch size, seeds, data, warm-up and each variant's switches
    are the demo's."""
    only_variants: tuple[str, ...] = ()
    """Fine-tuning variants to run (empty: the four core ones, plus the ablations with --full)."""
    progress: bool = True
    """Show progress bars."""

    FLAG_NAMES: ClassVar[dict[str, tuple[str, ...]]] = {
        "dictionary.atoms": ("--atoms",), "dictionary.sparsity": ("--sparsity",),
        **{f"dictionary.{name}": () for name in SET_BY_THE_DEMO}}
    """The flags from before the dictionary was a nested config; no flag for what the demo sets (the fine-tune's
    are `DemoFinetune.FLAG_NAMES`)."""

    def __post_init__(self):
        check_variants(self.only_variants, "DemoConfig", "only_variants")
        why = "its world, model, batch size, seeds and each arm's switches"
        refuse_set_fields("DemoConfig", "dictionary", self.dictionary, DEMO_DICTIONARY, SET_BY_THE_DEMO, "the demo", why)
        if self.jobs < 0:
            raise input_error("DemoConfig", "jobs", "0 (one per core) or a number of worker processes", self.jobs)
        if self.loss not in DEMO_LOSSES:
            raise input_error("DemoConfig", "loss", f"one of {DEMO_LOSSES}", self.loss)
        if self.loss == "sigmoid":
            self.model = SIGMOID_TWINS.get(self.model, self.model)

    @property
    def pretraining_seed(self) -> int:
        """Seed of the base's pretraining (`base_seed`, or `seed`)."""
        return self.seed if self.base_seed is None else self.base_seed

    @property
    def workers(self) -> int:
        """Worker processes of the stages that run side by side (`jobs`, or one per core the demo uses)."""
        return self.jobs or self.threads or os.cpu_count() or 1

    @property
    def variants(self) -> tuple[str, ...]:
        if self.only_variants:
            return tuple(self.only_variants)
        return CORE_VARIANTS + (FULL_VARIANTS if self.full else ())
