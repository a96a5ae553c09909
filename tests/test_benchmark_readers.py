"""Benchmark readers on tiny files in each release's exact layout, and their scoring rules.

A fake encoder with controllable similarities: an image embeds as its mean RGB colour,
a caption as the vector a table gives it.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from lace.concepts.vocabulary import vocabulary_from_dict
from lace.edits.captions import RuleNegatives
from lace.errors import LaceInputError
from lace.eval.benchmarks import BENCHMARKS, get_benchmark
from lace.eval.benchmarks.sugarcrepe import SUGARCREPE_FILES
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.order_perturbations import VocabularyTagger, order_perturbations, pre_caption
from tests.conftest import COLOURS

RED, GREEN, BLUE = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)


class ColourEncoder:
    """Images -> normalised mean RGB; captions -> table vector (unknown captions -> blue)."""

    embed_dim = 3

    def __init__(self, table: dict[str, tuple]):
        self.table = table

    def preprocess(self, image):
        return torch.tensor(np.asarray(image, dtype=np.float32).mean(axis=(0, 1)))

    def eval(self):
        return self

    def encode_images(self, pixels):
        return F.normalize(pixels.float(), dim=-1)

    def encode_texts(self, texts):
        return F.normalize(torch.tensor([self.table.get(t, BLUE) for t in texts], dtype=torch.float32), dim=-1)


def save_png(path: Path, colour=(255, 0, 0), size=(16, 16), right_colour=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, colour)
    if right_colour is not None:  # right half another colour (for crop tests)
        image.paste(Image.new("RGB", (size[0] // 2, size[1]), right_colour), (size[0] // 2, 0))
    image.save(path)


def test_every_benchmark_is_registered_by_name():
    assert {"retrieval", "sugarcrepe", "aro", "winoground", "valse", "world"} <= set(BENCHMARKS)
    with pytest.raises(LaceInputError, match="unknown benchmark"):
        get_benchmark("imagenet")


# ---- SugarCrepe ---------------------------------------------------------------------------

def make_sugarcrepe(root: Path) -> None:
    save_png(root / "val2017" / "000000000001.jpg".replace(".jpg", ".png"), (255, 0, 0))
    for name in SUGARCREPE_FILES:
        items = {"0": {"filename": "000000000001.png", "caption": "red", "negative_caption": "green"},
                 "1": {"filename": "000000000001.png", "caption": "red", "negative_caption": "green"}}
        if name == "swap_obj":  # the negative wins once: accuracy 0.5
            items["1"] = {"filename": "000000000001.png", "caption": "green", "negative_caption": "red"}
        (root / f"{name}.json").write_text(json.dumps(items))


def test_sugarcrepe_scores_each_file_and_the_mean(tmp_path):
    make_sugarcrepe(tmp_path)
    benchmark = get_benchmark("sugarcrepe")
    figures = benchmark.evaluate(ColourEncoder({"red": RED, "green": GREEN}), benchmark.load(tmp_path))
    assert figures["swap_obj"] == 0.5
    assert all(figures[name] == 1.0 for name in SUGARCREPE_FILES if name != "swap_obj")
    assert figures["mean"] == pytest.approx((6 + 0.5) / 7)


def test_sugarcrepe_missing_file_names_file_location_and_publisher(tmp_path):
    make_sugarcrepe(tmp_path)
    (tmp_path / "replace_rel.json").unlink()
    with pytest.raises(LaceInputError) as error:
        get_benchmark("sugarcrepe").load(tmp_path)
    message = str(error.value)
    assert "replace_rel.json" in message and str(tmp_path) in message and "github.com/RAIVNLab/sugar-crepe" in message


def test_sugarcrepe_missing_field_and_missing_images_are_named(tmp_path):
    make_sugarcrepe(tmp_path)
    (tmp_path / "add_att.json").write_text(json.dumps({"7": {"filename": "000000000001.png", "caption": "red"}}))
    with pytest.raises(LaceInputError, match="item 7: field 'negative_caption' missing"):
        get_benchmark("sugarcrepe").load(tmp_path)
    make_sugarcrepe(tmp_path)
    with pytest.raises(LaceInputError, match="cocodataset.org"):
        get_benchmark("sugarcrepe").load(tmp_path, image_root=tmp_path / "elsewhere")


# ---- ARO ----------------------------------------------------------------------------------

def vg_item(box_left: bool, relation=None, attributes=None, true="red", false="green") -> dict:
    item = {"image_path": "2316.jpg".replace(".jpg", ".png"), "bbox_x": 0 if box_left else 16, "bbox_y": 0,
            "bbox_w": 16, "bbox_h": 16, "true_caption": true, "false_caption": false}
    if relation is not None:
        item["relation_name"] = relation
    if attributes is not None:
        item["attributes"] = attributes
    return item


def make_aro(root: Path) -> None:
    save_png(root / "images" / "2316.png", (255, 0, 0), size=(32, 16), right_colour=(0, 255, 0))
    relation = [vg_item(True, "on"), vg_item(True, "on"), vg_item(False, "under")]  # crop right: green -> wrong
    attribution = [vg_item(True, attributes=["red", "green"]) for _ in range(25)]
    attribution += [vg_item(False, attributes=["rare", "pair"]) for _ in range(2)]
    (root / "visual_genome_relation.json").write_text(json.dumps(relation))
    (root / "visual_genome_attribution.json").write_text(json.dumps(attribution))


def test_aro_crops_to_the_box_and_reports_macro_and_micro(tmp_path):
    make_aro(tmp_path)
    benchmark = get_benchmark("aro")
    figures = benchmark.evaluate(ColourEncoder({"red": RED, "green": GREEN}), benchmark.load(root=tmp_path))
    assert figures["vg_relation/micro"] == pytest.approx(2 / 3)
    assert figures["vg_relation/macro"] == pytest.approx(0.5)  # on: 1.0, under: 0.0
    assert figures["vg_relation/macro_all_relations"] == pytest.approx(0.5)  # neither is on the symmetric list
    assert figures["vg_attribution/micro"] == pytest.approx(25 / 27)
    assert figures["vg_attribution/macro"] == pytest.approx(1.0)  # pairs seen < 25 times are left out, as ARO does


def test_aro_malformed_inputs_are_named(tmp_path):
    make_aro(tmp_path)
    items = json.loads((tmp_path / "visual_genome_relation.json").read_text())
    del items[1]["bbox_w"]
    (tmp_path / "visual_genome_relation.json").write_text(json.dumps(items))
    with pytest.raises(LaceInputError, match="item 1: field 'bbox_w' missing"):
        get_benchmark("aro").load(root=tmp_path)
    (tmp_path / "visual_genome_attribution.json").unlink()
    make_aro_relation_only = tmp_path / "visual_genome_relation.json"
    make_aro_relation_only.write_text(json.dumps([vg_item(True, "on")]))
    with pytest.raises(LaceInputError) as error:
        get_benchmark("aro").load(root=tmp_path)
    assert "visual_genome_attribution.json" in str(error.value)
    assert "github.com/mertyg/vision-language-models-are-bows" in str(error.value)


WORLD_VOCABULARY = {"name": "tiny", "objects": ["dog", "cat", "table"],
                    "attributes": {"colour": ["red", "brown"], "size": ["small"]}, "relations": ["on"]}


def test_order_perturbations_keep_the_words_and_shuffle_as_defined():
    tagger = VocabularyTagger(RuleNegatives(vocabulary_from_dict(WORLD_VOCABULARY)))
    caption = "A small brown dog sits on the red table near a cat."
    tokens, tags = tagger.tag(caption)
    assert [t for t, tag in zip(tokens, tags) if tag == "noun"] == ["dog", "table", "cat"]
    assert [t for t, tag in zip(tokens, tags) if tag == "adj"] == ["small", "brown", "red"]
    perturbed = order_perturbations(caption, tagger, np.random.default_rng(3))
    assert len(perturbed) == 4
    for text in perturbed:
        assert sorted(text.split()) == sorted(tokens)  # only the order changes
    nouns_adjectives = perturbed[0].split()
    # other words stay in place in the first perturbation; nouns/adjectives stay in place in the second
    assert [w for w, tag in zip(nouns_adjectives, tags) if tag == "other"] == [t for t, g in zip(tokens, tags) if g == "other"]
    others = perturbed[1].split()
    assert [w for w, tag in zip(others, tags) if tag != "other"] == [t for t, g in zip(tokens, tags) if g != "other"]
    within = perturbed[2].split()
    for start in range(0, len(tokens), 3):
        assert sorted(within[start: start + 3]) == sorted(tokens[start: start + 3])
    assert order_perturbations(caption, tagger, np.random.default_rng(3)) == perturbed  # seeded
    assert pre_caption("A Dog, on (the) table.") == "a dog, on the table"


def test_coco_order_scores_the_true_caption_against_its_perturbations(tmp_path):
    save_png(tmp_path / "val2014" / "a.png", (255, 0, 0))
    karpathy = {"images": [
        {"filepath": "val2014", "filename": "a.png", "split": "test",
         "sentences": [{"raw": "A red dog on a brown table."}, {"raw": "dog"}]},
        {"filepath": "val2014", "filename": "b.png", "split": "train", "sentences": [{"raw": "unused"}]},
    ]}
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(karpathy))
    vocabulary = tmp_path / "tiny.yaml"
    vocabulary.write_text(json.dumps(WORLD_VOCABULARY))  # JSON is YAML
    benchmark = get_benchmark("aro")
    data = benchmark.load(coco_karpathy=path, vocabulary=str(vocabulary))
    assert list(data) == ["coco_order"] and len(data["coco_order"].true_captions) == 2
    true = pre_caption("A red dog on a brown table.")
    figures = benchmark.evaluate(ColourEncoder({true: RED}), data)
    assert figures["coco_order"] == 1.0
    # the one-word caption has no perturbation that differs from it: left out of the strict figure
    assert figures["coco_order/strict"] == 1.0
    figures = benchmark.evaluate(ColourEncoder({true: BLUE}), data)
    assert figures["coco_order"] == 1.0  # as ARO's argmax: ties go to the true caption
    assert figures["coco_order/strict"] == 0.0  # strictly, a tie with every perturbation is a failure


# ---- Winoground --------------------------------------------------------------------

def make_winoground(root: Path) -> None:
    save_png(root / "images" / "ex_0_img_0.png", (255, 0, 0))
    save_png(root / "images" / "ex_0_img_1.png", (0, 255, 0))
    lines = [
        {"id": 0, "caption_0": "red", "caption_1": "green", "image_0": "ex_0_img_0", "image_1": "ex_0_img_1"},
        {"id": 1, "caption_0": "green", "caption_1": "red", "image_0": "ex_0_img_0", "image_1": "ex_0_img_1"},
    ]
    (root / "examples.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def test_winoground_reads_jsonl_and_scores_text_image_group(tmp_path):
    make_winoground(tmp_path)
    benchmark = get_benchmark("winoground")
    figures = benchmark.evaluate(ColourEncoder({"red": RED, "green": GREEN}), benchmark.load(tmp_path))
    assert figures == {"text": 0.5, "image": 0.5, "group": 0.5}


def test_winoground_missing_inputs_are_named(tmp_path):
    with pytest.raises(LaceInputError, match="examples.jsonl.*huggingface.co/datasets/facebook/winoground"):
        get_benchmark("winoground").load(tmp_path)
    make_winoground(tmp_path)
    (tmp_path / "images" / "ex_0_img_1.png").unlink()
    with pytest.raises(LaceInputError, match="ex_0_img_1.png"):
        get_benchmark("winoground").load(tmp_path)
    (tmp_path / "examples.jsonl").write_text(json.dumps({"id": 0, "caption_0": "a", "image_0": "x", "image_1": "y"}))
    with pytest.raises(LaceInputError, match="field 'caption_1' missing"):
        get_benchmark("winoground").load(tmp_path)


# ---- world, retrieval ---------------------------------------------------------------------

def test_world_scores_both_directions_per_family(tmp_path):
    save_png(tmp_path / "images" / "test" / "s0.png", (255, 0, 0))
    save_png(tmp_path / "benchmarks" / "images" / "test" / "s0_neg.png", (0, 255, 0))
    items = [
        {"family": "swap_attribute", "filename": "images/test/s0.png", "caption": "red",
         "negative_caption": "green", "negative_filename": "benchmarks/images/test/s0_neg.png"},
        {"family": "replace_object", "filename": "images/test/s0.png", "caption": "red",
         "negative_caption": "reddish", "negative_filename": "benchmarks/images/test/s0_neg.png"},
    ]
    (tmp_path / "benchmarks" / "test.json").write_text(json.dumps(items))
    quadruple = {"id": "q", "image_0": "images/test/s0.png", "image_1": "benchmarks/images/test/s0_neg.png",
                 "caption_0": "red", "caption_1": "green"}
    (tmp_path / "benchmarks" / "test_winoground.json").write_text(json.dumps([quadruple]))
    benchmark = get_benchmark("world")
    encoder = ColourEncoder({"red": RED, "green": GREEN, "reddish": (1.0, 0.1, 0.0)})
    figures = benchmark.evaluate(encoder, benchmark.load(tmp_path, split="test"))
    assert figures["i2t/swap_attribute"] == 1.0 and figures["i2t/replace_object"] == 1.0
    assert figures["t2i/swap_attribute"] == 1.0 and figures["t2i/replace_object"] == 1.0
    assert figures["winoground/group"] == 1.0
    (tmp_path / "benchmarks" / "test_winoground.json").unlink()
    with pytest.raises(LaceInputError, match="test_winoground.json"):
        benchmark.load(tmp_path, split="test")


def test_retrieval_reads_a_karpathy_file_and_names_a_missing_one(tiny_coco, tmp_path):
    benchmark = get_benchmark("retrieval")
    data = benchmark.load(tiny_coco, split=None)
    table = {caption: next(rgb for name, rgb in COLOURS.items() if name in caption) for caption in data.dataset.captions}
    figures = benchmark.evaluate(ColourEncoder(table), data)
    assert set(figures) == {f"{d}/R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)}
    assert figures["i2t/R@10"] == 1.0
    with pytest.raises(LaceInputError, match="'dataset_coco.json' not found") as error:
        benchmark.load(tmp_path / "dataset_coco.json")
    assert "karpathy" not in str(error.value).lower()  # the user's own file: no download page to point at


def test_embedding_cache_embeds_each_input_once_and_round_trips(tmp_path):
    save_png(tmp_path / "a.png", (255, 0, 0))
    calls = []

    class CountingEncoder(ColourEncoder):
        def encode_texts(self, texts):
            calls.append(list(texts))
            return super().encode_texts(texts)

    cache = EmbeddingCache(CountingEncoder({"red": RED}))
    first = cache.texts(["red", "red", "blue"])
    cache.texts(["blue", "red"])
    assert calls == [["red", "blue"]]
    images = cache.images([(str(tmp_path / "a.png"), None), (str(tmp_path / "a.png"), (0, 0, 4, 4))])
    cache.save(tmp_path / "cache.npz")
    other = EmbeddingCache(CountingEncoder({}))
    other.load(tmp_path / "cache.npz")
    torch.testing.assert_close(other.texts(["red", "red", "blue"]), first)
    torch.testing.assert_close(other.images([(str(tmp_path / "a.png"), None)]), images[:1])
    assert len(calls) == 1
