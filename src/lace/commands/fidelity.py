"""`lace fidelity`: how faithful edits inside the towers (and the pooled arms' image-side negatives) are, against the
shapes world's rendered counterfactuals, beside a same-size random control."""

from __future__ import annotations

import argparse

from lace.commands.common import PRETRAINED_HELP, add_output_arguments
from lace.config import add_config_arguments, config_from_args
from lace.errors import input_error
from lace.experiment.fidelity import FidelityConfig


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "fidelity", help="fidelity of local and pooled edits against the world's rendered counterfactuals",
        description=(
            "Edits made inside the image tower at each layer and operator (and, with --pooled, the pooled arms' "
            "image-side negatives) against the shapes world's rendered colour swaps: direction agreement, "
            "preferences and the share of rows each can edit, beside a same-size random control. Writes "
            "fidelity.json and fidelity.md into --out."
        ),
    )
    parser.add_argument("--model", default="lace-micro-rn-32", help="open_clip architecture (default: lace-micro-rn-32)")
    parser.add_argument("--pretrained", default=None, help=PRETRAINED_HELP + "; e.g. the demo's models/base.pt")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1)")
    parser.add_argument("--config", default=None, help="YAML file of FidelityConfig fields (flags override it)")
    add_output_arguments(parser, "folder for fidelity.json and fidelity.md")
    add_config_arguments(parser, FidelityConfig, skip=("extra",))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from lace.encoders.registry import load_encoder
    from lace.experiment.fidelity import fidelity_markdown, measure_fidelity
    from lace.io import atomic_write_json, atomic_write_text, prepare_output_dir

    if args.config is None and args.world is None:
        raise input_error("lace fidelity", "--world", "a shapes world folder (lace world, or a demo's world/)")
    base = FidelityConfig(world=args.world) if args.config is None else None
    config = config_from_args(FidelityConfig, args, yaml_path=args.config, base=base)
    out = prepare_output_dir(args.out, args.overwrite)
    torch.set_num_threads(max(1, args.threads))
    results = measure_fidelity(load_encoder(args.model, args.pretrained), config)
    atomic_write_json(out / "fidelity.json", results)
    atomic_write_text(out / "fidelity.md", fidelity_markdown(results))
    print(fidelity_markdown(results))
    return 0
