"""The one way captions are read for concepts: words, plural forms and phrase lookup.

Concept directions (`lace.concepts.directions.mention_matrix`), binding directions
(`lace.concepts.bindings.BindingMatcher`), the rule-made caption edits and the benchmarks'
taggers (`lace.edits.captions.RuleNegatives`) all split captions with `words` and know an
object's plurals from `plural` / `plural_forms`, one irregular table for all of them.
"""

from __future__ import annotations

import re

WORD = re.compile(r"[A-Za-z0-9]+(?:['-][A-Za-z0-9]+)*")
"""A word of a caption (hyphens and apostrophes inside a word keep it whole)."""
MAX_PHRASE_WORDS = 4
"""Longest concept phrase looked up in a caption ("to the left of")."""

IRREGULAR_PLURALS = {
    "person": "people", "man": "men", "woman": "women", "child": "children", "mouse": "mice",
    "goose": "geese", "foot": "feet", "tooth": "teeth", "knife": "knives", "wife": "wives", "leaf": "leaves",
    "shelf": "shelves", "calf": "calves", "wolf": "wolves", "scarf": "scarves", "sheep": "sheep",
    "fish": "fish", "deer": "deer", "bus": "buses", "cactus": "cacti",
}


def words(caption: str) -> list[tuple[str, int, int]]:
    """The words of `caption`, lower-cased, with their character spans: (word, start, end)."""
    return [(m.group(0).lower(), m.start(), m.end()) for m in WORD.finditer(caption)]


def plural(noun: str) -> str:
    """The plural a caption is written with: 'dog' -> 'dogs', 'bus' -> 'buses', 'berry' -> 'berries',
    'teddy bear' -> 'teddy bears', 'wolf' -> 'wolves'."""
    head, _, last = noun.rpartition(" ")
    prefix = head + " " if head else ""
    if last in IRREGULAR_PLURALS:
        return prefix + IRREGULAR_PLURALS[last]
    if last.endswith(("s", "x", "z", "ch", "sh")):
        return prefix + last + "es"
    if len(last) > 1 and last.endswith("y") and last[-2] not in "aeiou":
        return prefix + last[:-1] + "ies"
    return prefix + last + "s"


def plural_forms(noun: str) -> set[str]:
    """Every plural a caption may use: `plural(noun)`, and both 'potatos' and 'potatoes' for -o nouns."""
    forms = {plural(noun)}
    head, _, last = noun.rpartition(" ")
    if last.endswith("o") and last not in IRREGULAR_PLURALS:
        forms.add((head + " " if head else "") + last + "es")
    return forms


def surface_forms(name: str, kind: str) -> set[str]:
    """Lower-case word sequences that count as a mention of the concept (plural-aware for objects)."""
    phrase = " ".join(name.lower().split())
    return {phrase} | (plural_forms(phrase) if kind == "object" else set())
