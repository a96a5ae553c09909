"""`lace dict fit` and `lace dict inspect`: build a labelled concept dictionary, look inside it."""

from __future__ import annotations

import argparse
import time

from lace.commands.common import (
    PRETRAINED_HELP,
    add_device_argument,
    add_output_arguments,
    add_progress_argument,
)
from lace.config import add_config_arguments, config_from_args, config_to_dict
from lace.edits.config import EditConfig
from lace.errors import input_error
from lace.experiment.dictionary_config import DictionaryConfig
from lace.io import (
    atomic_dir,
    atomic_write_json,
    check_output_file,
    prepare_output_dir,
    removed_on_failure,
)
from lace.manifest import add_to_manifest


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "dict", help="fit or inspect a sparse concept dictionary",
        description="Sparse concept dictionaries shared by image and text embeddings.",
    )
    actions = parser.add_subparsers(dest="dict_command", metavar="ACTION")

    fit = actions.add_parser(
        "fit", help="fit a dictionary on an embedding store and label its atoms with concepts",
        description="Fit a sparse dictionary on the centred image and text embeddings of a store "
                    "(streamed from the memory-mapped .npy files), measure its quality (FVU, cosine, L0, "
                    "dead atoms per modality), derive concept directions (caption means from the store's "
                    "captions; prompt templates too when --model is given) and label every atom. With "
                    "--bindings (default) it also derives compound ('red square') directions for the rebind edit.",
    )
    fit.add_argument("--embeddings", required=True, help="embedding store folder written by `lace embed`")
    fit.add_argument("--model", default=None, help="text encoder for prompt-template concept directions (optional)")
    fit.add_argument("--pretrained", default=None, help=PRETRAINED_HELP)
    add_device_argument(fit)
    add_config_arguments(fit, DictionaryConfig)
    add_output_arguments(fit, "dictionary folder to write")
    add_progress_argument(fit)
    fit.set_defaults(func=run_fit)

    inspect = actions.add_parser(
        "inspect", help="list atoms, labels and usage; show one embedding's atoms before and after an edit",
        description="Print every atom's concept label, alignment and usage. With --embeddings and --index, "
                    "show the active atoms of one embedding, and with --edit the same after the edit; "
                    "--png draws them as a bar chart.",
    )
    inspect.add_argument("--dictionary", "--dict", dest="dict", metavar="DICTIONARY", required=True,
                         help="dictionary folder written by `lace dict fit`")
    inspect.add_argument("--embeddings", default=None, help="embedding store folder (for usage and --index)")
    inspect.add_argument("--modality", choices=("image", "text"), default="image", help="modality of --index")
    inspect.add_argument("--index", type=int, default=None, help="row of the embedding to show")
    inspect.add_argument("--edit", default=None, help="edit to apply to the --index embedding, e.g. 'transplant:red=blue'")
    inspect.add_argument("--png", default=None, help="write a bar chart of the --index embedding's active atoms to this file")
    inspect.add_argument("--overwrite", action="store_true", help="replace an existing --png")
    inspect.add_argument("--top", type=int, default=40, help="atoms to list (most used first)")
    add_config_arguments(inspect, EditConfig, prefix="edit.")
    inspect.set_defaults(func=run_inspect)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def run_fit(args: argparse.Namespace) -> int:
    with removed_on_failure(args.out):  # bad input: no empty output folder left behind
        return _fit(args)


def _fit(args: argparse.Namespace) -> int:
    from lace.concepts.labelled import concept_directions_for_store, save_labelled_dictionary
    from lace.embeddings import EmbeddingStore
    from lace.experiment.dictionary import fit_labelled_dictionary

    config = config_from_args(DictionaryConfig, args)
    store = EmbeddingStore.open(args.embeddings)
    out = prepare_output_dir(args.out, overwrite=args.overwrite, inputs=(args.embeddings,))
    encode_texts = None
    if args.model:
        from lace.encoders import load_encoder

        encode_texts = load_encoder(args.model, args.pretrained, device=args.device).encode_texts
    started = time.perf_counter()
    directions = concept_directions_for_store(
        config.vocabulary, store.captions, store.text_embeddings, encode_texts, config.min_mentions
    )
    result = fit_labelled_dictionary(
        store.image_embeddings, store.text_embeddings, directions, config, captions=store.captions,
        device=args.device, progress=args.progress,
    )
    with atomic_dir(out) as folder:  # the folder appears whole or not at all
        save_labelled_dictionary(result, folder)
        atomic_write_json(folder / "fit_config.json", {**config_to_dict(config), "embeddings": str(args.embeddings)})
        add_to_manifest(folder, ("fit_config.json",))
    quality = result.dictionary.quality_
    print(f"fitted {quality['n_atoms']} atoms (s={config.sparsity}, mode={config.mode}) in "
          f"{time.perf_counter() - started:.1f}s")
    print(f"{'modality':<9}{'FVU':>8}{'cosine':>9}{'L0':>7}{'dead':>7}")
    for modality in ("image", "text"):
        q = quality[modality]
        print(f"{modality:<9}{q['fvu']:>8.3f}{q['mean_cosine']:>9.3f}{q['mean_l0']:>7.2f}{q['dead_atom_share']:>7.2f}")
    labelling = result.labelling
    print(f"tau_align={labelling.tau_align:.3f}: {int(labelling.aligned().sum())} of {labelling.atom_concept.shape[0]} "
          f"atoms aligned, owning {len(set(labelling.atom_concept[labelling.aligned()].tolist()))} concepts")
    print(f"wrote {out}")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    from lace.concepts.labelled import load_labelled_dictionary
    from lace.edits.build import check_store_dimension
    from lace.embeddings import EmbeddingStore

    for flag, given in (("--png", args.png), ("--edit", args.edit)):
        if given and args.index is None:  # both act on one embedding's atoms: without a row they would do nothing
            raise input_error(flag, None, "--index, the row of --embeddings whose atoms it shows")
    if args.png:
        check_output_file(args.png, args.overwrite, what="--png file")
    labelled = load_labelled_dictionary(args.dict)
    edit_config = config_from_args(EditConfig, args, prefix="edit.")
    store = EmbeddingStore.open(args.embeddings) if args.embeddings else None
    if store is not None:
        check_store_dimension(labelled, args.dict, store.dim, args.embeddings)
    _print_atoms(labelled, _atom_usage(labelled.dictionary, store) if store is not None else None, args.top)
    if args.index is None:
        return 0
    if store is None:
        raise input_error("--index", None, "--embeddings to pick the embedding from")
    _show_embedding(args, labelled, store, edit_config)
    return 0


