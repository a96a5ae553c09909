"""Rule-made caption negatives (NegCLIP style), driven by a typed vocabulary.

Five kinds, each changing one thing in the caption and nothing else:
- `swap_attributes`: two attribute words of the same group on different objects trade
  places ("a red cube and a blue ball" -> "a blue cube and a red ball");
- `swap_objects`: two different object words trade places (each keeps its slot's number);
- `replace_attribute`: one attribute word becomes another of the same group that the
  caption does not use;
- `replace_object`: one object word becomes another object the caption does not use;
- `replace_relation`: one relation phrase becomes another relation of the vocabulary.

Matching is on lower-cased words, longest phrase first ("teddy bear", "to the left of"),
with plurals of objects (`lace.concepts.mentions.plural`: "dogs" matches "dog" and a replacement keeps
the plural), the
article before a replaced word fixed ("an apple" -> "a pear") and a capital first letter kept.
The vocabulary is a `lace.concepts.vocabulary.Vocabulary`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lace.concepts.mentions import plural
from lace.concepts.mentions import words as caption_words
from lace.concepts.vocabulary import Vocabulary

KINDS = ("swap_attributes", "swap_objects", "replace_attribute", "replace_object", "replace_relation")

# Everyday phrasings of spatial relations, read as the vocabulary's canonical relation.
RELATION_SYNONYMS = {
    "above": ("over", "on top of"), "below": ("under", "beneath", "underneath"),
    "left of": ("to the left of", "on the left of"), "right of": ("to the right of", "on the right of"),
    "next to": ("beside", "by"),
}
# English puts "to the" before these relation words when they follow a noun phrase.
NEEDS_TO_THE = ("left", "right")
MENTIONS_KEPT = 25_000
"""Captions whose mentions a `RuleNegatives` keeps found (all are dropped when it holds this many): about 1.5 KB
each, and the demo's training split has 20,400 captions."""


@dataclass(frozen=True)
class Mention:
    """A vocabulary phrase found in a caption: characters `start:end`, its concept and type."""

    start: int
    end: int
    concept: str
    kind: str  # "object", "attribute" or "relation"
    group: str | None = None  # attribute group
    is_plural: bool = False
    text: str = ""


@dataclass(frozen=True)
class _Phrase:
    concept: str
    kind: str
    group: str | None
    is_plural: bool


