"""Flags shared by several subcommands, so they read the same everywhere."""

from __future__ import annotations

import argparse

PRETRAINED_HELP = ("weights: a `lace train` run folder (its latest checkpoint), a training checkpoint, an export or "
                   "state dict file, a Hugging Face folder (with --model hf-clip), an open_clip tag (e.g. openai), "
                   "or none for random init (default)")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="open_clip architecture (ViT-B-32, lace-tiny, ...), 'hf-clip:<dir or hub id>' or 'lace-towers'")
    parser.add_argument("--pretrained", default=None, help=PRETRAINED_HELP)
    add_device_argument(parser)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    # argparse passes a string default through `type` only once the command runs, so `--help` imports no torch
    parser.add_argument("--device", default="auto", type=torch_device,
                        help="torch device: auto (cuda if available), cpu, cuda, cuda:1, ... (default: auto)")


def torch_device(name: str) -> str:
    """`name`, with auto read as cuda when a GPU is available, else cpu."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def add_data_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--data", required=required,
                        help="COCO captions JSON, Karpathy JSON, CSV/TSV, or webdataset shards (a.tar or 'shard-{000..009}.tar')")
    parser.add_argument("--split", default=None, help="Karpathy split to keep (train, val, test, ...)")
    parser.add_argument("--image-root", default=None, help="folder the image paths are relative to")


def add_output_arguments(parser: argparse.ArgumentParser, what: str = "output folder") -> None:
    parser.add_argument("--out", required=True, help=what)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty output")


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="show progress bars on long work")


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's own, one per core; 1 when other jobs share the cores)")


def set_threads(threads: int | None) -> None:
    """Give torch `threads` CPU threads (None: leave torch's default)."""
    if threads is not None:
        import torch

        torch.set_num_threads(max(1, threads))
