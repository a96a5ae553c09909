"""`lace train`: contrastive fine-tuning with counterfactual captions and images (or plain)."""

from __future__ import annotations

import argparse
import os

from lace.commands.common import add_progress_argument, add_threads_argument, set_threads
from lace.config import add_config_arguments, config_from_args
from lace.io import removed_on_failure
from lace.train.config import TrainConfig

# open_clip_train's names for the same settings are aliases (docs/cli.md maps every open_clip_train flag)
TRAIN_FLAGS = {
    "run.output": ("--out", "--output"),
    "run.data": ("--data", "--train-data"),
    "optim.weight_decay": ("--weight-decay", "--wd"),
    "run.num_workers": ("--workers", "--num-workers"),
    "optim.warmup_steps": ("--warmup-steps", "--warmup"),
    "log.log_every": ("--log-every", "--log-every-n-steps"),
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="fine-tune (or pretrain) a dual encoder, with LACE negatives and ablations",
        description=(
            "Contrastive training of a CLIP-style dual encoder. Switch on counterfactual captions "
            "(--counterfactual-captions) and images (--counterfactual-images) for LACE, rule-made caption "
            "negatives (--caption-negatives) for the text-only baseline, or nothing for plain CLIP training. "
            "Runs that differ only in a switch see the same data, seeds and steps. Start several processes "
            "with `torchrun --nproc_per_node N -m lace train ...` for data-parallel training. Writes "
            "config.json, metrics.jsonl and checkpoints/ into --out; continue with --resume latest."
        ),
    )
    parser.add_argument("--config", default=None, help="YAML file of TrainConfig fields (flags override it)")
    add_config_arguments(parser, TrainConfig, flags=TRAIN_FLAGS)
    add_threads_argument(parser)
    add_progress_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lace.train import train

    set_threads(args.threads)
    config = config_from_args(TrainConfig, args, yaml_path=args.config)
    with removed_on_failure(config.run.output):  # bad input: no half-made run folder left behind
        result = train(config, progress=args.progress)
    if os.environ.get("RANK", "0") == "0":  # one summary line, from the main process
        print(f"trained {result.steps} steps; checkpoint {result.checkpoint_path}; metrics {result.metrics_path}"
              + (f"; skipped {result.skipped_images} images" if result.skipped_images else ""))
    return 0
