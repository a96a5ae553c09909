"""What float16 storage of the cached intermediates costs on the pooled tower features.

For a seeded sample of Flickr8k images and captions, the intermediates below the tower
tops are recomputed in float32 and compared, after the pretrained tops and pooling,
with the same tops run on the cached float16 arrays: the cosine between the two pooled
(N, 1280) image and (N, 384) text features, and how far the cache is from the float32
intermediates rounded to float16 (0 when the cache holds what it should).

Usage: python benchmarks/towers_top_float16.py --data /path/to/flickr8k --cache DIR [--n 256]
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from lace.data.dataset import ImageRows
from lace.data.flickr8k import read_flickr8k
from lace.encoders.towers import image_tower
from lace.encoders.towers.model import TowersDualEncoder
from lace.encoders.towers.top import ImageTop, TextTop, image_below_top, text_below_top
from lace.encoders.towers.top_features import cached_image_top_features, cached_text_top_features


def cosines(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
    return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()), "max_cosine_error": float(1 - cos.min())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--n", type=int, default=256, help="images and captions sampled")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dataset = read_flickr8k(args.data)
    encoder = TowersDualEncoder().eval()
    maps = cached_image_top_features(encoder, dataset, args.cache)
    tokens = cached_text_top_features(encoder, dataset.captions, args.cache)
    rng = np.random.default_rng(0)
    image_rows = np.sort(rng.choice(len(dataset), args.n, replace=False))
    caption_rows = np.sort(rng.choice(len(dataset.captions), args.n, replace=False))
    image_top, text_top = ImageTop(encoder.image_tower.model), TextTop(encoder.text_tower.model)
    with torch.inference_mode():
        files = ImageRows(dataset, encoder.preprocess, draft=image_tower.RESIZE_SIZE)  # decoded as the cache was
        pixels = torch.stack([files[int(i)] for i in image_rows])
        maps32 = image_below_top(encoder.image_tower.model, pixels.contiguous(memory_format=torch.channels_last))
        maps16 = torch.from_numpy(np.asarray(maps[image_rows], dtype=np.float32))
        token_ids = encoder.tokenize([dataset.captions[i] for i in caption_rows])
        mask = (token_ids != encoder.text_tower.pad_token_id).long()
        token_ids, mask = token_ids[:, :int(mask.sum(1).max())], mask[:, :int(mask.sum(1).max())]
        states32 = text_below_top(encoder.text_tower.model, token_ids, mask)
        states16, mask16 = tokens.batch(caption_rows)
        result = {
            "n": args.n,
            "image": {**cosines(image_top(maps32), image_top(maps16)),
                      "cache_vs_rounded_float32_max_abs": float((maps32.half().float() - maps16).abs().max())},
            "text": {**cosines(text_top(states32, mask), text_top(states16, mask16)),
                     "cache_vs_rounded_float32_max_abs":
                         float(((states32.half().float() - states16) * mask.unsqueeze(-1)).abs().max())},
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
