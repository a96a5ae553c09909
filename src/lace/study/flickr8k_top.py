"""Flickr8k with the tops of the towers trainable: cache the intermediates, train, measure.

    python -m lace.study.flickr8k_top extract --data DIR --cache DIR [--threads 1]
    python -m lace.study.flickr8k_top locked --data DIR --cache DIR --out DIR
    python -m lace.study.flickr8k_top protocol --data DIR --cache DIR --out DIR [--seeds 2]
    python -m lace.study.flickr8k_top arms --data DIR --cache DIR --out DIR [--arms all] [--seeds 3]

`extract` caches, for every image and caption of Flickr8k, the features entering the
trainable tops (`lace.encoders.towers.top_features`). `locked` trains today's locked-tower
heads (the study's base grid) on the pooled features those tops give with their
pretrained weights, the reference to match. `protocol` trains a base (tops and heads) on
part of the training images, then plain fine-tunes of it on the other images, and
measures retrieval of each on validation (`--split test` once, at the end). `arms`
fine-tunes every training arm from that base (`lace.study.flickr8k_top_arms`). Every model
is saved as a `lace-towers` checkpoint that `lace eval` loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lace.data.flickr8k import SPLITS, read_flickr8k
from lace.encoders.towers.checkpoint import load_towers_checkpoint
from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
from lace.encoders.towers.top import TowersTop, save_top_checkpoint
from lace.encoders.towers.top_features import (
    cache_description,
    cached_image_top_features,
    cached_text_top_features,
    image_cache_path,
    text_cache_path,
)
from lace.eval.metrics import retrieval_recall
from lace.io import atomic_write_json
from lace.study.config import DEFAULT_BASE_GRID, HeadsTraining
from lace.study.features import SplitFeatures
from lace.study.heads import embed_split, fresh_heads, train_on_features
from lace.study.top_training import TopSplit, TopTraining, embed_top_split, train_top


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


def top_splits(data: str, cache: str, encoder: TowersDualEncoder) -> dict[str, TopSplit]:
    """Cached intermediates of Flickr8k's train, val and test splits (images in split order)."""
    dataset = read_flickr8k(data)
    maps = cached_image_top_features(encoder, dataset, cache)
    tokens = cached_text_top_features(encoder, dataset.captions, cache)
    owner = np.asarray(dataset.caption_image_index, dtype=np.int64)
    splits = {}
    for name in SPLITS:
        rows = np.array([i for i, record in enumerate(dataset.records) if record.split == name], dtype=np.int64)
        local = np.full(len(dataset), -1, dtype=np.int64)
        local[rows] = np.arange(rows.size)
        keep = np.flatnonzero(local[owner] >= 0)
        splits[name] = TopSplit(name, np.asarray(maps[rows]), tokens, keep, local[owner[keep]])
    return splits


def recall(top: TowersTop, split: TopSplit) -> dict[str, float]:
    return recall_of(*embed_top_split(top, split), split)


def recall_of(images: torch.Tensor, texts: torch.Tensor, split: TopSplit) -> dict[str, float]:
    """Retrieval figures of a split's (N_img, d) and (N_txt, d) embeddings, with the mean R@1 of both ways."""
    figures = retrieval_recall(images, texts, split.caption_image_index)
    return {**figures, "mean_R@1": 0.5 * (figures["i2t/R@1"] + figures["t2i/R@1"])}


def fresh_top(settings: TopTraining, seed: int) -> TowersTop:
    """Pretrained tops with new heads seeded by `seed`."""
    torch.manual_seed(seed)
    return TowersTop(TowersDualEncoder(TowersConfig(
        embed_dim=settings.embed_dim, head_hidden_dim=settings.hidden_dim, head_dropout=settings.dropout,
        init_logit_scale=math.log(1 / settings.init_temperature))).eval())


@torch.no_grad()
def pooled_features(top: TowersTop, split: TopSplit, batch_size: int = 512) -> SplitFeatures:
    """The pooled tower features of a split, (N_img, 1280) and (N_txt, 384), through `top`'s layers."""
    top.eval()
    images = torch.cat([top.image_top(torch.from_numpy(split.image_maps[i:i + batch_size].astype(np.float32)))
                        for i in range(0, len(split.image_maps), batch_size)])
    rows = split.caption_rows
    order = np.argsort(split.token_states.offsets[rows + 1] - split.token_states.offsets[rows], kind="stable")
    texts = torch.cat([top.text_top(*split.token_states.batch(rows[order[i:i + batch_size]]))
                       for i in range(0, len(rows), batch_size)])[torch.from_numpy(np.argsort(order))]
    return SplitFeatures(split.name, images, texts, [""] * len(texts), split.caption_image_index, [""] * len(images))