class RuleNegatives:
    """Makes rule-based hard-negative captions from a typed vocabulary.

    `make(caption, kind, rng)` draws one negative (kind None: a random applicable kind),
    `make_all(caption)` lists every negative of every kind. Both are deterministic given
    the caption (and the rng).
    """

    def __init__(self, vocabulary: Vocabulary, kinds: Sequence[str] = KINDS):
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown rule negative kind(s) {unknown}; expected some of {KINDS}")
        self.kinds = tuple(kinds)
        self.objects = tuple(_words(c.name for c in vocabulary.of_kind("object")))
        self.attribute_groups: dict[str, tuple[str, ...]] = {}
        for concept in vocabulary.of_kind("attribute"):
            self.attribute_groups[concept.group] = self.attribute_groups.get(concept.group, ()) + tuple(_words([concept.name]))
        self.relations = tuple(_words(c.name for c in vocabulary.of_kind("relation")))
        self._phrases: dict[tuple[str, ...], list[_Phrase]] = {}
        for obj in self.objects:
            self._add(obj, _Phrase(obj, "object", None, False))
            if plural(obj) != obj:
                self._add(plural(obj), _Phrase(obj, "object", None, True))
        for group, words in self.attribute_groups.items():
            for word in words:
                self._add(word, _Phrase(word, "attribute", group, False))
        for relation in self.relations:
            self._add(relation, _Phrase(relation, "relation", None, False))
            for synonym in RELATION_SYNONYMS.get(relation, ()):
                self._add(synonym, _Phrase(relation, "relation", None, False))
            if relation.split()[0] in NEEDS_TO_THE:
                for prefix in ("to the ", "on the "):
                    self._add(prefix + relation, _Phrase(relation, "relation", None, False))
        self._longest = max((len(k) for k in self._phrases), default=1)
        self._mentions: dict[str, tuple[Mention, ...]] = {}  # training describes the same captions step after step

    @property
    def key(self) -> tuple:
        """Everything the negatives depend on besides the caption and the rng: the kinds and the vocabulary's words."""
        return self.kinds, self.objects, tuple(self.attribute_groups.items()), self.relations

    def _add(self, phrase: str, entry: _Phrase) -> None:
        key = tuple(phrase.split())
        entries = self._phrases.setdefault(key, [])
        if entry not in entries:
            entries.append(entry)

    # ---- finding mentions -------------------------------------------------------------

    def mentions(self, caption: str) -> list[Mention]:
        """Vocabulary phrases in `caption`, left to right, longest match first, no overlaps.

        A word that is both an attribute and an object ("orange") counts as an attribute
        when an object follows it, else as an object. Found once per caption (kept for the next call).
        """
        found = self._mentions.get(caption)
        if found is None:
            if len(self._mentions) >= MENTIONS_KEPT:
                self._mentions.clear()
            found = self._mentions[caption] = tuple(self._find_mentions(caption))
        return list(found)

    def _find_mentions(self, caption: str) -> list[Mention]:
        words = caption_words(caption)
        found: list[tuple[int, int, list[_Phrase]]] = []  # (first word, last word + 1, readings)
        i = 0
        while i < len(words):
            for length in range(min(self._longest, len(words) - i), 0, -1):
                key = tuple(w for w, _, _ in words[i : i + length])
                if key in self._phrases:
                    found.append((i, i + length, self._phrases[key]))
                    i += length
                    break
            else:
                i += 1
        mentions = []
        for n, (first, last, readings) in enumerate(found):
            reading = readings[0]
            if len(readings) > 1:
                next_is_object = n + 1 < len(found) and found[n + 1][2][0].kind == "object"
                preferred = "attribute" if next_is_object else "object"
                reading = next((r for r in readings if r.kind == preferred), readings[0])
            start, end = words[first][1], words[last - 1][2]
            mentions.append(Mention(start, end, reading.concept, reading.kind, reading.group,
                                    reading.is_plural, caption[start:end]))
        return mentions

    # ---- candidate edits ----------------------------------------------------------------

    def _candidates(self, mentions: list[Mention], kind: str) -> list[list[tuple[Mention, str]]]:
        """Each candidate is a list of (mention, replacement concept) to write together; `mentions`: the
        caption's (found once for every kind: finding them costs more than listing the candidates)."""
        objects = [m for m in mentions if m.kind == "object"]
        attributes = [m for m in mentions if m.kind == "attribute"]
        relations = [m for m in mentions if m.kind == "relation"]
        used = {m.concept for m in mentions}
        candidates: list[list[tuple[Mention, str]]] = []
        if kind == "swap_objects":
            for i, a in enumerate(objects):
                for b in objects[i + 1 :]:
                    if a.concept != b.concept:
                        candidates.append([(a, b.concept), (b, a.concept)])
        elif kind == "swap_attributes":
            for i, a in enumerate(attributes):
                for b in attributes[i + 1 :]:
                    if a.group == b.group and a.concept != b.concept and _different_objects(a, b, objects):
                        candidates.append([(a, b.concept), (b, a.concept)])
        elif kind == "replace_attribute":
            for a in attributes:
                for word in self.attribute_groups[a.group]:
                    if word not in used:
                        candidates.append([(a, word)])
        elif kind == "replace_object":
            for a in objects:
                for word in self.objects:
                    if word not in used:
                        candidates.append([(a, word)])
        elif kind == "replace_relation":
            for a in relations:
                for word in self.relations:
                    if word != a.concept:
                        candidates.append([(a, word)])
        else:
            raise ValueError(f"unknown rule negative kind {kind!r}; expected one of {KINDS}")
        return candidates

    def make(self, caption: str, kind: str | None, rng: random.Random | np.random.Generator) -> str | None:
        """One negative of `kind` (None: a random kind among those that apply), or None."""
        kinds = [kind] if kind is not None else list(self.kinds)
        mentions = self.mentions(caption)
        options = [(k, c) for k in kinds for c in [self._candidates(mentions, k)] if c]
        if not options:
            return None
        _, candidates = options[_randbelow(rng, len(options))]
        return self._apply(caption, candidates[_randbelow(rng, len(candidates))])

    def make_all(self, caption: str) -> dict[str, list[str]]:
        """Every negative of every kind, deduplicated, in a fixed order."""
        result = {}
        mentions = self.mentions(caption)
        for kind in self.kinds:
            texts = dict.fromkeys(self._apply(caption, c) for c in self._candidates(mentions, kind))
            texts.pop(caption, None)
            result[kind] = list(texts)
        return result

    def describe(self, caption: str, changes: dict[str, str]) -> str | None:
        """The caption an edit describes: `caption` with each concept of `changes` written as the concept it
        became ({"red": "blue", "blue": "red"} for a binding swap, {"red": "green"} for a transplant).

        None where the caption cannot describe the edit: it does not name every changed concept exactly once,
        or it already names a concept the edit brings in that is not itself changed (the edited caption would
        then name it twice).
        """
        if not changes or any(source == target for source, target in changes.items()):
            return None
        mentions = self.mentions(caption)
        named = [m.concept for m in mentions]
        if any(named.count(source) != 1 for source in changes):
            return None
        if any(target in named and target not in changes for target in changes.values()):
            return None
        return self._apply(caption, [(m, changes[m.concept]) for m in mentions if m.concept in changes])

    # ---- writing ------------------------------------------------------------------------

    def _surface(self, mention: Mention, concept: str) -> str:
        if mention.kind == "object":
            return plural(concept) if mention.is_plural else concept
        if mention.kind == "relation":
            lowered = mention.text.lower()
            has_prefix = lowered.startswith(("to the ", "on the ")) and concept.split()[0] in NEEDS_TO_THE
            if has_prefix and not concept.startswith(("to the ", "on the ")):
                return mention.text[:7] + concept
        return concept

    def _apply(self, caption: str, edits: list[tuple[Mention, str]]) -> str:
        text = caption
        for mention, concept in sorted(edits, key=lambda e: e[0].start, reverse=True):
            replacement = self._surface(mention, concept)
            if mention.text[:1].isupper():
                replacement = replacement[:1].upper() + replacement[1:]
            text = text[: mention.start] + replacement + text[mention.end :]
            text = _fix_article(text, mention.start, replacement)
        return text


def _words(items: Iterable[str]) -> list[str]:
    return [" ".join(str(item).lower().split()) for item in items]


def _different_objects(a: Mention, b: Mention, objects: list[Mention]) -> bool:
    """True when an object mention lies between a and b: they describe different objects."""
    return any(a.end <= o.start < b.start for o in objects)


def _fix_article(text: str, start: int, replacement: str) -> str:
    """Make the article just before position `start` agree with `replacement` (a/an)."""
    match = re.search(r"\b(a|an|A|An)(\s+)$", text[:start])
    if not match:
        return text
    article = "an" if replacement[:1].lower() in "aeiou" else "a"
    if match.group(1)[0].isupper():
        article = article.capitalize()
    return text[: match.start()] + article + match.group(2) + text[start:]


def _randbelow(rng: random.Random | np.random.Generator, n: int) -> int:
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(n))
    return rng.randrange(n)
