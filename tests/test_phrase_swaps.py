"""The independent swap writer (`lace.study.phrase_swaps`): each rewrite kind, its refusals, determinism,
its independence from the rule editor, and its items measured in both Flickr8k studies."""

from __future__ import annotations

import ast
import csv
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from lace.study.phrase_swaps import phrase_swap, phrase_swap_items, phrase_swaps

WRITER = Path(__file__).resolve().parents[1] / "src" / "lace" / "study"
SOURCES = (WRITER / "phrase_swaps.py", WRITER / "phrase_lexicon.py")  # the writer and its lexicon


@pytest.mark.parametrize("caption, kind, rewrite", [
    # clothing phrases of two people exchanged whole, across a symmetric and a directed relation
    ("A man in a red shirt and a woman in a blue hat walk down the street .", "swap_att",
     "A man in a blue hat and a woman in a red shirt walk down the street ."),
    ("a girl wearing a green jacket is pushing a boy in an orange hat on a swing", "swap_att",
     "a girl in an orange hat is pushing a boy wearing a green jacket on a swing"),
    ("The boy in blue runs after the boy in red .", "swap_att", "The boy in red runs after the boy in blue ."),
    # colour phrases of two animals exchanged whole, the article following its new word
    ("a black and white dog chases a brown dog .", "swap_att", "a brown dog chases a black and white dog ."),
    ("An orange cat and a black dog sit on a couch .", "swap_att", "A black cat and an orange dog sit on a couch ."),
    # the colour phrases of two garments one person wears
    ("A girl in an orange shirt and dark blue shorts runs .", "swap_att",
     "A girl in a dark blue shirt and orange shorts runs ."),
    # whole noun phrases around a directed relation
    ("A man in a red shirt chases a black dog .", "swap_obj", "A black dog chases a man in a red shirt ."),
    ("The little boy is pushing a man in a wheelchair .", "swap_obj",
     "A man is pushing the little boy in a wheelchair ."),
    ("two girls are being chased by two boys", "swap_obj", "two boys are being chased by two girls"),
    ("a white dog being led by a person", "swap_obj", "a person being led by a white dog"),
    # the colour phrases of two things, one of them worn alone, moved whole
    ("A man in a blue and white shirt rides a red bike .", "swap_att",
     "A man in a red shirt rides a blue and white bike ."),
    ("A man dressed in black and white rides a green bike .", "swap_att",
     "A man dressed in green rides a black and white bike ."),
    ("A black and white dog jumps up towards a yellow toy .", "swap_att",
     "A yellow dog jumps up towards a black and white toy ."),
    # the clothing phrases of two people no relation joins directly, and of the subjects of two clauses
    ("A man in a black jacket sits on a bench near a woman in a hat .", "swap_att",
     "A man in a hat sits on a bench near a woman in a black jacket ."),
    ("A girl in a red coat is jumping while a boy in a hat watches .", "swap_att",
     "A girl in a hat is jumping while a boy in a red coat watches ."),
    # a small word and a big word, whole modifier phrases of two animals a directed relation tells apart
    ("A little girl hugs a big dog .", "swap_att", "A big girl hugs a little dog ."),
    ("A young girl plays while an older woman watches .", "swap_att",
     "An older girl plays while a young woman watches ."),
    ("A large brown dog chases a small white dog .", "swap_att", "A small white dog chases a large brown dog ."),
    # a person and a thing in front of or behind each other, the subjects of two clauses, verbs that agree
    ("A man in a red shirt stands in front of a brick wall .", "swap_obj",
     "A brick wall stands in front of a man in a red shirt ."),
    ("A man in a red shirt sits while a woman stands .", "swap_obj",
     "A woman sits while a man in a red shirt stands ."),
    ("A dog runs while a man watches .", "swap_obj", "A man runs while a dog watches ."),
    ("Two dogs chase a cat .", "swap_obj", "A cat chases two dogs ."),
    ("A man is being chased by two dogs .", "swap_obj", "Two dogs are being chased by a man ."),
    ("A woman in red carries a man .", "swap_obj", "A man carries a woman in red ."),
])
def test_each_rewrite_moves_whole_phrases(caption, kind, rewrite):
    assert rewrite in phrase_swaps(caption, kind)


