"""Typed concept vocabularies: objects, attributes in named groups, relations.

File format (YAML):

    name: world
    objects: [circle, square]
    attributes:            # named groups; "same type" for attributes means same group
      colour: [red, blue]
      size: [small, large]
    relations: [left of, right of]

"Same type" means object for object, attribute for an attribute of the same group
(red -> blue, never red -> wooden), relation for relation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lace.errors import LaceInputError, input_error
from lace.io import read_text

KINDS = ("object", "attribute", "relation")
VOCABULARY_DIR = Path(__file__).parent / "vocabularies"


@dataclass(frozen=True)
class Concept:
    """One concept. kind: 'object' | 'attribute' | 'relation'. group: the attribute group
    name for attributes, 'object' for objects, 'relation' for relations."""

    name: str
    kind: str
    group: str


@dataclass
class Vocabulary:
    """An ordered list of typed concepts with unique names."""

    name: str
    concepts: list[Concept]
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {concept.name: i for i, concept in enumerate(self.concepts)}

    def __len__(self) -> int:
        return len(self.concepts)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    @property
    def names(self) -> list[str]:
        return [concept.name for concept in self.concepts]

    def index(self, name: str) -> int:
        """Position of concept `name`; `LaceInputError` for an unknown one."""
        if name not in self._index:
            raise input_error(f"vocabulary '{self.name}'", "concept", "a concept of the vocabulary", name)
        return self._index[name]

    def get(self, name: str) -> Concept:
        return self.concepts[self.index(name)]

    def same_type(self, a: str, b: str) -> bool:
        """True when a and b may replace each other: same kind and, for attributes, same group."""
        return self.get(a).group == self.get(b).group

    def of_kind(self, kind: str) -> list[Concept]:
        return [concept for concept in self.concepts if concept.kind == kind]

    def groups(self) -> dict[str, list[str]]:
        """Group name -> concept names, in file order."""
        result: dict[str, list[str]] = {}
        for concept in self.concepts:
            result.setdefault(concept.group, []).append(concept.name)
        return result


class _ConceptLoader(yaml.SafeLoader):
    """YAML 1.1 reads `on`, `off`, `yes`, `no` as booleans; in a vocabulary they are words
    (the relation "on"), so only `true` / `false` stay booleans."""


_ConceptLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_vocabulary(path: str | Path) -> Vocabulary:
    """Read a vocabulary YAML file. A bare name ("natural") reads a shipped vocabulary."""
    path = Path(path)
    if not path.suffix and not path.exists() and (VOCABULARY_DIR / f"{path.name}.yaml").is_file():
        path = VOCABULARY_DIR / f"{path.name}.yaml"
    if not path.is_file():
        raise LaceInputError(f"{path}: vocabulary file not found (expected a YAML file)")
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=_ConceptLoader)
    except yaml.YAMLError as error:
        raise LaceInputError(f"{path}: not valid YAML ({error})") from error
    return vocabulary_from_dict(data, where=path)


def vocabulary_from_dict(data: object, where: object = "vocabulary") -> Vocabulary:
    """Build a `Vocabulary` from the parsed YAML mapping; errors name `where` and the field."""
    if not isinstance(data, dict):
        raise input_error(where, None, "a mapping with objects, attributes and relations", type(data).__name__)
    unknown = set(data) - {"name", "objects", "attributes", "relations"}
    if unknown:
        raise input_error(where, min(map(str, unknown)), "only the fields name, objects, attributes, relations")
    concepts: list[Concept] = []
    for name in _names(data.get("objects"), where, "objects"):
        concepts.append(Concept(name, "object", "object"))
    attributes = data.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise input_error(where, "attributes", "a mapping of group name -> list of attributes", type(attributes).__name__)
    for group, members in attributes.items():
        if not isinstance(group, str) or group in ("object", "relation"):
            raise input_error(where, "attributes", "group names other than 'object' and 'relation'", group)
        for name in _names(members, where, f"attributes.{group}"):
            concepts.append(Concept(name, "attribute", group))
    for name in _names(data.get("relations"), where, "relations"):
        concepts.append(Concept(name, "relation", "relation"))
    if not concepts:
        raise input_error(where, None, "at least one typed concept under objects, attributes or relations", "none")
    seen: dict[str, Concept] = {}
    for concept in concepts:
        if concept.name in seen:
            raise input_error(
                where, concept.group, "each concept name once in the vocabulary",
                f"'{concept.name}' also under {seen[concept.name].group}",
            )
        seen[concept.name] = concept
    return Vocabulary(str(data.get("name") or Path(str(where)).stem), concepts)


def _names(value: object, where: object, field_name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise input_error(where, field_name, "a list of concept names", type(value).__name__)
    names = []
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise input_error(where, field_name, "non-empty strings", item)
        names.append(" ".join(item.strip().split()))
    return names