def heads_base(top: TowersTop, split: TopSplit, settings: HeadsTraining) -> dict:
    """Train only the heads of `top` (top layers locked at their pretrained weights), on the
    pooled features of `split`, as the locked-tower study trains its base."""
    encoder = top.encoder
    encoder.unlock_top_blocks(0, 0)
    fresh_heads(encoder, settings, seed=0)
    summary = train_on_features(encoder, pooled_features(top, split), settings, seed=0)
    encoder.unlock_top_blocks(*top.unlocked_blocks)
    return summary


def locked_reference(data: str, cache: str, out: str, split: str, candidates: list[int], log=print) -> dict:
    """Today's locked-tower heads (study base grid candidates, chosen on val) on pooled features
    of the pretrained tops; retrieval on val, and on `split` when it is "test"."""
    top = fresh_top(TopTraining(), seed=0)
    splits = top_splits(data, cache, top.encoder)
    pooled = {name: pooled_features(top, part) for name, part in splits.items()}
    encoder, rows = top.encoder, []
    best, best_score = None, -1.0
    for i in candidates:
        settings = DEFAULT_BASE_GRID[i]
        fresh_heads(encoder, settings, seed=0)
        summary = train_on_features(encoder, pooled["train"], settings, seed=0)
        val = retrieval_recall(*embed_split(encoder, pooled["val"]), pooled["val"].caption_image_index)
        score = 0.5 * (val["i2t/R@1"] + val["t2i/R@1"])
        row = {"candidate": i, "settings": dataclasses.asdict(settings), "train": summary, "val": val, "val_mean_R@1": score}
        if split == "test":
            row["test"] = retrieval_recall(*embed_split(encoder, pooled["test"]), pooled["test"].caption_image_index)
        rows.append(row)
        log(f"locked candidate {i}: val i2t R@1 {val['i2t/R@1']:.3f} t2i {val['t2i/R@1']:.3f} ({summary['seconds']:.0f}s)")
        if score > best_score:
            best, best_score = i, score
    result = {"candidates": rows, "chosen": best}
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out) / f"locked-{split}.json", result)
    return result


