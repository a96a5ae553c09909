"""One writer for each logged step of a run: metrics.jsonl, TensorBoard and the console (a start line, then a plain
line per logged step, with or without a progress bar: docs/logging.md). What a step's record holds is
`lace.train.metrics`."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from lace.progress import bar

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
# The switches that make an arm, as the start line names them (none of them on: the plain arm).
ARM_SWITCHES = ("counterfactual_captions", "counterfactual_images", "caption_negatives", "paired_caption_directions",
                "local_image_negatives", "local_caption_swaps", "rendered_negatives", "edited_image_rows")


class MetricsWriter:
    """Writes each logged step of a run to `run_dir`/metrics.jsonl, TensorBoard (`tensorboard`) and the console
    (`console`), and keeps the run's progress bar (drawn when `progress` and stderr is a terminal). Only the main
    process writes (`main`). Use as a context manager, so the bar and TensorBoard close however the run ends."""

    def __init__(self, run_dir: Path, total_steps: int, first_step: int, *, main: bool = True, progress: bool = True,
                 tensorboard: bool = False, console: bool = True):
        self.path = Path(run_dir) / METRICS_FILE
        self.total_steps, self.main, self.console = total_steps, main, console
        self.bar = bar(total=total_steps, initial=first_step, enabled=progress and main, desc="train", unit="step")
        self.board = open_tensorboard(run_dir) if tensorboard and main else None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def say(self, line: str) -> None:
        """One plain line on stdout (above the bar when one is drawn)."""
        if not (self.main and self.console):
            return
        if not self.bar.disable:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def write(self, record: Mapping) -> None:
        """Append `record` (one logged step, from `step_record`) to metrics.jsonl and TensorBoard, and say it."""
        if not self.main:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.board is not None:
            for key, value in record.items():
                if key != "step":
                    self.board.add_scalar(f"train/{key}", value, record["step"])
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                             samples_per_s=f"{record['samples_per_second']:.0f}")
        self.say(step_line(record, self.total_steps))

    def advance(self) -> None:
        """One step done (the bar moves)."""
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        if self.board is not None:
            self.board.close()


def step_line(record: Mapping, total_steps: int) -> str:
    """The console line of a logged step: `step 4/6  epoch 1.33  loss 2.0794  lr 1.00e-03  96 samples/s`, with the
    images skipped so far when there are any."""
    line = (f"step {record['step']}/{total_steps}  epoch {record['epoch']:.2f}  loss {record['loss']:.4f}  "
            f"lr {record['lr']:.2e}  {record['samples_per_second']:.0f} samples/s")
    return line + (f"  skipped {record['skipped_images']} images" if record.get("skipped_images") else "")


def start_line(config, pairs, total_steps: int, resumed_step: int | None) -> str:
    """The run's first console line: `train: data pairs.csv (30 rows, 24 images); model lace-micro-32; arm plain;
    6 steps of 8 pairs`, and `; resumed from step 4` when it carries on from a checkpoint."""
    n_captions = list(pairs.n_captions)
    source = getattr(getattr(pairs, "dataset", None), "source", None) or config.run.data or \
        f"{type(pairs).__name__} passed in"
    accumulation = config.optim.grad_accumulation
    line = (f"train: data {source} ({sum(n_captions)} rows, {len(n_captions)} images); model {config.run.model}; "
            f"arm {arm_name(config)}; {total_steps} step{'s' * (total_steps != 1)} of {config.run.batch_size * accumulation} pairs"
            + (f" ({accumulation} micro-batches of {config.run.batch_size})" if accumulation > 1 else ""))
    return line + (f"; resumed from step {resumed_step}" if resumed_step is not None else "")


def arm_name(config) -> str:
    """The arm's switches that are on, then the sources it names (`TrainConfig.arm.sources`), joined by '+' ('plain'
    when there are none)."""
    on = [name for name in ARM_SWITCHES if getattr(config.arm, name, False)]
    return "+".join([*on, *config.arm.sources]) or "plain"


def open_tensorboard(run_dir: Path):
    """A TensorBoard `SummaryWriter` on `run_dir`/tensorboard, or None (with a warning) when it is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.warning("tensorboard is not installed; metrics go to %s only", METRICS_FILE)
        return None
    return SummaryWriter(str(Path(run_dir) / "tensorboard"))
