"""The one way to build an editor: from a labelled dictionary and an `EditConfig`."""

from __future__ import annotations

from pathlib import Path

from lace.concepts.labelled import LabelledDictionary
from lace.edits.config import EditConfig
from lace.edits.editor import CounterfactualEditor
from lace.errors import LaceInputError


def build_editor(labelled: LabelledDictionary, config: EditConfig | None = None) -> CounterfactualEditor:
    """A `CounterfactualEditor` over `labelled` with the knobs of `config` (default: `EditConfig()`);
    the labelled dictionary's binding directions, when it has them, let it rebind."""
    return CounterfactualEditor(labelled.dictionary, labelled.labelling, labelled.directions,
                                config or EditConfig(), labelled.bindings)


def check_store_dimension(labelled: LabelledDictionary, dictionary_path: str | Path, store_dim: int,
                          store_path: str | Path) -> None:
    """Refuse a dictionary fitted in a space of another dimension than the embedding store it is to edit,
    naming both folders."""
    dictionary_dim = int(labelled.dictionary.atoms_.shape[1])
    if dictionary_dim != store_dim:
        raise LaceInputError(
            f"{dictionary_path}: dictionary atoms have dimension {dictionary_dim}, but the embedding store "
            f"{store_path} holds embeddings of dimension {store_dim}; fit the dictionary on this store "
            f"(`lace dict fit --embeddings {store_path}`) or pass the store it was fitted on"
        )
