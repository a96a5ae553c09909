"""The `lace` command line: one subcommand per module in `lace.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from lace import __version__
from lace.commands.interrupted import interrupted_message
from lace.errors import LaceInputError
from lace.manifest import verification
from lace.train.lost_rank import LostProcess

COMMANDS = (
    "demo",
    "demo_draws",
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
    for subparser in subparsers.choices.values():
        add_verify_argument(subparser)
    return parser


def add_verify_argument(parser: argparse.ArgumentParser) -> None:
    """`--no-verify` on every command (and its subcommands): read lace's folders without their SHA-256 check."""
    sub_actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in sub_actions:
        for subparser in action.choices.values():
            add_verify_argument(subparser)
    if not sub_actions:
        parser.add_argument("--no-verify", dest="verify", action="store_false", default=True,
                            help="read dictionaries, embedding stores, caches, worlds and stages without checking "
                                 "their SHA-256 manifests (faster on large stores; a damaged file is then read as data)")


def main(argv: list[str] | None = None) -> int:
    """Run `lace` with `argv` (default: `sys.argv[1:]`); return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with verification(getattr(args, "verify", True)):
            return int(args.func(args) or 0)
    except LaceInputError as error:
        print(f"lace {args.command}: error: {error}", file=sys.stderr)
        return 2
    except LostProcess as error:  # every process still running says what it saw
        print(f"lace {args.command}: error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    except KeyboardInterrupt as interrupt:  # Ctrl-C (130), or a preemption notice (75: resumable)
        if os.environ.get("RANK", "0") == "0":
            words = list(argv) if argv is not None else sys.argv[1:]
            print(interrupted_message(args.command, words, interrupt), file=sys.stderr, flush=True)
        return getattr(interrupt, "exit_code", 130)


if __name__ == "__main__":
    raise SystemExit(main())
