"""`lace demo`: generate the shapes world, pretrain a base that does not bind, fit the
concept dictionary, fine-tune with and without LACE, evaluate everything, write a report."""

from __future__ import annotations

import argparse
import time
from collections.abc import Collection
from pathlib import Path

from lace.config import (
    add_config_arguments,
    config_from_args,
    flag_dests,
    flags_as_fields,
    with_changes,
)
from lace.demo.config import DemoConfig


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the whole LACE story on the built-in shapes world (CPU, no downloads)",
        description="Generate the shapes world, pretrain a lace-tiny base on web-like captions, fit the concept "
                    "dictionary, fine-tune in each variant (plain, caption negatives, LACE, ...), evaluate every "
                    "model and write report.md and report.html. Stages are cached: a rerun resumes.",
    )
    parser.add_argument("--out", default="runs/demo", help="run folder (stages are cached here; a rerun reuses them)")
    parser.add_argument("--config", default=None, help="YAML file of DemoConfig fields")
    parser.add_argument("--quick", action="store_true",
                        help="a small world and few steps: checks the pipeline end to end in about a minute")
    parser.add_argument("--sweep", default=None, metavar="GRID",
                        help="YAML of named LACE settings (DemoConfig overrides) to fine-tune from the same base and "
                             "compare on the validation split; writes sweep.md and sweep.html (e.g. configs/demo-sweep.yaml)")
    parser.add_argument("--reuse", default=None, metavar="RUN",
                        help="start from another demo run folder's world and base (reused when the settings that "
                             "made them match; everything after them is recomputed)")
    add_config_arguments(parser, DemoConfig)
    parser.set_defaults(func=run)


QUICK = {"world_images": 600, "base_steps": 30, "finetune_steps": 10, "batch_size": 32, "atoms": 32, "sparsity": 4}
"""`--quick` sizes, by flag name."""


def quick_config(config: DemoConfig, given: Collection[str] = ()) -> DemoConfig:
    """`config` at the `--quick` sizes, but for the flags of `given` (names as in `QUICK`)."""
    return with_changes(config, flags_as_fields(DemoConfig, {k: v for k, v in QUICK.items() if k not in given}))


def run(args: argparse.Namespace) -> int:
    from lace.demo import run_demo
    from lace.demo.report import summary_markdown
    from lace.demo.sweep import read_grid, reuse_run, run_sweep, sweep_report

    config = config_from_args(DemoConfig, args, args.config)
    if args.quick:
        dests = flag_dests(DemoConfig)
        config = quick_config(config, {name for name in QUICK if getattr(args, dests[name], None) is not None})
    start = time.perf_counter()
    if args.reuse:
        reuse_run(args.reuse, args.out)
    if args.sweep:
        result = run_sweep(config, args.out, read_grid(args.sweep))
        print()
        print(sweep_report(result).markdown(Path(args.out)))
        print(f"sweep: {args.out}/sweep.md and {args.out}/sweep.html ({time.perf_counter() - start:.0f}s)")
        return 0
    summary = run_demo(config, args.out)
    print()
    print(summary_markdown(summary))
    print(f"\nreport: {args.out}/report.md and {args.out}/report.html ({time.perf_counter() - start:.0f}s)")
    return 0
