"""`train`: the training loop shared by plain (pre)training, LACE and its ablations.

One optimiser step = `grad_accumulation` micro-batches of `batch_size` pairs (global), each its own contrastive
loss. Per micro-batch: the run's embed path (`lace.train.paths`: pixels, cached features or tower tops) encodes
images and captions, the negative sources its arm switches on (`lace.train.sources`) make their negatives, the
embeddings of all processes are gathered, and the loss of this process's rows is taken. The trainer holds the
optimiser, data parallelism, the step loop, checkpoints and the run folder; what differs between grounds and arms
lives in the path and the sources.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from lace.config import config_to_dict
from lace.data import ImageTextDataset
from lace.distributed import DistributedContext, init_distributed, shutdown_distributed
from lace.encoders import DualEncoder, load_encoder
from lace.encoders.weights import RUN_CONFIG
from lace.errors import LaceInputError
from lace.io import atomic_write_json, prepare_output_dir
from lace.losses import duplicate_pairs
from lace.progress import dependency_bars, shows_bars
from lace.train import checkpoints
from lace.train.config import TrainConfig
from lace.train.data import RankBatches, TrainingOrder, pair_keys
from lace.train.distributed import barrier, gather_with_grad
from lace.train.interrupt import StopRequest
from lace.train.loss_choice import choose_loss, contrastive_losses, logit_bias_of
from lace.train.lost_rank import WatchCollectives
from lace.train.metrics import MetricWindow, log_window, truncate_metrics
from lace.train.metrics_writer import METRICS_FILE, MetricsWriter, start_line
from lace.train.negatives import Negatives, valid_rows
from lace.train.optim import build_optimizer, clamp_logit_scale, cosine_lr, set_lr
from lace.train.paths import MicroBatch, Run, TrainingPairs, embed_path, total_steps, training_pairs
from lace.train.rendered import RenderedNegatives
from lace.train.sources import build_sources

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
    dataset: ImageTextDataset | TrainingPairs | None = None,
    progress: bool = True,
    on_batch: Callable[[int, list[int]], None] | None = None,
    local_editor=None,
    rendered: RenderedNegatives | None = None,
    encoder: DualEncoder | None = None,
    console: bool = True,
) -> TrainResult:
    """Train `config.run.model` on `dataset` (default: read `config.run.data`) as `config` says.

    Args:
        editor: a `lace.edits.CounterfactualEditor` (default: built from `config.run.dictionary`
            and `config.run.vocabulary` when counterfactuals are on).
        dataset: an `ImageTextDataset`, in-memory `TensorPairs`, cached tower `FeaturePairs`, cached tower-top
            inputs `TopPairs`, or None to read `config.run.data`.
        on_batch: called as `on_batch(micro_batch_number, dataset_indices)` for every
            micro-batch this process trains on (to record the data order).
        local_editor: the fitted local image editor of `local_image_negatives` (default: fitted on the
            training images before the first step; with `TopPairs`, a `lace.local.maps.MapEditor` passed in);
            `local.refresh_every` replaces it by refits from `config.negatives.local` (`lace.train.local_refresh`).
        rendered: the ceiling arm's `RenderedNegatives`, one per training image (default: rendered from
            the shapes world that `config.run.data` lies in).
        encoder: the model to train in place (default: `load_encoder(config.run.model, config.run.pretrained)`);
            `FeaturePairs` need a `lace-towers` encoder here, `TopPairs` a `TowersTop`.
        console: print the start line and a line per logged step on stdout (docs/logging.md); off for runs an
            experiment makes by the dozen.
    Runs distributed when started by torchrun (environment variables set).
    """
    config.validate()
    already_initialised = dist.is_available() and dist.is_initialized()
    context = init_distributed(resolve_device(config.run.device), timeout=config.run.dist_timeout)
    try:
        with dependency_bars(shows_bars(progress)):  # no "Loading weights" bar from transformers under --no-progress
            return Trainer(config, context, editor, dataset, progress, on_batch, local_editor, rendered, encoder,
                           console).run()
    finally:
        if not already_initialised:
            shutdown_distributed()


class Trainer:
    """State of one run; `run()` trains it to `total_steps`."""

    def __init__(self, config: TrainConfig, context: DistributedContext, editor, dataset, progress: bool,
                 on_batch: Callable[[int, list[int]], None] | None, local_editor=None,
                 rendered: RenderedNegatives | None = None, encoder: DualEncoder | None = None, console: bool = True):
        self.config, self.context, self.progress, self.on_batch = config, context, progress, on_batch
        self.console = console
        self.device = context.device
        if config.run.batch_size % context.world_size:
            raise LaceInputError(
                f"train config: field 'batch_size': expected a multiple of the {context.world_size} processes "
                f"(got {config.run.batch_size})"
            )
        self.run_dir = self._prepare_run_dir()
        torch.manual_seed(config.run.seed)  # the same initial weights in every process and every ablation
        if encoder is None:
            encoder = load_encoder(config.run.model, config.run.pretrained, device="cpu")
        self.encoder = encoder.to(self.device)
        self.config = config = choose_loss(config, self.encoder, log=context.is_main)
        self.logit_bias = logit_bias_of(self.encoder)
        self.pairs, self.skipped_images = training_pairs(dataset, config, self.encoder, context)
        bf16 = config.run.precision == "bf16" or (config.run.precision == "auto" and self.device.type == "cuda")
        run = Run(config, context, self.encoder, self.pairs, self.logit_bias, bf16, model=self.encoder)
        self.path = embed_path(run)
        given = {"editor": editor, "local_editor": local_editor, "rendered": rendered}
        self.path.check(given)
        self.order = TrainingOrder(self.pairs.n_captions, config.run.batch_size, config.run.seed)
        self.total_steps = total_steps(config, self.pairs, self.order)
        self.sources = build_sources(run, self.path, given)
        pretrained = getattr(self.encoder, "pretrained_parameters", list)()
        self.optimizer = build_optimizer(self.encoder, config.optim.lr, config.optim.weight_decay, (config.optim.beta1, config.optim.beta2),
                                         config.optim.eps, frozenset(map(id, pretrained)), config.optim.pretrained_lr_scale)
        self.model = self.encoder
        if context.enabled:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = run.model = DistributedDataParallel(self.encoder, device_ids=device_ids)
        self.step = 0
        self.samples_seen = 0
        self.checkpoint_path: Path | None = None
        if self.resume_from is not None:
            self._resume()
        if context.is_main:  # a resumed run records what it now runs to (its steps, its schedule)
            atomic_write_json(self.run_dir / RUN_CONFIG, config_to_dict(config))
        self.metrics_path = self.run_dir / METRICS_FILE

    # ---- the run folder ---------------------------------------------------------------

    def _prepare_run_dir(self) -> Path:
        run_dir = Path(self.config.run.output)
        # None: a fresh start ('auto' without a whole checkpoint)
        self.resume_from = checkpoints.resume_point(run_dir, self.config.run.resume)
        if self.resume_from is None and self.context.is_main:
            if self.config.run.resume == "auto":
                checkpoints.clear_unstarted_run(run_dir)
            prepare_output_dir(run_dir, self.config.run.overwrite)
        barrier(self.context)
        return run_dir

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> TrainResult:
        config, context = self.config, self.context
        accumulation = config.optim.grad_accumulation
        loader = DataLoader(
            self.pairs,
            batch_sampler=RankBatches(self.order, self.step * accumulation, self.total_steps * accumulation,
                                      context.rank, context.world_size),
            collate_fn=self.path.collate, num_workers=config.run.num_workers, pin_memory=self.device.type == "cuda",
        )
        # A loader's iterator draws its base seed from the global random stream. An uninterrupted run draws it at
        # its start, before the random state its checkpoints save; a resumed run, whose stream restarts from that
        # state, must not draw it again (the dropout of the tower tops' heads reads the stream).
        with torch.random.fork_rng(devices=[]) if self.resume_from is not None else nullcontext():
            batches = iter(loader)
        writer = MetricsWriter(self.run_dir, self.total_steps, self.step, main=context.is_main,
                               progress=self.progress, tensorboard=config.log.tensorboard, console=self.console)
        writer.say(start_line(config, self.pairs, self.total_steps, self.step if self.resume_from else None))
        window = MetricWindow()
        last_metrics: dict = {}
        self.encoder.train()
        with writer, StopRequest() as stop, WatchCollectives(context, config.run.dist_timeout) as watch:
            while self.step < self.total_steps:
                watch.step, watch.checkpoint = self.step + 1, self.checkpoint_path
                lr = cosine_lr(self.step, config.optim.lr, config.optim.warmup_steps, self.total_steps)
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
                    window.add(stats)
                line_due = self._optimiser_step()
                stop_now = stop.agreed(context)  # Ctrl-C, SIGTERM, SIGUSR1: save this step, then stop
                checkpoint_now = (config.run.checkpoint_every and self.step % config.run.checkpoint_every == 0) \
                    or self.step == self.total_steps or stop_now
                # Log at checkpoints too, so the counters a checkpoint saves include every batch before it.
                if self.step % config.log.log_every == 0 or checkpoint_now or line_due:
                    last_metrics = log_window(self, window, lr, writer)
                if checkpoint_now:
                    self._save_checkpoint()
                writer.advance()
                if stop_now and self.step < self.total_steps:
                    raise stop.stopped(self.step, self.checkpoint_path)
        barrier(context)
        return TrainResult(self.encoder, self.run_dir, self.run_dir / METRICS_FILE, self.checkpoint_path,
                           self.step, self.skipped_images, last_metrics)

    def _optimiser_step(self) -> bool:
        """Clip, step and clamp; then every source's upkeep, in order. True when a source needs a metrics line."""
        if self.config.optim.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.encoder.parameters(), self.config.optim.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        clamp_logit_scale(self.encoder.logit_scale)
        self.step += 1
        dues = [source.after_step(self.step) for source in self.sources]
        return any(dues)

    # ---- one micro-batch ----------------------------------------------------------------

    def _micro_step(self, batch, number: int) -> tuple[torch.Tensor, dict]:
        config = self.config
        micro, negatives = self.embed(batch, number)
        gallery_images, offset = gather_with_grad(micro.U, self.context)
        gallery_texts, _ = gather_with_grad(micro.V, self.context)
        false_negatives = self._false_negatives(batch, offset) if config.negatives.mask_duplicate_pairs else None
        loss, plain = contrastive_losses(config.run.loss, micro.U, micro.V, micro.scale, self.logit_bias, negatives,
                                         config.negatives.counterfactual_weight, gallery_images=gallery_images,
                                         gallery_texts=gallery_texts, row_offset=offset,
                                         false_negatives=false_negatives)
        figures = {"pair_valid": 0.0}
        for source in self.sources:
            term, made = source.loss_term(micro, negatives)
            loss = loss if term is None else loss + term
            figures.update(made)
        for source in self.sources:
            source.seen(gallery_images.detach(), gallery_texts.detach())
        # Tensors, not numbers: reading them out each micro-batch would stall the GPU; the log does it.
        stats = {"loss": loss.detach(), "plain_loss": plain, "samples": micro.U.shape[0], "skipped": batch.skipped,
                 "caption_valid": valid_rows(negatives.caption_valid), "image_valid": valid_rows(negatives.image_valid),
                 "rule_collisions": float(negatives.rule_collisions), **figures}
        return loss, stats

    def embed(self, batch, number: int) -> tuple[MicroBatch, Negatives]:
        """Micro-batch `number` through the embed path and the sources: U, V, the scale (in the `MicroBatch`) and
        every extra negative the arm takes, its columns in the sources' order."""
        micro = MicroBatch(batch, number, number // self.order.batches_per_epoch, self._logged(number))
        for source in self.sources:
            source.begin(micro)
        self.path.embed(micro, self.sources)
        for source in self.sources:
            source.embed(micro)
        negatives = Negatives()
        for source in self.sources:
            source.negatives(micro, negatives)
        return micro, negatives

    def _false_negatives(self, batch, offset: int) -> torch.Tensor:
        """(B, G) bool: the other copies of each row's image or caption among all processes' pairs."""
        images, captions = (keys.to(self.device) for keys in pair_keys(batch))
        gallery_images, _ = gather_with_grad(images, self.context)
        gallery_captions, _ = gather_with_grad(captions, self.context)
        return duplicate_pairs(images, captions, gallery_images, gallery_captions, row_offset=offset)

    def _logged(self, number: int) -> bool:
        """Whether micro-batch `number` is the last one of a logged step (its provenance figures are logged)."""
        accumulation = self.config.optim.grad_accumulation
        step = number // accumulation + 1
        last = number % accumulation == accumulation - 1
        return last and (step % self.config.log.log_every == 0 or step == self.total_steps)

    # ---- checkpoints ------------------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        if not self.context.is_main:
            barrier(self.context)
            return
        empty = torch.zeros(0)
        state = {
            "step": self.step,
            "micro_batch": self.step * self.config.optim.grad_accumulation,
            "world_batch": [self.config.run.batch_size, self.config.optim.grad_accumulation],
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else empty,
            "samples_seen": self.samples_seen,
            "skipped_images": self.skipped_images,
            **{key: value for source in self.sources for key, value in source.state().items()},
        }
        self.checkpoint_path = checkpoints.save_checkpoint(
            self.run_dir, self.step, self.encoder.state_dict(), state, keep=self.config.run.keep_checkpoints)
        barrier(self.context)

    def _resume(self) -> None:
        config = self.config
        saved_path = self.run_dir / RUN_CONFIG
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
        if state.get("world_batch") != [config.run.batch_size, config.optim.grad_accumulation]:
            raise LaceInputError(f"{manifest}: saved with batch size / accumulation {state.get('world_batch')}, "
                                 f"resumed with {[config.run.batch_size, config.optim.grad_accumulation]}")
        self.encoder.load_state_dict(checkpoint.weights)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.samples_seen = int(state["samples_seen"])
        self.skipped_images = int(state["skipped_images"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None and state["cuda_rng"].numel():
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        for source in self.sources:
            source.restore(state)
        self.checkpoint_path = manifest
        if self.context.is_main:
            truncate_metrics(self.run_dir / METRICS_FILE, self.step)


__all__ = ["METRICS_FILE", "RESUME_INVARIANTS", "TrainResult", "Trainer", "train"]
