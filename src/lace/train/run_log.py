"""The run's metrics: a window of micro-batch stats summed over processes into one metrics.jsonl line (and
TensorBoard scalars), and the lines a resumed run drops."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from lace.errors import LaceInputError
from lace.io import atomic_write_text
from lace.train.distributed import sum_over_processes
from lace.train.pairs import PROVENANCE_FIGURES

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
WINDOW_FIGURES = ("loss", "plain_loss", "caption_valid", "image_valid", "pair_valid", "rule_collisions")
"""The micro-batch stats a window sums by name (with the samples, the skipped images and the count)."""


def log_window(trainer, window: list[dict], seconds: float, lr: float, writer) -> dict:
    """Sum the window's stats over micro-batches and processes, append its metrics line, return it."""
    measured = [s["provenance"] for s in window if "provenance" in s]
    local = {name: float(sum(s[name] for s in window)) for name in WINDOW_FIGURES}
    local.update({f"provenance_{name}": float(sum(m[name] for m in measured)) for name in (*PROVENANCE_FIGURES, "n")})
    local.update(samples=sum(s["samples"] for s in window), skipped=sum(s["skipped"] for s in window),
                 count=len(window))
    totals = dict(zip(local, sum_over_processes(list(local.values()), trainer.context)))
    count = totals["count"]
    samples, skipped = int(totals["samples"]), int(totals["skipped"])
    trainer.samples_seen += samples
    trainer.skipped_images += skipped
    config = trainer.config
    metrics = {
        "step": trainer.step,
        "epoch": trainer.step * config.grad_accumulation / trainer.order.batches_per_epoch,
        "loss": totals["loss"] / count,
        "plain_loss": totals["plain_loss"] / count,
        "lr": lr,
        "logit_scale": float(trainer.encoder.logit_scale.exp().item()),
        **({"logit_bias": float(trainer.logit_bias.item())} if trainer.logit_bias is not None else {}),
        "samples_per_second": samples / max(seconds, 1e-9),
        "caption_negatives_valid_rows": totals["caption_valid"] / max(samples, 1),
        "image_negatives_valid_rows": totals["image_valid"] / max(samples, 1),
        **({"pair_rows_valid": totals["pair_valid"] / max(samples, 1)} if config.edited_image_rows else {}),
        **({"rule_collision_rows": totals["rule_collisions"] / max(samples, 1)}
           if config.edited_image_rows and config.caption_negatives else {}),
        **_provenance_metrics(totals),
        "samples_seen": trainer.samples_seen,
        "skipped_images": trainer.skipped_images,
        **{name: value for source in trainer.sources for name, value in source.metrics().items()},
    }
    if trainer.context.is_main:
        with open(trainer.run_dir / METRICS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(metrics) + "\n")
        if writer is not None:
            for key, value in metrics.items():
                if key != "step":
                    writer.add_scalar(f"train/{key}", value, trainer.step)
    _refuse_diverged(metrics, trainer.checkpoint_path)
    return metrics


def tensorboard_writer(config, context, run_dir: Path):
    if not (config.tensorboard and context.is_main):
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.warning("tensorboard is not installed; metrics go to %s only", METRICS_FILE)
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def _provenance_metrics(totals: dict[str, float]) -> dict[str, float]:
    """Summed provenance figures and their count -> `provenance_<figure>` means (nothing when none was measured)."""
    count = totals["provenance_n"]
    if not count:
        return {}
    return {f"provenance_{name}": totals[f"provenance_{name}"] / count for name in PROVENANCE_FIGURES}


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
