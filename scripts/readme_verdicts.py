"""Put the opening verdict table of a demo report into the README (or check that it is there).

    python scripts/readme_verdicts.py runs/demo/report.md README.md           # replace the README's table
    python scripts/readme_verdicts.py runs/demo/report.md README.md --check   # exit 1 when they differ

The table runs from its header line (`| claim |`) to the tally line under it (`*in distribution: ...*`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HEADER = "| claim |"
TALLY = "*in distribution:"


def verdict_block(text: str, where: str) -> tuple[int, int]:
    """(first, last + 1) line numbers of the verdict table and its tally line in `text`."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(HEADER)), None)
    stop = next((i for i, line in enumerate(lines[start or 0:], start or 0) if line.startswith(TALLY)), None)
    if start is None or stop is None:
        raise SystemExit(f"{where}: expected a verdict table starting '{HEADER}' and its tally line starting '{TALLY}'")
    return start, stop + 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("readme", type=Path)
    parser.add_argument("--check", action="store_true", help="only say whether the README holds the report's table")
    args = parser.parse_args()
    report, readme = args.report.read_text(), args.readme.read_text()
    start, stop = verdict_block(report, str(args.report))
    table = report.splitlines()[start:stop]
    lines = readme.splitlines()
    first, last = verdict_block(readme, str(args.readme))
    if lines[first:last] == table:
        print(f"{args.readme}: the verdict table is the one of {args.report}")
        return 0
    if args.check:
        print(f"{args.readme}: the verdict table differs from the one of {args.report}")
        return 1
    args.readme.write_text("\n".join(lines[:first] + table + lines[last:]) + "\n")
    print(f"{args.readme}: verdict table replaced by the one of {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
