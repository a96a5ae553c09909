"""The lexicon of the swap-item writer (`lace.study.phrase_swaps`): its own small word lists, written apart from
the rule editor's vocabulary (`lace.concepts`), which it never reads.

People, animals, things, garments and places with their number; the words that may stand before a head (colours,
shades, materials, sizes and ages); relations between two noun phrases by whether their two directions differ and
are both plausible; and the words that end a phrase or a clause. The words live in `phrase_lexicon.yaml` beside
this module (each list there says what it holds); this module gives them the forms the writer reads. A change
there changes the writer's items: `lace.study.phrase_swaps.VERSION` follows it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

WORDS: dict = yaml.safe_load(Path(__file__).with_name("phrase_lexicon.yaml").read_text(encoding="utf-8"))
"""The word lists by name, as `phrase_lexicon.yaml` writes them."""


def _set(name: str) -> frozenset[str]:
    return frozenset(WORDS[name].split())


def _phrases(name: str) -> frozenset[tuple[str, ...]]:
    """A list of phrases -> their word tuples ("" -> ())."""
    return frozenset(tuple(phrase.split()) for phrase in WORDS[name])


def _forms(name: str) -> dict[str, str]:
    """'man/men woman/women' -> {'man': 'singular', 'men': 'plural', ...}."""
    number = {}
    for pair in WORDS[name].split():
        singular, plural = pair.split("/")
        number[singular], number[plural] = "singular", "plural"
    return number


def _singulars(name: str) -> dict[str, str]:
    """'man/men woman/women' -> {'man': 'man', 'men': 'man', ...}."""
    return {form: pair.split("/")[0] for pair in WORDS[name].split() for form in pair.split("/")}


def _classes(name: str) -> dict[str, str]:
    """{class: 'word word ...'} -> {word: class, ...}."""
    return {word: head for head, words in WORDS[name].items() for word in words.split()}


def _other_forms(name: str) -> dict[str, str]:
    """'chase/chases' -> {'chase': 'chases', 'chases': 'chase'}."""
    found = {}
    for pair in WORDS[name].split():
        plain, third = pair.split("/")
        found[plain], found[third] = third, plain
    return found


def _verb_connectors(name: str) -> frozenset[tuple[str, ...]]:
    """'chase/chases/chasing run/runs/running+after' -> every form: (chases,), (chase,), (is, chasing), ..."""
    found = set()
    for entry in WORDS[name].split():
        forms, _, particle = entry.partition("+")
        plain, third, ing = forms.split("/")
        tail = tuple(particle.split("_")) if particle else ()
        for head in ((plain,), (third,), (ing,), ("is", ing), ("are", ing)):
            found.add(head + tail)
    return frozenset(found)


def _passives(name: str) -> frozenset[tuple[str, ...]]:
    """'chased led' -> (chased, by), (is, chased, by), ..., (being, led, by)."""
    prefixes = ((), ("is",), ("are",), ("is", "being"), ("are", "being"), ("being",))
    return frozenset(prefix + (done, "by") for prefix in prefixes for done in WORDS[name].split())


COLOURS, SHADES, MATERIALS = _set("colours"), _set("shades"), _set("materials")
ENTITY_ADJECTIVES = COLOURS | SHADES | _set("entity_adjectives")
GARMENT_MODIFIERS = COLOURS | SHADES | _set("garment_modifiers")
PEOPLE, ANIMALS, THINGS = _forms("people"), _forms("animals"), _forms("things")
GARMENTS, WOMENS_GARMENTS, NOT_AGENTS = _set("garments"), _set("womens_garments"), _set("not_agents")
ENTITY_DETERMINERS, GARMENT_DETERMINERS = _set("entity_determiners"), _set("garment_determiners")
ATTIRE_OPENERS = tuple(tuple(opener.split()) for opener in WORDS["attire_openers"])
OBJECT_RELATIONS = (_verb_connectors("object_relations") | _phrases("object_relation_phrases")
                    | _passives("object_passives"))
DIRECTED_RELATIONS = OBJECT_RELATIONS | _verb_connectors("directed_relations")
PLACES, STILL_VERBS = _phrases("places"), _phrases("still_verbs")
PLACE_THINGS = _forms("place_things") | THINGS
SYMMETRIC_RELATIONS = _phrases("symmetric_relation_phrases") | _verb_connectors("symmetric_relations")
SAME_KIND_RELATIONS = (OBJECT_RELATIONS | _verb_connectors("same_kind_relations")
                       | _passives("same_kind_passives"))
OTHER_NUMBER = _other_forms("other_number")
ANIMAL_COLOURS = _set("animal_colours")
HEAD_CLASSES = _singulars("animals") | _singulars("things") | _classes("head_classes")
PERSON_CLASSES = _classes("person_classes")
SIZES = tuple(frozenset(side.split()) for side in WORDS["sizes"])
AGES = tuple(frozenset(side.split()) for side in WORDS["ages"])
CHILDREN, CARRYING, SHARED_VERBS = _set("children"), _set("carrying"), _set("shared_verbs")
POSSESSIVES, RELATIVES, REFERRING = _set("possessives"), _set("relatives"), _set("referring")
GENDERED_PRONOUNS, MALE, FEMALE = _set("gendered_pronouns"), _set("male"), _set("female")
CLAUSE_JOINS, LEFT_BOUNDARIES, RIGHT_BOUNDARIES = _set("clause_joins"), _set("left_boundaries"), _set("right_boundaries")
CLAUSE_VERBS, ING_NOUNS, ATTACHING = _set("clause_verbs"), _set("ing_nouns"), _set("attaching")
