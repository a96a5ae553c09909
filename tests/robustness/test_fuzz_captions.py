"""Fuzzing the caption parser (`lace.concepts.mentions`) and the rule editor (`lace.edits.captions`).

Captions are any text, and sentences made of vocabulary words with noise between them; vocabularies
are the shipped natural one and random ones. Neither the parser nor the editor may raise on any
caption, and what they return must hold: spans point at the words they name, mentions do not
overlap and each reads a known kind, a negative is a string that differs from its caption, and
`make_all` lists each negative once, under every enabled kind.
"""

from __future__ import annotations

import itertools
import random

from hypothesis import assume, given
from hypothesis import strategies as st

from lace.concepts.mentions import plural, plural_forms, surface_forms, words
from lace.concepts.vocabulary import load_vocabulary, vocabulary_from_dict
from lace.edits.captions import KINDS, RuleNegatives
from tests.robustness.fuzz_support import fuzz

NATURAL = load_vocabulary("natural")
NATURAL_RULES = RuleNegatives(NATURAL)
NATURAL_WORDS = sorted({word for concept in NATURAL.concepts for word in (concept.name, plural(concept.name))})
FILLERS = ["a", "an", "the", "and", "is", "of", "on", "to the", "A", "An", ",", ".", "  ", "-", "'s", "\n"]

WORD_SOUP = st.lists(st.sampled_from(NATURAL_WORDS) | st.sampled_from(FILLERS) | st.text(max_size=6), max_size=12)
CAPTIONS = st.text(max_size=80) | WORD_SOUP.map(" ".join) | WORD_SOUP.map(lambda parts: " ".join(parts).upper())
NAMES = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=10).filter(str.strip)


def check_mentions(rules: RuleNegatives, caption: str) -> None:
    mentions = rules.mentions(caption)
    for earlier, later in itertools.pairwise(mentions):
        assert earlier.end <= later.start
    for mention in mentions:
        assert caption[mention.start:mention.end] == mention.text
        assert mention.kind in ("object", "attribute", "relation")


def check_negatives(rules: RuleNegatives, caption: str, seed: int) -> None:
    made = rules.make(caption, None, random.Random(seed))
    assert made is None or isinstance(made, str)
    every = rules.make_all(caption)
    assert list(every) == list(rules.kinds)
    for negatives in every.values():
        assert caption not in negatives
        assert len(set(negatives)) == len(negatives)


@fuzz(200)
@given(CAPTIONS)
def test_words_spans_point_at_their_words(caption):
    for word, start, end in words(caption):
        assert caption[start:end].lower() == word and word


@fuzz(100)
@given(st.text(max_size=20), st.sampled_from(["object", "attribute", "relation"]))
def test_plurals_and_surface_forms_of_any_name(name, kind):
    assert plural(name) in plural_forms(name)
    forms = surface_forms(name, kind)
    assert " ".join(name.lower().split()) in forms


@fuzz(200)
@given(CAPTIONS, st.integers(0, 2**16))
def test_rule_editor_on_any_caption_with_the_natural_vocabulary(caption, seed):
    check_mentions(NATURAL_RULES, caption)
    check_negatives(NATURAL_RULES, caption, seed)


@fuzz(100)
@given(
    st.lists(NAMES, max_size=4), st.dictionaries(st.sampled_from(["colour", "size", "Material"]),
                                                 st.lists(NAMES, max_size=3), max_size=2),
    st.lists(NAMES, max_size=3), st.data(),
)
def test_rule_editor_with_random_vocabularies(objects, attributes, relations, data):
    names = objects + [n for members in attributes.values() for n in members] + relations
    cleaned = [" ".join(n.strip().split()) for n in names]
    assume(cleaned and len(set(cleaned)) == len(cleaned))  # the loader refuses the rest (test_fuzz_vocabulary)
    vocabulary = vocabulary_from_dict({"objects": objects, "attributes": attributes, "relations": relations})
    rules = RuleNegatives(vocabulary, data.draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=5,
                                                         unique=True)))
    pieces = st.lists(st.sampled_from(cleaned + FILLERS) | st.text(max_size=4), max_size=10)
    caption = " ".join(data.draw(pieces))
    check_mentions(rules, caption)
    check_negatives(rules, caption, data.draw(st.integers(0, 100)))
