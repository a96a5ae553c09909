"""The `lace` command line: one subcommand per module in `lace.commands`.

Start-up is fast: the top-level parser lists the commands from `COMMANDS` alone, and only the command the
words name is imported and given its flags (`lace --help` imports no torch); each command imports its
implementation when it runs. An unknown flag is refused with the command's own usage and the closest of
its flags.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

from lace import __version__
from lace.commands.interrupted import interrupted_message
from lace.errors import LaceInputError
from lace.manifest import verification

COMMANDS = {
    # command -> (module of lace.commands, the one line `lace --help` shows, as the module's add_parser says it)
    "demo": ("demo", "run the whole LACE story on the built-in shapes world (CPU, no downloads)"),
    "demo-draws": ("demo_draws", "pool demo runs made from several base draws on one world and check the targets"),
    "world": ("world", "generate the shapes world: rendered scenes, captions and binding benchmarks"),
    "embed": ("embed", "embed a dataset's images and captions into a memory-mapped store"),
    "dict": ("dict", "fit or inspect a sparse concept dictionary"),
    "edit": ("edit", "edit one image's embedding by concept and list its nearest captions"),
    "train": ("train", "fine-tune (or pretrain) a dual encoder, with LACE negatives and ablations"),
    "export": ("export", "write a run's weights as a plain open_clip state dict"),
    "eval": ("eval", "score a model on retrieval, compositional benchmarks and geometry diagnostics"),
    "compare": ("compare", "compare lace eval results files side by side"),
    "study": ("study", "run a whole study on real data and write its report"),
    "fidelity": ("fidelity", "fidelity of local and pooled edits against the world's rendered counterfactuals"),
    "explore": ("explore", "a local web app: inspect embeddings, atoms and edits in the browser"),
}
PARSER = "_parser"
"""Namespace attribute naming the parser of the command that parsed the words (for its usage in errors)."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `lace` parser with every command's flags, or (`only`) with those of that one command alone (the
    others listed by name and help line, their modules not imported)."""
    parser = argparse.ArgumentParser(
        prog="lace",
        description=(
            "LACE: fine-tune CLIP-style dual encoders with counterfactual embeddings as hard "
            "negatives for both modalities, and measure the geometry of their shared space."
        ),
    )
    parser.add_argument("--version", action="version", version=f"lace {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"lace.commands.{module}").add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    for name in subparsers.choices:
        if only is None or name == only:
            add_verify_argument(subparsers.choices[name])
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
        parser.set_defaults(**{PARSER: parser})


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse `argv` (default: `sys.argv[1:]`) with the parser of the command it names; an unknown flag exits 2
    with that command's usage and the closest of its flags."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in words if not word.startswith("-")), None)
    parser = build_parser(only=command if command in COMMANDS else "")
    if command is not None and command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=3, cutoff=0.6)
        parser.error(f"unknown command {command!r}" + (f"; did you mean {' or '.join(close)}?" if close else "")
                     + f" (commands: {', '.join(COMMANDS)})")
    args, unknown = parser.parse_known_args(words)
    owner = vars(args).pop(PARSER, parser)
    if unknown:
        owner.error(unknown_message(owner, unknown))
    return parser, args


def unknown_message(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """'unrecognized arguments: ...', with 'did you mean' for each flag close to one of `parser`'s."""
    flags = [option for action in parser._actions for option in action.option_strings]
    hints = []
    for word in unknown:
        flag = word.split("=", 1)[0]
        close = difflib.get_close_matches(flag, flags, n=3, cutoff=0.6) if flag.startswith("--") else []
        if close:
            hints.append(f"{flag}: did you mean {' or '.join(close)}?")
    return f"unrecognized arguments: {' '.join(unknown)}" + "".join(f"\n  {hint}" for hint in hints)


def main(argv: list[str] | None = None) -> int:
    """Run `lace` with `argv` (default: `sys.argv[1:]`); return the exit code."""
    parser, args = parse(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with verification(getattr(args, "verify", True)):
            return int(args.func(args) or 0)
    except LaceInputError as error:
        print(f"lace {args.command}: error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # a lost process of a data-parallel run: every process still running says so
        if not _is_lost_process(error):
            raise
        print(f"lace {args.command}: error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    except KeyboardInterrupt as interrupt:  # Ctrl-C (130), or a preemption notice (75: resumable)
        if os.environ.get("RANK", "0") == "0":
            words = list(argv) if argv is not None else sys.argv[1:]
            print(interrupted_message(args.command, words, interrupt), file=sys.stderr, flush=True)
        return getattr(interrupt, "exit_code", 130)


def _is_lost_process(error: BaseException) -> bool:
    """Whether `error` is `lace.train.lost_rank.LostProcess` (only a run that imported the module raises one)."""
    module = sys.modules.get("lace.train.lost_rank")
    return module is not None and isinstance(error, module.LostProcess)


if __name__ == "__main__":
    raise SystemExit(main())
