"""`train`: the training loop shared by plain (pre)training, LACE and its ablations.

One optimiser step = `grad_accumulation` micro-batches of `batch_size` pairs (global),
each its own contrastive loss. Per micro-batch: encode images and captions (plus any
rule-made captions, in the same text pass), make the counterfactual negatives, gather
the embeddings of all processes, and take the LACE loss of this process's rows.

Three embed paths, one loss and one assembly of negatives (`train.negatives.arm_negatives`):
- pixels and captions through the whole encoder (any `DualEncoder`);
- `FeaturePairs` (cached pooled tower features) with a `lace-towers` encoder passed in: the heads map the
  cached image and caption features (and those of the rule-made captions) into the joint space;
- `TopPairs` (cached inputs of the tower tops) with a `TowersTop` passed in: the trainable tops and heads
  run on the cached maps and token states; LACE-local edits the maps themselves (a `MapEditor`), and the captions
  image edits describe (the pairs layout) get their token states through the text tower below the cut.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from lace.concepts.vocabulary import load_vocabulary
from lace.config import config_to_dict
from lace.data import ImageTextDataset, read_dataset
from lace.distributed import DistributedContext, init_distributed, shutdown_distributed
from lace.edits.captions import RuleNegatives
from lace.encoders import DualEncoder, load_encoder
from lace.encoders.towers.top_features import encode_captions
from lace.errors import LaceInputError
from lace.io import atomic_write_json, atomic_write_text, prepare_output_dir
from lace.local import build_local_editor
from lace.losses import duplicate_pairs
from lace.provenance import PREFERENCES, provenance_preferences
from lace.row_random import RowGenerators
from lace.train import checkpoints
from lace.train.config import TrainConfig
from lace.train.data import (
    EDIT_STREAM,
    LOCAL_STREAM,
    FeatureBatch,
    FeaturePairs,
    ImagePairs,
    RankBatches,
    TensorPairs,
    TopBatch,
    TopPairs,
    TrainingOrder,
    collate,
    drop_missing_images,
    pair_keys,
    row_seeds,
)
from lace.train.distributed import barrier, gather_with_grad, sum_over_processes
from lace.train.editor import refresh_editor, run_editor
from lace.train.interrupt import StopRequest
from lace.train.local_arm import (
    LocalImagePass,
    group_token_ids,
    local_caption_negatives,
    map_negatives,
)
from lace.train.local_refresh import LocalEditorUpkeep, fidelity_probe
from lace.train.loss_choice import choose_loss, contrastive_losses, logit_bias_of
from lace.train.lost_rank import WatchCollectives
from lace.train.negatives import (
    BatchSources,
    Negatives,
    arm_negatives,
    check_editor_dimension,
    rule_made_captions,
)
from lace.train.optim import build_optimizer, clamp_logit_scale, cosine_lr, set_lr
from lace.train.pairs import describe_slots, pair_rows, pair_term
from lace.train.rendered import RenderedNegatives, rendered_negatives, world_of

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
# Fields that fix the model, the data order or what a step means: a resumed run must keep them.
RESUME_INVARIANTS = ("model", "data", "split", "batch_size", "grad_accumulation", "seed")


@dataclass
class TrainResult:
    """What a finished run hands back."""

    model: DualEncoder
    run_dir: Path
    metrics_path: Path
    checkpoint_path: Path | None
    steps: int
    skipped_images: int
    last_metrics: dict = field(default_factory=dict)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def train(
    config: TrainConfig,
    editor=None,
    dataset: ImageTextDataset | TensorPairs | FeaturePairs | TopPairs | None = None,
    progress: bool = True,
    on_batch: Callable[[int, list[int]], None] | None = None,
    local_editor=None,
    rendered: RenderedNegatives | None = None,
    encoder: DualEncoder | None = None,
) -> TrainResult:
    """Train `config.model` on `dataset` (default: read `config.data`) as `config` says.

    Args:
        editor: a `lace.edits.CounterfactualEditor` (default: built from `config.dictionary`
            and `config.vocabulary` when counterfactuals are on).
        dataset: an `ImageTextDataset`, in-memory `TensorPairs`, cached tower `FeaturePairs`, cached tower-top
            inputs `TopPairs`, or None to read `config.data`.
        on_batch: called as `on_batch(micro_batch_number, dataset_indices)` for every
            micro-batch this process trains on (to record the data order).
        local_editor: the fitted local image editor of `local_image_negatives` (default: fitted on the
            training images before the first step; with `TopPairs`, a `lace.local.maps.MapEditor` passed in);
            `local.refresh_every` replaces it by refits from `config.local` (`lace.train.local_refresh`).
        rendered: the ceiling arm's `RenderedNegatives`, one per training image (default: rendered from
            the shapes world that `config.data` lies in).
        encoder: the model to train in place (default: `load_encoder(config.model, config.pretrained)`);
            `FeaturePairs` need a `lace-towers` encoder here, `TopPairs` a `TowersTop`.
    Runs distributed when started by torchrun (environment variables set).
    """
    config.validate()
    already_initialised = dist.is_available() and dist.is_initialized()
    context = init_distributed(resolve_device(config.device), timeout=config.dist_timeout)
    try:
        return Trainer(config, context, editor, dataset, progress, on_batch, local_editor, rendered, encoder).run()
    finally:
        if not already_initialised:
            shutdown_distributed()


class Trainer:
    """State of one run; `run()` trains it to `total_steps`."""

    def __init__(self, config: TrainConfig, context: DistributedContext, editor, dataset, progress: bool,
                 on_batch: Callable[[int, list[int]], None] | None, local_editor=None,
                 rendered: RenderedNegatives | None = None, encoder: DualEncoder | None = None):
        self.config, self.context, self.progress, self.on_batch = config, context, progress, on_batch
        self.device = context.device
        if config.batch_size % context.world_size:
            raise LaceInputError(
                f"train config: field 'batch_size': expected a multiple of the {context.world_size} processes "
                f"(got {config.batch_size})"
            )
        self.run_dir = self._prepare_run_dir()
        torch.manual_seed(config.seed)  # the same initial weights in every process and every ablation
        if encoder is None:
            encoder = load_encoder(config.model, config.pretrained, device="cpu")
        self.encoder = encoder.to(self.device)
        self.config = config = choose_loss(config, self.encoder, log=context.is_main)
        self.logit_bias = logit_bias_of(self.encoder)
        self.pairs, self.skipped_images = self._training_pairs(dataset)
        self.features = isinstance(self.pairs, (FeaturePairs, TopPairs))
        self.tops = isinstance(self.pairs, TopPairs)
        if self.features:
            self._check_feature_run(local_editor)
        self.order = TrainingOrder(self.pairs.n_captions, config.batch_size, config.seed)
        self.total_steps = config.steps
        if config.epochs is not None:
            self.total_steps = math.ceil(config.epochs * self._batches_per_epoch() / config.grad_accumulation)
        self.editor = None
        if config.uses_counterfactuals:
            self.editor = editor if editor is not None else run_editor(config, self.encoder)
            check_editor_dimension(self.editor, self.encoder.embed_dim, config.dictionary or "editor")
        self.rules = None
        if config.uses_rule_captions and not self.features:
            self.rules = RuleNegatives(load_vocabulary(config.vocabulary), config.rule_negative_kinds)
        self.describer = None  # writes the caption each image edit describes (pairs rows, provenance figures)
        describable = not self.features or self.tops and not self.pairs.missing_for_descriptions(
            config.uses_rule_captions)
        if config.uses_image_edits and config.vocabulary is not None and describable:
            self.describer = RuleNegatives(load_vocabulary(config.vocabulary))
        self.local_editor = local_editor if config.local_image_negatives else None  # an arm takes only its own
        if config.local_image_negatives and local_editor is None:
            self.local_editor = self._fit_local_editor()
        self.local_upkeep = None  # refits and fidelity of the editor (pixels only: the cached maps are frozen)
        if self.local_editor is not None and not self.tops:
            self.local_upkeep = LocalEditorUpkeep(config.local, self._fit_local_editor,
                                                  fidelity_probe(config, self.encoder, context.is_main))
        self.concept_token_ids = None
        if config.local_caption_swaps:
            self.concept_token_ids = group_token_ids(self.encoder.tokenize, load_vocabulary(config.vocabulary),
                                                     config.local.group)
        self.rendered = rendered if config.rendered_negatives else None
        if config.rendered_negatives and rendered is None:
            self.rendered = self._render_negatives()
        self.bf16 = config.precision == "bf16" or (config.precision == "auto" and self.device.type == "cuda")
        pretrained = getattr(self.encoder, "pretrained_parameters", list)()
        self.optimizer = build_optimizer(self.encoder, config.lr, config.weight_decay, (config.beta1, config.beta2),
                                         config.eps, frozenset(map(id, pretrained)), config.pretrained_lr_scale)
        self.model = self.encoder
        if context.enabled:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.encoder, device_ids=device_ids)
        self.step = 0
        self.samples_seen = 0
        self.pool_images: deque[torch.Tensor] = deque()
        self.pool_texts: deque[torch.Tensor] = deque()
        self.refit_images: torch.Tensor | None = None
        self.refit_texts: torch.Tensor | None = None
        self.checkpoint_path: Path | None = None
        if self.resume_from is not None:
            self._resume()
        elif context.is_main:
            atomic_write_json(self.run_dir / CONFIG_FILE, config_to_dict(config))
        self.metrics_path = self.run_dir / METRICS_FILE

    # ---- set-up -----------------------------------------------------------------------

    def _prepare_run_dir(self) -> Path:
        run_dir = Path(self.config.output)
        # None: a fresh start ('auto' without a whole checkpoint)
        self.resume_from = checkpoints.resume_point(run_dir, self.config.resume)
        if self.resume_from is None and self.context.is_main:
            if self.config.resume == "auto":
                checkpoints.clear_unstarted_run(run_dir)
            prepare_output_dir(run_dir, self.config.overwrite)
        barrier(self.context)
        return run_dir

    def _check_feature_run(self, local_editor) -> None:
        """Refuse what a run over cached tower features or cached tower-top inputs cannot do."""
        config = self.config
        what, method = ("tower-top inputs", "encode_image_states") if self.tops else ("tower features",
                                                                                       "forward_features")
        where = f"train config (cached {what})"
        if not hasattr(self.encoder, method):
            expected = "a TowersTop" if self.tops else "a lace-towers encoder"
            raise LaceInputError(f"{where}: field 'model': expected {expected} passed in, "
                                 f"got {type(self.encoder).__name__}")
        if self.context.enabled:
            raise LaceInputError(f"{where}: expected one process (got {self.context.world_size})")
        negatives = self.pairs.negative_states if self.tops else self.pairs.negative_features
        if config.uses_rule_captions and negatives is None:
            raise LaceInputError(f"{where}: fields 'caption_negatives' / 'paired_caption_directions': expected the "
                                 f"cached {'token states' if self.tops else 'features'} of the rule-made captions in "
                                 f"the {type(self.pairs).__name__}")
        if self.tops and config.local_image_negatives and local_editor is None:
            raise LaceInputError(f"{where}: field 'local_image_negatives': expected a fitted lace.local.maps.MapEditor "
                                 "passed in as local_editor (the maps' objects are found on the cached maps)")
        upkeep = [f"local.{name}" for name in ("refresh_every", "fidelity_every") if getattr(config.local, name)]
        if self.tops and config.local_image_negatives and upkeep:
            raise LaceInputError(f"{where}: fields {upkeep}: expected 0 (the maps below the cut are frozen, so a "
                                 "refit would give the same MapEditor; the fidelity needs the pixels)")
        below_cut = ["local_caption_swaps", "rendered_negatives"]
        if not self.tops:  # pooled features: no maps to edit, no token states to write an edit's caption into
            below_cut = ["paired_caption_directions", "local_image_negatives", "edited_image_rows", *below_cut]
        unsupported = [name for name in below_cut if getattr(config, name)]
        if unsupported:
            raise LaceInputError(f"{where}: fields {unsupported}: expected off (they need pixels or tokens)")
        missing = self.pairs.missing_for_descriptions(config.uses_rule_captions) if self.tops else []
        if config.edited_image_rows and missing:
            raise LaceInputError(f"{where}: field 'edited_image_rows': expected the TopPairs' {' and '.join(missing)} "
                                 "(each edit's caption is written from the caption texts, and its token states made "
                                 "through the text tower below the cut)")

    def _batches_per_epoch(self) -> int:
        """Batches in one of `--epochs`: a pass over the rows (image-caption pairs) of data read from a file, as
        open_clip_train counts an epoch; a pass over the images of in-memory pairs and cached features (the
        studies' heads and tower tops)."""
        if isinstance(self.pairs, ImagePairs):
            return max(1, sum(self.pairs.n_captions) // self.config.batch_size)
        return self.order.batches_per_epoch

    def _training_pairs(self, dataset) -> tuple[ImagePairs | TensorPairs | FeaturePairs | TopPairs, int]:
        config = self.config
        if isinstance(dataset, (TensorPairs, FeaturePairs, TopPairs)):
            return dataset, 0
        if dataset is None:
            if config.data is None:
                raise LaceInputError("train config: field 'data': expected a dataset path (--data)")
            dataset = read_dataset(config.data, split=config.split, image_root=config.image_root,
                                   csv_columns=(config.csv_img_key, config.csv_caption_key, config.csv_separator))
        if not isinstance(dataset, ImageTextDataset):
            raise LaceInputError(f"train(): expected an ImageTextDataset or TensorPairs, got {type(dataset).__name__}")
        dataset, missing = drop_missing_images(dataset, config.on_missing_image)
        if missing and self.context.is_main:
            logger.warning("%s: skipped %d record(s) whose image file is missing", dataset.source, missing)
        pairs = ImagePairs(dataset, self.encoder.preprocess_train, config.seed,
                           skip_unreadable=config.on_missing_image == "skip", cache_images=config.cache_images)
        return pairs, missing

    def _fit_images(self, count: int) -> tuple[torch.Tensor, list[list[str]]]:
        """The first `count` training images (N, 3, H, W) in the model's input format, with their captions."""
        if isinstance(self.pairs, TensorPairs):
            count = min(count, len(self.pairs))
            return self.pairs.pixels[:count], [list(c) for c in self.pairs.captions[:count]]
        dataset = self.pairs.dataset
        count = min(count, len(dataset))
        pixels = torch.stack([self.encoder.preprocess(dataset.load_image(i)) for i in range(count)])
        return pixels, [list(dataset.records[i].captions) for i in range(count)]

    def _fit_local_editor(self):
        pixels, captions = self._fit_images(self.config.local.fit_images)
        normalise = self.encoder.preprocess.transforms[-1]
        with torch.random.fork_rng(devices=[]):  # fitting leaves the run's random stream as it was
            return build_local_editor(self.config.local, self.encoder.model, pixels.to(self.device), captions,
                                      normalise, load_vocabulary(self.config.vocabulary), seed=self.config.seed)

    def _render_negatives(self) -> RenderedNegatives:
        if isinstance(self.pairs, TensorPairs):
            raise LaceInputError("train(): rendered_negatives with in-memory pairs needs `rendered` passed in")
        records = self.pairs.dataset.records
        return rendered_negatives(world_of(self.config.data), [Path(r.image_path).stem for r in records],
                                  self.encoder.preprocess)

    def _resume(self) -> None:
        config = self.config
        saved_path = self.run_dir / CONFIG_FILE
        if saved_path.is_file():
            saved = json.loads(saved_path.read_text(encoding="utf-8"))
            current = config_to_dict(config)
            changed = [k for k in RESUME_INVARIANTS if k in saved and saved[k] != current[k]]
            if changed:
                raise LaceInputError(
                    f"{saved_path}: cannot resume with a different {', '.join(changed)} "
                    f"(run has {[saved[k] for k in changed]}, given {[current[k] for k in changed]})"
                )
        manifest = self.resume_from
        checkpoint = checkpoints.load_checkpoint(manifest, self.run_dir)
        state = checkpoint.state
        if state.get("world_batch") != [config.batch_size, config.grad_accumulation]:
            raise LaceInputError(f"{manifest}: saved with batch size / accumulation {state.get('world_batch')}, "
                                 f"resumed with {[config.batch_size, config.grad_accumulation]}")
        self.encoder.load_state_dict(checkpoint.weights)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.samples_seen = int(state["samples_seen"])
        self.skipped_images = int(state["skipped_images"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None and state["cuda_rng"].numel():
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        if state.get("pool_images") is not None and state["pool_images"].numel():
            sizes = state["pool_sizes"].tolist() if "pool_sizes" in state else [state["pool_images"].shape[0]]
            self.pool_images.extend(state["pool_images"].to(self.device).split(sizes))
            self.pool_texts.extend(state["pool_texts"].to(self.device).split(sizes))
        if state.get("refit_images") is not None and state["refit_images"].numel() and self.editor is not None:
            # Refitting on the saved pool rebuilds the dictionary the run was using.
            self.refit_images, self.refit_texts = state["refit_images"], state["refit_texts"]
            self.editor = refresh_editor(self.editor, self.refit_images, self.refit_texts)
        if self.local_upkeep is not None:  # the local editor in use at the checkpoint, refitted since or not
            self.local_editor = self.local_upkeep.restore(state.get("local_editor"), self.local_editor)
        self.checkpoint_path = manifest
        if self.context.is_main:
            _truncate_metrics(self.run_dir / METRICS_FILE, self.step)

    # ---- one micro-batch ----------------------------------------------------------------

    def _micro_step(self, batch, number: int) -> tuple[torch.Tensor, dict]:
        config = self.config
        if isinstance(batch, TopBatch):
            U, V, scale, negatives = self._embed_tops(batch, number)
        elif isinstance(batch, FeatureBatch):
            U, V, scale, negatives = self._embed_features(batch, number)
        else:
            U, V, scale, negatives = self._embed_pixels(batch, number)
        n = U.shape[0]
        gallery_images, offset = gather_with_grad(U, self.context)
        gallery_texts, _ = gather_with_grad(V, self.context)
        false_negatives = self._false_negatives(batch, offset) if config.mask_duplicate_pairs else None
        loss, plain = contrastive_losses(config.loss, U, V, scale, self.logit_bias, negatives,
                                         config.counterfactual_weight, gallery_images=gallery_images,
                                         gallery_texts=gallery_texts, row_offset=offset,
                                         false_negatives=false_negatives)
        rows = None
        if negatives.edited:
            if config.edited_image_rows:
                text = config.edited_rows_train_text
                rows = pair_rows(negatives.edited, self._encode_described if text else self._encode_constants)
                bias = self.logit_bias if config.loss == "sigmoid" else None
                term = pair_term(rows, U, V if text else V.detach(), scale, bias, self.context,
                                 config.edited_rows_real_image_negative)
                loss = loss + config.edited_rows_weight * term
            else:  # a columns-only arm at a logged step: its edits' captions, for the provenance figures alone
                with torch.no_grad():
                    rows = pair_rows(negatives.edited, self._encode_described)
        if config.refresh_dictionary_every and self.editor is not None:
            # every process pools the whole global batch, in its global order: the refit then sees
            # the rows one process would, however many processes share the batch
            self.pool_images.append(gallery_images.detach())
            self.pool_texts.append(gallery_texts.detach())
            _trim(self.pool_images, config.refresh_pool_size)
            _trim(self.pool_texts, config.refresh_pool_size)
        # Tensors, not numbers: reading them out each micro-batch would stall the GPU; `_log` does it.
        stats = {"loss": loss.detach(), "plain_loss": plain, "samples": n, "skipped": batch.skipped,
                 "caption_valid": _valid_rows(negatives.caption_valid),
                 "image_valid": _valid_rows(negatives.image_valid),
                 "pair_valid": _valid_rows(rows.valid) if rows is not None and config.edited_image_rows else 0.0,
                 "rule_collisions": float(negatives.rule_collisions)}
        if rows is not None and self._measures_provenance(number):
            stats["provenance"] = _provenance_sums(U, V, rows)
        return loss, stats

    def _false_negatives(self, batch, offset: int) -> torch.Tensor:
        """(B, G) bool: the other copies of each row's image or caption among all processes' pairs."""
        images, captions = (keys.to(self.device) for keys in pair_keys(batch))
        gallery_images, _ = gather_with_grad(images, self.context)
        gallery_captions, _ = gather_with_grad(captions, self.context)
        return duplicate_pairs(images, captions, gallery_images, gallery_captions, row_offset=offset)

    def _embed_pixels(self, batch, number: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Negatives]:
        """Encode a micro-batch of pixels and captions (plus rule-made captions): U, V (B, d), the scale and
        the negatives."""
        config = self.config
        n = len(batch.captions)
        texts = batch.captions
        rule_valid = None
        epoch = number // self.order.batches_per_epoch
        if self.rules is not None:
            keys = [(config.seed, epoch, index) for index in batch.indices]
            rule_texts, rule_valid = rule_made_captions(self.rules, batch.captions, keys,
                                                        config.rule_negatives_per_caption)
            texts = batch.captions + rule_texts
        tokens = self.encoder.tokenize(texts)
        local_pass = None
        if self.local_editor is not None:  # U and the local negatives come from one pass of the image tower
            local_pass = LocalImagePass(self.local_editor, self.encoder.model, config.local.n_edits,
                                        self._row_seeds(epoch, batch.indices, LOCAL_STREAM))
        with self._autocast():
            U, all_texts, scale = self.model(batch.pixels.to(self.device, non_blocking=True),
                                             tokens.to(self.device, non_blocking=True), encode_images=local_pass)
        U, all_texts, scale = U.float(), all_texts.float(), scale.float()
        V = all_texts[:n]  # (B, d)
        made = BatchSources()
        if rule_valid is not None:
            per_caption = config.rule_negatives_per_caption
            rule_texts = all_texts[n:].view(n, per_caption, -1)  # (B, R, d)
            made.rule_captions = (rule_texts, rule_valid.to(self.device))
            made.rule_strings = [texts[n + b * per_caption:n + (b + 1) * per_caption] for b in range(n)]
        if local_pass is not None:
            made.local_images = (local_pass.negatives.float(), local_pass.valid)
            made.local_changes = local_pass.changes
        with self._autocast():
            if self.concept_token_ids is not None:
                embeddings, valid = local_caption_negatives(self.encoder.model, tokens.to(self.device),
                                                            self.concept_token_ids, config.local.text_layer)
                made.local_captions = (embeddings.float(), valid.to(self.device))
            if self.rendered is not None:
                rendered, valid = self.rendered.batch(batch.indices)
                embeddings = self.encoder.encode_images(rendered.to(self.device)).float()  # (B, d)
                made.rendered_images = (embeddings[:, None], valid.to(self.device))
                made.rendered_changes = self.rendered.batch_changes(batch.indices)
        describe = None
        if self.describer is not None and (config.edited_image_rows or self._measures_provenance(number)):
            describe = partial(describe_slots, self.describer, batch.captions)
        return U, V, scale, self._negatives(U, V, epoch, batch.indices, made, describe)

    def _embed_features(self, batch: FeatureBatch, number: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                          Negatives]:
        """The heads over a micro-batch of cached tower features: U, V (B, d), the scale and the negatives."""
        U, V, scale = self.encoder.forward_features(batch.image_features.to(self.device),
                                                    batch.text_features.to(self.device))
        made = BatchSources()
        if self.config.uses_rule_captions:
            rule_texts = self.encoder.head_text(batch.negative_features.to(self.device))  # (B, d)
            made.rule_captions = (rule_texts.unsqueeze(1), batch.negative_valid.to(self.device).unsqueeze(1))
        return U, V, scale, self._negatives(U, V, number // self.order.batches_per_epoch, batch.indices, made)

    def _embed_tops(self, batch: TopBatch, number: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Negatives]:
        """The trainable tops and heads over a micro-batch of cached maps and token states: U, V (B, d), the scale
        and the negatives (rule-made captions from their cached token states, LACE-local on the maps)."""
        config, pairs, top = self.config, self.pairs, self.encoder
        epoch = number // self.order.batches_per_epoch
        maps = batch.maps.to(self.device)
        U = top.encode_image_states(maps)
        V = encode_captions(top, pairs.token_states, batch.caption_rows)
        made = BatchSources()
        describe = None
        if self.describer is not None and (config.edited_image_rows or self._measures_provenance(number)):
            captions = [pairs.caption_texts[row] for row in batch.caption_rows]
            describe = partial(describe_slots, self.describer, captions)
        if config.uses_rule_captions:
            rows = pairs.negative_of_caption[batch.caption_rows]
            valid = torch.from_numpy(rows >= 0).to(self.device)
            rule_texts = V.new_zeros(len(rows), top.embed_dim)
            if valid.any():
                rule_texts = rule_texts.index_put((valid,), encode_captions(top, pairs.negative_states, rows[rows >= 0]))
            made.rule_captions = (rule_texts[:, None], valid[:, None])
            if describe is not None:  # the paired directions' captions and the rule collisions read them
                made.rule_strings = [[pairs.negative_texts[row] if row >= 0 else caption]  # as rule_made_captions
                                     for row, caption in zip(rows, captions)]
        if self.local_editor is not None:
            embeddings, valid, made.local_changes = map_negatives(
                top.encode_image_states, top.embed_dim, self.local_editor, maps, config.local.n_edits,
                self._row_seeds(epoch, batch.indices, LOCAL_STREAM))
            made.local_images = (embeddings, valid)
        return U, V, top.logit_scale.exp(), self._negatives(U, V, epoch, batch.indices, made, describe)

    def _negatives(self, U: torch.Tensor, V: torch.Tensor, epoch: int, indices: list[int],
                   made: BatchSources, describe=None) -> Negatives:
        """The arm's negatives of the rows (B,) `indices` of `epoch` (`arm_negatives`; `describe` writes the captions
        of image edits, for the pairs rows and the provenance figures).

        Each row draws its edits from its own generator, seeded by (seed, epoch, image): a row gets the
        same edits whatever other rows share its batch, so W processes draw what one process draws.
        """
        generators = None
        if self.editor is not None:  # CPU generators: tiny draws per row, one copy to the device
            generators = RowGenerators(self._row_seeds(epoch, indices, EDIT_STREAM))
        return arm_negatives(self.config, self.editor, U, V, generators, made, describe)

    def _measures_provenance(self, number: int) -> bool:
        """Whether micro-batch `number` is the last one of a logged step (its provenance figures are logged)."""
        accumulation = self.config.grad_accumulation
        step = number // accumulation + 1
        last = number % accumulation == accumulation - 1
        return last and (step % self.config.log_every == 0 or step == self.total_steps)

    def _encode_described(self, texts: list[str]) -> torch.Tensor:
        """(n,) described captions -> (n, d) unit embeddings with gradient (the text tower outside the joint pass,
        as the rendered images are encoded; on cached tower-top inputs, their token states made below the cut
        (`TopPairs.state_encoder`), then the trainable text top, as the cached captions take it)."""
        # Read for the provenance figures alone (no gradient), they leave the run's random stream (the text tower's
        # dropout) as it was: a columns-only arm trains as it would without them.
        devices = [self.device] if self.device.type == "cuda" else []
        with nullcontext() if torch.is_grad_enabled() else torch.random.fork_rng(devices=devices):
            if self.tops:
                states, mask = self.pairs.state_encoder(texts)
                return self.encoder.encode_text_states(states, mask)
            with self._autocast():
                return self.encoder.encode_texts(texts).float()

    def _encode_constants(self, texts: list[str]) -> torch.Tensor:
        """`_encode_described` without gradient: (n, d) constants, the run's random stream left as it was."""
        with torch.no_grad():
            return self._encode_described(texts)

    def _row_seeds(self, epoch: int, indices: list[int], stream: int) -> list[int]:
        return row_seeds(self.config.seed, [(epoch, index) for index in indices], stream)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> TrainResult:
        config, context = self.config, self.context
        accumulation = config.grad_accumulation
        loader = DataLoader(
            self.pairs,
            batch_sampler=RankBatches(self.order, self.step * accumulation, self.total_steps * accumulation,
                                      context.rank, context.world_size),
            collate_fn=self.pairs.collate if self.features else collate, num_workers=config.num_workers, pin_memory=self.device.type == "cuda",
        )
        batches = iter(loader)
        writer = self._tensorboard()
        bar = tqdm(total=self.total_steps, initial=self.step, disable=not (self.progress and context.is_main),
                   desc="train", unit="step")
        window: list[dict] = []
        window_started = time.perf_counter()
        last_metrics: dict = {}
        self.encoder.train()
        with StopRequest() as stop, WatchCollectives(context, config.dist_timeout) as watch:
            while self.step < self.total_steps:
                watch.step, watch.checkpoint = self.step + 1, self.checkpoint_path
                lr = cosine_lr(self.step, config.lr, config.warmup_steps, self.total_steps)
                set_lr(self.optimizer, lr)
                for k in range(accumulation):
                    number = self.step * accumulation + k
                    batch = next(batches)
                    if self.on_batch is not None:
                        self.on_batch(number, list(batch.indices))
                    sync = k == accumulation - 1 or not context.enabled
                    with nullcontext() if sync else self.model.no_sync():
                        loss, stats = self._micro_step(batch, number)
                        (loss / accumulation).backward()
                    window.append(stats)
                if config.grad_clip_norm is not None:
                    torch.nn.utils.clip_grad_norm_(self.encoder.parameters(), config.grad_clip_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                clamp_logit_scale(self.encoder.logit_scale)
                self.step += 1
                if config.refresh_dictionary_every and self.editor is not None \
                        and self.step % config.refresh_dictionary_every == 0:
                    self._refresh_dictionary()
                fidelity_due = self._tend_local_editor()
                stop_now = stop.agreed(context)  # Ctrl-C, SIGTERM, SIGUSR1: save this step, then stop
                checkpoint_now = (config.checkpoint_every and self.step % config.checkpoint_every == 0) \
                    or self.step == self.total_steps or stop_now
                # Log at checkpoints too, so the counters a checkpoint saves include every batch before it.
                if self.step % config.log_every == 0 or checkpoint_now or fidelity_due:
                    last_metrics = self._log(window, time.perf_counter() - window_started, lr, writer)
                    bar.set_postfix(loss=f"{last_metrics['loss']:.4f}", lr=f"{lr:.2e}",
                                    samples_per_s=f"{last_metrics['samples_per_second']:.0f}")
                    window, window_started = [], time.perf_counter()
                if checkpoint_now:
                    self._save_checkpoint()
                bar.update(1)
                if stop_now and self.step < self.total_steps:
                    bar.close()
                    raise stop.stopped(self.step, self.checkpoint_path)
        bar.close()
        if writer is not None:
            writer.close()
        barrier(context)
        return TrainResult(self.encoder, self.run_dir, self.run_dir / METRICS_FILE, self.checkpoint_path,
                           self.step, self.skipped_images, last_metrics)

    def _tend_local_editor(self) -> bool:
        """After step `self.step`: refit the local editor when due (`LocalEditorUpkeep`); True when the step's
        local fidelity is due, so that its metrics line is written."""
        if self.local_upkeep is None:
            return False
        self.local_editor, fidelity_due = self.local_upkeep.after_step(self.step, self.local_editor)
        return fidelity_due

    def _refresh_dictionary(self) -> None:
        self.refit_images = torch.cat(list(self.pool_images)).cpu()
        self.refit_texts = torch.cat(list(self.pool_texts)).cpu()
        self.editor = refresh_editor(self.editor, self.refit_images, self.refit_texts)
        check_editor_dimension(self.editor, self.encoder.embed_dim, "refreshed dictionary")

    def _log(self, window: list[dict], seconds: float, lr: float, writer) -> dict:
        keys = ("loss", "plain_loss", "caption_valid", "image_valid", "pair_valid", "rule_collisions")
        measured = [s["provenance"] for s in window if "provenance" in s]
        provenance = [float(sum(m[name] for m in measured)) for name in (*PROVENANCE_FIGURES, "n")]
        local = [float(sum(s[k] for s in window)) for k in keys] + provenance + [
            sum(s["samples"] for s in window), sum(s["skipped"] for s in window), len(window)]
        totals = sum_over_processes(local, self.context)
        provenance_totals = totals[len(keys):len(keys) + len(provenance)]
        count = totals[-1]
        samples, skipped = int(totals[-3]), int(totals[-2])
        self.samples_seen += samples
        self.skipped_images += skipped
        metrics = {
            "step": self.step,
            "epoch": self.step * self.config.grad_accumulation / self.order.batches_per_epoch,
            "loss": totals[0] / count,
            "plain_loss": totals[1] / count,
            "lr": lr,
            "logit_scale": float(self.encoder.logit_scale.exp().item()),
            **({"logit_bias": float(self.logit_bias.item())} if self.logit_bias is not None else {}),
            "samples_per_second": samples / max(seconds, 1e-9),
            "caption_negatives_valid_rows": totals[2] / max(samples, 1),
            "image_negatives_valid_rows": totals[3] / max(samples, 1),
            **({"pair_rows_valid": totals[4] / max(samples, 1)} if self.config.edited_image_rows else {}),
            **({"rule_collision_rows": totals[5] / max(samples, 1)}
               if self.config.edited_image_rows and self.config.caption_negatives else {}),
            **_provenance_metrics(provenance_totals),
            "samples_seen": self.samples_seen,
            "skipped_images": self.skipped_images,
            **(self.local_upkeep.metrics() if self.local_upkeep is not None else {}),
        }
        if self.context.is_main:
            with open(self.run_dir / METRICS_FILE, "a", encoding="utf-8") as f:
                f.write(json.dumps(metrics) + "\n")
            if writer is not None:
                for key, value in metrics.items():
                    if key != "step":
                        writer.add_scalar(f"train/{key}", value, self.step)
        _refuse_diverged(metrics, self.checkpoint_path)
        return metrics

    def _save_checkpoint(self) -> None:
        if not self.context.is_main:
            barrier(self.context)
            return
        empty = torch.zeros(0)
        pool_images = torch.cat(list(self.pool_images)).cpu() if self.pool_images else empty
        pool_texts = torch.cat(list(self.pool_texts)).cpu() if self.pool_texts else empty
        state = {
            "step": self.step,
            "micro_batch": self.step * self.config.grad_accumulation,
            "world_batch": [self.config.batch_size, self.config.grad_accumulation],
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else empty,
            "samples_seen": self.samples_seen,
            "skipped_images": self.skipped_images,
            "pool_images": pool_images,
            "pool_texts": pool_texts,
            # the pool's micro-batches, so that a resumed run trims it as the uninterrupted run does
            "pool_sizes": torch.tensor([t.shape[0] for t in self.pool_images], dtype=torch.long),
            "refit_images": self.refit_images if self.refit_images is not None else empty,
            "refit_texts": self.refit_texts if self.refit_texts is not None else empty,
            **({"local_editor": self.local_upkeep.state(self.local_editor)} if self.local_upkeep is not None else {}),
        }
        self.checkpoint_path = checkpoints.save_checkpoint(
            self.run_dir, self.step, self.encoder.state_dict(), state, keep=self.config.keep_checkpoints)
        barrier(self.context)

    def _tensorboard(self):
        if not (self.config.tensorboard and self.context.is_main):
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            logger.warning("tensorboard is not installed; metrics go to %s only", METRICS_FILE)
            return None
        return SummaryWriter(str(self.run_dir / "tensorboard"))


def _trim(pool: deque, size: int) -> None:
    while sum(t.shape[0] for t in pool) - pool[0].shape[0] >= size:
        pool.popleft()


PROVENANCE_FIGURES = (*PREFERENCES, "edit_cosine")


def _provenance_sums(U: torch.Tensor, V: torch.Tensor, rows) -> dict[str, float]:
    """The provenance figures (`lace.provenance`) of a micro-batch's rows with a describable edit, the first
    such slot of each, as sums over those rows (and their count "n"), so that windows and processes add up."""
    valid = rows.valid  # (B, P)
    first = valid.float().argmax(dim=1)  # (B,) the first valid slot (0 where none, masked below)
    picked = torch.arange(len(first), device=first.device)
    figures = provenance_preferences(U, V, rows.images[picked, first], rows.captions[picked, first], valid.any(dim=1))
    count = figures["n"]
    return {**{name: figures[name] * count if count else 0.0 for name in PROVENANCE_FIGURES}, "n": count}


def _provenance_metrics(totals: list[float]) -> dict[str, float]:
    """Summed provenance figures and their count -> `provenance_<figure>` means (nothing when none was measured)."""
    count = totals[-1]
    if not count:
        return {}
    return {f"provenance_{name}": total / count for name, total in zip(PROVENANCE_FIGURES, totals)}


def _valid_rows(valid: torch.Tensor | None) -> torch.Tensor | float:
    return valid.any(dim=1).sum() if valid is not None else 0.0


def _refuse_diverged(metrics: dict, latest: Path | None) -> None:
    """Stop a run whose logged loss is NaN or inf, before a checkpoint of its weights can be written: every
    process reads the same summed figures, so all stop together and the latest checkpoint stays finite."""
    if math.isfinite(metrics["loss"]):
        return
    kept = f"the latest checkpoint, {latest}, is from before" if latest is not None else "no checkpoint was written"
    raise LaceInputError(
        f"train: the loss is {metrics['loss']} at step {metrics['step']}; the run diverged or its data holds NaN/inf, "
        f"and {kept}; lower --lr, set --grad-clip-norm, or check the data, then resume or start again"
    )


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines logged after the checkpoint being resumed (they will be logged again)."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if (record := _metrics_record(line)) is not None and record.get("step", 0) <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _metrics_record(line: str) -> dict | None:
    """A metrics line as a dict; None for a blank line or one cut short by a process killed mid-append."""
    try:
        record = json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
