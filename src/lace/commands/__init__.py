"""Subcommands of `lace`: each module registers itself with `add_parser(subparsers)`."""
