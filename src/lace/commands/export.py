"""`lace export`: a trained run -> a plain checkpoint of the original architecture."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a run's weights as a plain open_clip state dict",
        description=(
            "Write the weights of a training run as a state dict of the original architecture, loadable "
            "with open_clip.create_model(name, pretrained=OUT) and nothing of lace; the model name goes to "
            "OUT.json. OUT ending in .safetensors is written with safetensors, else with torch.save."
        ),
    )
    parser.add_argument("--run", required=True, help="run folder written by `lace train`")
    parser.add_argument("--out", required=True, help="file to write (model.pt or model.safetensors)")
    parser.add_argument("--checkpoint", default="latest",
                        help="which checkpoint: latest, or a name such as step_0001000")
    parser.add_argument("--interpolate", type=float, default=None, metavar="ALPHA",
                        help="WiSE-FT: write (1 - ALPHA) * base + ALPHA * the run's weights (0 = base, 1 = the run); "
                             "needs --base")
    parser.add_argument("--base", default=None,
                        help="what to mix with: a checkpoint of the same architecture or a pretrained tag such as "
                             "openai (e.g. what the run started from)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lace.train import export_run

    out = export_run(args.run, args.out, checkpoint=args.checkpoint, overwrite=args.overwrite,
                     interpolate=args.interpolate, base=args.base)
    print(f"wrote {out} (model name in {out}.json)")
    return 0
