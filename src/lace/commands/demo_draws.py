"""`lace demo-draws`: pool demo runs on one world, one base draw each, and check the pre-registered targets."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo-draws", help="pool demo runs made from several base draws on one world and check the targets",
        description="Read the results.json of several `lace demo` runs on one world, each from its own base draw "
                    "(`lace demo --base-seed K`), and write a markdown report and a JSON beside it: per variant and "
                    "figure the mean over base draws x seeds, the spread across draws and across fine-tune seeds, "
                    "and the pre-registered targets, each met or missed and by how much.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="demo run folders (or their results.json)")
    parser.add_argument("--out", required=True, metavar="FILE.md",
                        help="markdown report to write; the figures go beside it as FILE.json")
    parser.add_argument("--best", default=None, metavar="VARIANT",
                        help="the LACE arm the targets are checked for, chosen on validation (default: the pairs arm "
                             "without caption negatives with the best validation mean of i2t and t2i swap-attribute)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out and its .json")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lace.demo.draws import combine_draws, read_draws, summary_table, write_draws

    draws = read_draws(args.runs)
    result = combine_draws(draws, args.best)
    markdown, data = write_draws(result, args.out, args.overwrite)
    print(summary_table(result).markdown())
    for target in result["targets"]:
        print(f"{target['status']}: {target['text']} ({target['split']}) — {target['evidence']}")
    print(f"\nwrote {markdown} and {data}")
    return 0
