"""Count the swap items written independently of the rule editor on each Flickr8k split, and print a sample.

    python scripts/phrase_swap_yield.py /data/flickr8k
    python scripts/phrase_swap_yield.py /data/flickr8k --show 20 --kind swap_obj --split val

For each split: the captions the writer rewrites (`lace.study.phrase_swaps.phrase_swap_items`) and the items kept
once those the rule editor can also write are left out (`lace.study.measure.independent_swap_items`, as both
Flickr8k studies draw them, at most `--per-kind` per kind).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

import numpy as np

from lace.concepts.vocabulary import load_vocabulary
from lace.data.flickr8k import read_flickr8k_splits
from lace.edits.captions import RuleNegatives
from lace.study.measure import independent_swap_items
from lace.study.phrase_swaps import KINDS, phrase_swap_items


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="the Flickr8k folder (captions.csv and images/)")
    parser.add_argument("--per-kind", type=int, default=1000, help="at most this many items per kind and split")
    parser.add_argument("--show", type=int, default=0, help="print this many random kept items")
    parser.add_argument("--kind", choices=KINDS, default="swap_att", help="the kind --show prints")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test", help="the split --show reads")
    args = parser.parse_args(argv)
    splits = read_flickr8k_splits(args.root, check_images=False)
    rules = RuleNegatives(load_vocabulary("natural"))
    print(f"{'split':6} {'captions':>8} " + " ".join(f"{kind + ' written':>16} {kind + ' kept':>13}" for kind in KINDS))
    for name in ("test", "val", "train"):
        captions, owners = splits[name].captions, np.asarray(splits[name].caption_image_index)
        written = Counter(item["kind"] for item in phrase_swap_items(captions, owners, per_kind=len(captions)))
        items = independent_swap_items(rules, captions, owners, args.per_kind)
        kept = Counter(item["kind"] for item in items)
        print(f"{name:6} {len(captions):8d} " + " ".join(f"{written[kind]:16d} {kept[kind]:13d}" for kind in KINDS))
        if name == args.split and args.show:
            chosen = [item for item in items if item["kind"] == args.kind]
            for item in random.Random(0).sample(chosen, min(args.show, len(chosen))):
                print(f"  {item['caption']}\n    -> {item['negative_caption']}")


if __name__ == "__main__":
    main()