def base_images(n_train: int, share: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of the training images: (base rows, fine-tune rows)."""
    permuted = np.random.default_rng(seed).permutation(n_train)
    cut = round(share * n_train)
    return np.sort(permuted[:cut]), np.sort(permuted[cut:])


def run_protocol(data: str, cache: str, out: str, base: TopTraining, finetune: TopTraining, base_share: float,
                 seeds: int, split: str, finetune_on: str, base_heads: HeadsTraining | None = None, log=print) -> dict:
    """A base on `base_share` of the training images, then plain fine-tunes from it (one per
    seed) on the other images ("rest") or on all of them ("all"); retrieval on `split`.

    The base trains tops and heads with `base`, or, given `base_heads`, only the heads on
    the pooled features of the pretrained tops (the locked-tower regime); fine-tunes always
    train tops and heads with `finetune`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    top = fresh_top(base, seed=0)
    splits = top_splits(data, cache, top.encoder)
    base_rows, rest_rows = base_images(len(splits["train"].image_maps), base_share)
    base_split = splits["train"].subset(base_rows, "train-base")
    finetune_split = (splits["train"].subset(rest_rows, "train-rest") if finetune_on == "rest" else splits["train"])
    base_path = out / "models" / "base.safetensors"
    if base_path.is_file():
        top, base_summary = TowersTop(load_towers_checkpoint(base_path).eval()), {"reused": str(base_path)}
    else:
        base_summary = (heads_base(top, base_split, base_heads) if base_heads is not None
                        else train_top(top, base_split, base, seed=0))
        save_top_checkpoint(top, base_path)
    result = {"split": split, "base_share": base_share, "finetune_on": finetune_on,
              "base_images": len(base_rows), "finetune_images": len(finetune_split.image_maps),
              "base_settings": dataclasses.asdict(base_heads if base_heads is not None else base),
              "base_trains": "heads" if base_heads is not None else "tops and heads",
              "finetune_settings": dataclasses.asdict(finetune),
              "base": {"train": base_summary, split: recall(top, splits[split])}, "plain": []}
    log(f"base: {split} {result['base'][split]} ({base_summary.get('seconds', 0):.0f}s)")
    for seed in range(seeds):
        top = TowersTop(load_towers_checkpoint(base_path).eval())
        path = out / "models" / f"finetune-plain-seed{seed}.safetensors"
        if path.is_file():
            top, summary = TowersTop(load_towers_checkpoint(path).eval()), {"reused": str(path)}
        else:
            summary = train_top(top, finetune_split, finetune, seed=seed)
            save_top_checkpoint(top, path)
        figures = recall(top, splits[split])
        result["plain"].append({"seed": seed, "train": summary, split: figures, "checkpoint": str(path)})
        log(f"plain seed {seed}: {split} {figures} ({summary.get('seconds', 0):.0f}s)")
    atomic_write_json(out / f"protocol-{split}.json", result)
    return result


def _training(args, prefix: str) -> TopTraining:
    return TopTraining(epochs=getattr(args, f"{prefix}_epochs"), lr=getattr(args, f"{prefix}_lr"),
                       top_lr_scale=args.top_lr_scale, hidden_dim=args.hidden_dim, dropout=args.dropout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lace.study.flickr8k_top", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    extract_parser = commands.add_parser("extract", help="cache the features entering the tower tops")
    extract_parser.add_argument("--data", required=True, help="Flickr8k folder (captions.csv, images/)")
    extract_parser.add_argument("--cache", required=True, help="folder of cached intermediates")
    extract_parser.add_argument("--which", choices=("both", "images", "texts"), default="both")
    extract_parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    for name, help_text in (("locked", "locked-tower heads on pooled features: the reference"),
                            ("protocol", "base on part of the training images, plain fine-tunes on the rest"),
                            ("arms", "every training arm fine-tuned from the protocol's base")):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--data", required=True)
        command.add_argument("--cache", required=True)
        command.add_argument("--out", required=True, help="folder for results and checkpoints")
        command.add_argument("--split", choices=("val", "test"), default="val", help="split to measure on")
        command.add_argument("--threads", type=int, default=1)
    commands.choices["locked"].add_argument("--candidates", default="0,3", help="base grid rows to try")
    protocol, arms = commands.choices["protocol"], commands.choices["arms"]
    for command in (protocol, arms):
        command.add_argument("--base-share", type=float, default=0.5, help="share of training images for the base")
    protocol.add_argument("--finetune-on", choices=("rest", "all"), default="rest")
    protocol.add_argument("--seeds", type=int, default=2)
    arms.add_argument("--arms", default="all", help="comma-separated arm names, or all")
    arms.add_argument("--seeds", type=int, default=3)
    arms.add_argument("--n-edits", type=int, default=4, help="pooled dictionary edits per row")
    arms.add_argument("--local-n-edits", type=int, default=2, help="local edits per image (swap, transplants)")
    arms.add_argument("--dictionary-seconds", type=float, default=150.0)
    protocol.add_argument("--base", choices=("tops", "heads"), default="heads",
                          help="what the base trains: tops and heads, or heads only (tops pretrained)")
    protocol.add_argument("--base-heads-candidate", type=int, default=3,
                          help="row of the study's base grid for a heads-only base")
    protocol.add_argument("--base-epochs", type=float, default=10.0)
    protocol.add_argument("--base-lr", type=float, default=1e-3)
    for command in (protocol, arms):
        command.add_argument("--finetune-epochs", type=float, default=8.0)
        command.add_argument("--finetune-lr", type=float, default=5e-4)
        command.add_argument("--top-lr-scale", type=float, default=0.1)
        command.add_argument("--hidden-dim", type=int, default=2048)
        command.add_argument("--dropout", type=float, default=0.5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    if args.command == "extract":
        print(json.dumps(extract(args.data, args.cache, args.which), indent=2))
    elif args.command == "locked":
        locked_reference(args.data, args.cache, args.out, args.split, [int(i) for i in args.candidates.split(",")])
    elif args.command == "arms":
        from lace.study.flickr8k_top_arms import TOP_ARMS, run_arms

        names = list(TOP_ARMS) if args.arms == "all" else [name.strip() for name in args.arms.split(",")]
        run_arms(args.data, args.cache, args.out, names, _training(args, "finetune"), args.seeds, args.split,
                 args.base_share, args.n_edits, args.local_n_edits, dictionary_seconds=args.dictionary_seconds)
    else:
        run_protocol(args.data, args.cache, args.out, _training(args, "base"), _training(args, "finetune"),
                     args.base_share, args.seeds, args.split, args.finetune_on,
                     DEFAULT_BASE_GRID[args.base_heads_candidate] if args.base == "heads" else None)
    print(f"wall {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
