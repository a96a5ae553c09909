"""Fidelity tables of local edits: `python -m lace.experiment.fidelity_cli --world W --model M --pretrained P --out DIR`.

With `--pooled` (and `--dictionary` for lace and concept_arithmetic) also the pooled-embedding arms.

Writes DIR/fidelity.json and DIR/fidelity.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lace.encoders.registry import load_encoder
from lace.experiment.fidelity import METHODS, FidelityConfig, fidelity_markdown, measure_fidelity
from lace.experiment.pooled_fidelity import POOLED_METHODS
from lace.io import atomic_write_json, atomic_write_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lace.experiment.fidelity_cli", description=__doc__)
    parser.add_argument("--world", required=True, help="shapes world folder")
    parser.add_argument("--model", default="lace-micro-rn-32")
    parser.add_argument("--pretrained", default=None, help="checkpoint of the model (e.g. the demo's models/base.pt)")
    parser.add_argument("--out", required=True, help="folder for fidelity.json and fidelity.md")
    parser.add_argument("--layers", default="stem,layer1,layer2")
    parser.add_argument("--text-layers", default="block0,block1,block2")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--split", default="val")
    parser.add_argument("--n-items", type=int, default=400)
    parser.add_argument("--n-train", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--locate-layer", default=None, help="layer the reader finds objects at (default: each edit layer)")
    parser.add_argument("--renderer-masks", action="store_true",
                        help="also measure each method placed by the renderer's masks (a diagnostic of the operator)")
    parser.add_argument("--pooled", default="",
                        help=f"pooled-embedding arms to measure too, comma-separated from {','.join(POOLED_METHODS)}")
    parser.add_argument("--dictionary", default=None,
                        help="labelled dictionary folder of the same base (lace dict fit; the demo's DIR/dictionary), "
                             "for the lace and concept_arithmetic arms")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    encoder = load_encoder(args.model, args.pretrained)
    config = FidelityConfig(world=args.world, layers=tuple(args.layers.split(",")),
                            text_layers=tuple(filter(None, args.text_layers.split(","))),
                            methods=tuple(args.methods.split(",")), split=args.split, n_items=args.n_items,
                            n_train=args.n_train, seed=args.seed, locate_layer=args.locate_layer,
                            renderer_masks=args.renderer_masks, pooled=tuple(filter(None, args.pooled.split(","))),
                            dictionary=args.dictionary)
    results = measure_fidelity(encoder, config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "fidelity.json", results)
    atomic_write_text(out / "fidelity.md", fidelity_markdown(results))
    print(fidelity_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