@pytest.mark.parametrize("caption, kind", [
    ("A black dog and a brown dog run .", "swap_att"),  # "and" between two dogs: the same meaning either way
    ("A man in a red shirt and a man in a blue shirt .", "swap_att"),
    ("A man in a hat and a woman in a blue dress .", "swap_att"),  # a dress moved onto a man
    ("A black man and a white woman talk .", "swap_att"),  # colours of people are not attributes to exchange
    ("A man in a red shirt and a dog with a collar .", "swap_att"),  # clothing of a person onto a dog
    ("A man in a blue and white shirt walks a brown dog .", "swap_att"),  # "a blue and white dog": implausible
    ("A black and white dog with a white ball .", "swap_att"),  # "a white dog with a black and white ball"
    ("A black dog and a brown and white puppy play .", "swap_att"),  # a dog and a puppy: one kind, "and"
    ("A black dog toy and a red ball .", "swap_att"),  # the colour is the toy's, which has none to give
    ("The small girl pushes the little boy .", "swap_att"),  # "little" for "small" says nothing
    ("A girl in a striped shirt and blue jeans .", "swap_att"),  # "striped" is not a colour phrase
    ("A man in red winter clothes talks to another man in red .", "swap_att"),  # the same colour on both
    ("A man and a woman walk together .", "swap_obj"),  # symmetric relation
    ("Two dogs chase a cat and run .", "swap_obj"),  # the later verb would disagree with its new subject
    ("Two women are holding a young child .", "swap_obj"),  # "a young child is holding two women"
    ("A man throws a ball while a dog runs .", "swap_obj"),  # "a dog throws a ball"
    ("A man holds his hat while a woman watches .", "swap_obj"),  # "a woman holds his hat"
    ("A girl sits while another boy stands .", "swap_obj"),  # "another" refers back
    ("A man sings in front of a building .", "swap_obj"),  # "a building sings"
    ("A boy runs while a child watches .", "swap_obj"),  # the child may be the boy
    ("A white dog carries a gray bird .", "swap_obj"),  # "a gray bird carries a white dog"
    ("A little white dog runs out of a tube while a man runs along clapping .", "swap_obj"),  # a dog clapping
    ("A boy holding a ball falls in front of another boy while a man smiles .", "swap_obj"),  # "another" would change referent
    ("A man in a jersey stands in front of a large crowd .", "swap_obj"),  # a crowd faces its own way
    ("A man stands in front of a brick wall and a sign .", "swap_obj"),  # the wall is one of two
    ("A man with glasses and a woman wearing a hat that looks like a dog .", "swap_att"),  # the hat goes on
    ("A man in a maroon shirt runs behind a girl wearing a red , white and blue tutu .", "swap_att"),  # a list
    ("A man holds a dog .", "swap_obj"),  # "a dog holds a man": not plausible
    ("A man pushes a baby in a stroller .", "swap_obj"),  # "a baby pushes a man": not plausible
    ("A dog chases a dog .", "swap_obj"),
    ("A dog chases a cat toy .", "swap_obj"),  # the second phrase does not end at "cat"
    ("A dog chases a cat 's tail .", "swap_obj"),
    ("A woman is standing in front of a dog that is sitting .", "swap_obj"),  # a relative clause on the second
    ("The owner of a dog chases a cat .", "swap_obj"),  # "a dog" does not start the clause
    ("A gorilla chases a zebra .", "swap_obj"),  # words outside the lexicon
    ("", "swap_att"),
])
def test_it_refuses_what_it_cannot_rewrite_safely(caption, kind):
    assert phrase_swaps(caption, kind) == []
    assert phrase_swap(caption, kind, random.Random(0)) is None


def test_a_clothing_phrase_that_goes_on_is_not_moved():
    rewrites = phrase_swaps("A man in a white hat stands behind a woman with a red shawl over her head .", "swap_att")
    assert rewrites == ["A man in a red hat stands behind a woman with a white shawl over her head ."]


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="replace_att"):
        phrase_swaps("A dog chases a cat .", "replace_att")


