"""Cost of a training step with local image-side negatives over a plain CLIP step.

The tiny world model (lace-micro-rn-32, random init or --pretrained) at batch 128, on world
scenes drawn here or, with --world, on a world folder's training images (fit) and validation
images (timed batch). Timed, interleaved so machine load hits both alike, median over repeats:
- plain: forward, CLIP loss, backward, AdamW step;
- local: the same plus M binding swaps / transplants at layer L (`LocalImageEditor.negatives`,
  the recolouring operator) as text->image negatives in the LACE loss.
Also the share of rows with a valid edit per slot. Last line: one JSON object.

    PYTHONPATH=src python benchmarks/local_negatives.py [--repeats 5] [--threads 1] [--layer layer1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from lace.concepts.vocabulary import load_vocabulary, vocabulary_from_dict
from lace.data.readers import read_dataset
from lace.data.world import (
    WorldConfig,
    caption_scene,
    colour_shape_combinations,
    render_scene,
    sample_scene,
)
from lace.data.world.config import PALETTE
from lace.data.world.scene import sample_rng
from lace.encoders import load_encoder
from lace.local.editor import fit_recolour_editor
from lace.losses import clip_loss, lace_loss


def world_batch(n: int, seed: int = 0):
    """Raw pixels (n, 3, 32, 32) in [0, 1], one COCO-style caption per image, and the vocabulary."""
    config = WorldConfig(n_images=n, image_size=32, seed=seed)
    combinations = colour_shape_combinations(config)
    scenes = [sample_scene(sample_rng(seed, "train", i, 0), config, "train", combinations, i) for i in range(n)]
    captions = [caption_scene(s, sample_rng(seed, "train", i, 1), "coco", config) for i, s in enumerate(scenes)]
    pixels = torch.from_numpy(np.stack([np.asarray(render_scene(s, config)) for s in scenes]))
    vocabulary = vocabulary_from_dict({"name": "world", "objects": list(config.shapes),
                                       "attributes": {"colour": list(config.colours)}, "relations": []})
    return pixels.permute(0, 3, 1, 2).float() / 255.0, captions, vocabulary


def world_folder_batch(encoder, world: str, n_fit: int, n_batch: int):
    """Raw pixels of n_fit training and n_batch validation images of a world folder, their captions, vocabulary."""
    normalise = encoder.preprocess.transforms[-1]
    std, mean = torch.tensor(normalise.std).view(3, 1, 1), torch.tensor(normalise.mean).view(3, 1, 1)
    raw, captions = [], []
    for split, n in (("train", n_fit), ("val", n_batch)):
        dataset = read_dataset(f"{world}/karpathy_coco.json", split=split)
        raw += [encoder.preprocess(dataset.load_image(i)) * std + mean for i in range(n)]
        captions += [list(dataset.records[i].captions) for i in range(n)]
    return torch.stack(raw), captions, load_vocabulary(f"{world}/vocabulary.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--n-edits", type=int, default=2)
    parser.add_argument("--layer", default="layer1")
    parser.add_argument("--pretrained", default=None)
    parser.add_argument("--fit-images", type=int, default=1000)
    parser.add_argument("--world", default=None, help="a world folder (e.g. the demo's) instead of drawn scenes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-rn-32", args.pretrained)
    normalise = encoder.preprocess.transforms[-1]
    if args.world:
        raw, captions, vocabulary = world_folder_batch(encoder, args.world, args.fit_images, args.batch)
    else:
        raw, captions, vocabulary = world_batch(args.fit_images + args.batch)
        captions = [[caption] for caption in captions]
    prototypes = torch.tensor([PALETTE[name] for name in vocabulary.groups()["colour"]]).float() / 255.0
    started = time.perf_counter()
    editor = fit_recolour_editor(encoder.model, raw[: args.fit_images], normalise,
                                 captions[: args.fit_images], vocabulary, args.layer, prototypes)
    fit_seconds = time.perf_counter() - started
    pixels = normalise(raw[args.fit_images :])
    tokens = encoder.tokenize([image_captions[0] for image_captions in captions[args.fit_images :]])
    optimiser = torch.optim.AdamW(encoder.parameters(), lr=1e-5)
    encoder.train()

    def step(local: bool) -> float:
        begin = time.perf_counter()
        if local:  # one image pass: the unedited embeddings come out of the editor's batched upper layers
            negatives = editor.negatives(encoder.model, pixels, args.n_edits)
            texts, scale = encoder.encode_tokens(tokens), encoder.logit_scale.exp()
            loss = lace_loss(negatives.original, texts, scale, image_negatives=negatives.embeddings,
                             image_valid=negatives.valid)
            step.valid = negatives.valid.float().mean(dim=0).tolist()
        else:
            images, texts, scale = encoder(pixels, tokens)
            loss = clip_loss(images, texts, scale)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        return time.perf_counter() - begin

    step(False), step(True)  # warm up
    plain, local = [], []
    for _ in range(args.repeats):
        plain.append(step(False))
        local.append(step(True))
    result = {"batch": args.batch, "n_edits": args.n_edits, "layer": args.layer, "threads": args.threads,
              "plain_seconds": statistics.median(plain), "local_seconds": statistics.median(local),
              "ratio": statistics.median(local) / statistics.median(plain), "valid_share_per_slot": step.valid,
              "editor_fit_seconds": fit_seconds, "fit_images": args.fit_images, "world": args.world,
              "pretrained": args.pretrained}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
