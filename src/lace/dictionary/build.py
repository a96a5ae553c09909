"""From an embedding store to a labelled concept dictionary folder, and back.

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

import torch
from torch import Tensor

from lace.concepts.bindings import BindingDirections, binding_directions, load_bindings
from lace.concepts.directions import (
    ConceptDirections,
    directions_from_captions,
    directions_from_templates,
    merge_directions,
)
from lace.concepts.labelling import AtomLabelling, label_atoms
from lace.concepts.vocabulary import load_vocabulary
from lace.dictionary.concept_dictionary import ConceptDictionary
from lace.dictionary.streaming import Rows, streaming_mean
from lace.errors import LaceInputError


@dataclass
class DictionaryFitConfig:
    atoms: int = 512
    """Number of dictionary atoms K (learned mode; vocabulary mode has one per concept)."""
    sparsity: int = 8
    """Most non-zero codes per embedding (s)."""
    mode: str = "learned"
    """'learned' (online dictionary learning) or 'vocabulary' (atoms = concept directions)."""
    vocabulary: str = "natural"
    """Typed vocabulary YAML, or the name of a shipped one ('natural')."""
    method: str = "omp"
    """Sparse coder: 'omp' (non-negative batch OMP) or 'topk'."""
    epochs: int = 1
    """Passes over the embedding pool when learning."""
    batch_size: int = 4096
    """Embeddings per learning mini-batch (both modalities together)."""
    max_seconds: float | None = None
    """Stop learning after this many seconds (none: no limit)."""
    min_mentions: int = 5
    """Captions that must mention a concept for a caption-mean direction."""
    tau_align: float | None = None
    """Atom alignment threshold (none: calibrated against random directions of the data)."""
    seed: int = 0
    """Seed for initial atoms and batch order."""
    bindings: bool = True
    """Also derive compound ('red square') binding directions from the captions, for the rebind edit."""


@dataclass
class LabelledDictionary:
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


def fit_labelled_dictionary(
    image_embeddings,
    text_embeddings,
    directions: ConceptDirections,
    config: DictionaryFitConfig,
    device: str = "cpu",
    progress: bool = False,
) -> LabelledDictionary:
    """Fit the dictionary, measure its quality and label its atoms against `directions`."""
    dictionary = ConceptDictionary(
        n_atoms=config.atoms, sparsity=config.sparsity, mode=config.mode,
        directions=directions if config.mode == "vocabulary" else None, method=config.method,
        batch_size=config.batch_size, n_epochs=config.epochs, max_seconds=config.max_seconds,
        random_state=config.seed, device=device, progress=progress,
    )
    dictionary.fit(image_embeddings, text_embeddings)
    dictionary.quality(image_embeddings, text_embeddings)
    labelling = label_atoms(dictionary, directions, image_embeddings, text_embeddings, config.tau_align, seed=config.seed)
    return LabelledDictionary(dictionary, directions, labelling)


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


def nearest_rows(queries: Tensor, rows, k: int, chunk_size: int = 65536) -> tuple[Tensor, Tensor]:
    """Top-k cosine neighbours of queries (Q, d) among unit rows (N, d) read in chunks:
    scores (Q, k) and row indices (Q, k)."""
    table = Rows(rows, "embeddings")
    best_scores = torch.full((queries.shape[0], 0), -float("inf"))
    best_rows = torch.zeros((queries.shape[0], 0), dtype=torch.long)
    for start in range(0, table.n_rows, chunk_size):
        block = table.read(start, min(start + chunk_size, table.n_rows))
        scores = queries.float() @ block.T
        best_scores = torch.cat([best_scores, scores], dim=1)
        best_rows = torch.cat([best_rows, torch.arange(start, start + block.shape[0]).expand(queries.shape[0], -1)], dim=1)
        keep = best_scores.topk(min(k, best_scores.shape[1]), dim=1)
        best_scores, best_rows = keep.values, best_rows.gather(1, keep.indices)
    return best_scores, best_rows
