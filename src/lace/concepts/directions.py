"""Concept directions e_c: centred, normalised text-side directions of typed concepts.

Two sources:
- prompt templates: the mean text embedding of "a photo of a {c}"-style prompts,
  minus the text mean, normalised;
- caption means: the mean embedding of captions that mention c minus the mean of
  those that don't (the text mean cancels in the difference), normalised. Mentions
  are matched on whole words, plural-aware ("sheep", "boxes", "people" for person).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

from lace.concepts.mentions import MAX_PHRASE_WORDS, surface_forms, words
from lace.concepts.vocabulary import Vocabulary
from lace.dictionary.streaming import Rows, RowSource
from lace.errors import LaceInputError, input_error
from lace.io import atomic_path, atomic_write_json, read_json, read_safetensors
from lace.manifest import add_to_manifest, verify

TEMPLATES = {
    "object": ("a photo of a {}.", "a picture of a {}.", "a {} in the scene.", "there is a {}."),
    "attribute": ("a photo of something {}.", "a {} object.", "a {} thing.", "something that is {}."),
    "relation": ("a photo of one thing {} another.", "something {} something else.", "a thing {} a thing."),
}



@dataclass
class ConceptDirections:
    """Typed concept directions.

    names, kinds, groups: one entry per concept (see `lace.concepts.vocabulary.Concept`).
    directions: (C, d) unit rows in the centred embedding space.
    counts: for caption-mean directions, how many captions mention each concept (else None).
    """

    names: list[str]
    kinds: list[str]
    groups: list[str]
    directions: Tensor
    source: str = "templates"
    counts: list[int] | None = None
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.kinds) == len(self.groups) == self.directions.shape[0]):
            raise ValueError("names, kinds, groups and directions must have one entry per concept")
        self._index = {name: i for i, name in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def index(self, name: str) -> int:
        if name not in self._index:
            raise input_error("concept directions", "concept", f"one of the {len(self)} known concepts", name)
        return self._index[name]

    def group_ids(self) -> Tensor:
        """(C,) long: concepts of the same type share an id."""
        lookup: dict[str, int] = {}
        return torch.tensor([lookup.setdefault(group, len(lookup)) for group in self.groups], dtype=torch.long)

    def same_type(self) -> Tensor:
        """(C, C) bool: same kind and, for attributes, same group."""
        ids = self.group_ids()
        return ids.unsqueeze(0) == ids.unsqueeze(1)

    def save(self, directory: str | Path) -> None:
        """concepts.json (names, kinds, groups, source, counts) + concept_directions.safetensors."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(directory / "concept_directions.safetensors") as tmp:
            save_file({"directions": self.directions.contiguous().cpu()}, str(tmp))
        atomic_write_json(
            directory / "concepts.json",
            {"names": self.names, "kinds": self.kinds, "groups": self.groups, "source": self.source, "counts": self.counts},
        )
        add_to_manifest(directory, ("concepts.json", "concept_directions.safetensors"))

    @classmethod
    def load(cls, directory: str | Path) -> ConceptDirections:
        directory = Path(directory)
        verify(directory, ("concepts.json", "concept_directions.safetensors"))
        meta = read_json(directory / "concepts.json", dict)
        tensors = read_safetensors(directory / "concept_directions.safetensors")
        if "directions" not in tensors or tensors["directions"].ndim != 2:
            raise LaceInputError(f"{directory / 'concept_directions.safetensors'}: expected a tensor 'directions' (C, d)")
        try:
            return cls(meta["names"], meta["kinds"], meta["groups"], tensors["directions"],
                       meta.get("source", "templates"), meta.get("counts"))
        except (KeyError, TypeError, ValueError) as error:
            raise LaceInputError(f"{directory / 'concepts.json'}: not a concepts file, or it disagrees with "
                                 f"concept_directions.safetensors ({error!r})") from error


def directions_from_templates(
    vocabulary: Vocabulary,
    encode_texts: Callable[[list[str]], Tensor],
    mean_text: Tensor,
    templates: dict[str, Sequence[str]] = TEMPLATES,
) -> ConceptDirections:
    """Directions from prompt templates: mean of the prompts' unit embeddings, minus the text
    mean (d,), normalised. `encode_texts(list[str]) -> (N, d)` unit vectors."""
    prompts: list[str] = []
    owners: list[int] = []
    for i, concept in enumerate(vocabulary.concepts):
        for template in templates[concept.kind]:
            prompts.append(template.format(concept.name))
            owners.append(i)
    with torch.no_grad():
        embeddings = torch.as_tensor(encode_texts(prompts), dtype=torch.float32).cpu()  # (P, d)
    if embeddings.ndim != 2 or embeddings.shape[0] != len(prompts) or embeddings.shape[1] != mean_text.shape[0]:
        raise input_error("encode_texts", "output", f"({len(prompts)}, {mean_text.shape[0]}) embeddings", tuple(embeddings.shape))
    sums = torch.zeros(len(vocabulary), embeddings.shape[1]).index_add_(0, torch.tensor(owners), embeddings)
    counts = torch.bincount(torch.tensor(owners), minlength=len(vocabulary)).unsqueeze(1)
    directions = F.normalize(sums / counts - mean_text.float().cpu(), dim=-1)
    return ConceptDirections(
        vocabulary.names, [c.kind for c in vocabulary.concepts], [c.group for c in vocabulary.concepts],
        directions, source="templates",
    )


