"""Flickr8k with the tops of the towers trainable: cache the intermediates, train, measure.

    python -m lace.study.flickr8k_top extract --data DIR --cache DIR [--threads 1]

caches, for every image and caption of Flickr8k, the features entering the trainable
tops (`lace.encoders.towers.top_features`).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from lace.data.flickr8k import read_flickr8k
from lace.encoders.towers.model import TowersDualEncoder
from lace.encoders.towers.top_features import (
    cache_description,
    cached_image_top_features,
    cached_text_top_features,
    image_cache_path,
    text_cache_path,
)


def extract(data: str, cache: str, which: str = "both", progress: bool = True) -> dict:
    """Cache the intermediates of every Flickr8k image and caption; return their descriptions."""
    dataset = read_flickr8k(data)
    encoder = TowersDualEncoder().eval()
    described = {}
    if which in ("both", "images"):
        cached_image_top_features(encoder, dataset, cache, progress=progress)
        described["images"] = cache_description(image_cache_path(encoder, dataset, cache))
    if which in ("both", "texts"):
        cached_text_top_features(encoder, dataset.captions, cache, progress=progress)
        described["texts"] = cache_description(text_cache_path(encoder, dataset.captions, cache))
    return described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lace.study.flickr8k_top", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    extract_parser = commands.add_parser("extract", help="cache the features entering the tower tops")
    extract_parser.add_argument("--data", required=True, help="Flickr8k folder (captions.csv, images/)")
    extract_parser.add_argument("--cache", required=True, help="folder of cached intermediates")
    extract_parser.add_argument("--which", choices=("both", "images", "texts"), default="both")
    extract_parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.command == "extract":
        print(json.dumps(extract(args.data, args.cache, args.which), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
