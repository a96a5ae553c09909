"""Rule-made caption negatives change exactly what their kind says, on natural and world captions."""

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lace.concepts.mentions import plural
from lace.concepts.vocabulary import load_vocabulary, vocabulary_from_dict
from lace.edits.captions import KINDS, RuleNegatives

WORLD_VOCABULARY = Path(__file__).resolve().parents[1] / "src/lace/data/world/vocabulary.yaml"


@pytest.fixture
def natural() -> RuleNegatives:
    return RuleNegatives(vocabulary_from_dict({
        "objects": ["dog", "cat", "bus", "teddy bear", "apple", "suitcase", "backpack", "man"],
        "attributes": {"colour": ["red", "black", "white", "orange"], "material": ["wooden", "metal"]},
        "relations": ["next to", "on", "left of", "right of"],
    }))


@pytest.fixture
def world() -> RuleNegatives:
    return RuleNegatives(load_vocabulary(WORLD_VOCABULARY))


def words(text: str) -> list[str]:
    return text.lower().replace(".", "").split()


def test_swap_attributes_on_natural_caption(natural):
    caption = "A red suitcase next to a black backpack."
    assert natural.make_all(caption)["swap_attributes"] == ["A black suitcase next to a red backpack."]
    # Attributes of different groups never trade places; two attributes of one object neither.
    assert natural.make_all("a red wooden suitcase")["swap_attributes"] == []


def test_swap_objects_keeps_each_slot_number_and_fixes_articles(natural):
    assert natural.make_all("Two dogs sitting next to an apple")["swap_objects"] == ["Two apples sitting next to a dog"]
    assert natural.make_all("a man on a bus")["swap_objects"] == ["a bus on a man"]


def test_replacements_change_one_word_within_its_type(natural):
    caption = "a white cat on a wooden teddy bear"
    made = natural.make_all(caption)
    for text in made["replace_attribute"]:
        before, after = words(caption), words(text)
        changed = [(a, b) for a, b in zip(before, after) if a != b and {a, b} != {"a", "an"}]
        assert len(before) == len(after) and len(changed) == 1
        a, b = changed[0]
        assert {a, b} <= {"red", "black", "white", "orange"} or {a, b} <= {"wooden", "metal"}
    assert "a white cat on a metal teddy bear" in made["replace_attribute"]
    assert "a red cat on a wooden teddy bear" in made["replace_attribute"]
    assert "a white cat on a wooden dog" in made["replace_object"]
    assert all(t.count("teddy bear") + t.count(" cat ") == 1 for t in made["replace_object"])
    assert sorted(made["replace_relation"]) == sorted([
        "a white cat next to a wooden teddy bear", "a white cat left of a wooden teddy bear",
        "a white cat right of a wooden teddy bear"])


def test_world_captions(world):
    caption = "a large striped red square to the left of a blue circle"
    made = world.make_all(caption)
    assert made["swap_attributes"] == ["a large striped blue square to the left of a red circle"]
    assert made["swap_objects"] == ["a large striped red circle to the left of a blue square"]
    assert "a large striped red square to the right of a blue circle" in made["replace_relation"]
    assert "a large striped red square above a blue circle" in made["replace_relation"]  # no "to the above"
    for text in made["replace_attribute"]:
        diff = Counter(words(caption)) - Counter(words(text))
        diff.pop("a", None)  # "a blue" may become "an orange"
        assert sum(diff.values()) == 1
    assert len(made["replace_object"]) == 2 * 6  # either object, to one of the 6 shapes the caption does not name
    assert world.make_all("there is a red star above an orange hexagon")["swap_attributes"] == [
        "there is an orange star above a red hexagon"]


def test_make_is_deterministic_and_none_when_nothing_applies(world):
    caption = "a small red circle above a blue square"
    first = [world.make(caption, None, random.Random(3)) for _ in range(3)]
    assert len(set(first)) == 1 and first[0] != caption
    assert world.make(caption, "swap_objects", np.random.default_rng(0)) == "a small red square above a blue circle"
    assert world.make("a picture of nothing", None, random.Random(0)) is None
    assert world.make("a red circle", "replace_relation", random.Random(0)) is None
    for kind in KINDS:
        made = world.make(caption, kind, random.Random(1))
        assert made is None or made in world.make_all(caption)[kind]


def test_plurals_and_unknown_kind(natural):
    assert [plural(w) for w in ("bus", "berry", "man", "teddy bear", "day")] == ["buses", "berries", "men", "teddy bears", "days"]
    with pytest.raises(ValueError, match="unknown rule negative kind"):
        RuleNegatives(load_vocabulary(WORLD_VOCABULARY), kinds=("shuffle",))
