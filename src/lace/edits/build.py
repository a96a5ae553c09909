"""The one way to build an editor: from a labelled dictionary and an `EditConfig`."""

from __future__ import annotations

from lace.concepts.labelled import LabelledDictionary
from lace.edits.config import EditConfig
from lace.edits.editor import CounterfactualEditor


def build_editor(labelled: LabelledDictionary, config: EditConfig | None = None) -> CounterfactualEditor:
    """A `CounterfactualEditor` over `labelled` with the knobs of `config` (default: `EditConfig()`);
    the labelled dictionary's binding directions, when it has them, let it rebind."""
    return CounterfactualEditor(labelled.dictionary, labelled.labelling, labelled.directions,
                                config or EditConfig(), labelled.bindings)
