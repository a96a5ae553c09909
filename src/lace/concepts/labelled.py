"""A labelled concept dictionary: the dictionary, its concept directions, atom labels and
binding directions, their folder on disk, and the directions derived from a store's captions.

A dictionary folder holds:
    cfg.json, dictionary.safetensors, quality.json    the `ConceptDictionary`
    concepts.json, concept_directions.safetensors     the `ConceptDirections`
    labelling.json, labelling.safetensors             the `AtomLabelling`
    bindings.json, binding_directions.safetensors     the `BindingDirections` (optional)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from lace.concepts.bindings import BindingDirections, binding_directions, load_bindings
from lace.concepts.directions import (
    ConceptDirections,
    directions_from_captions,
    directions_from_templates,
    merge_directions,
)
from lace.concepts.labelling import AtomLabelling
from lace.concepts.vocabulary import load_vocabulary
from lace.dictionary.concept_dictionary import ConceptDictionary
from lace.dictionary.streaming import Rows, streaming_mean
from lace.errors import LaceInputError


@dataclass
class LabelledDictionary:
    """What an editor needs: the fitted dictionary, concept directions (C, d), the atoms' labels
    and, when captions state bindings, compound directions for rebind."""

    dictionary: ConceptDictionary
    directions: ConceptDirections
    labelling: AtomLabelling
    bindings: BindingDirections | None = None


def concept_directions_for_store(
    vocabulary_path: str,
    captions: list[str],
    text_embeddings,
    encode_texts: Callable[[list[str]], Tensor] | None = None,
    min_mentions: int = 5,
    log: Callable[[str], None] = print,
) -> ConceptDirections:
    """Caption-mean directions where captions mention a concept often enough; prompt-template
    directions for the rest when a text encoder is given."""
    vocabulary = load_vocabulary(vocabulary_path)
    directions = None
    try:
        directions = directions_from_captions(vocabulary, captions, text_embeddings, min_count=min_mentions)
        log(f"caption-mean directions for {len(directions)} of {len(vocabulary)} concepts")
    except LaceInputError as error:
        log(f"no caption-mean directions: {error}")
    if encode_texts is not None:
        mean_text = streaming_mean(Rows(text_embeddings, "text_embeddings"))
        templates = directions_from_templates(vocabulary, encode_texts, mean_text)
        directions = templates if directions is None else merge_directions(directions, templates)
        log(f"{len(directions)} concept directions after adding prompt templates")
    if directions is None:
        raise LaceInputError(
            "concept directions: expected captions mentioning the vocabulary's concepts, or a text encoder (--model)"
        )
    return directions


def binding_directions_for_store(
    vocabulary_path: str,
    captions: list[str],
    text_embeddings,
    min_mentions: int = 5,
    log: Callable[[str], None] = print,
) -> BindingDirections | None:
    """Compound binding directions from the captions, or None (logged) when the vocabulary has no
    attribute groups or no binding is stated by `min_mentions` captions."""
    try:
        bindings = binding_directions(load_vocabulary(vocabulary_path), captions, text_embeddings, min_count=min_mentions)
    except LaceInputError as error:
        log(f"no binding directions: {error}")
        return None
    log(f"binding directions for {len(bindings)} attribute-object compounds")
    return bindings


def save_labelled_dictionary(result: LabelledDictionary, directory: str | Path) -> Path:
    directory = Path(directory)
    result.dictionary.save(directory)
    result.directions.save(directory)
    result.labelling.save(directory)
    if result.bindings is not None:
        result.bindings.save(directory)
    return directory


def load_labelled_dictionary(directory: str | Path, device: str = "cpu") -> LabelledDictionary:
    """Read a folder written by `save_labelled_dictionary` (`lace dict fit`)."""
    directory = Path(directory)
    if not (directory / "cfg.json").is_file():
        raise LaceInputError(f"{directory}: expected a dictionary folder written by `lace dict fit` (no cfg.json)")
    dictionary = ConceptDictionary.load(directory, device=device)
    directions = ConceptDirections.load(directory)
    labelling = AtomLabelling.load(directory)
    if labelling.atom_concept.shape[0] != dictionary.atoms_.shape[0]:
        raise LaceInputError(f"{directory}: labelling has {labelling.atom_concept.shape[0]} atoms, dictionary {dictionary.atoms_.shape[0]}")
    return LabelledDictionary(dictionary, directions, labelling, load_bindings(directory))
