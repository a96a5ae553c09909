"""Each reader on items copied from its benchmark's published files (tests/fixtures/releases),
scored by the authors' rules: which items count and how ties count.

Images are small solid colours written under the file names the items name; the
`ColourEncoder` gives each caption the colour a table says, so a test decides which
option wins for every item.
"""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lace.errors import LaceInputError
from lace.eval.benchmarks import get_benchmark
from lace.eval.benchmarks.aro import SYMMETRIC_RELATIONS
from lace.eval.order_perturbations import SpacyTagger, pre_caption
from lace.eval.runner import EvalConfig, run_evaluation
from tests.test_benchmark_readers import BLUE, GREEN, RED, ColourEncoder

RELEASES = Path(__file__).parent / "fixtures" / "releases"


def write_image(path: Path, colour=(255, 0, 0), size=(16, 16), right_colour=None) -> None:
    """A lossless image under any name (the releases name JPEGs; PNG keeps colours exact)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, colour)
    if right_colour is not None:
        image.paste(Image.new("RGB", (size[0] // 2, size[1]), right_colour), (size[0] // 2, 0))
    image.save(path, format="PNG")


def copy_release(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(RELEASES / name, tmp_path / name))


# ---- VALSE --------------------------------------------------------------------------------

VALSE_UNVALIDATED = {"existence_visual7w_150304", "1064139", "actions_test_3", "coref_train_2174",
                     "plurals:coco2017:2174"}  # mturk["caption"] < 2 in the release
VALSE_WRONG = {"1100983"}  # a validated item the test encoder gets wrong


def valse_table(root: Path) -> dict[str, tuple]:
    """Captions red and foils green (right on a red image), flipped for unvalidated and wrong items."""
    table = {}
    for path in root.glob("*.json"):
        for key, item in json.loads(path.read_text()).items():
            flipped = key in VALSE_UNVALIDATED or key in VALSE_WRONG
            table[item["caption"]] = GREEN if flipped else RED
            table[item["foil"]] = RED if flipped else GREEN
    return table


def make_valse(tmp_path: Path) -> Path:
    root = copy_release("valse", tmp_path)
    for path in root.glob("*.json"):
        for item in json.loads(path.read_text()).values():
            write_image(root / "images" / item["image_file"])
    return root


def test_valse_reads_the_release_and_scores_validated_items_per_piece(tmp_path):
    root = make_valse(tmp_path)
    benchmark = get_benchmark("valse")
    data = benchmark.load(root)
    assert {name: len(items.captions) for name, items in data.items()} == {
        "actant-swap": 1, "action-replacement": 1, "coreference-standard": 1, "counting-hard": 1, "existence": 2,
        "foil-it": 2, "plurals": 1, "relations": 1}
    assert data["existence"].negatives[0] == "There are people in the picture."
    figures = benchmark.evaluate(ColourEncoder(valse_table(root)), data)
    assert figures == {"actant-swap": 1.0, "action-replacement": 1.0, "coreference-standard": 1.0,
                       "counting-hard": 1.0, "existence": 1.0, "foil-it": 0.5, "plurals": 1.0, "relations": 1.0,
                       "mean": pytest.approx(7.5 / 8)}


def test_valse_all_items_keeps_what_annotators_rejected(tmp_path):
    root = make_valse(tmp_path)
    benchmark = get_benchmark("valse")
    figures = benchmark.evaluate(ColourEncoder(valse_table(root)), benchmark.load(root, all_items=True))
    assert figures["existence"] == pytest.approx(2 / 3)
    assert figures["foil-it"] == pytest.approx(1 / 3)
    assert figures["actant-swap"] == figures["plurals"] == figures["coreference-standard"] == 0.5


def test_valse_caption_as_a_list_uses_its_first_entry_and_bad_items_are_named(tmp_path):
    root = make_valse(tmp_path)
    items = json.loads((root / "existence.json").read_text())
    items["existence_visual7w_2371044"]["caption"] = ["There are no people in the picture.", "unused"]
    (root / "existence.json").write_text(json.dumps(items))
    data = get_benchmark("valse").load(root)
    assert data["existence"].captions[0] == "There are no people in the picture."
    del items["existence_visual7w_2371044"]["foil"]
    (root / "existence.json").write_text(json.dumps(items))
    with pytest.raises(LaceInputError, match="existence.json: item existence_visual7w_2371044: field 'foil' missing"):
        get_benchmark("valse").load(root)
    items["existence_visual7w_2371044"]["foil"] = "x"
    items["existence_visual7w_2371044"]["mturk"] = "yes"
    (root / "existence.json").write_text(json.dumps(items))
    with pytest.raises(LaceInputError, match="field 'mturk'"):
        get_benchmark("valse").load(root)


# ---- SugarCrepe ---------------------------------------------------------------------------

def test_sugarcrepe_reads_the_release_and_scores_each_file(tmp_path):
    root = copy_release("sugarcrepe", tmp_path)
    table = {}
    for path in root.glob("*.json"):
        for key, item in json.loads(path.read_text()).items():
            write_image(root / "val2017" / item["filename"])
            wrong = path.stem == "swap_obj" and key == "2"
            table[item["caption"]], table[item["negative_caption"]] = (GREEN, RED) if wrong else (RED, GREEN)
    benchmark = get_benchmark("sugarcrepe")
    data = benchmark.load(root)
    assert all(len(items.captions) == 2 for items in data.values()) and len(data) == 7
    figures = benchmark.evaluate(ColourEncoder(table), data)
    assert figures["swap_obj"] == 0.5
    assert all(figures[name] == 1.0 for name in data if name != "swap_obj")
    assert figures["mean"] == pytest.approx(6.5 / 7)
    table[data["add_att"].negatives[0]] = RED  # a tie is a failure: the authors test pos_score > neg_score
    assert benchmark.evaluate(ColourEncoder(table), data)["add_att"] == 0.5


# ---- ARO ----------------------------------------------------------------------------------

def make_visual_genome(tmp_path: Path) -> Path:
    root = copy_release("aro", tmp_path)
    write_image(root / "images" / "2315375.jpg", (255, 0, 0), size=(32, 16), right_colour=(0, 255, 0))
    return root


def test_vg_relation_macro_leaves_out_the_authors_symmetric_relations(tmp_path):
    root = make_visual_genome(tmp_path)
    table = {"the horse is eating the grass": RED, "the grass is eating the horse": GREEN,
             "the man is next to the horse": RED, "the horse is next to the man": GREEN,
             "the paved road and the white house": RED, "the white road and the paved house": GREEN}
    benchmark = get_benchmark("aro")
    figures = benchmark.evaluate(ColourEncoder(table), benchmark.load(root=root))
    # "eating" (left box, red) is right; "next to" (right box, green) is wrong and symmetric
    assert "next to" in SYMMETRIC_RELATIONS and "eating" not in SYMMETRIC_RELATIONS
    assert figures["vg_relation/macro"] == 1.0
    assert figures["vg_relation/macro_all_relations"] == 0.5
    assert figures["vg_relation/micro"] == 0.5
    assert figures["vg_attribution/micro"] == 1.0
    assert np.isnan(figures["vg_attribution/macro"])  # the only pair is seen once, under the authors' 25
    table["the grass is eating the horse"] = RED  # a tie: the authors' argmax over [false, true] picks false
    assert benchmark.evaluate(ColourEncoder(table), benchmark.load(root=root))["vg_relation/micro"] == 0.0


@pytest.mark.parametrize("name, images, flag", [
    ("coco_order", "val2014/COCO_val2014_000000391895.jpg", "coco_karpathy"),
    ("flickr30k_order", "flickr30k-images/1007129816.jpg", "flickr_karpathy"),
])
def test_order_tasks_read_blip_test_lists_and_ties_go_to_the_true_caption(tmp_path, name, images, flag):
    root = copy_release("aro", tmp_path)
    file_name = "coco_karpathy_test.json" if name == "coco_order" else "flickr30k_test.json"
    write_image(root / images)
    captions = json.loads((root / file_name).read_text())[0]["caption"]
    benchmark = get_benchmark("aro")
    data = benchmark.load(**{flag: root / file_name})
    choice = data[name]
    assert choice.true_captions == [pre_caption(caption) for caption in captions]  # five items, one per caption
    assert all(len(options) == 4 for options in choice.alternatives)
    if name == "coco_order":
        assert choice.true_captions[0] == "a man with a red helmet on a small moped on a dirt road"
    figures = benchmark.evaluate(ColourEncoder({caption: RED for caption in choice.true_captions}), data)
    assert figures[name] == 1.0 and figures[f"{name}/strict"] == 1.0
    constant = benchmark.evaluate(ColourEncoder({}), data)  # every option the same vector
    assert constant[name] == 1.0  # the authors' argmax keeps index 0, the true caption
    assert constant[f"{name}/strict"] == 0.0


def test_order_taggers_unknown_or_missing_spacy_are_named(tmp_path):
    root = copy_release("aro", tmp_path)
    with pytest.raises(LaceInputError, match="unknown tagger 'nltk'"):
        get_benchmark("aro").load(coco_karpathy=root / "coco_karpathy_test.json", tagger="nltk")
    try:
        import spacy  # noqa: F401
    except ImportError:
        with pytest.raises(LaceInputError, match="spaCy"):
            get_benchmark("aro").load(coco_karpathy=root / "coco_karpathy_test.json", tagger="spacy")
    else:
        assert SpacyTagger().tag("a red dog")[1] == ["other", "adj", "noun"]


# ---- Winoground ---------------------------------------------------------------------------

def test_winoground_reads_the_release_and_scores_as_the_paper(tmp_path):
    root = copy_release("winoground", tmp_path)
    write_image(root / "images" / "ex_0_img_0.png", (255, 0, 0))
    write_image(root / "images" / "ex_0_img_1.png", (0, 255, 0))
    benchmark = get_benchmark("winoground")
    data = benchmark.load(root)
    assert data.ids == ["0"]
    assert data.captions == [("an old person kisses a young person", "a young person kisses an old person")]
    right = {"an old person kisses a young person": RED, "a young person kisses an old person": GREEN}
    assert benchmark.evaluate(ColourEncoder(right), data) == {"text": 1.0, "image": 1.0, "group": 1.0}
    tied = {"an old person kisses a young person": BLUE, "a young person kisses an old person": BLUE}
    assert benchmark.evaluate(ColourEncoder(tied), data) == {"text": 0.0, "image": 0.0, "group": 0.0}


def test_lace_eval_config_carries_the_valse_filter_and_the_aro_tagger(tmp_path):
    root = make_valse(tmp_path)
    encoder = ColourEncoder(valse_table(root))
    base = EvalConfig(benchmarks=("valse",), valse_root=str(root), diagnostics=False)
    validated = run_evaluation(encoder, base, model="colours")["benchmarks"]["valse"]
    everything = run_evaluation(encoder, replace(base, valse_all_items=True), model="colours")["benchmarks"]["valse"]
    assert validated["foil-it"] == 0.5 and everything["foil-it"] == pytest.approx(1 / 3)
    aro = copy_release("aro", tmp_path)
    with pytest.raises(LaceInputError, match="unknown tagger"):
        run_evaluation(encoder, EvalConfig(benchmarks=("aro",), aro_coco=str(aro / "coco_karpathy_test.json"),
                                           aro_tagger="nltk", diagnostics=False), model="colours")
