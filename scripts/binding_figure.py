"""Draw the README's figure: swap-attribute accuracy in and out of distribution, from a `lace demo-draws` JSON.

    python scripts/binding_figure.py docs/realistic-draws.json --out docs/images/binding.png

Bars are means over base draws x fine-tune seeds; whiskers are +- the spread across seeds (the mean of the
within-draw sample standard deviations), as `lace demo-draws` records it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ARMS = ("plain", "caption negatives", "LACE-local pairs + real-image negative", "LACE-local symmetric pairs (round trip)",
        "LACE-local symmetric pairs (round trip) + caption negatives", "ceiling (rendered swaps)")
LABELS = ("plain", "caption\nnegatives", "LACE-local\npairs", "LACE-local\nsymmetric\npairs",
          "symmetric\npairs + caption\nnegatives", "ceiling\n(rendered\nswaps)")
PANELS = (("test", "in distribution"), ("test_comp", "held-out colour-shape pairs"))
DIRECTIONS = (("i2t swap-att", "image->text"), ("t2i swap-att", "text->image"))


def draw(draws: dict, out: Path) -> None:
    """One panel per split, two bars (image->text, text->image) per arm."""
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    runs = draws["figures"]["test"][ARMS[0]][DIRECTIONS[0][0]]["runs"]
    for axis, (split, title) in zip(axes, PANELS):
        figures = draws["figures"][split]
        for offset, (key, name) in zip((-0.2, 0.2), DIRECTIONS):
            means = [figures[arm][key]["mean"] for arm in ARMS]
            spreads = [figures[arm][key]["across_seeds"] or 0.0 for arm in ARMS]
            positions = [i + offset for i in range(len(ARMS))]
            axis.bar(positions, means, width=0.38, yerr=spreads, capsize=3, label=name)
        axis.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="chance (two captions or two images)")
        axis.set_xticks(range(len(ARMS)), LABELS, fontsize=8)
        axis.set_title(title)
        axis.set_ylim(0.2, 0.95)
    axes[0].set_ylabel("swap-attribute accuracy")
    axes[1].legend(fontsize=8, loc="upper left")
    figure.suptitle(f"Shapes world, test split: mean over {len(draws['base_seeds'])} base draws x seeds "
                    f"({runs} runs), whiskers = spread across seeds", fontsize=9)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draws", type=Path, help="a JSON written by lace demo-draws")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    draw(json.loads(args.draws.read_text()), args.out)


if __name__ == "__main__":
    main()