CAPTIONS = [
    "A man in a red shirt chases a black dog .",
    "A brown dog jumps over a small white dog .",
    "A dog runs on the grass .",
    "A boy in a green shirt and blue jeans walks .",
    "A girl in a pink hat stands next to a boy in a yellow shirt , a black dog chases a white cat .",
]


def _words(text: str) -> list[str]:
    return sorted("a" if word.lower() in ("a", "an") else word.lower() for word in text.split())


def test_items_are_deterministic_given_the_seed_and_keep_per_kind():
    owner = np.array([0, 1, 2, 3, 4])
    items = phrase_swap_items(CAPTIONS, owner, per_kind=10)
    assert items == phrase_swap_items(CAPTIONS, owner, per_kind=10)
    assert {item["kind"] for item in items} == {"swap_att", "swap_obj"}
    assert all(item["caption"] == CAPTIONS[item["caption_row"]] and item["image"] == owner[item["caption_row"]]
               and item["negative_caption"] != item["caption"] for item in items)
    # a swap only moves words: the same words (but the article agreeing with its new neighbour)
    assert all(_words(item["negative_caption"]) == _words(item["caption"]) for item in items)
    # the last caption has several rewrites: some seed draws another, every draw is one of them
    draws = {phrase_swap_items(CAPTIONS[4:], owner[:1], per_kind=10, seed=seed)[0]["negative_caption"]
             for seed in range(20)}
    assert len(draws) > 1 and draws <= set(phrase_swaps(CAPTIONS[4], "swap_att"))
    assert len([i for i in phrase_swap_items(CAPTIONS, owner, per_kind=1) if i["kind"] == "swap_att"]) == 1
    # an excluded rewrite is never drawn
    kept = phrase_swap_items(CAPTIONS, owner, per_kind=10, exclude=lambda caption, text: "black" in text)
    assert kept and not any("black" in item["negative_caption"] for item in kept)


def test_the_writer_shares_no_code_or_vocabulary_with_the_rule_editor():
    imported = set()
    for source in SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(("." * node.level) + (node.module or ""))
    own = {"lace.study.phrase_lexicon"}  # the writer's own lexicon, which imports nothing of lace itself
    assert "lace.study.phrase_lexicon" in imported
    assert not any(name.startswith(("lace", ".")) for name in imported - own), imported


def test_independent_items_leave_out_what_the_rule_editor_can_write():
    from lace.concepts.vocabulary import load_vocabulary
    from lace.edits.captions import RuleNegatives
    from lace.study.measure import independent_swap_items

    rules = RuleNegatives(load_vocabulary("natural"))
    captions = ["A boy in a green shirt and blue jeans walks .", "A man in a red shirt chases a black dog ."]
    written = phrase_swap_items(captions, np.arange(2), per_kind=10)
    kept = independent_swap_items(rules, captions, np.arange(2), per_kind=10)
    made = {text for caption in captions for texts in rules.make_all(caption).values() for text in texts}
    assert "A boy in a blue shirt and green jeans walks ." in made  # the rule editor's colour-word exchange
    assert [item["negative_caption"] for item in written if item["negative_caption"] in made]
    assert kept == [item for item in written if item["negative_caption"] not in made] and kept


def test_a_new_pattern_leaves_out_the_exchanges_the_rule_editor_can_write():
    from lace.concepts.vocabulary import load_vocabulary
    from lace.edits.captions import RuleNegatives
    from lace.study.measure import independent_swap_items

    rules = RuleNegatives(load_vocabulary("natural"))
    single, phrase = "A man in a red shirt rides a blue bike .", "A man in a blue and white shirt rides a red bike ."
    # one colour word on each side: the writer's exchange is a word exchange the rule editor also writes
    assert phrase_swaps(single, "swap_att") == ["A man in a blue shirt rides a red bike ."]
    assert "A man in a blue shirt rides a red bike ." in rules.make_all(single)["swap_attributes"]
    kept = independent_swap_items(rules, [single, phrase], np.arange(2), per_kind=10)
    assert [(item["caption_row"], item["negative_caption"]) for item in kept] == [
        (1, "A man in a red shirt rides a blue and white bike .")]


