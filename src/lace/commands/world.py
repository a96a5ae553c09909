"""`lace world`: generate the built-in shapes world (images, captions, scenes, benchmarks)."""

from __future__ import annotations

import argparse

from lace.commands.common import add_output_arguments, add_progress_argument
from lace.config import add_config_arguments, config_from_args
from lace.data.world import WorldConfig, generate_world, preview_grid

SHORT_FLAGS = {"n_images": ("--n",), "image_size": ("--size",), "objects_per_scene": ("--objects",)}
"""The WorldConfig fields `lace world` names shorter than their field names."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "world",
        help="generate the shapes world: rendered scenes, captions and binding benchmarks",
        description=(
            "Render a compositional shapes world (shapes, colours, sizes, textures, spatial "
            "relations) with scene graphs, web-like and COCO-like captions, train/val/test "
            "splits plus a test_comp split of held-out colour-shape pairs, and SugarCrepe- "
            "and Winoground-style binding benchmarks whose negatives exist as text and as "
            "images. Output is byte-identical for a seed."
        ),
    )
    add_output_arguments(parser, "world folder to write")
    parser.add_argument("--preview", action="store_true", help="write preview.png: sample images with captions")
    parser.add_argument("--config", default=None, help="YAML file of WorldConfig fields (flags override it)")
    add_progress_argument(parser)
    add_config_arguments(parser, WorldConfig, flags=SHORT_FLAGS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(WorldConfig, args, args.config)
    summary = generate_world(config, args.out, overwrite=args.overwrite, progress=args.progress)
    counts = ", ".join(f"{split} {count}" for split, count in summary.images.items())
    items = ", ".join(f"{split} {count}" for split, count in summary.benchmark_items.items())
    print(f"wrote {sum(summary.images.values())} images ({counts}) to {summary.out_dir}")
    print(f"binding items: {items}")
    print(
        f"throughput: {summary.images_per_second:.1f} images/s "
        f"({summary.rendered_per_second:.1f} PNGs/s with benchmark negatives) "
        f"in {summary.seconds:.1f}s wall, {summary.cpu_seconds:.1f}s CPU"
    )
    if args.preview:
        path = preview_grid(summary.out_dir, summary.out_dir / "preview.png")
        print(f"preview: {path}")
    return 0
