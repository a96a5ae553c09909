"""Tower feature extraction speed: lace's batched path against the plain per-item path.

The peer is what a plain script does: decode each image with Pillow, preprocess it,
run the timm model on a batch of one (default memory layout, `torch.no_grad`), and
run the Hugging Face text model on one caption at a time. lace's path is
`compute_image_tower_features` / `compute_text_tower_features`: DataLoader workers
decode JPEGs (Pillow draft mode), the image tower runs in channels_last layout under
`inference_mode` on batches of 64, and captions go in length-sorted batches of 256.
The image settings (threads, layout, workers, batch size) are also switched one at
a time to show which of them helps. On a shared, busy CPU the thread count matters
most: two intra-op threads competing with other processes can be many times slower
than one. Each lace timing is the best of `--repeats` runs; the slow peer runs once,
on the first `--peer-images` images and `--peer-captions` captions (rates are per item).

Usage: python benchmarks/towers_features.py --data /path/to/flickr8k
       (or set LACE_FLICKR8K). The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from lace.data.flickr8k import ENV_VARIABLE, read_flickr8k
from lace.encoders import load_encoder
from lace.encoders.towers import features as tower_features
from lace.encoders.towers import image_tower


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def naive_images(encoder, dataset) -> torch.Tensor:
    """One image at a time, default memory layout, `no_grad`."""
    tower = encoder.image_tower.to(memory_format=torch.contiguous_format)
    try:
        with torch.no_grad():
            return torch.cat([tower(encoder.preprocess(dataset.load_image(i)).unsqueeze(0)) for i in range(len(dataset))])
    finally:
        tower.to(memory_format=torch.channels_last)


def naive_captions(encoder, captions) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([encoder.text_tower(encoder.tokenize([caption])) for caption in captions])


def batched_images(encoder, dataset, batch_size: int, num_workers: int, channels_last: bool, threads: int) -> float:
    """Images/s of a batched loop with one setting switched at a time (draft decoding always on)."""
    torch.set_num_threads(threads)
    loader = torch.utils.data.DataLoader(
        tower_features._ImageFiles(dataset, encoder.preprocess, image_tower.RESIZE_SIZE),
        batch_size=batch_size, num_workers=num_workers,
    )
    layout = torch.channels_last if channels_last else torch.contiguous_format
    tower = encoder.image_tower.to(memory_format=layout)
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            for pixels in loader:
                tower(pixels.contiguous(memory_format=layout))
        return len(dataset) / (time.perf_counter() - start)
    finally:
        tower.to(memory_format=torch.channels_last)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get(ENV_VARIABLE), help=f"Flickr8k folder (default: ${ENV_VARIABLE})")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--captions", type=int, default=512)
    parser.add_argument("--peer-images", type=int, default=32)
    parser.add_argument("--peer-captions", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of lace's path")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers decoding JPEGs")
    parser.add_argument("--repeats", type=int, default=2, help="runs per lace timing; the best counts")
    args = parser.parse_args(argv)
    if not args.data or not (Path(args.data) / "captions.csv").is_file():
        message = f"skipped: no Flickr8k folder (pass --data or set {ENV_VARIABLE}; got {args.data!r})"
        print(message)
        print(json.dumps({"benchmark": "towers_features", "skipped": message}))
        return 0

    default_threads = torch.get_num_threads()
    torch.manual_seed(0)
    dataset = read_flickr8k(args.data, split="test")
    images = dataset.subset(list(range(args.images)))
    peer_images = images.subset(list(range(min(args.peer_images, len(images)))))
    captions = read_flickr8k(args.data, split="train").captions[: args.captions]
    peer_captions = captions[: args.peer_captions]
    encoder = load_encoder("lace-towers").eval()

    # Warm-up: first calls allocate and pick kernels.
    tower_features.compute_image_tower_features(encoder, images.subset([0, 1]), batch_size=2, num_workers=0)
    naive_captions(encoder, captions[:4])

    peer = {}
    for threads in sorted({default_threads, args.threads}):
        torch.set_num_threads(threads)
        image_s, naive_image_features = timed(lambda: naive_images(encoder, peer_images))
        text_s, naive_text_features = timed(lambda: naive_captions(encoder, peer_captions))
        peer[threads] = (len(peer_images) / image_s, len(peer_captions) / text_s)

    torch.set_num_threads(args.threads)
    image_runs = [timed(lambda: tower_features.compute_image_tower_features(
        encoder, images, batch_size=64, num_workers=args.workers)) for _ in range(args.repeats)]
    text_runs = [timed(lambda: tower_features.compute_text_tower_features(encoder, captions, batch_size=256))
                 for _ in range(args.repeats)]
    image_s, image_features = min(image_runs, key=lambda run: run[0])
    text_s, text_features = min(text_runs, key=lambda run: run[0])
    settings = {
        "threads2_batch64_contiguous_no_workers": (64, 0, False, 2),
        "threads1_batch64_contiguous_no_workers": (64, 0, False, 1),
        "threads1_batch64_channels_last_no_workers": (64, 0, True, 1),
        f"threads1_batch64_channels_last_{args.workers}_workers": (64, args.workers, True, 1),
        f"threads1_batch16_channels_last_{args.workers}_workers": (16, args.workers, True, 1),
    }
    ablation = {name: max(batched_images(encoder, images, *setting) for _ in range(args.repeats))
                for name, setting in settings.items()}
    torch.set_num_threads(args.threads)
    n_peer = len(peer_images)
    image_gap = float((torch.from_numpy(image_features[:n_peer]) - naive_image_features).abs().max())
    text_gap = float((torch.from_numpy(text_features[: len(peer_captions)]) - naive_text_features).abs().max())

    images_per_s, captions_per_s = len(images) / image_s, len(captions) / text_s
    peer_images_per_s, peer_captions_per_s = peer[default_threads]
    # Time for the same work (all images and captions) on the peer path over lace's path.
    peer_time = len(images) / peer_images_per_s + len(captions) / peer_captions_per_s
    lace_time = image_s + text_s
    result = {
        "benchmark": "towers_features",
        "images_per_s": round(images_per_s, 2),
        "captions_per_s": round(captions_per_s, 2),
        "vs_peer_ratio": round(peer_time / lace_time, 2),
        "peer": f"per-item timm + transformers, default settings ({default_threads} threads)",
        "peer_images_per_s": round(peer_images_per_s, 2),
        "peer_captions_per_s": round(peer_captions_per_s, 2),
        "images_vs_peer_ratio": round(images_per_s / peer_images_per_s, 2),
        "captions_vs_peer_ratio": round(captions_per_s / peer_captions_per_s, 2),
        "peer_by_threads": {str(k): {"images_per_s": round(v[0], 2), "captions_per_s": round(v[1], 2)}
                            for k, v in peer.items()},
        "image_settings_images_per_s": {k: round(v, 2) for k, v in ablation.items()},
        "max_abs_difference_vs_peer": {"image": image_gap, "text": text_gap},
        "n_images": len(images), "n_captions": len(captions),
        "n_peer_images": n_peer, "n_peer_captions": len(peer_captions),
        "threads": args.threads, "workers": args.workers, "repeats": args.repeats,
        "note": "Pillow draft decoding is a no-op on this copy: its JPEGs are already 224 px",
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