# --- both studies measure the items as they measure the rule editor's --------------------------------------

SWAP_CAPTIONS = ("a man in a {a} shirt chases a {b} dog .", "a {a} dog chases a {b} cat .",
                 "a boy in a {a} hat is pushing a girl in a {b} jacket .")


def _add_swap_captions(root: Path) -> Path:
    """Every image of a Flickr8k-like folder gets captions the phrase writer rewrites (colours from its name)."""
    with open(root / "captions.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    colours = ("red", "blue", "green", "yellow")
    names = sorted({name for name, _ in rows})
    rows += [(name, template.format(a=colours[i % 4], b=colours[(i + 1) % 4]))
             for i, name in enumerate(names) for template in SWAP_CAPTIONS]
    with open(root / "captions.csv", "w", newline="") as f:
        csv.writer(f).writerows([("image", "caption"), *rows])
    return root


@pytest.mark.slow
def test_the_locked_study_reports_the_independent_items_apart(tmp_path):
    from lace.concepts.vocabulary import load_vocabulary
    from lace.data.flickr8k import read_flickr8k
    from lace.edits.captions import RuleNegatives
    from lace.encoders.towers import TowersConfig, TowersDualEncoder
    from lace.study import run_flickr8k_study
    from lace.study.features import dataset_features
    from lace.study.heads import embed_split, load_heads
    from lace.study.measure import PhraseSwapSet, independent_swap_items, score_items
    from tests.test_study import make_folder, tiny_config

    torch.set_num_threads(1)
    data = _add_swap_captions(make_folder(tmp_path / "data"))
    config = replace(tiny_config(data, tmp_path / "study", tmp_path / "cache"), seeds=1, variants=("plain",))
    results = run_flickr8k_study(config, log=lambda _: None)
    counts = results["bank"]["phrase_swap_items"]
    assert counts["swap_att"] > 0 and counts["swap_obj"] > 0
    for figures in (results["base_figures"], results["finetunes"]["plain"][0]["figures"]):
        assert {"phrase_swaps/swap_att", "phrase_swaps/swap_obj", "sugarcrepe_style/swap_att"} <= set(figures)
    assert results["summary"]["plain"]["phrase_swaps/swap_att"]["n"] == 1
    report = (tmp_path / "study" / "report.md").read_text()
    assert "written independently of the rule editor" in report and "phrase_swaps/swap_obj" in report
    # the figures are `score_items` on the base's test embeddings and its head on the banked tower features
    encoder = TowersDualEncoder(TowersConfig())
    test = dataset_features(encoder, read_flickr8k(str(data)), tmp_path / "cache", 16, 0, False)[0]["test"]
    load_heads(encoder, tmp_path / "study" / "models" / "base.safetensors")
    phrase = PhraseSwapSet.encode(encoder, independent_swap_items(
        RuleNegatives(load_vocabulary("natural")), test.captions, test.caption_image_index, 8), tmp_path / "cache")
    images, texts = embed_split(encoder, test)
    negatives = encoder.head_text(phrase.bank.lookup([item["negative_caption"] for item in phrase.items]))
    expected = score_items(images, texts, negatives, phrase.items)
    assert results["base_figures"]["phrase_swaps/swap_att"] == pytest.approx(expected["swap_att"])
    assert results["base_figures"]["phrase_swaps/swap_obj"] == pytest.approx(expected["swap_obj"])


@pytest.mark.slow
def test_the_tops_study_measures_the_independent_items_as_it_measures_the_rule_items(tmp_path):
    from lace.concepts.vocabulary import load_vocabulary
    from lace.data.flickr8k import read_flickr8k
    from lace.edits.captions import RuleNegatives
    from lace.encoders.towers import encode_captions
    from lace.experiment.protocol import Run
    from lace.study.flickr8k_top import embed_top_split, top_splits
    from lace.study.flickr8k_top_arms import SplitItems, load_top, run_tops_study
    from lace.study.measure import score_items
    from tests.test_top_arms import tiny_study
    from tests.towers_support import make_coloured_flickr8k

    torch.set_num_threads(1)
    data, out = _add_swap_captions(make_coloured_flickr8k(tmp_path / "flickr8k", 16)), tmp_path / "out"
    result = run_tops_study(tiny_study(data, out, arms=("plain",)), log=lambda _: None)
    figures = result["runs"]["plain"][0]
    assert result["phrase_swap_items"]["swap_att"] > 0 and result["phrase_swap_items"]["swap_obj"] > 0
    assert {"phrase_swaps/swap_att", "phrase_swaps/swap_obj"} <= set(figures)
    assert set(result["summary"]["plain"]) >= {"phrase_swaps/swap_att", "sugarcrepe_style/swap_att"}
    assert "written independently of the rule editor" in (out / "arms-val.md").read_text()
    # the figures are `score_items` on the measured model's embeddings, as the rule items' are
    model = load_top(Run("plain", 0).model_file(out, ".safetensors"))
    split = top_splits(str(data), str(out / "features"), model.encoder, progress=False)["val"]
    measured = SplitItems(model, RuleNegatives(load_vocabulary("natural")), split, list(read_flickr8k(str(data)).captions),
                          str(out / "features"), tiny_study(data, out))
    images, texts = embed_top_split(model, split)
    negatives = encode_captions(model, measured.phrase_states, np.arange(len(measured.phrase_items)))
    expected = score_items(images, texts, negatives, measured.phrase_items)
    assert figures["phrase_swaps/swap_att"] == pytest.approx(expected["swap_att"])
    assert figures["phrase_swaps/swap_obj"] == pytest.approx(expected["swap_obj"])


def test_the_tops_table_and_targets_show_the_independent_items_apart():
    from lace.experiment.summary import summarise_over_seeds
    from lace.study.flickr8k_top_arms import arms_table, target_checks

    def arm(rule: float, phrase: float) -> list[dict]:
        return [{"sugarcrepe_style/swap_att": rule + d, "sugarcrepe_style/swap_obj": rule + d, "i2t/R@1": 0.5,
                 "t2i/R@1": 0.5, "phrase_swaps/swap_att": phrase + d, "phrase_swaps/swap_obj": phrase + d}
                for d in (-0.01, 0.0, 0.01)]

    runs = {"plain": arm(0.60, 0.50), "LACE-local": arm(0.70, 0.45)}
    checks = target_checks(runs, "LACE-local")
    assert [check.text for check in checks][-2:] == ["LACE-local beats plain on i2t swap_att written independently",
                                                     "LACE-local beats plain on i2t swap_obj written independently"]
    assert [check.status for check in checks] == ["met", "met", "met", "met", "missed", "missed"]
    # runs without the family keep the four targets of before
    assert len(target_checks({name: [{k: v for k, v in figures.items() if not k.startswith("phrase")}
                                     for figures in seeds] for name, seeds in runs.items()}, "LACE-local")) == 4
    summary = summarise_over_seeds(runs, ("sugarcrepe_style/swap_att", "phrase_swaps/swap_att",
                                          "phrase_swaps/swap_obj", "i2t/R@1", "t2i/R@1"))
    table = arms_table({"split": "val", "summary": summary, "runs": runs,
                        "phrase_swap_items": {"swap_att": 17, "swap_obj": 10}})
    rule_table, phrase_table = table.split("written independently of the rule editor", 1)
    assert "| LACE-local | 0.700 ± 0.010 (3) |" in rule_table and "0.450" not in rule_table
    assert "swap_att 17 items, swap_obj 10 items" in phrase_table
    assert "| LACE-local | 0.450 ± 0.010 (3) | 0.450 ± 0.010 (3) | -5.0 pts |" in phrase_table
    assert "phrase swap" not in arms_table({"split": "val", "summary": summary, "runs": runs})
