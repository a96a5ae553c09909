"""Writing the captions of image edits, made cheaper without changing them: the rule editor finds a caption's
mentions once (`RuleNegatives.mentions`) and every later describe of that caption reads them back."""

from __future__ import annotations

from lace.concepts.vocabulary import vocabulary_from_dict
from lace.edits import captions as captions_module
from lace.edits.captions import RuleNegatives
from lace.train.pairs import describe_slots

VOCABULARY = {"objects": ["cube", "ball", "cone"], "attributes": {"colour": ["red", "blue", "green"]},
              "relations": ["left of"]}


def test_mentions_found_once_are_the_mentions_found_afresh_and_callers_cannot_change_them():
    vocabulary = vocabulary_from_dict(VOCABULARY)
    kept, fresh = RuleNegatives(vocabulary), RuleNegatives(vocabulary)
    caption = "A red cube left of a blue ball"
    first = kept.mentions(caption)
    first.clear()  # a caller's list is its own
    assert kept.mentions(caption) == fresh.mentions(caption) != []
    assert kept.describe(caption, {"red": "blue", "blue": "red"}) == "A blue cube left of a red ball"


def test_a_batchs_captions_are_read_once_each_and_described_as_before(monkeypatch):
    rules = RuleNegatives(vocabulary_from_dict(VOCABULARY))
    captions = ["a red cube left of a blue ball", "a green cone left of a red ball", "a red cube left of a blue ball"]
    changes = [[{"red": "blue", "blue": "red"}, {"red": "green"}], [{"green": "blue"}, {"red": "blue"}],
               [{"red": "blue", "blue": "red"}, {"blue": "green"}]]
    expected = [[RuleNegatives(vocabulary_from_dict(VOCABULARY)).describe(caption, change) for change in row]
                for caption, row in zip(captions, changes)]
    read = []
    words = captions_module.caption_words
    monkeypatch.setattr(captions_module, "caption_words", lambda caption: read.append(caption) or words(caption))
    for _ in range(2):  # two steps over the same batch
        assert describe_slots(rules, captions, changes) == expected
    assert sorted(read) == sorted(set(captions))  # six describes a step, each distinct caption read once in all
    assert expected[0] == ["a blue cube left of a red ball", "a green cube left of a blue ball"]