def _atom_usage(dictionary, store):
    """(K,) share of the store's embeddings (up to 10k per modality, evenly spaced) with each atom active."""
    import numpy as np
    import torch

    active = []
    for modality, table in (("image", store.image_embeddings), ("text", store.text_embeddings)):
        rows = np.unique(np.linspace(0, table.shape[0] - 1, min(10000, table.shape[0])).astype(int))
        active.append(dictionary.transform(np.asarray(table[rows]), modality, dense=True) > 0)
    return torch.cat(active).float().mean(0)


def _print_atoms(labelled, usage, top: int) -> None:
    """The `top` atoms (most used first when `usage` is known): label, kind, alignment, aligned, usage."""
    import torch

    directions, labelling = labelled.directions, labelled.labelling
    order = torch.argsort(usage, descending=True) if usage is not None else torch.arange(labelling.atom_concept.shape[0])
    print(f"{'atom':>6}  {'label':<20}{'kind':<11}{'align':>7}{'aligned':>9}" + (f"{'usage':>8}" if usage is not None else ""))
    for k in order[:top].tolist():
        concept = int(labelling.atom_concept[k])
        line = (f"{k:>6}  {directions.names[concept]:<20}{directions.groups[concept]:<11}"
                f"{float(labelling.atom_alignment[k]):>7.3f}{'yes' if bool(labelling.aligned()[k]) else 'no':>9}")
        if usage is not None:
            line += f"{float(usage[k]):>8.3f}"
        print(line)


def _show_embedding(args: argparse.Namespace, labelled, store, edit_config: EditConfig) -> None:
    """The active atoms of row `--index` of the store, before and after `--edit`; `--png` draws them."""
    import numpy as np
    import torch

    from lace.edits import build_editor, parse_edit
    from lace.report.plots import atom_bars

    dictionary, names, labelling = labelled.dictionary, labelled.directions.names, labelled.labelling
    table = store.image_embeddings if args.modality == "image" else store.text_embeddings
    if not 0 <= args.index < table.shape[0]:
        raise input_error("--index", None, f"a row in 0..{table.shape[0] - 1}", args.index)
    z = torch.from_numpy(np.array(table[args.index : args.index + 1], dtype=np.float32))
    before = dictionary.transform(z, args.modality, dense=True)[0]
    after = None
    if args.edit:
        editor = build_editor(labelled, edit_config)
        edited = editor.apply(z, args.modality, parse_edit(args.edit))
        record = edited.records.to_dicts(editor.unit_names)[0]
        print(f"edit {args.edit}: proposed={record['proposed']} passed_check={record['passed_check']} "
              f"step={record['step_size']:.3f}")
        after = dictionary.transform(edited.embeddings[:, 0], args.modality, dense=True)[0]
    active = sorted(set(before.nonzero().squeeze(1).tolist()) | (set(after.nonzero().squeeze(1).tolist()) if after is not None else set()))
    print(f"\nactive atoms of {args.modality} {args.index}:")
    for k in active:
        label = names[int(labelling.atom_concept[k])]
        line = f"{k:>6}  {label:<20}{float(before[k]):>8.3f}"
        if after is not None:
            line += f"  -> {float(after[k]):.3f}"
        print(line)
    if args.png:
        panels = [("before", before.numpy())] + ([(f"after {args.edit}", after.numpy())] if after is not None else [])
        atom_bars(panels, [names[int(c)] for c in labelling.atom_concept.tolist()], args.png,
                  title=f"{args.modality} {args.index}")
        print(f"wrote {args.png}")