def mention_matrix(vocabulary: Vocabulary, captions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Which captions mention which concepts, on whole words: (rows, concepts) index arrays.

    Captions are split into words; every run of up to four words is looked up among the
    concepts' surface forms, so "teddy bear" and "bear" are both found in "a teddy bear".
    """
    lookup: dict[str, list[int]] = {}
    for i, concept in enumerate(vocabulary.concepts):
        for form in surface_forms(concept.name, concept.kind):
            lookup.setdefault(form, []).append(i)
    rows: list[int] = []
    concepts: list[int] = []
    for row, caption in enumerate(captions):
        tokens = [word for word, _, _ in words(caption)]
        found: set[int] = set()
        for start in range(len(tokens)):
            for length in range(1, MAX_PHRASE_WORDS + 1):
                if start + length > len(tokens):
                    break
                hit = lookup.get(" ".join(tokens[start : start + length]))
                if hit:
                    found.update(hit)
        rows.extend([row] * len(found))
        concepts.extend(found)
    return np.asarray(rows, dtype=np.int64), np.asarray(concepts, dtype=np.int64)


def mention_sums(
    rows: Rows, mention_rows: np.ndarray, mention_ids: np.ndarray, n_ids: int, chunk_size: int = 65536
) -> tuple[Tensor, Tensor]:
    """Float64 sums of the embeddings mentioning each id (n_ids, d) and of all rows (d,).

    rows: the (N, d) caption embeddings, read in chunks; (mention_rows, mention_ids): one
    pair per (caption, mentioned id), as `mention_matrix` gives them.
    """
    sums = torch.zeros(n_ids, rows.dim, dtype=torch.float64)
    total = torch.zeros(rows.dim, dtype=torch.float64)
    order = np.argsort(mention_rows, kind="stable")
    mention_rows, mention_ids = mention_rows[order], mention_ids[order]
    for start in range(0, rows.n_rows, chunk_size):
        block = rows.read(start, min(start + chunk_size, rows.n_rows)).double()  # (n, d)
        total += block.sum(0)
        lo, hi = np.searchsorted(mention_rows, [start, start + block.shape[0]])
        if hi > lo:
            local_rows = torch.from_numpy(mention_rows[lo:hi] - start)
            sums.index_add_(0, torch.from_numpy(mention_ids[lo:hi]), block[local_rows])
    return sums, total


def directions_from_captions(
    vocabulary: Vocabulary,
    captions: Sequence[str],
    text_embeddings: RowSource,
    min_count: int = 5,
    chunk_size: int = 65536,
) -> ConceptDirections:
    """Directions from caption means: mean of captions mentioning c minus mean of the others.

    captions: N strings; text_embeddings: (N, d) unit embeddings (array, tensor or .npy
    path, read in chunks). Concepts mentioned fewer than `min_count` times (or by every
    caption) get no direction and are left out; `counts` holds the mention counts.
    """
    rows = Rows(text_embeddings, "text_embeddings")
    if rows.n_rows != len(captions):
        raise input_error(rows.name, "shape", f"one embedding per caption ({len(captions)})", rows.n_rows)
    mention_rows, mention_concepts = mention_matrix(vocabulary, captions)
    n_concepts = len(vocabulary)
    sums, total = mention_sums(rows, mention_rows, mention_concepts, n_concepts, chunk_size)
    counts = np.bincount(mention_concepts, minlength=n_concepts)
    keep = [i for i in range(n_concepts) if min_count <= counts[i] < rows.n_rows]
    if not keep:
        raise input_error(
            "captions", None, f"at least one concept mentioned by {min_count} or more captions", "none"
        )
    keep_tensor = torch.tensor(keep)
    count_tensor = torch.from_numpy(counts[keep]).double().unsqueeze(1)
    with_mention = sums[keep_tensor] / count_tensor
    without_mention = (total - sums[keep_tensor]) / (rows.n_rows - count_tensor)
    directions = F.normalize((with_mention - without_mention).float(), dim=-1)
    concepts = [vocabulary.concepts[i] for i in keep]
    return ConceptDirections(
        [c.name for c in concepts], [c.kind for c in concepts], [c.group for c in concepts],
        directions, source="captions", counts=[int(counts[i]) for i in keep],
    )


def merge_directions(primary: ConceptDirections, fallback: ConceptDirections) -> ConceptDirections:
    """`primary`'s directions, plus `fallback`'s for the concepts `primary` lacks (fallback order)."""
    if primary.directions.shape[1] != fallback.directions.shape[1]:
        raise input_error("concept directions", "directions", f"dimension {primary.directions.shape[1]}", fallback.directions.shape[1])
    extra = [i for i, name in enumerate(fallback.names) if name not in primary]
    if not extra:
        return primary
    counts = (primary.counts or [0] * len(primary)) + [0] * len(extra)
    return ConceptDirections(
        primary.names + [fallback.names[i] for i in extra],
        primary.kinds + [fallback.kinds[i] for i in extra],
        primary.groups + [fallback.groups[i] for i in extra],
        torch.cat([primary.directions, fallback.directions[extra]]),
        source=f"{primary.source}+{fallback.source}",
        counts=counts,
    )
