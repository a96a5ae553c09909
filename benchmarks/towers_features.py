"""Tower feature extraction speed: where the time goes, and the rate of each runtime.

Two parts, both on Flickr8k (`--data` or $LACE_FLICKR8K), with `--threads` intra-op threads:
1. A per-stage table, each stage timed alone on `--stage-images` images and `--stage-captions`
   captions: read + decode (Pillow, draft mode), resize + centre crop, to tensor + normalise,
   the image tower in PyTorch (channels_last, `inference_mode`) and in ONNX Runtime (batches
   of 64), the copy into the output array; tokenising, and the text tower in each of its runtimes
   (PyTorch float32, PyTorch bfloat16 autocast, ONNX Runtime; length-sorted batches of 256).
2. End to end: `compute_image_tower_features` / `compute_text_tower_features` on `--images`
   images and `--captions` captions (default: all of Flickr8k, 8,091 and 40,455, the extraction
   the targets are set for; small runs pay the loader's start-up on few images) in each runtime (DataLoader workers decode while the tower
   runs), best of `--repeats` (the runtimes take turns), with the smallest cosine between each runtime's
   features and PyTorch float32's (the agreement every runtime must keep: >= 1 - 1e-4).
   The ONNX export (once per process and weights) is timed apart and not counted in the rates.
   The headline rates are those of each tower's default runtime (`onnx_runtime.default_runtime`).

Draft decoding is also compared with a full decode (smallest cosine of the features) on
`--photos` (a glob of JPEGs; default: the same Flickr8k images, where draft mode does
nothing when the copy's JPEGs are already small).

Usage: python benchmarks/towers_features.py --data /path/to/flickr8k [--threads 2]
The last printed line is one JSON object; `vs_peer_ratio` is the whole extraction's time in PyTorch float32
for both towers over its time with the default runtimes, `vs_floor_ratio` that time over each default tower's model
stage alone (timed in part 1) times the items.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lace.data.dataset import ImageTextDataset, ImageTextRecord
from lace.data.flickr8k import ENV_VARIABLE, read_flickr8k
from lace.encoders import load_encoder
from lace.encoders.towers import features as tower_features
from lace.encoders.towers import image_tower, onnx_runtime

TARGETS = {"images_per_s": 80.0, "captions_per_s": 900.0}
AGREEMENT = 1 - 1e-4
"""Smallest cosine every runtime's features must keep to PyTorch float32's."""


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(torch.nn.functional.cosine_similarity(torch.from_numpy(np.asarray(a)),
                                                       torch.from_numpy(np.asarray(b))).min())


def image_stages(encoder, paths: list[str], session) -> dict[str, float]:
    """Milliseconds per image of each image stage, run one stage at a time over all of `paths`."""
    resize_crop, to_tensor = encoder.preprocess.transforms[:2], encoder.preprocess.transforms[2:]
    seconds = {}

    def decode(path):
        with Image.open(path) as image:
            image.draft("RGB", (image_tower.RESIZE_SIZE, image_tower.RESIZE_SIZE))
            return image.convert("RGB")

    seconds["read + decode (draft)"], images = timed(lambda: [decode(path) for path in paths])
    seconds["resize + centre crop"], cropped = timed(lambda: [_apply(resize_crop, image) for image in images])
    seconds["to tensor + normalise"], tensors = timed(lambda: [_apply(to_tensor, image) for image in cropped])
    batches = [torch.stack(tensors[start:start + 64]) for start in range(0, len(tensors), 64)]
    with torch.inference_mode():
        seconds["image tower, torch"], _ = timed(lambda: [encoder.image_tower_features(b) for b in batches])
    seconds["image tower, onnxruntime"], outputs = timed(lambda: [session(b.numpy()) for b in batches])
    output = np.empty((len(paths), image_tower.FEATURE_DIM), dtype=np.float32)
    seconds["copy to the output array"], _ = timed(lambda: _copy(outputs, output))
    return {name: 1e3 * value / len(paths) for name, value in seconds.items()}


def text_stages(encoder, captions: list[str], session) -> dict[str, float]:
    """Milliseconds per caption of each text stage (length-sorted batches of 256)."""
    ordered = sorted(captions, key=len)
    seconds = {}
    seconds["tokenise"], batches = timed(lambda: [encoder.tokenize(ordered[start:start + 256])
                                                  for start in range(0, len(ordered), 256)])
    with torch.inference_mode():
        seconds["text tower, torch"], _ = timed(lambda: [encoder.text_tower_features(b) for b in batches])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seconds["text tower, torch-bf16"], _ = timed(lambda: [encoder.text_tower_features(b) for b in batches])
    pad = encoder.text_tower.pad_token_id
    seconds["text tower, onnxruntime"], _ = timed(lambda: [session(*onnx_runtime.text_inputs(b, pad)) for b in batches])
    return {name: 1e3 * value / len(captions) for name, value in seconds.items()}


def _apply(transforms, image):
    for transform in transforms:
        image = transform(image)
    return image


def _copy(outputs: list[np.ndarray], output: np.ndarray) -> None:
    start = 0
    for features in outputs:
        output[start:start + len(features)] = features
        start += len(features)


def draft_against_full(encoder, photos: list[str], runtime: str) -> dict:
    """Smallest cosine between features of draft-decoded and fully decoded `photos`."""
    folder = ImageTextDataset([ImageTextRecord(Path(path).stem, Path(path), ("",)) for path in photos], "photos")
    draft = tower_features.compute_image_tower_features(encoder, folder, num_workers=0, runtime=runtime)
    full = tower_features.compute_image_tower_features(encoder, folder, num_workers=0, runtime=runtime, draft=False)
    sizes = sorted({Image.open(path).size for path in photos})
    return {"photos": len(photos), "sizes": [list(size) for size in sizes[:5]], "min_cosine": min_cosine(draft, full)}


def print_table(title: str, unit: str, stages: dict[str, float]) -> None:
    print(f"\n{title}\n| stage | {unit} |\n|---|---|")
    for name, value in stages.items():
        print(f"| {name} | {value:.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get(ENV_VARIABLE), help=f"Flickr8k folder (default: ${ENV_VARIABLE})")
    parser.add_argument("--images", type=int, default=None, help="images to embed (default: all of Flickr8k)")
    parser.add_argument("--captions", type=int, default=None, help="captions to embed (default: all of Flickr8k)")
    parser.add_argument("--stage-images", type=int, default=256)
    parser.add_argument("--stage-captions", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of both runtimes")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers decoding JPEGs")
    parser.add_argument("--repeats", type=int, default=2, help="end-to-end runs per runtime; the best counts")
    parser.add_argument("--photos", default=None, help="glob of JPEGs for the draft-against-full comparison")
    args = parser.parse_args(argv)
    if not args.data or not (Path(args.data) / "captions.csv").is_file():
        message = f"skipped: no Flickr8k folder (pass --data or set {ENV_VARIABLE}; got {args.data!r})"
        print(message)
        print(json.dumps({"benchmark": "towers_features", "skipped": message}))
        return 0

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    everything = read_flickr8k(args.data)  # all splits: the extraction the targets are set for
    images = everything.subset(list(range(min(args.images or len(everything), len(everything)))))
    captions = everything.captions[: args.captions]
    encoder = load_encoder("lace-towers").eval()
    export_image_s, image_session = timed(lambda: tower_features._session("image", encoder.image_tower))
    export_text_s, text_session = timed(lambda: tower_features._session("text", encoder.text_tower))
    # Warm-up: first calls allocate and pick kernels.
    tower_features.compute_image_tower_features(encoder, images.subset([0, 1]), batch_size=2, num_workers=0,
                                                runtime="torch")
    tower_features.compute_text_tower_features(encoder, captions[:8], runtime="torch")

    stage_paths = [images.records[i].image_path for i in range(min(args.stage_images, len(images)))]
    per_image = image_stages(encoder, stage_paths, image_session)
    per_caption = text_stages(encoder, captions[: args.stage_captions], text_session)
    print_table(f"Image stages, {len(stage_paths)} images, {args.threads} threads", "ms per image", per_image)
    print_table(f"Text stages, {min(args.stage_captions, len(captions))} captions, {args.threads} threads",
                "ms per caption", per_caption)

    # The runtimes take turns, repeat by repeat, so that a change in the machine's load hits both alike.
    runs: dict[tuple[str, str], list[tuple[float, np.ndarray]]] = {}
    extract = {"image": partial(tower_features.compute_image_tower_features, encoder, images, batch_size=64,
                                num_workers=args.workers),
               "text": partial(tower_features.compute_text_tower_features, encoder, captions, batch_size=256)}
    for _ in range(args.repeats):
        for kind, runtimes in onnx_runtime.RUNTIMES.items():
            for runtime in runtimes:
                runs.setdefault((kind, runtime), []).append(timed(partial(extract[kind], runtime=runtime)))
    best = {key: min(timings, key=lambda run: run[0]) for key, timings in runs.items()}
    items = {"image": len(images), "text": len(captions)}
    rates = {kind: {runtime: round(items[kind] / best[kind, runtime][0], 2) for runtime in runtimes}
             for kind, runtimes in onnx_runtime.RUNTIMES.items()}
    cosines = {kind: {runtime: min_cosine(best[kind, runtime][1], best[kind, "torch"][1]) for runtime in runtimes}
               for kind, runtimes in onnx_runtime.RUNTIMES.items()}
    print("\n| tower | runtime | items/s | smallest cosine to torch float32 |\n|---|---|---|---|")
    for kind, by_runtime in rates.items():
        for runtime, rate in by_runtime.items():
            agreement = "(reference)" if runtime == "torch" else f"{cosines[kind][runtime]:.7f}"
            print(f"| {kind} | {runtime} | {rate:.1f} | {agreement} |")

    photos = sorted(glob.glob(args.photos)) if args.photos else stage_paths[:32]
    draft = draft_against_full(encoder, photos, onnx_runtime.default_runtime("image"))
    runtimes = {"image": onnx_runtime.default_runtime("image"), "text": onnx_runtime.default_runtime("text")}
    default = {"images_per_s": rates["image"][runtimes["image"]], "captions_per_s": rates["text"][runtimes["text"]]}
    # Whole extraction (images + captions) in seconds: the defaults, the peer (PyTorch float32 for both
    # towers), and the floor (each default tower's model stage alone, per item, times the items).
    seconds = {name: len(images) / rates["image"][runtime["image"]] + len(captions) / rates["text"][runtime["text"]]
               for name, runtime in (("default", runtimes), ("torch", {"image": "torch", "text": "torch"}))}
    floor_s = (per_image[f"image tower, {runtimes['image']}"] * len(images)
               + per_caption[f"text tower, {runtimes['text']}"] * len(captions)) / 1000
    result = {
        "benchmark": "towers_features",
        "images_per_s": default["images_per_s"],
        "captions_per_s": default["captions_per_s"],
        "default_runtimes": runtimes,
        "targets": TARGETS,
        "targets_met": {name: default[name] >= target for name, target in TARGETS.items()},
        "agreement_met": all(cosines[kind][runtime] >= AGREEMENT for kind, runtime in runtimes.items()),
        "by_runtime": rates,
        "min_cosine_vs_torch_fp32": cosines,
        "export_seconds": {"image": round(export_image_s, 2), "text": round(export_text_s, 2)},
        "ms_per_image_by_stage": {name: round(value, 3) for name, value in per_image.items()},
        "ms_per_caption_by_stage": {name: round(value, 4) for name, value in per_caption.items()},
        "draft_against_full_decode": draft,
        "n_images": len(images), "n_captions": len(captions),
        "threads": args.threads, "workers": args.workers, "repeats": args.repeats,
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "vs_peer_ratio": round(seconds["torch"] / seconds["default"], 3),
        "vs_floor_ratio": round(seconds["default"] / floor_s, 3),
        "peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
