"""Swap items split by words (SugarCrepe issue 10): same multiset of words in caption and negative, or not."""

import json
import math

import numpy as np
import pytest

from lace.eval.benchmarks import get_benchmark
from lace.eval.benchmarks.pairs import same_words, same_words_split
from lace.eval.benchmarks.sugarcrepe import SUGARCREPE_FILES
from tests.test_benchmark_readers import GREEN, RED, ColourEncoder, save_png


def test_same_words_compares_multisets_of_words():
    assert same_words("A red cube and a blue ball.", "a blue cube and a red ball")  # case, punctuation
    assert same_words("a dog  chasing a cat", "a cat chasing a dog")
    assert not same_words("a red cube and a blue ball", "a blue cube and the red ball")  # a word differs
    assert not same_words("a cat on a mat", "a cat on mat")  # counts matter: one "a" fewer
    assert not same_words("the man rides a horse", "the horse is ridden by a man")


def test_the_split_scores_each_part_and_its_share():
    captions = ["a red cube and a blue ball", "a dog chasing a cat", "a man on a horse", "two cats"]
    negatives = ["a blue cube and a red ball", "a cat chasing a dog", "a horse on the man", "two dogs"]
    correct = [True, False, True, True]  # same words: items 0, 1; other: items 2, 3
    assert same_words_split(correct, captions, negatives, "swap_att") == {
        "swap_att/same_words": 0.5, "swap_att/other": 1.0, "swap_att/same_words_share": 0.5}
    only_same = same_words_split(np.array([True]), captions[:1], negatives[:1], "x")
    assert only_same["x/same_words"] == 1.0 and math.isnan(only_same["x/other"])
    with pytest.raises(ValueError, match="one value per item"):
        same_words_split([True], captions, negatives, "x")


def make_release(root):
    """Every file: two items the model gets right. swap_att adds a same-words item it gets wrong
    (green is the caption), swap_obj an other-words one it gets wrong."""
    save_png(root / "val2017" / "1.png", (255, 0, 0))
    for name in SUGARCREPE_FILES:
        items = {"0": {"filename": "1.png", "caption": "red thing", "negative_caption": "green thing"},
                 "1": {"filename": "1.png", "caption": "a red cube left of a ball", "negative_caption": "a ball left of a red cube"}}
        if name == "swap_att":
            items["2"] = {"filename": "1.png", "caption": "a green ball right of a cube", "negative_caption": "a cube right of a green ball"}
        if name == "swap_obj":
            items["2"] = {"filename": "1.png", "caption": "green thing", "negative_caption": "red thing"}
        (root / f"{name}.json").write_text(json.dumps(items))


def test_sugarcrepe_adds_the_split_and_keeps_the_authors_figures(tmp_path):
    make_release(tmp_path)
    table = {"red thing": RED, "green thing": GREEN, "a red cube left of a ball": RED,
             "a ball left of a red cube": GREEN, "a green ball right of a cube": GREEN,
             "a cube right of a green ball": RED}
    benchmark = get_benchmark("sugarcrepe")
    figures = benchmark.evaluate(ColourEncoder(table), benchmark.load(tmp_path))
    assert figures["swap_att"] == pytest.approx(2 / 3) and figures["swap_obj"] == pytest.approx(2 / 3)
    assert figures["mean"] == pytest.approx((5 + 2 * 2 / 3) / 7)  # over the seven files only
    assert figures["swap_att/same_words"] == 0.5 and figures["swap_att/other"] == 1.0
    assert figures["swap_att/same_words_share"] == pytest.approx(2 / 3)
    assert figures["swap_obj/same_words"] == 1.0 and figures["swap_obj/other"] == 0.5
    assert not any(key.startswith(("add_", "replace_")) and "/" in key for key in figures)


def test_world_splits_swap_families_in_both_directions(tmp_path):
    save_png(tmp_path / "images" / "test" / "s0.png", (255, 0, 0))
    save_png(tmp_path / "benchmarks" / "images" / "test" / "s0_neg.png", (0, 255, 0))
    item = {"filename": "images/test/s0.png", "negative_filename": "benchmarks/images/test/s0_neg.png"}
    items = [  # i2t right on the first, wrong on the second; t2i right on both (the negative image is green)
        {**item, "family": "swap_attribute", "caption": "a red square and a blue circle",
         "negative_caption": "a blue square and a red circle"},
        {**item, "family": "swap_attribute", "caption": "a red square", "negative_caption": "the red square"},
        {**item, "family": "replace_object", "caption": "a red square", "negative_caption": "a red star"},
    ]
    (tmp_path / "benchmarks" / "test.json").write_text(json.dumps(items))
    (tmp_path / "benchmarks" / "test_winoground.json").write_text("[]")
    table = {"a red square and a blue circle": RED, "a blue square and a red circle": GREEN,
             "a red square": (0.8, 0.6, 0.0), "the red square": RED, "a red star": GREEN}
    benchmark = get_benchmark("world")
    figures = benchmark.evaluate(ColourEncoder(table), benchmark.load(tmp_path, split="test"))
    assert figures["i2t/swap_attribute"] == 0.5 and figures["t2i/swap_attribute"] == 1.0
    assert figures["i2t/swap_attribute/same_words"] == 1.0 and figures["i2t/swap_attribute/other"] == 0.0
    assert figures["t2i/swap_attribute/same_words"] == 1.0 and figures["t2i/swap_attribute/other"] == 1.0
    assert figures["i2t/swap_attribute/same_words_share"] == 0.5
    assert not any(key.startswith("i2t/replace_object/") for key in figures)
