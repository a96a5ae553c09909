"""`lace eval`: retrieval, compositional benchmarks and geometry diagnostics for one model."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from lace.commands.common import add_model_arguments, add_output_arguments, add_progress_argument
from lace.config import add_config_arguments, config_from_args
from lace.encoders import load_encoder
from lace.eval.runner import EvalConfig, run_evaluation
from lace.eval.summary import console_lines
from lace.io import atomic_write_json, check_output_file, removed_on_failure


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="score a model on retrieval, compositional benchmarks and geometry diagnostics",
        description="Embed each benchmark image and caption once, score retrieval (recall@1/5/10), "
                    "SugarCrepe, ARO, Winoground, VALSE and the shapes world, and measure the "
                    "geometry of the space (hubness, one-way neighbours, mutual k-NN, brittleness "
                    "under rule-made edits) against an isotropic baseline. With --dictionary, also "
                    "counterfactual brittleness and edit retrieval (transplants looked up among real "
                    "images, against random and concept-arithmetic edits of the same size). "
                    "Writes one results JSON.",
    )
    add_model_arguments(parser)
    parser.add_argument("--config", default=None, help="YAML file of EvalConfig fields (flags override it)")
    add_config_arguments(parser, EvalConfig, skip=("transplants",))
    parser.add_argument("--transplant", action="append", default=None, metavar="A=B",
                        help="edit-retrieval transplant of concept A to concept B of the same type; repeat for "
                             "more (default: a few chosen among same-type concepts the captions mention)")
    parser.add_argument("--skip-missing", dest="missing_images", action="store_const", const="skip",
                        help="score the items whose images exist and can be read (same as --missing-images skip)")
    add_output_arguments(parser, "results JSON file to write")
    add_progress_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(EvalConfig, args, args.config)
    if args.transplant:
        config = dataclasses.replace(config, transplants=tuple(args.transplant))
    out = check_output_file(args.out, args.overwrite, what="results file")
    with removed_on_failure(out.parent):  # bad input: no empty results folder left behind
        encoder = load_encoder(args.model, args.pretrained, device=args.device)
        results = run_evaluation(encoder, config, model=args.model, pretrained=args.pretrained,
                                 progress=args.progress)
        atomic_write_json(out, results)
    for line in results["skipped_images"]:
        print(line, file=sys.stderr)
    for line in console_lines(results):
        print(line)
    print(f"wrote {out}")
    return 0
