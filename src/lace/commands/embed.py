"""`lace embed`: embed every image and caption of a dataset into an embedding store."""

from __future__ import annotations

import argparse
import sys
import time

from lace.commands.common import (
    add_data_arguments,
    add_model_arguments,
    add_output_arguments,
    add_progress_argument,
)
from lace.data import read_dataset
from lace.data.images import MISSING_IMAGE_POLICIES, apply_image_policy
from lace.distributed import init_distributed, shutdown_distributed
from lace.embeddings import extract_embeddings
from lace.encoders import load_encoder
from lace.io import prepare_output_dir, removed_on_failure


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "embed", help="embed a dataset's images and captions into a memory-mapped store",
        description="Embed every image and caption of a dataset (batched; runs under torchrun, "
                    "each rank a shard, merged at the end). Writes image_embeddings.npy, "
                    "text_embeddings.npy and index.json.",
    )
    add_model_arguments(parser)
    add_data_arguments(parser)
    add_output_arguments(parser, "embedding store folder to write")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch (texts use 4x)")
    parser.add_argument("--workers", "--num-workers", type=int, default=0, help="image-decoding worker processes")
    parser.add_argument("--missing-images", choices=MISSING_IMAGE_POLICIES, default="error",
                        help="image files that are missing or unreadable: error (name them) or skip (leave them out)")
    add_progress_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    context = init_distributed(args.device)
    try:
        with removed_on_failure(args.out if context.is_main else None):
            return _embed(args, context)
    finally:
        shutdown_distributed()


def _embed(args: argparse.Namespace, context) -> int:
    dataset = read_dataset(args.data, split=args.split, image_root=args.image_root)
    dataset, check = apply_image_policy(dataset, args.missing_images)
    if check.bad and context.is_main:
        print(check.summary(), file=sys.stderr)
    if context.is_main:
        prepare_output_dir(args.out, overwrite=args.overwrite)
    encoder = load_encoder(args.model, args.pretrained, device=context.device)
    start = time.perf_counter()
    store = extract_embeddings(
        encoder, dataset, args.out, model_name=args.model, batch_size=args.batch_size,
        num_workers=args.workers, progress=args.progress,
    )
    if store is not None:
        seconds = time.perf_counter() - start
        print(f"wrote {store.image_embeddings.shape[0]} image and {store.text_embeddings.shape[0]} text "
              f"embeddings (d={store.dim}) to {args.out} in {seconds:.1f}s")
    return 0
