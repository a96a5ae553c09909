"""What a training run logs: a window of figures added up by name (the negative sources' among them), the record
of one logged step, the check that stops a diverged run, and the lines a resumed run drops. The record goes to
metrics.jsonl, TensorBoard and the console through one writer (`lace.train.metrics_writer`, docs/logging.md)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path

from lace.errors import LaceInputError
from lace.io import atomic_write_text
from lace.train.distributed import sum_over_processes
from lace.train.metrics_writer import MetricsWriter
from lace.train.pairs import PROVENANCE_FIGURES

# What each micro-batch adds to the window: losses, valid negative rows and pair rows, rule collisions, rows
# trained and images skipped; the provenance figures as sums over the rows measured ("n" of them).
WINDOW_SUMS = ("loss", "plain_loss", "caption_valid", "image_valid", "pair_valid", "rule_collisions", "samples",
               "skipped", *(f"provenance_{name}" for name in (*PROVENANCE_FIGURES, "n")), "micro_batches")


class MetricWindow:
    """The figures of the micro-batches since the last logged step, added up by name (tensors stay on their device
    until `totals` reads them, so that adding never waits for the GPU)."""

    def __init__(self, names: tuple[str, ...] = WINDOW_SUMS):
        self.names = names
        self.reset()

    def reset(self) -> None:
        self.sums: dict = {}
        self.started = time.perf_counter()

    def add(self, figures: Mapping) -> None:
        """Add one micro-batch's figures: numbers or 0-d tensors by name, a nested mapping ("provenance") as
        `<name>_<key>`; counts the micro-batch."""
        for name, value in figures.items():
            for key, part in ({f"{name}_{k}": v for k, v in value.items()} if isinstance(value, Mapping)
                              else {name: value}).items():
                if key not in self.names:
                    raise KeyError(f"metric window: figure {key!r} is not one of {self.names}")
                self.sums[key] = self.sums.get(key, 0) + part
        self.sums["micro_batches"] = self.sums.get("micro_batches", 0) + 1

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def totals(self, context) -> dict[str, float]:
        """Every name's sum over the window and over all processes (0 for a figure nobody added)."""
        local = [float(self.sums.get(name, 0)) for name in self.names]
        return dict(zip(self.names, sum_over_processes(local, context)))


def step_record(step: int, epoch: float, totals: Mapping[str, float], seconds: float, model: Mapping[str, float],
                counters: Mapping[str, float], pair_rows: bool, rule_collisions: bool) -> dict:
    """One metrics.jsonl line: the step, the window's mean losses, `model`'s figures (lr, logit scale and bias),
    throughput, shares of rows with valid negatives (pair rows and rule collisions when the arm has them), the
    provenance means when measured, then the run's `counters`."""
    count, samples = totals["micro_batches"], int(totals["samples"])
    return {
        "step": step,
        "epoch": epoch,
        "loss": totals["loss"] / count,
        "plain_loss": totals["plain_loss"] / count,
        **model,
        "samples_per_second": samples / max(seconds, 1e-9),
        "caption_negatives_valid_rows": totals["caption_valid"] / max(samples, 1),
        "image_negatives_valid_rows": totals["image_valid"] / max(samples, 1),
        **({"pair_rows_valid": totals["pair_valid"] / max(samples, 1)} if pair_rows else {}),
        **({"rule_collision_rows": totals["rule_collisions"] / max(samples, 1)} if rule_collisions else {}),
        **provenance_means(totals),
        **counters,
    }


def log_window(trainer, window: MetricWindow, lr: float, writer: MetricsWriter) -> dict:
    """Write `window`'s figures as the record of `trainer`'s step (`lace.train.loop.Trainer`: its counters, its
    model's figures, its sources' `metrics()`), start a new window, and stop a diverged run."""
    totals = window.totals(trainer.context)
    trainer.samples_seen += int(totals["samples"])
    trainer.skipped_images += int(totals["skipped"])
    config, bias = trainer.config, trainer.logit_bias
    model = {"lr": lr, "logit_scale": float(trainer.encoder.logit_scale.exp().item()),
             **({"logit_bias": float(bias.item())} if bias is not None else {})}
    counters = {"samples_seen": trainer.samples_seen, "skipped_images": trainer.skipped_images,
                **{name: value for source in trainer.sources for name, value in source.metrics().items()}}
    epoch = trainer.step * config.optim.grad_accumulation / trainer.order.batches_per_epoch
    rows = config.arm.edited_image_rows
    record = step_record(trainer.step, epoch, totals, window.seconds, model, counters, pair_rows=rows,
                         rule_collisions=rows and config.arm.caption_negatives)
    writer.write(record)
    window.reset()
    refuse_diverged(record, trainer.checkpoint_path)
    return record


def provenance_means(totals: Mapping[str, float]) -> dict[str, float]:
    """Summed provenance figures and their count -> `provenance_<figure>` means (nothing when none was measured)."""
    count = totals["provenance_n"]
    if not count:
        return {}
    return {f"provenance_{name}": totals[f"provenance_{name}"] / count for name in PROVENANCE_FIGURES}


def refuse_diverged(record: Mapping, latest: Path | None) -> None:
    """Stop a run whose logged loss is NaN or inf, before a checkpoint of its weights can be written: every
    process reads the same summed figures, so all stop together and the latest checkpoint stays finite."""
    if math.isfinite(record["loss"]):
        return
    kept = f"the latest checkpoint, {latest}, is from before" if latest is not None else "no checkpoint was written"
    raise LaceInputError(
        f"train: the loss is {record['loss']} at step {record['step']}; the run diverged or its data holds NaN/inf, "
        f"and {kept}; lower --lr, set --grad-clip-norm, or check the data, then resume or start again"
    )


def truncate_metrics(path: Path, step: int) -> None:
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
