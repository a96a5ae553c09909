"""Settings of the Flickr8k study: what to train, how, and how much to measure.

Every default was chosen for the full Flickr8k on a small CPU; the tests shrink them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lace.edits.config import EditConfig
from lace.errors import input_error
from lace.experiment.variants import check_variants


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

TRANSPLANTS: tuple[tuple[str, str], ...] = (("grass", "snow"), ("dog", "horse"), ("beach", "snow"), ("man", "woman"))


@dataclass(frozen=True)
class StudyConfig:
    """The Flickr8k study: base heads, their geometry, a dictionary, edits and fine-tunes."""

    data: str
    """Flickr8k folder (captions.csv and images/)."""
    out: str
    """Study folder: report.md, report.html, results.json, stages/, figures/, models/."""
    feature_cache: str | None = None
    """Folder of cached tower features (default: <out>/features); shared between studies."""
    seeds: int = 3
    """Seeds of every fine-tune (mean and standard deviation over them)."""
    base_grid: tuple[HeadsTraining, ...] = DEFAULT_BASE_GRID
    """Candidate base trainings; the best mean validation R@1 is kept."""
    finetune: HeadsTraining = HeadsTraining(epochs=6, lr=5e-4, warmup_steps=10)
    """Fine-tunes from the base (the head shape comes from the base)."""
    variants: tuple[str, ...] = STUDY_VARIANTS
    """Fine-tune variants to run (names of `lace.experiment.variants.VARIANTS`)."""
    n_edits: int = 4
    """Counterfactual edits per embedding and side (M)."""
    edit: EditConfig = field(default_factory=EditConfig)
    """The editor of LACE fine-tuning and counterfactual brittleness (edit retrieval sets its own strengths)."""
    vocabulary: str = "natural"
    """Typed vocabulary for concepts, rule-made captions and edits."""
    atoms: int = 512
    """Atoms K of the learned dictionary."""
    sparsity: int = 8
    """Non-zeros s per code."""
    tau_align: float | None = None
    """Atom alignment threshold (None: calibrated against random directions of the data)."""
    dictionary_seconds: float | None = 150.0
    """Time limit of dictionary learning (None: no limit)."""
    transplants: tuple[tuple[str, str], ...] = TRANSPLANTS
    """Named transplants of the edit-retrieval stage (source, target)."""
    strengths: tuple[float, ...] = (1.0, 2.0, 4.0)
    """Transplant strengths."""
    zeroshot_min_images: int = 5
    """Test images a class of the caption-derived zero-shot task needs (`lace.study.zeroshot`)."""
    zeroshot_root: str | None = None
    """Also score zero-shot on this image folder, one subfolder per class (`lace eval --benchmarks zeroshot`);
    the caption-derived proxy task (`lace.study.zeroshot`) is always scored."""
    zeroshot_classnames: str | None = None
    """Class names of `zeroshot_root` (as `lace eval --zeroshot-classnames` reads them)."""
    zeroshot_templates: str | None = None
    """Prompt templates of `zeroshot_root` (as `lace eval --zeroshot-templates` reads them)."""
    neighbours: int = 10
    """Nearest real images looked up per edited image."""
    rule_brittleness_captions: int = 1000
    """Test captions drawn for rule-made brittleness (each with one edit per kind)."""
    items_per_kind: int = 1000
    """SugarCrepe-style items per kind built from test captions."""
    concepts_shown: int = 8
    """Concepts whose best atoms are shown with their top images and captions."""
    image_batch_size: int = 64
    """Images per tower batch when extracting features."""
    num_workers: int = 1
    """DataLoader workers decoding JPEGs for the image tower."""
    progress: bool = True
    """Show progress bars."""

    def validate(self) -> StudyConfig:
        where = "study config"
        if self.seeds < 1:
            raise input_error(where, "seeds", "at least 1", self.seeds)
        if not self.base_grid:
            raise input_error(where, "base_grid", "at least one candidate")
        for candidate in self.base_grid:
            candidate.validate(f"{where}: base_grid")
        self.finetune.validate(f"{where}: finetune")
        if not self.variants:
            raise input_error(where, "variants", "at least one variant")
        check_variants(self.variants, where)
        self.edit.validate(f"{where}: edit")
        if self.n_edits < 1 or self.atoms < 1 or self.sparsity < 1 or self.neighbours < 1:
            raise input_error(where, "n_edits / atoms / sparsity / neighbours", "positive integers")
        return self

    def with_changes(self, **changes) -> StudyConfig:
        return replace(self, **changes)


def heads_from(base: HeadsTraining, finetune: HeadsTraining) -> HeadsTraining:
    """Fine-tune settings with the head shape of the base."""
    return replace(finetune, hidden_dim=base.hidden_dim, dropout=base.dropout, embed_dim=base.embed_dim)


__all__ = ["DEFAULT_BASE_GRID", "STUDY_VARIANTS", "TRANSPLANTS", "HeadsTraining", "StudyConfig", "heads_from"]
