"""`lace compare`: side-by-side table (and bar chart) of several `lace eval` results files."""

from __future__ import annotations

import argparse
from pathlib import Path

from lace.errors import LaceInputError
from lace.io import atomic_write_text, check_output_file
from lace.report.compare import comparison_chart, comparison_table, load_results


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare lace eval results files side by side",
        description="Print a markdown table of every metric of several results files, with the "
                    "difference of each model from the first; optionally draw a bar chart.",
    )
    parser.add_argument("results", nargs="+", help="results JSON files written by `lace eval` (the first is the reference)")
    parser.add_argument("--labels", default=None, help="comma-separated column names (default: file names)")
    parser.add_argument("--png", default=None, help="also write a bar chart of the benchmark metrics to this PNG")
    parser.add_argument("--out", default=None, help="also write the markdown table to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out or --png (never one of the results files)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.out and args.png and Path(args.out).resolve() == Path(args.png).resolve():
        raise LaceInputError(f"{args.out}: --out and --png name the same file; give each its own")
    for flag, path in (("--out", args.out), ("--png", args.png)):
        if path:
            check_output_file(path, args.overwrite, what=f"{flag} file", inputs=args.results)
    results = load_results(args.results)
    labels = args.labels.split(",") if args.labels else None
    table = comparison_table(results, labels)
    print(table)
    if args.out:
        atomic_write_text(args.out, table + "\n")
    if args.png:
        comparison_chart(results, args.png, labels)
        print(f"wrote {args.png}")
    return 0
