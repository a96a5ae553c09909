"""The `lace` command line: one subcommand per module in `lace.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from lace import __version__
from lace.commands.interrupted import interrupted_message
from lace.errors import LaceInputError

COMMANDS = (
    "demo",
    "world",
    "embed",
    "dict",
    "edit",
    "train",
    "export",
    "eval",
    "compare",
    "study",
    "fidelity",
    "explore",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lace",
        description=(
            "LACE: fine-tune CLIP-style dual encoders with counterfactual embeddings as hard "
            "negatives for both modalities, and measure the geometry of their shared space."
        ),
    )
    parser.add_argument("--version", action="version", version=f"lace {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"lace.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `lace` with `argv` (default: `sys.argv[1:]`); return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except LaceInputError as error:
        print(f"lace {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        if os.environ.get("RANK", "0") == "0":
            words = list(argv) if argv is not None else sys.argv[1:]
            print(interrupted_message(args.command, words, interrupt), file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
