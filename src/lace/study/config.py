"""Settings of the Flickr8k study: what to train, how, and how much to measure.

Every default was chosen for the full Flickr8k on a small CPU; the tests shrink them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import ClassVar

from lace.edits.config import EditConfig
from lace.errors import input_error
from lace.experiment.dictionary_config import DictionaryConfig
from lace.experiment.variants import VARIANTS, check_variants
from lace.local.config import CACHED_TOPS_SERVE, LocalEditConfig
from lace.train.config import NegativesConfig, OptimConfig, RunConfig, TrainConfig


@dataclass(frozen=True)
class HeadsTraining:
    """One heads-only training run on cached tower features (towers locked, LiT style)."""

    hidden_dim: int = 2048
    """Hidden width of the MLP heads (0: linear heads)."""
    dropout: float = 0.5
    """Dropout inside the heads."""
    embed_dim: int = 256
    """Dimension of the shared space."""
    lr: float = 1e-3
    """Peak AdamW learning rate (cosine decay after a linear warm-up)."""
    weight_decay: float = 0.1
    """AdamW weight decay (open_clip's rule: none on biases and the temperature)."""
    epochs: float = 20.0
    """Passes over the training images (one caption drawn per image per epoch)."""
    batch_size: int = 256
    """Pairs per contrastive batch."""
    warmup_steps: int = 20
    """Linear warm-up steps."""
    init_temperature: float = 0.07
    """Initial temperature (the logit scale starts at 1 / temperature and is learned)."""
    grad_clip_norm: float | None = 1.0
    """Clip the global gradient norm to this value, as `lace train` does (None: no clipping)."""

    def train_changes(self) -> dict:
        """The run's training settings as a delta on a `TrainConfig` (the head shape is the model's, not the
        trainer's)."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, "epochs": self.epochs, "batch_size": self.batch_size,
                "warmup_steps": self.warmup_steps, "grad_clip_norm": self.grad_clip_norm}

    def validate(self, where: str = "heads training") -> HeadsTraining:
        if self.epochs <= 0 or self.batch_size < 2 or self.lr <= 0 or not 0 <= self.dropout < 1:
            raise input_error(where, "epochs / batch_size / lr / dropout",
                              "epochs > 0, batch_size >= 2, lr > 0 and 0 <= dropout < 1", self)
        return self


# The grid the base heads are chosen from, on validation recall only. Sized for a small
# shared CPU: one epoch of 2048-wide heads over 6,000 pairs costs about 10 s there.
DEFAULT_BASE_GRID: tuple[HeadsTraining, ...] = (
    HeadsTraining(hidden_dim=2048, dropout=0.5, lr=1e-3, weight_decay=0.1, epochs=12, batch_size=256),
    HeadsTraining(hidden_dim=2048, dropout=0.5, lr=2e-3, weight_decay=0.5, epochs=12, batch_size=512),
    HeadsTraining(hidden_dim=1024, dropout=0.3, lr=1e-3, weight_decay=0.1, epochs=12, batch_size=256),
    HeadsTraining(hidden_dim=2048, dropout=0.5, lr=1e-3, weight_decay=0.1, epochs=30, batch_size=512),
    HeadsTraining(hidden_dim=4096, dropout=0.6, lr=1e-3, weight_decay=0.1, epochs=20, batch_size=512),
)

STUDY_VARIANTS = ("plain", "caption negatives", "LACE", "LACE + caption negatives", "LACE captions only",
                  "LACE images only")
"""Fine-tunes from the base (names of `lace.experiment.variants.VARIANTS`)."""

STUDY_DICTIONARY = DictionaryConfig(atoms=512, sparsity=8, max_seconds=150.0, calibration="covariance",
                                    bindings=False)
"""The studies' dictionary: K = 512, s = 8, at most 150 s of learning, tau_align against covariance-shaped random
directions of the data, and no binding directions (the studies' LACE edits are METHOD.md's three kinds)."""

TRANSPLANTS: tuple[tuple[str, str], ...] = (("grass", "snow"), ("dog", "horse"), ("beach", "snow"), ("man", "woman"))


@dataclass(frozen=True)
class Flickr8kStudy:
    """What both Flickr8k studies read and keep: the data, the study folder and feature cache, the seeds, the concept
    dictionary and vocabulary, the measured items, zero-shot on a folder of the user's, and progress bars."""

    data: str
    """Flickr8k folder (captions.csv and images/)."""
    out: str
    """Study folder: stages/, models/ and the study's results (the locked towers: report.md, report.html,
    results.json, figures/; the tops: arms-<split>.json and .md, every fine-tune a lace-towers checkpoint)."""
    feature_cache: str | None = None
    """Folder of cached tower features (the tops: their inputs; default: <out>/features); shared between studies."""
    seeds: int = 3
    """Seeds of every fine-tune (mean and standard deviation over them)."""
    dictionary: DictionaryConfig = field(default_factory=lambda: STUDY_DICTIONARY)
    """The concept dictionary of LACE's pooled edits (`--dictionary-<field>`), fitted on the base's training
    embeddings (`dictionary.vocabulary` is replaced by the study's `vocabulary`)."""
    vocabulary: str = "natural"
    """Typed vocabulary for concepts, rule-made captions and edits."""
    items_per_kind: int = 1000
    """SugarCrepe-style items per kind built from the measured split's captions."""
    zeroshot_root: str | None = None
    """Also score zero-shot on this image folder, one subfolder per class, for the base and every fine-tune
    (`lace eval --benchmarks zeroshot`)."""
    zeroshot_classnames: str | None = None
    """Class names of `zeroshot_root` (as `lace eval --zeroshot-classnames` reads them)."""
    zeroshot_templates: str | None = None
    """Prompt templates of `zeroshot_root` (as `lace eval --zeroshot-templates` reads them)."""
    progress: bool = True
    """Show progress bars."""

    def _validate_shared(self, where: str) -> None:
        if self.seeds < 1:
            raise input_error(where, "seeds", "at least 1", self.seeds)
        self.dictionary.validate(f"{where}: dictionary")


@dataclass(frozen=True)
class StudyConfig(Flickr8kStudy):
    """The Flickr8k study: base heads, their geometry, a dictionary, edits and fine-tunes (the caption-derived
    zero-shot proxy task, `lace.study.zeroshot`, is always scored; the SugarCrepe-style items come from the test
    captions)."""

    base_grid: tuple[HeadsTraining, ...] = DEFAULT_BASE_GRID
    """Candidate base trainings; the best mean validation R@1 is kept."""
    finetune: HeadsTraining = HeadsTraining(epochs=6, lr=5e-4, warmup_steps=10)
    """Fine-tunes from the base (the head shape comes from the base)."""
    variants: tuple[str, ...] = STUDY_VARIANTS
    """Fine-tune variants to run (names of `lace.experiment.variants.VARIANTS`)."""
    edit: EditConfig = field(default_factory=EditConfig)
    """The editor of LACE fine-tuning and counterfactual brittleness, with its M (`edit.n_edits`: counterfactual
    edits per embedding and side; edit retrieval sets its own strengths)."""
    transplants: tuple[tuple[str, str], ...] = TRANSPLANTS
    """Named transplants of the edit-retrieval stage (source, target)."""
    strengths: tuple[float, ...] = (1.0, 2.0, 4.0)
    """Transplant strengths."""
    zeroshot_min_images: int = 5
    """Test images a class of the caption-derived zero-shot task needs (`lace.study.zeroshot`)."""
    neighbours: int = 10
    """Nearest real images looked up per edited image."""
    rule_brittleness_captions: int = 1000
    """Test captions drawn for rule-made brittleness (each with one edit per kind)."""
    concepts_shown: int = 8
    """Concepts whose best atoms are shown with their top images and captions."""
    image_batch_size: int = 64
    """Images per tower batch when extracting features."""
    num_workers: int = 1
    """DataLoader workers decoding JPEGs for the image tower."""

    FLAG_NAMES: ClassVar[dict[str, tuple[str, ...]]] = {"edit.n_edits": ("--edit-n-edits", "--n-edits")}
    """M lives in the editor's config; `n_edits`, the name from before, still sets it."""

    def validate(self) -> StudyConfig:
        where = "study config"
        self._validate_shared(where)
        if not self.base_grid:
            raise input_error(where, "base_grid", "at least one candidate")
        for candidate in self.base_grid:
            candidate.validate(f"{where}: base_grid")
        self.finetune.validate(f"{where}: finetune")
        if not self.variants:
            raise input_error(where, "variants", "at least one variant")
        check_variants(self.variants, where)
        self.edit.validate(f"{where}: edit")
        if self.neighbours < 1:
            raise input_error(where, "neighbours", "a positive integer", self.neighbours)
        return self


def heads_from(base: HeadsTraining, finetune: HeadsTraining) -> HeadsTraining:
    """Fine-tune settings with the head shape of the base."""
    return replace(finetune, hidden_dim=base.hidden_dim, dropout=base.dropout, embed_dim=base.embed_dim)


def _tops_local_knobs(local: dict) -> bool:
    """Whether an arm's own local knobs (its `local` mapping in `VARIANTS`) are all ones the tower tops serve
    (`lace.local.config.CACHED_TOPS_SERVE`: round-trip and no-op symmetry, the learnt operator), nothing else."""
    return bool(local) and all(value in CACHED_TOPS_SERVE.get(knob, ()) for knob, value in local.items())


TOP_ARMS = ("plain", "caption negatives", "LACE", "concept-arithmetic negatives", "paired-caption directions",
            "LACE-local", "LACE-local + caption negatives", "LACE-local pairs", "LACE-local pairs + column",
            "LACE-local pairs + caption negatives", "LACE-local pairs + real-image negative",
            "LACE-local pairs + real-image negative + caption negatives", "LACE-local image-side pairs",
            "LACE-local image-side pairs + caption negatives") + tuple(
    name for name, changes in VARIANTS.items() if _tops_local_knobs(changes.get("local", {})))
"""Every arm the tower tops can train (names of `lace.experiment.variants.VARIANTS`), in the report's order: the
arms without local knobs of their own, then every arm whose local knobs the tops serve (artefact-symmetric pairs,
round trip or no-op; the learnt operator), chosen by those knobs, not by name."""

@dataclass(frozen=True)
class TopsFinetune:
    """The parts of every arm's fine-tune a tops study user sets: its length, batch and precision, its optimiser
    and how its negatives are made (the study's editors: `--edit-*`, `--local-*`). The study sets the run (model,
    data, seeds, folders) and each arm its switches (`lace.experiment.variants`). The defaults are the fine-tune the
    protocol chose on validation (docs/flickr8k-top.md): 8 epochs of batch 256 over the fine-tune images (88 steps)."""

    FLAT_PARTS: ClassVar[tuple[str, ...]] = ("optim", "negatives")
    FLAG_NAMES: ClassVar[dict[str, tuple[str, ...]]] = {
        **{f"negatives.edit.{f.name}": (f"--edit-{f.name.replace('_', '-')}",) for f in fields(EditConfig)},
        **{f"negatives.local.{f.name}": (f"--local-{f.name.replace('_', '-')}",) for f in fields(LocalEditConfig)}}
    """The editors' flags from before they moved into the fine-tune (`--edit-<knob>`, `--local-<knob>`)."""
    SET_ELSEWHERE: ClassVar[tuple[type, str, str]] = (
        TrainConfig, "the study", "its model, data, seeds and each arm's switches")
    """A fine-tune key this part does not hold is the study's (or its arms')."""

    epochs: float | None = 8.0
    """Passes over the fine-tune images (`RunConfig.epochs`; None: `steps`)."""
    steps: int = 1000
    """Optimiser steps when epochs is None (`RunConfig.steps`)."""
    batch_size: int = 256
    """Pairs per contrastive batch (`RunConfig.batch_size`; at most the fine-tune images)."""
    precision: str = "fp32"
    """fp32, bf16 or auto (`RunConfig.precision`)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(
        lr=5e-4, pretrained_lr_scale=0.1, warmup_steps=20, weight_decay=0.1, grad_clip_norm=None))
    """Heads and scale at 5e-4, the pretrained top layers at a tenth of it, no gradient clipping (the setting the
    recorded figures were trained with)."""
    negatives: NegativesConfig = field(default_factory=lambda: NegativesConfig(local=LocalEditConfig(n_edits=2)))
    """The counterfactual editor of LACE's pooled arms (`edit`) and LACE-local on the cached maps (`local`: the maps
    are the editor's layer, so only n_edits and group apply), with the other negatives' knobs."""

    def train_config(self, **run: object) -> TrainConfig:
        """The `TrainConfig` of one fine-tune: `run` (`RunConfig` fields the study sets) with these parts."""
        own = {"epochs": self.epochs, "steps": self.steps, "batch_size": self.batch_size, "precision": self.precision,
               "device": "cpu"}
        return TrainConfig(run=RunConfig(**{**own, **run}), optim=self.optim, negatives=self.negatives)

    def validate(self, where: str) -> TopsFinetune:
        self.train_config().validate()
        return self


@dataclass(frozen=True)
class TopsStudyConfig(Flickr8kStudy):
    """Flickr8k with the tops of the towers trainable: a heads-only base on part of the training images, then every
    training arm fine-tuned on the others (tops and heads) over seeds, measured on one split."""

    arms: tuple[str, ...] = TOP_ARMS
    """Training arms to run (names of `lace.experiment.variants.VARIANTS`)."""
    split: str = "val"
    """Split to measure on: val while choosing, test once at the end (it reuses every trained model)."""
    base_share: float = 0.5
    """Share of the training images the base trains on (the fine-tunes train on the others)."""
    base: HeadsTraining = DEFAULT_BASE_GRID[3]
    """The heads-only base (`--base-<field>`; default: row 3 of the locked study's base grid, the protocol's
    choice on validation)."""
    finetune: TopsFinetune = field(default_factory=TopsFinetune)
    """Every arm's fine-tune (`--finetune-<field>`, the editors `--edit-<knob>` and `--local-<knob>`; `edit:` and
    `local:` in YAML); the study sets the model, data, seed and the arm's switches."""

    def validate(self) -> TopsStudyConfig:
        where = "tower-tops study config"
        self._validate_shared(where)
        if not self.arms:
            raise input_error(where, "arms", "at least one arm")
        check_variants(self.arms, where, "arms")
        if self.split not in ("val", "test"):
            raise input_error(where, "split", "val or test", self.split)
        if not 0.0 < self.base_share < 1.0:
            raise input_error(where, "base_share", "a share in (0, 1)", self.base_share)
        self.base.validate(f"{where}: base")
        self.finetune.validate(f"{where}: finetune")
        return self


__all__ = ["DEFAULT_BASE_GRID", "STUDY_VARIANTS", "TOP_ARMS", "TRANSPLANTS",
           "Flickr8kStudy", "HeadsTraining", "StudyConfig", "TopsFinetune", "TopsStudyConfig", "heads_from"]
