"""Bound concepts: "<attribute> <object>" compounds ("red square") and their directions.

A sparse code says which concepts an embedding holds, not which attribute belongs to
which object: "red square + blue circle" and "blue square + red circle" hold the same
bag of concepts. Compound directions carry the missing part, the binding.

- Binding in a caption: an attribute binds to an object when its word comes before the
  object noun with at most attribute words of *other* groups in between: "a large
  striped red square" binds large, striped and red to square; in "a red blue square"
  only blue binds (a same-group word in between takes the slot), and in "a red square
  left of a blue circle" red never binds to circle. Nouns are plural-aware, as for
  concept mentions (`lace.concepts.mentions.surface_forms`). Names are unique in a
  vocabulary, but a plural form may equal an attribute name: such a word reads as an
  attribute when a vocabulary word follows it, else as an object.
- Compound direction: the mean text embedding of captions that bind the attribute to
  the object minus the mean of the captions that don't (the text mean cancels), normalised,
  exactly as `directions_from_captions` makes concept directions.

Stored per attribute group g as a grid (A_g, O) over the group's attributes and the
vocabulary's objects; compounds bound by fewer than `min_count` captions (or by all of
them) are absent from the grid's presence mask and have a zero row.

Files in a dictionary folder (optional; no files means no bindings): `bindings.json`
(`format_version`, `objects`, `groups`, `attributes` per group, `counts` per group as
(A_g, O) nested lists, `min_count`, `source`) and `binding_directions.safetensors`
(`directions_<i>` (A_g, O, d) float32 and `present_<i>` (A_g, O) bool for group i).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import Tensor

from lace.concepts.directions import mention_sums
from lace.concepts.mentions import MAX_PHRASE_WORDS, surface_forms, words
from lace.concepts.vocabulary import Vocabulary
from lace.dictionary.streaming import Rows, RowSource
from lace.errors import LaceInputError, input_error
from lace.io import atomic_path, atomic_write_json, read_json, read_safetensors
from lace.manifest import add_to_manifest, verify

FORMAT_VERSION = 1
BINDINGS_FILE = "bindings.json"
BINDING_DIRECTIONS_FILE = "binding_directions.safetensors"


def compound_name(attribute: str, obj: str) -> str:
    """'red', 'square' -> 'red square'."""
    return f"{attribute} {obj}"


class BindingMatcher:
    """Finds which attribute is bound to which object in a caption.

    vocabulary: the typed vocabulary; groups: attribute groups to read (None: all).
    `bindings(caption)` gives the set of (attribute concept index, object concept index)
    pairs, indices into `vocabulary.concepts`.
    """

    def __init__(self, vocabulary: Vocabulary, groups: Sequence[str] | None = None):
        attribute_groups = [g for g in vocabulary.groups() if g not in ("object", "relation")]
        if groups is None:
            groups = attribute_groups
        unknown = [g for g in groups if g not in attribute_groups]
        if unknown:
            raise input_error(f"vocabulary '{vocabulary.name}'", "groups", f"attribute groups among {attribute_groups}", unknown)
        self.groups = list(groups)
        self.group_of: dict[int, str] = {}
        # surface form -> (attribute concept indices, object concept indices)
        self._forms: dict[str, tuple[list[int], list[int]]] = {}
        for index, concept in enumerate(vocabulary.concepts):
            if concept.kind == "attribute" and concept.group in self.groups:
                self.group_of[index] = concept.group
                slot = 0
            elif concept.kind == "object":
                slot = 1
            else:
                continue
            for form in surface_forms(concept.name, concept.kind):
                self._forms.setdefault(form, ([], []))[slot].append(index)

    def _items(self, caption: str) -> list[tuple[list[int], list[int]] | None]:
        """Longest vocabulary phrases left to right; None for any other word."""
        tokens = [word for word, _, _ in words(caption)]
        items: list[tuple[list[int], list[int]] | None] = []
        start = 0
        while start < len(tokens):
            for length in range(min(MAX_PHRASE_WORDS, len(tokens) - start), 0, -1):
                hit = self._forms.get(" ".join(tokens[start : start + length]))
                if hit is not None:
                    items.append(hit)
                    start += length
                    break
            else:
                items.append(None)
                start += 1
        return items

    def bindings(self, caption: str) -> set[tuple[int, int]]:
        """(attribute, object) concept-index pairs the caption binds."""
        items = self._items(caption)
        found: set[tuple[int, int]] = set()
        run: dict[str, int] = {}  # group -> the latest attribute of that group since the last other word
        for position, item in enumerate(items):
            if item is None:
                run = {}
                continue
            attributes, objects = item
            followed = position + 1 < len(items) and items[position + 1] is not None
            if attributes and (not objects or followed):
                for attribute in attributes:
                    run[self.group_of[attribute]] = attribute
                continue
            found.update((attribute, obj) for obj in objects for attribute in run.values())
            run = {}
        return found


@dataclass
class BindingDirections:
    """Compound ("<attribute> <object>") directions, one (A_g, O) grid per attribute group.

    objects: the O object names. groups: the G attribute group names. attributes: per
    group, its A_g attribute names. directions: per group (A_g, O, d) unit rows in the
    centred text space (zero where absent). present: per group (A_g, O) bool. counts: per
    group (A_g, O) long, captions binding each compound. min_count: the count a compound
    needed to get a direction.
    """

    objects: list[str]
    groups: list[str]
    attributes: list[list[str]]
    directions: list[Tensor]
    present: list[Tensor]
    counts: list[Tensor]
    min_count: int = 5
    source: str = "captions"

    def __post_init__(self) -> None:
        n_groups = len(self.groups)
        if not (len(self.attributes) == len(self.directions) == len(self.present) == len(self.counts) == n_groups):
            raise ValueError("attributes, directions, present and counts need one entry per group")
        for attributes, directions, present, counts in zip(self.attributes, self.directions, self.present, self.counts):
            grid = (len(attributes), len(self.objects))
            if tuple(directions.shape[:2]) != grid or tuple(present.shape) != grid or tuple(counts.shape) != grid:
                raise ValueError(f"each group's grids must be (A_g, O) = {grid}")

    @property
    def dim(self) -> int:
        return int(self.directions[0].shape[-1]) if self.directions else 0

    def __len__(self) -> int:
        """Number of compounds with a direction."""
        return int(sum(int(present.sum()) for present in self.present))

    def names(self) -> list[str]:
        """Names of the compounds with a direction, group by group, attribute-major."""
        return [
            compound_name(attribute, obj)
            for attributes, present in zip(self.attributes, self.present)
            for (a, o) in present.nonzero().tolist()
            for attribute, obj in [(attributes[a], self.objects[o])]
        ]

    def direction(self, attribute: str, obj: str) -> Tensor | None:
        """(d,) direction of compound 'attribute obj', or None where it has none."""
        if obj not in self.objects:
            return None
        o = self.objects.index(obj)
        for attributes, directions, present in zip(self.attributes, self.directions, self.present):
            if attribute in attributes:
                a = attributes.index(attribute)
                return directions[a, o] if bool(present[a, o]) else None
        return None

    def compound_table(self, concept_names: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Lookup by concept index for an editor's concept list of C names.

        Returns index (C, C) long, entry [attribute, object] the row of compound
        'attribute object' in table, -1 where there is none; and table (P, d).
        """
        position = {name: i for i, name in enumerate(concept_names)}
        index = torch.full((len(concept_names), len(concept_names)), -1, dtype=torch.long)
        rows: list[Tensor] = []
        for attributes, directions, present in zip(self.attributes, self.directions, self.present):
            for a, o in present.nonzero().tolist():
                attribute, obj = attributes[a], self.objects[o]
                if attribute in position and obj in position:
                    index[position[attribute], position[obj]] = len(rows)
                    rows.append(directions[a, o].float())
        table = torch.stack(rows) if rows else torch.zeros(0, self.dim)
        return index, table

    def save(self, directory: str | Path) -> None:
        """bindings.json + binding_directions.safetensors in `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for i, (directions, present) in enumerate(zip(self.directions, self.present)):
            tensors[f"directions_{i}"] = directions.float().contiguous().cpu()
            tensors[f"present_{i}"] = present.bool().contiguous().cpu()
        with atomic_path(directory / BINDING_DIRECTIONS_FILE) as tmp:
            save_file(tensors, str(tmp))
        atomic_write_json(directory / BINDINGS_FILE, {
            "format_version": FORMAT_VERSION,
            "objects": self.objects,
            "groups": self.groups,
            "attributes": self.attributes,
            "counts": [counts.tolist() for counts in self.counts],
            "min_count": self.min_count,
            "source": self.source,
        })
        add_to_manifest(directory, (BINDINGS_FILE, BINDING_DIRECTIONS_FILE))

    @classmethod
    def load(cls, directory: str | Path) -> BindingDirections:
        directory = Path(directory)
        verify(directory, (BINDINGS_FILE, BINDING_DIRECTIONS_FILE))
        meta = read_json(directory / BINDINGS_FILE)
        if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
            raise input_error(directory / BINDINGS_FILE, "format_version", f"{FORMAT_VERSION}", meta.get("format_version") if isinstance(meta, dict) else meta)
        tensors = read_safetensors(directory / BINDING_DIRECTIONS_FILE)
        groups = list(meta["groups"])
        try:
            return cls(
                list(meta["objects"]), groups, [list(a) for a in meta["attributes"]],
                [tensors[f"directions_{i}"] for i in range(len(groups))],
                [tensors[f"present_{i}"].bool() for i in range(len(groups))],
                [torch.tensor(c, dtype=torch.long).reshape(len(a), len(meta["objects"]))
                 for c, a in zip(meta["counts"], meta["attributes"])],
                int(meta.get("min_count", 5)), meta.get("source", "captions"),
            )
        except (KeyError, ValueError, RuntimeError) as error:
            raise LaceInputError(f"{directory}: bindings.json and {BINDING_DIRECTIONS_FILE} disagree ({error})") from error


def load_bindings(directory: str | Path) -> BindingDirections | None:
    """The binding directions of a dictionary folder, or None when it has none."""
    directory = Path(directory)
    if not (directory / BINDINGS_FILE).is_file():
        return None
    return BindingDirections.load(directory)


def binding_directions(
    vocabulary: Vocabulary,
    captions: Sequence[str],
    text_embeddings: RowSource,
    min_count: int = 5,
    groups: Sequence[str] | None = None,
    chunk_size: int = 65536,
) -> BindingDirections:
    """Caption-mean directions of every compound bound by at least `min_count` captions.

    captions: N strings; text_embeddings: (N, d) unit embeddings (array, tensor or .npy
    path, read in chunks). groups: attribute groups to use (None: all of the vocabulary's).
    Raises `LaceInputError` when the vocabulary has no objects or attribute groups, or no
    compound is bound often enough.
    """
    matcher = BindingMatcher(vocabulary, groups)
    objects = [i for i, c in enumerate(vocabulary.concepts) if c.kind == "object"]
    if not objects or not matcher.groups:
        raise input_error(f"vocabulary '{vocabulary.name}'", "objects/attributes", "objects and at least one attribute group", "none")
    rows = Rows(text_embeddings, "text_embeddings")
    if rows.n_rows != len(captions):
        raise input_error(rows.name, "shape", f"one embedding per caption ({len(captions)})", rows.n_rows)
    group_members = [[i for i, c in enumerate(vocabulary.concepts) if c.kind == "attribute" and c.group == g]
                     for g in matcher.groups]
    # compound id = attribute slot (over all groups, in order) x O + object slot
    attribute_slot = {concept: slot for slot, concept in enumerate(i for members in group_members for i in members)}
    object_slot = {concept: slot for slot, concept in enumerate(objects)}
    n_objects = len(objects)
    n_ids = len(attribute_slot) * n_objects
    mention_rows, mention_ids = [], []
    for row, caption in enumerate(captions):
        for attribute, obj in matcher.bindings(caption):
            mention_rows.append(row)
            mention_ids.append(attribute_slot[attribute] * n_objects + object_slot[obj])
    mention_rows_array = np.asarray(mention_rows, dtype=np.int64)
    mention_ids_array = np.asarray(mention_ids, dtype=np.int64)
    sums, total = mention_sums(rows, mention_rows_array, mention_ids_array, n_ids, chunk_size)
    counts = torch.from_numpy(np.bincount(mention_ids_array, minlength=n_ids)).long()
    present = (counts >= min_count) & (counts < rows.n_rows)
    if not bool(present.any()):
        raise input_error("captions", None, f"at least one attribute-object binding stated by {min_count} or more captions", "none")
    safe = counts.clamp(1, rows.n_rows - 1).double().unsqueeze(1)
    difference = sums / safe - (total - sums) / (rows.n_rows - safe)  # (n_ids, d)
    directions = difference / difference.norm(dim=1, keepdim=True).clamp_min(1e-12)
    directions = torch.where(present.unsqueeze(1), directions, torch.zeros_like(directions)).float()
    directions = directions.view(-1, n_objects, rows.dim)
    present, counts = present.view(-1, n_objects), counts.view(-1, n_objects)
    ends = np.cumsum([len(members) for members in group_members]).tolist()
    spans = [slice(end - len(members), end) for members, end in zip(group_members, ends)]
    return BindingDirections(
        objects=[vocabulary.concepts[i].name for i in objects],
        groups=list(matcher.groups),
        attributes=[[vocabulary.concepts[i].name for i in members] for members in group_members],
        directions=[directions[span].contiguous() for span in spans],
        present=[present[span].contiguous() for span in spans],
        counts=[counts[span].contiguous() for span in spans],
        min_count=min_count,
    )
