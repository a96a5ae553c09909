"""`lace edit`: apply a named edit to one image's embedding and look up the nearest real captions."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from lace.concepts.labelled import load_labelled_dictionary
from lace.config import add_config_arguments, config_from_args
from lace.edits import EditConfig, build_editor, parse_edit
from lace.edits.build import check_store_dimension
from lace.embeddings import EmbeddingStore
from lace.errors import LaceInputError, input_error
from lace.eval.neighbours import topk_neighbours
from lace.io import check_output_file, removed_on_failure
from lace.report.edit_grid import images_naming


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "edit", help="edit one image's embedding by concept and list its nearest captions",
        description="Apply a named edit (attenuate:c, swap:c=c', transplant:c=c', rebind:a=a' with a dictionary "
                    "that has binding directions) to an image's embedding "
                    "and list the nearest real captions before, after, and after a random edit of the same "
                    "step size.",
    )
    parser.add_argument("--dictionary", "--dict", dest="dict", metavar="DICTIONARY", required=True,
                        help="dictionary folder written by `lace dict fit`")
    parser.add_argument("--embeddings", required=True, help="embedding store folder written by `lace embed`")
    parser.add_argument("--image", type=int, default=None,
                        help="row of the image in the store (required unless --png chooses the sources)")
    parser.add_argument("--edit", required=True, help="the edit, e.g. 'transplant:square=star'")
    parser.add_argument("--k", type=int, default=10, help="neighbours to list")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random control")
    add_config_arguments(parser, EditConfig, prefix="edit.", flags={"strength": ("--strength", "--edit-strength")})
    parser.add_argument("--png", default=None,
                        help="write the neighbour grid: for the first --sources images (store order) whose captions "
                             "name the source and not the target, their nearest real images before the edit, after "
                             "it and after a random edit of the same size, at each of --strengths")
    parser.add_argument("--sources", type=int, default=4, help="source images in the --png grid")
    parser.add_argument("--strengths", default="1,4",
                        help="comma-separated transplant strengths of the --png grid (the figures' and a stronger one)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --png")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    labelled = load_labelled_dictionary(args.dict)
    store = EmbeddingStore.open(args.embeddings)
    check_store_dimension(labelled, args.dict, store.dim, args.embeddings)
    if args.png is not None:
        with removed_on_failure(Path(args.png).parent):
            code = _write_grid(args, labelled, store)
        if args.image is None:
            return code
    if args.image is None:
        raise input_error("--image", None, "a row of the store (or --png for the neighbour grid)", None)
    if not 0 <= args.image < store.image_embeddings.shape[0]:
        raise input_error("--image", None, f"a row in 0..{store.image_embeddings.shape[0] - 1}", args.image)
    spec = parse_edit(args.edit)
    editor = build_editor(labelled, config_from_args(EditConfig, args, prefix="edit."))
    z = torch.from_numpy(np.array(store.image_embeddings[args.image : args.image + 1], dtype=np.float32))
    edited = editor.apply(z, "image", spec)
    control = editor.apply(z, "image", spec, control="random", generator=torch.Generator().manual_seed(args.seed))
    record = edited.records.to_dicts(editor.unit_names)[0]
    if not record["proposed"]:
        raise LaceInputError(_nothing_to_edit(args.edit, spec, args.image, record))
    print(f"edit {args.edit} on image {args.image}: step |(a'-a)D| = {record['step_size']:.3f}, "
          f"effect check {'passed' if record['passed_check'] else 'FAILED'}")
    concept = labelled.directions.names[labelled.directions.index(spec.target or spec.source)]
    kind = labelled.directions.kinds[labelled.directions.index(concept)]
    mention = images_naming(store.captions, range(len(store.captions)), len(store.captions), concept, kind)
    queries = torch.cat([z, edited.embeddings[:, 0].detach(), control.embeddings[:, 0].detach()])
    neighbours = topk_neighbours(queries, np.array(store.text_embeddings, dtype=np.float32), args.k).indices
    for title, rows in zip(("before", "after edit", "after random edit of the same size"), neighbours.tolist()):
        share = np.mean([mention[r] for r in rows])
        print(f"\n{title}  (captions naming '{concept}': {share:.0%})")
        for rank, row in enumerate(rows, 1):
            print(f"  {rank:>2}. {store.captions[row]}")
    return 0


def _nothing_to_edit(edit: str, spec, image: int, record: dict) -> str:
    """Why an edit found nothing to edit on one image, in words."""
    source_weight, target_weight = record["source_weight_before"], record["target_weight_before"]
    if source_weight <= 0:
        found = f"its code holds no '{spec.source}' (source weight {source_weight:.3f})"
    elif spec.kind == "transplant" and target_weight > 0:
        found = f"it already holds '{spec.target}' (target weight {target_weight:.3f})"
    else:
        found = f"'{spec.source}' is too weak to edit (source weight {source_weight:.3f})"
    need = "the source present" + (" and the target absent" if spec.kind == "transplant" else "")
    return (f"edit {edit} finds nothing to edit on image {image}: {found}; the edit needs {need}. Pick an image "
            f"whose captions name '{spec.source}', or another edit")


def _write_grid(args: argparse.Namespace, labelled, store: EmbeddingStore) -> int:
    from PIL import Image

    from lace.experiment.edit_grids import edit_grid_stage

    png = check_output_file(args.png, args.overwrite, what="--png file")
    spec = parse_edit(args.edit)
    if spec.kind != "transplant":
        raise input_error("--edit", None, "a transplant 'transplant:a=b' for the --png grid", args.edit)
    try:
        strengths = [float(value) for value in args.strengths.split(",") if value.strip()]
    except ValueError as error:
        raise input_error("--strengths", None, "comma-separated numbers such as 1,4", args.strengths) from error
    if not strengths or min(strengths) <= 0 or args.sources < 1:
        raise input_error("--strengths/--sources", None, "positive strengths and at least one source",
                          f"{args.strengths} / {args.sources}")
    paths = store.index.get("image_paths")
    if not paths:
        raise input_error(store.path / "index.json", "image_paths", "the image files of the store (`lace embed`)", None)
    def load_image(row: int) -> Image.Image:
        path = Path(paths[row])
        if not path.is_file():
            raise input_error(store.path / "index.json", "image_paths", "image files that exist", str(path))
        with Image.open(path) as image:
            return image.convert("RGB")

    gallery = torch.from_numpy(np.array(store.image_embeddings, dtype=np.float32))
    grid = edit_grid_stage(labelled, gallery, store.captions, store.text_image_index, args.edit, load_image, png,
                           strengths, n_sources=args.sources, k=args.k, seed=args.seed,
                           config=config_from_args(EditConfig, args, prefix="edit."))
    rows = grid["rows"]
    if not rows:
        raise LaceInputError(f"no grid: the edit {args.edit} finds nothing to edit on any of the "
                             f"{grid['candidates']} images naming '{spec.source}' and not '{spec.target}'")
    for row in rows:
        print(f"image {row['source']}: {row['label']}: {row['target_count']}/{args.k} {spec.target}")
    print(f"wrote {png}")
    return 0
