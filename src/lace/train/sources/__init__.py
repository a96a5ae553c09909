"""The negative sources, by name: the one registry through which a run builds what its arm switches on.

The order of `SOURCES` is the order of the loss's columns (the counterfactual edits first, then the rule-made
captions, the paired directions, LACE-local's image and caption edits, the rendered ceiling); the pairs rows, which
read every other source's image edits, run last. A new source is one module defining a `NegativeSource` and one
entry here (or `register_source` from outside the package), switched on by its config field or by its name in
`TrainConfig.sources` (a `lace.experiment.variants.VARIANTS` entry sets either).
"""

from __future__ import annotations

from typing import Any

from lace.errors import LaceInputError
from lace.train.paths.base import EmbedPath, Run
from lace.train.sources.base import NegativeSource
from lace.train.sources.counterfactual_edits import CounterfactualEdits
from lace.train.sources.local_captions import LocalCaptionSwaps
from lace.train.sources.local_images import LocalImageEdits
from lace.train.sources.paired_directions import PairedDirections
from lace.train.sources.pairs_rows import PairsRows
from lace.train.sources.rendered_ceiling import RenderedCeiling
from lace.train.sources.rule_captions import RuleCaptions

SOURCES: dict[str, type[NegativeSource]] = {source.name: source for source in (
    CounterfactualEdits, RuleCaptions, PairedDirections, LocalImageEdits, LocalCaptionSwaps, RenderedCeiling,
    PairsRows)}


def register_source(source: type[NegativeSource]) -> type[NegativeSource]:
    """Add `source` to `SOURCES` under its `name` (usable as a class decorator); a taken name is refused."""
    if source.name in SOURCES and SOURCES[source.name] is not source:
        raise ValueError(f"negative sources: the name {source.name!r} is taken by {SOURCES[source.name].__name__}")
    SOURCES[source.name] = source
    return source


def build_sources(run: Run, path: EmbedPath, given: dict[str, Any]) -> list[NegativeSource]:
    """The sources the run's arm switches on, built in run order, after refusing (`LaceInputError`) what they
    cannot do on `path` or with what `train()` was `given` (editor, local_editor, rendered)."""
    config = run.config
    unknown = [name for name in config.arm.sources if name not in SOURCES]
    if unknown:
        raise LaceInputError(f"train config: field 'sources': expected names from {list(SOURCES)}, got {unknown}")
    off_path = [source.switch or "sources" for source in SOURCES.values()
                if source.switched_on(config) and path.name not in source.paths]
    wanted = [source for source in SOURCES.values() if source.wanted(config, path)]
    for source in wanted:
        missing = [need for need in source.needs if SOURCES[need] not in wanted]
        if missing:
            raise LaceInputError(f"train config: the {source.name} source needs {missing} switched on")
        source.check(run, path, given)
    if off_path:
        raise LaceInputError(f"{path.where}: fields {off_path}: expected off (they need pixels or tokens)")
    ordered = sorted(wanted, key=lambda source: source.order)  # stable: registry order within an order
    return [source(run, path, given) for source in ordered]


__all__ = ["SOURCES", "NegativeSource", "build_sources", "register_source"]
