"""`lace study flickr8k`: LACE measured on real photographs, as one cached, resumable report."""

from __future__ import annotations

import argparse
import os

from lace.commands.common import add_progress_argument
from lace.config import add_config_arguments, config_from_args, with_changes
from lace.data.flickr8k import ENV_VARIABLE
from lace.edits.config import EditConfig
from lace.errors import input_error
from lace.study.config import TOP_ARMS, TopsFinetune, TopsStudyConfig

# TopsStudyConfig fields the command's own flags set (shared with the locked-tower study)
TOPS_OWN_FLAGS = ("data", "out", "feature_cache", "seeds", "arms", "split", "finetune.negatives.edit", "zeroshot_root",
                  "zeroshot_classnames", "zeroshot_templates", "progress")


# Fields that do not apply to the tops: the local editor acts on the cached maps themselves (no tower layer to
# choose; its reader fitted on every training image, its operator the Gaussian transport or, for the arms that
# switch to it, the learnt recolouring fitted on the first local.fit_images training photographs), one rule-made
# negative per caption is cached, and the dictionary takes the study's vocabulary.
TOPS_NOT_ON_MAPS = (*(f"finetune.negatives.local.{name}" for name in ("layer", "locate_layer", "text_layer",
                                                                       "operator")),
                    "finetune.negatives.rule_negatives_per_caption", "dictionary.vocabulary")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "study", help="run a whole study on real data and write its report",
        description="Studies of the method on real data, each one command writing report.md and report.html.",
    )
    studies = parser.add_subparsers(dest="study", metavar="STUDY")
    flickr = studies.add_parser(
        "flickr8k", help="LACE on Flickr8k photographs with locked pretrained towers",
        description=(
            "Tower features of every Flickr8k image and caption (cached), base heads chosen on validation, "
            "their hubness, one-way neighbours and brittleness, a concept dictionary with atom alignment, "
            "edit retrieval with named transplants, and fine-tunes from the base (plain, rule-made caption "
            "negatives, LACE, LACE + caption negatives, LACE on captions only and on images only) over seeds. "
            "With --tops, the tops of the towers train too, and every training arm runs. "
            "Stages are cached in --out/stages: running again resumes and reuses."
        ),
    )
    flickr.add_argument("--data", default=os.environ.get(ENV_VARIABLE),
                        help=f"Flickr8k folder with captions.csv and images/ (default: ${ENV_VARIABLE})")
    flickr.add_argument("--out", required=True, help="study folder (an earlier study's folder is resumed)")
    flickr.add_argument("--overwrite", action="store_true", help="start over in a non-empty --out")
    flickr.add_argument("--seeds", type=int, default=3, help="seeds per fine-tune variant (default: 3)")
    flickr.add_argument("--feature-cache", default=None,
                        help="folder of cached tower features, shared between studies (default: OUT/features)")
    flickr.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default: 1, fastest for the towers on a small shared CPU)")
    flickr.add_argument("--zeroshot-root", default=None, metavar="FOLDER",
                        help="also score zero-shot on this image folder, one subfolder per class, before and after "
                             "every fine-tune (the locked-tower study always scores a task derived from the test "
                             "captions)")
    flickr.add_argument("--zeroshot-classnames", default=None, help="class names of --zeroshot-root")
    flickr.add_argument("--zeroshot-templates", default=None, help="prompt templates of --zeroshot-root")
    flickr.add_argument("--edit-config", default=None, metavar="YAML",
                        help="YAML of EditConfig fields for LACE fine-tuning and counterfactual brittleness")
    tops = flickr.add_argument_group(
        "trainable tops", "with --tops: the last stage of the image tower and the last two text layers train with the "
        "heads, on cached intermediates, through the project trainer, and every training arm runs "
        "(lace.study.flickr8k_top_arms): " + ", ".join(TOP_ARMS))
    tops.add_argument("--tops", action="store_true", help="run the tower-tops study instead of the locked-tower one")
    tops.add_argument("--arms", dest="arm_names", default="all", help="comma-separated arm names, or all (default: all)")
    tops.add_argument("--split", choices=("val", "test"), default="val",
                      help="split to measure on (default: val; test once, at the end: it reuses every trained model)")
    add_config_arguments(flickr, EditConfig, prefix="edit.")
    add_config_arguments(flickr, TopsStudyConfig,
                         skip=TOPS_OWN_FLAGS + TOPS_NOT_ON_MAPS)
    add_progress_argument(flickr)
    flickr.set_defaults(func=run)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def run(args: argparse.Namespace) -> int:
    import torch

    from lace.study import StudyConfig, run_flickr8k_study
    from lace.study.flickr8k import prepare_study_folder

    if not args.data:
        raise input_error("--data", None, f"a Flickr8k folder (or the environment variable {ENV_VARIABLE})")
    torch.set_num_threads(max(1, args.threads))
    prepare_study_folder(args.out, args.overwrite)
    edit = config_from_args(EditConfig, args, yaml_path=args.edit_config, prefix="edit.")
    if args.tops:
        return run_tops(args, edit)
    config = StudyConfig(data=args.data, out=args.out, seeds=args.seeds, feature_cache=args.feature_cache,
                         edit=edit, progress=args.progress, zeroshot_root=args.zeroshot_root,
                         zeroshot_classnames=args.zeroshot_classnames, zeroshot_templates=args.zeroshot_templates)
    results = run_flickr8k_study(config)
    print(f"wrote {args.out}/report.md and report.html in {results['total_seconds']:.0f}s")
    return 0


def tops_config(args: argparse.Namespace, edit: EditConfig) -> TopsStudyConfig:
    """The tower-tops study's config from every flag the command shows."""
    arms = TOP_ARMS if args.arm_names == "all" else tuple(name.strip() for name in args.arm_names.split(","))
    base = TopsStudyConfig(data=args.data, out=args.out, feature_cache=args.feature_cache, arms=arms, seeds=args.seeds,
                           split=args.split, finetune=with_changes(TopsFinetune(), {"edit": edit}),
                           zeroshot_root=args.zeroshot_root,
                           zeroshot_classnames=args.zeroshot_classnames, zeroshot_templates=args.zeroshot_templates,
                           progress=args.progress)
    return config_from_args(TopsStudyConfig, args, base=base)


def run_tops(args: argparse.Namespace, edit: EditConfig) -> int:
    from lace.study.flickr8k_top_arms import run_tops_study

    result = run_tops_study(tops_config(args, edit))
    print(f"wrote {args.out}/arms-{result['split']}.md and arms-{result['split']}.json")
    return 0
