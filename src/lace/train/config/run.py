"""`RunConfig`: what a training run trains and reads, where it writes, how long it runs and where."""

from __future__ import annotations

from dataclasses import dataclass

from lace.data.images import MISSING_IMAGE_POLICIES
from lace.errors import input_error

PRECISIONS = ("auto", "fp32", "bf16")
LOSSES = ("auto", "clip", "sigmoid")


@dataclass
class RunConfig:
    """The model and its loss, the data and the files negatives are made from, the run folder, the length and
    batch of the run, the device and the seed."""

    model: str = "lace-tiny"
    """Architecture: an open_clip name (ViT-B-32, lace-tiny, lace-micro-32, ...)."""
    pretrained: str | None = None
    """Starting weights: a run folder (its latest checkpoint), a training checkpoint, an export, a Hugging Face folder,
    an open_clip tag (openai), or none for random init (`lace.encoders.weights`)."""
    loss: str = "auto"
    """Contrastive loss: auto (sigmoid for a model with a logit bias, SigLIP's; the softmax CLIP loss
    otherwise), clip or sigmoid. The run's config.json records the loss it trained with."""
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
    on_missing_image: str = "skip"
    """Missing or unreadable image files, found before training starts: skip (named and counted) or error."""
    num_workers: int = 0
    """DataLoader worker processes for image decoding."""
    cache_images: bool = False
    """Keep decoded images in memory after first use (small datasets such as the shapes world)."""
    dictionary: str | None = None
    """Folder of a fitted ConceptDictionary (needed for counterfactuals)."""
    vocabulary: str | None = None
    """Vocabulary YAML (or a shipped name such as 'natural') for edits and rule negatives."""
    output: str = "runs/train"
    """Run folder: config.json, metrics.jsonl, checkpoints/."""
    overwrite: bool = False
    """Replace a non-empty run folder (ignored when resuming)."""
    resume: str | None = None
    """Continue a run: 'latest' (the run folder's latest checkpoint), 'auto' (latest if the run has a whole
    checkpoint, else a fresh start: for torchrun --max-restarts) or a checkpoint path."""
    checkpoint_every: int = 500
    """Write a checkpoint every this many steps (and always at the end; 0: only at the end)."""
    keep_checkpoints: int = 3
    """Complete checkpoints to keep (older ones are removed after a newer one is written; 0: all)."""
    steps: int = 1000
    """Optimiser steps to run (ignored when epochs is set)."""
    epochs: float | None = None
    """Passes over the data, as open_clip_train counts them: over its rows (image-caption pairs) for data read from
    a file (over the images for in-memory pairs and cached features); sets steps = ceil(epochs * rows // batch_size
    / grad_accumulation)."""
    batch_size: int = 128
    """Global batch size: pairs per contrastive loss, summed over all processes."""
    precision: str = "auto"
    """fp32, bf16 (autocast) or auto (bf16 on CUDA, fp32 on CPU)."""
    device: str = "auto"
    """Torch device: auto (cuda if available), cpu or cuda; with torchrun each process takes its local GPU."""
    seed: int = 0
    """Seed of the data order, augmentation, initialisation and negatives; switches do not change it."""
    dist_timeout: float = 1800.0
    """Seconds a process waits on the others in a collective (data-parallel runs) before the run ends naming the
    process that died or hangs; keep it above the time a step and a checkpoint write take."""

    def validate(self, where: str = "train config") -> RunConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise input_error(where, name, "a positive integer", getattr(self, name))
        if self.epochs is not None and self.epochs <= 0:
            raise input_error(where, "epochs", "a positive number or None", self.epochs)
        for name, allowed in (("precision", PRECISIONS), ("on_missing_image", MISSING_IMAGE_POLICIES),
                              ("loss", LOSSES)):
            if getattr(self, name) not in allowed:
                raise input_error(where, name, f"one of {allowed}", getattr(self, name))
        for name in ("checkpoint_every", "keep_checkpoints", "num_workers"):
            if getattr(self, name) < 0:
                raise input_error(where, name, "a non-negative integer", getattr(self, name))
        if not self.dist_timeout > 0:
            raise input_error(where, "dist_timeout", "a positive number of seconds", self.dist_timeout)
        return self
