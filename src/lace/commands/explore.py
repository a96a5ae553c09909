"""`lace explore`: a local web app to look inside embeddings, concept atoms and edits."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lace.commands.common import PRETRAINED_HELP, add_progress_argument
from lace.commands.demo import quick_config
from lace.config import config_from_dict, config_to_dict
from lace.demo.config import DemoConfig
from lace.errors import LaceInputError, input_error
from lace.io import atomic_write_json, read_json

EXPLORE_MARK = "explore.json"
"""Written in a demo folder whose stages `lace explore` made with the quick settings (no full demo there)."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "explore", help="a local web app: inspect embeddings, atoms and edits in the browser",
        description="Serve a page to pick an image (or type a caption), see its active concept atoms, edit it "
                    "(attenuate, swap, transplant, rebind) and compare the nearest real images and captions "
                    "before, after and after a random edit of the same size; atom pages; a 2-D map with hubs "
                    "and one-way neighbours; two models side by side. With no --model it opens the shapes "
                    "world of `lace demo` (its cached base model and dictionary, made first if missing).",
    )
    parser.add_argument("--model", default=None, help="model to explore (as `lace eval --model`); none: the demo's base")
    parser.add_argument("--pretrained", default=None, help=PRETRAINED_HELP)
    parser.add_argument("--dictionary", "--dict", dest="dictionary", default=None,
                        help="dictionary folder written by `lace dict fit` for this model (none: codes and edits off)")
    parser.add_argument("--data", default=None, help="image-caption data (COCO, Karpathy, CSV, webdataset)")
    parser.add_argument("--split", default=None, help="Karpathy split to show (default: all; a finished demo's: test)")
    parser.add_argument("--image-root", default=None, help="folder the image paths are relative to")
    parser.add_argument("--model2", default=None, help="a second model to compare side by side")
    parser.add_argument("--pretrained2", default=None, help="the second model's weights (as --pretrained)")
    parser.add_argument("--dictionary2", default=None,
                        help="the second model's dictionary (default: the first one's, when the dimensions match)")
    parser.add_argument("--demo", default="runs/demo",
                        help="demo folder used without --model (the `lace demo` default): a finished or running demo's "
                             "world, base and dictionary are used as they are; in an empty folder they are made with "
                             "`lace demo --quick` sizes (a minute) and reused by later runs")
    parser.add_argument("--k", type=int, default=10, help="neighbours per item in the geometry lists")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    parser.add_argument("--port", type=int, default=8765, help="port to listen on")
    parser.add_argument("--device", default="cpu", help="torch device of the models")
    add_progress_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from lace.explore.app import create_app

    start = time.perf_counter()
    session = session_from_args(args)
    url = f"http://{args.host}:{args.port}/"
    print(f"lace explore: ready in {time.perf_counter() - start:.1f}s at {url}  (Ctrl-C stops it)", flush=True)
    uvicorn.run(create_app(session), host=args.host, port=args.port, log_level="warning")
    return 0


def session_from_args(args: argparse.Namespace):
    """The `ExploreSession` the flags describe: data and models loaded, embedded (progress bars), coded."""
    from lace.explore.state import build_model_view, build_session

    if args.k < 1:
        raise input_error("--k", None, "at least one neighbour", args.k)
    dataset, first, second = _inputs(args)
    views = [build_model_view(name, encoder, labelled, dataset, k=args.k, progress=args.progress)
             for name, encoder, labelled in (first, second) if name is not None]
    return build_session(dataset, views)


def _inputs(args: argparse.Namespace):
    """The dataset and (name, encoder, labelled dictionary) of each model; the demo's when no --model is given."""
    from lace.concepts.labelled import load_labelled_dictionary
    from lace.data import read_dataset
    from lace.demo.pipeline import demo_model_and_dictionary
    from lace.encoders import load_encoder

    if args.model is None:
        if args.pretrained or args.data or args.dictionary:
            raise input_error("--model", None, "a model whenever --pretrained, --data or --dictionary is given", None)
        foundation = demo_model_and_dictionary(_demo_config(Path(args.demo), args.progress), args.demo)
        # a finished demo's held-out test split; the quick world's is too small to browse, so all of it
        finished = (Path(args.demo) / "results.json").is_file()
        dataset = read_dataset(foundation.world_dir / "karpathy_coco.json",
                               split=args.split or ("test" if finished else None))
        first = ("demo base", foundation.encoder, load_labelled_dictionary(foundation.dictionary_dir))
        labelled = first[2]
        fine_tune = foundation.base_path.with_name(f"lace-seed{foundation.config.seed}.pt")
        if args.model2 is None and fine_tune.is_file():  # a finished demo: compare the base with its LACE fine-tune
            args.model2, args.pretrained2 = foundation.config.model, str(fine_tune)
    else:
        if args.data is None:
            raise input_error("--data", None, "image-caption data to explore with --model", None)
        dataset = read_dataset(args.data, split=args.split, image_root=args.image_root)
        labelled = load_labelled_dictionary(args.dictionary) if args.dictionary else None
        first = (_name(args.model, args.pretrained), load_encoder(args.model, args.pretrained, device=args.device),
                 labelled)
    if not len(dataset):
        raise LaceInputError(f"{args.data or args.demo}: no images to explore (split {args.split!r})")
    second = (None, None, None)
    if args.model2 is not None:
        labelled2 = load_labelled_dictionary(args.dictionary2) if args.dictionary2 else labelled
        second = (_name(args.model2, args.pretrained2), load_encoder(args.model2, args.pretrained2, device=args.device),
                  labelled2)
    return dataset, first, second


def _demo_config(folder: Path, progress: bool) -> DemoConfig:
    """The settings of the demo in `folder`: a finished demo's, the quick ones `lace explore` made there before,
    the defaults for a `lace demo` under way, or (empty folder) the quick ones, recorded."""
    if (folder / "results.json").is_file():
        return config_from_dict(DemoConfig, read_json(folder / "results.json")["config"], str(folder / "results.json"))
    if (folder / EXPLORE_MARK).is_file():
        return config_from_dict(DemoConfig, read_json(folder / EXPLORE_MARK)["config"], str(folder / EXPLORE_MARK))
    if (folder / "stages").is_dir():
        return DemoConfig(progress=progress)
    config = quick_config(DemoConfig(progress=progress))
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / EXPLORE_MARK, {"config": config_to_dict(config)})
    print(f"lace explore: no demo in {folder}; making its world, base and dictionary with `lace demo --quick` sizes")
    return config


def _name(model: str, pretrained: str | None) -> str:
    return model if not pretrained else f"{model} ({Path(pretrained).name})"
