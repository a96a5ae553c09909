"""`TrainConfig`: every switch of `lace train`, one docstring each (they become the CLI help)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from lace.data.images import MISSING_IMAGE_POLICIES
from lace.edits.captions import KINDS as RULE_KINDS
from lace.edits.config import EditConfig
from lace.errors import input_error
from lace.local.config import LocalEditConfig

PRECISIONS = ("auto", "fp32", "bf16")
COUNTERFACTUAL_SOURCES = ("dictionary", "concept_arithmetic")
LOSSES = ("auto", "clip", "sigmoid")


class ArmSwitches:
    """What a config's training-arm switches imply; shared by `TrainConfig` and every config that reads
    `lace.experiment.variants` onto the same field names (the tower tops' `TopArm`)."""

    @property
    def uses_counterfactuals(self) -> bool:
        return self.counterfactual_captions or self.counterfactual_images

    @property
    def uses_image_edits(self) -> bool:
        """Whether the arm makes image-side edits (columns of the real caption, rows of their own, or both)."""
        return (self.counterfactual_images or self.paired_caption_directions or self.local_image_negatives
                or self.rendered_negatives)

    @property
    def uses_rule_captions(self) -> bool:
        """Whether rule-made captions are encoded each step (as negatives or as paired directions)."""
        return self.caption_negatives or self.paired_caption_directions


@dataclass
class TrainConfig(ArmSwitches):
    """Contrastive (fine-)tuning of a dual encoder, with or without LACE negatives."""

    # M was TrainConfig.n_edits before it moved into the editor's config: its flag and YAML key keep working
    FLAG_NAMES: ClassVar[dict[str, tuple[str, ...]]] = {"edit.n_edits": ("--edit-n-edits", "--n-edits"),
                                                         "on_missing_image": ("--missing-images", "--on-missing-image")}

    model: str = "lace-tiny"
    """Architecture: an open_clip name (ViT-B-32, lace-tiny, lace-micro-32, ...)."""
    pretrained: str | None = None
    """Starting weights: a run folder (its latest checkpoint), a training checkpoint, an export, a Hugging Face folder,
    an open_clip tag (openai), or none for random init (`lace.encoders.weights`)."""
    data: str | None = None
    """Training data: COCO captions JSON, Karpathy JSON, CSV/TSV or webdataset shards."""
    split: str | None = None
    """Karpathy split to train on (train, restval counts as train); None keeps all images."""
    image_root: str | None = None
    """Folder the image paths of the data file are relative to (default: next to the file)."""
    csv_separator: str | None = None
    """Column separator of CSV data, e.g. '\\t' (default: ',' for .csv, tab for .tsv and for a .csv whose header
    has tabs and no commas)."""
    csv_img_key: str | None = None
    """Image-path column of CSV data (default: the first of filepath, image, image_path, file_name, filename, path)."""
    csv_caption_key: str | None = None
    """Caption column of CSV data (default: the first of caption, title, text, sentence)."""
    output: str = "runs/train"
    """Run folder: config.json, metrics.jsonl, checkpoints/."""
    overwrite: bool = False
    """Replace a non-empty run folder (ignored when resuming)."""
    resume: str | None = None
    """Continue a run: 'latest' (the run folder's latest checkpoint), 'auto' (latest if the run has a whole
    checkpoint, else a fresh start: for torchrun --max-restarts) or a checkpoint path."""
    steps: int = 1000
    """Optimiser steps to run (ignored when epochs is set)."""
    epochs: float | None = None
    """Passes over the data, as open_clip_train counts them: over its rows (image-caption pairs) for data read from
    a file (over the images for in-memory pairs and cached features); sets steps = ceil(epochs * rows // batch_size
    / grad_accumulation)."""
    batch_size: int = 128
    """Global batch size: pairs per contrastive loss, summed over all processes."""
    lr: float = 1e-5
    """Peak learning rate of AdamW (1e-5 suits fine-tuning a pretrained CLIP; ~1e-3 from scratch)."""
    pretrained_lr_scale: float = 1.0
    """Learning rate of the pretrained layers an encoder names (the tower tops of a `TowersTop`) as a fraction of
    lr; its new heads and the logit scale take lr."""
    weight_decay: float = 0.1
    """AdamW weight decay; biases, norms, 1-d params and logit_scale get none (open_clip's rule)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.98
    """AdamW beta2 (0.98 as in CLIP)."""
    eps: float = 1e-6
    """AdamW epsilon."""
    warmup_steps: int = 50
    """Linear warm-up steps before the cosine decay."""
    grad_clip_norm: float | None = 1.0
    """Clip the global gradient norm to this value (None: no clipping)."""
    grad_accumulation: int = 1
    """Batches per optimiser step; each batch is its own contrastive loss, gradients averaged."""
    loss: str = "auto"
    """Contrastive loss: auto (sigmoid for a model with a logit bias, SigLIP's; the softmax CLIP loss
    otherwise), clip or sigmoid. The run's config.json records the loss it trained with."""
    mask_duplicate_pairs: bool = False
    """Leave other copies of a pair's image or caption in the batch (all processes) out of its softmax
    in both directions. Off by default: every other pair is a negative, as in open_clip's ClipLoss."""
    precision: str = "auto"
    """fp32, bf16 (autocast) or auto (bf16 on CUDA, fp32 on CPU)."""
    device: str = "auto"
    """Torch device: auto (cuda if available), cpu or cuda; with torchrun each process takes its local GPU."""
    seed: int = 0
    """Seed of the data order, augmentation, initialisation and negatives; switches do not change it."""
    counterfactual_captions: bool = False
    """LACE: M edits of each caption embedding are extra negatives of its image's image->text row."""
    counterfactual_images: bool = False
    """LACE: M edits of each image embedding are extra negatives of its caption's text->image row."""
    caption_negatives: bool = False
    """Text-only baseline: rule-made captions (NegCLIP style), encoded as text, are image->text negatives."""
    paired_caption_directions: bool = False
    """AHNPL-style baseline: each rule-made caption t' of caption t gives the image-side negative
    normalise(u + v(t') - v(t)) of the text->image row (rule_negative_kinds, rule_negatives_per_caption)."""
    local_image_negatives: bool = False
    """LACE-local: binding swaps and transplants made inside the image tower at local_layer (lace.local)
    are text->image negatives; the editor is fitted on the training images before the first step (and again every
    local_refresh_every steps). The
    edited maps run through the upper layers in the images' own pass, with BatchNorm statistics from the
    real images alone (lace.local.batch_norm)."""
    local_caption_swaps: bool = False
    """LACE-local, caption side: two concept words' token states swapped at local_text_layer are
    image->text negatives."""
    rendered_negatives: bool = False
    """Ceiling (shapes world only): each training scene re-rendered with two objects' colours swapped,
    encoded by the image tower, is a text->image negative."""
    sources: tuple[str, ...] = ()
    """Further negative sources switched on by their name in `lace.train.sources.SOURCES` (a source without a
    switch of its own here: one module and one `lace.experiment.variants.VARIANTS` entry)."""
    edited_image_rows: bool = False
    """Pairs layout (TripletCLIP's): every image-side edit the arm makes (LACE's image edits, concept arithmetic,
    paired-caption directions, LACE-local, the rendered ceiling) is also a row of its own, whose positive is the
    caption its edit describes (the real caption rewritten by the rule editor from the changed concepts) and whose
    hard negative is the real caption; edits whose caption cannot be written are skipped."""
    edited_image_columns: bool = True
    """Each image-side edit is a text->image negative of its real caption (today's layout); off with
    edited_image_rows gives the pairs layout alone."""
    edited_rows_real_image_negative: bool = False
    """The described caption of each edited row also takes the real image as a hard negative (its text->image row
    gets one more column), so it is taught to prefer the edit over the image the edit was made from."""
    edited_rows_weight: float = 1.0
    """Weight of the edited rows' term (`lace.losses.pair_loss`) added to the loss; it scales only those terms."""
    edited_rows_train_text: bool = True
    """The edited rows' term also trains the text tower. Off, the described and the real captions enter it as
    constants (the described captions are encoded without gradient): only the image side learns from the edits,
    so an edit that stays close to its image cannot pull the text of its swap toward the real image."""
    local: LocalEditConfig = field(default_factory=LocalEditConfig)
    """LACE-local's knobs: where and how the image and caption towers are edited (`--local-<knob>`; `local:` in
    YAML)."""
    counterfactual_source: str = "dictionary"
    """How counterfactuals are made: dictionary (sparse-code edits) or concept_arithmetic (ablation)."""
    edit: EditConfig = field(default_factory=EditConfig)
    """The counterfactual editor's knobs, M = `n_edits` among them (`--edit-<knob>`; `edit:` in YAML)."""
    rule_negative_kinds: tuple[str, ...] = RULE_KINDS
    """Rule-made caption negative kinds: swap_attributes, swap_objects, replace_attribute, replace_object, replace_relation."""
    rule_negatives_per_caption: int = 1
    """Rule-made negatives drawn per caption (each encoded by the text tower)."""
    counterfactual_weight: float = 1.0
    """w in plain + w * (extended - plain); 1 is one softmax over batch and negatives (with the sigmoid
    loss: the weight of the negatives' own z = -1 terms)."""
    refresh_dictionary_every: int = 0
    """Refit the dictionary on recent embeddings every this many steps (0: never)."""
    refresh_pool_size: int = 4096
    """Recent embeddings per modality kept for a dictionary refit."""
    dictionary: str | None = None
    """Folder of a fitted ConceptDictionary (needed for counterfactuals)."""
    vocabulary: str | None = None
    """Vocabulary YAML (or a shipped name such as 'natural') for edits and rule negatives."""
    checkpoint_every: int = 500
    """Write a checkpoint every this many steps (and always at the end; 0: only at the end)."""
    keep_checkpoints: int = 3
    """Complete checkpoints to keep (older ones are removed after a newer one is written; 0: all)."""
    on_missing_image: str = "skip"
    """Missing or unreadable image files, found before training starts: skip (named and counted) or error."""
    num_workers: int = 0
    """DataLoader worker processes for image decoding."""
    cache_images: bool = False
    """Keep decoded images in memory after first use (small datasets such as the shapes world)."""
    log_every: int = 10
    """Append a metrics.jsonl line every this many steps."""
    tensorboard: bool = False
    """Also write TensorBoard scalars to the run folder (when tensorboard is installed)."""
    dist_timeout: float = 1800.0
    """Seconds a process waits on the others in a collective (data-parallel runs) before the run ends naming the
    process that died or hangs; keep it above the time a step and a checkpoint write take."""

    def validate(self) -> TrainConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        where = "train config"
        positive = {"steps": self.steps, "batch_size": self.batch_size, "grad_accumulation": self.grad_accumulation,
                    "log_every": self.log_every, "rule_negatives_per_caption": self.rule_negatives_per_caption}
        for name, value in positive.items():
            if value < 1:
                raise input_error(where, name, "a positive integer", value)
        if self.epochs is not None and self.epochs <= 0:
            raise input_error(where, "epochs", "a positive number or None", self.epochs)
        for name, value, allowed in (
            ("precision", self.precision, PRECISIONS),
            ("counterfactual_source", self.counterfactual_source, COUNTERFACTUAL_SOURCES),
            ("on_missing_image", self.on_missing_image, MISSING_IMAGE_POLICIES),
            ("loss", self.loss, LOSSES),
        ):
            if value not in allowed:
                raise input_error(where, name, f"one of {allowed}", value)
        self.edit.validate(f"{where}: edit")
        self.local.validate(f"{where}: local")
        for name, values, allowed in (("rule_negative_kinds", self.rule_negative_kinds, RULE_KINDS),):
            if not values or any(v not in allowed for v in values):
                raise input_error(where, name, f"a non-empty subset of {allowed}", values)
        for name in ("warmup_steps", "checkpoint_every", "keep_checkpoints", "refresh_dictionary_every",
                     "num_workers"):
            if getattr(self, name) < 0:
                raise input_error(where, name, "a non-negative integer", getattr(self, name))
        if not self.dist_timeout > 0:
            raise input_error(where, "dist_timeout", "a positive number of seconds", self.dist_timeout)
        if not (self.edited_image_columns or self.edited_image_rows):
            raise input_error(where, "edited_image_columns", "on unless edited_image_rows is on (the arm's image "
                              "edits would be made and not used)", self.edited_image_columns)
        if self.edited_image_rows and not self.uses_image_edits:
            raise input_error(where, "edited_image_rows", "an arm with image-side edits (counterfactual_images, "
                              "paired_caption_directions, local_image_negatives or rendered_negatives)", True)
        if self.edited_image_rows and self.vocabulary is None:
            raise input_error(where, "vocabulary", "a vocabulary file when edited_image_rows is on (the rule "
                              "editor writes each edit's caption)")
        if self.edited_rows_weight < 0:
            raise input_error(where, "edited_rows_weight", "a non-negative weight", self.edited_rows_weight)
        if self.lr <= 0 or self.counterfactual_weight < 0 or self.pretrained_lr_scale < 0:
            raise input_error(where, "lr / counterfactual_weight / pretrained_lr_scale",
                              "lr > 0, counterfactual_weight >= 0 and pretrained_lr_scale >= 0")
        for name in ("caption_negatives", "paired_caption_directions", "local_image_negatives", "local_caption_swaps"):
            if getattr(self, name) and self.vocabulary is None:
                raise input_error(where, "vocabulary", f"a vocabulary file when {name} is on")
        return self
