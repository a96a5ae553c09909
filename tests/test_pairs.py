"""The pairs layout: edited images as rows of their own, positive with the caption their edit describes
(`lace.train.pairs`, `lace.losses.pair_loss`), through the one trainer."""

import json

import pytest
import torch
import torch.nn.functional as F

from lace.concepts.vocabulary import vocabulary_from_dict
from lace.config import with_changes
from lace.edits.captions import RuleNegatives
from lace.edits.records import EDIT_KINDS, EditRecords
from lace.errors import LaceInputError
from lace.experiment.variants import variant_config
from lace.local import LocalEditConfig
from lace.local.editor import slot_changes
from lace.losses import pair_loss
from lace.train import TrainConfig, train
from lace.train.config import train_config
from lace.train.pairs import EditedImages, describe_slots, pair_rows, record_changes
from tests.distributed_support import assert_same_weights, train_in_two_processes

VOCABULARY = {"objects": ["cube", "ball", "cone"], "attributes": {"colour": ["red", "blue", "green"]},
              "relations": ["left of"]}


@pytest.fixture(scope="module")
def rules():
    return RuleNegatives(vocabulary_from_dict(VOCABULARY))


@pytest.fixture(scope="module")
def world(shapes_world):
    """The session's 48-scene shapes world (tests/conftest.py), shared with the other files that train on it."""
    return shapes_world


def test_the_caption_of_a_swap_exchanges_both_words_and_of_a_transplant_replaces_one(rules):
    caption = "A red cube left of a blue ball"
    assert rules.describe(caption, {"red": "blue", "blue": "red"}) == "A blue cube left of a red ball"
    assert rules.describe(caption, {"red": "green"}) == "A green cube left of a blue ball"
    assert rules.describe(caption, {"cube": "cone"}) == "A red cone left of a blue ball"


@pytest.mark.parametrize("caption, changes", [
    ("a red cube left of a ball", {"red": "blue", "blue": "red"}),  # blue is not named: no caption for the swap
    ("a red cube and a red ball", {"red": "green"}),  # named twice: which object changed is not said
    ("a red cube left of a green ball", {"red": "green"}),  # green would be named twice
    ("a cube left of a ball", {"red": "green"}),
    ("a red cube", {}),
])
def test_an_edit_the_caption_cannot_describe_has_no_caption(rules, caption, changes):
    assert rules.describe(caption, changes) is None


def test_slot_changes_name_the_swapped_and_the_transplanted_concepts():
    names = ["red", "blue", "green"]
    changes = torch.tensor([[[0, 1], [0, 2]], [[2, 1], [1, 0]]])  # (B=2, M=2, 2)
    assert slot_changes(["swap", "transplant"], changes, names) == [
        [{"red": "blue", "blue": "red"}, {"red": "green"}],
        [{"green": "blue", "blue": "green"}, {"blue": "red"}]]


def test_the_pooled_editors_records_become_changes_and_attenuate_has_none():
    kinds = torch.tensor([[EDIT_KINDS.index("swap"), EDIT_KINDS.index("attenuate"), EDIT_KINDS.index("rebind"), -1]])
    sources, targets = torch.tensor([[0, 1, 0, 0]]), torch.tensor([[2, -1, 1, -1]])
    zeros = torch.zeros(1, 4)
    records = EditRecords(kinds, sources, targets, zeros, zeros, zeros, zeros, zeros, zeros.bool(), zeros.bool())
    assert record_changes(records, ["red", "blue", "green"]) == [
        [{"red": "green"}, None, {"red": "blue", "blue": "red"}, None]]


def test_a_pair_rows_positive_is_the_caption_its_edit_describes_and_others_are_skipped(rules):
    captions = ["a red cube left of a blue ball", "a green cone", "a blue ball left of a green cube"]
    changes = [[{"red": "blue", "blue": "red"}, {"red": "green"}],
               [{"green": "blue", "blue": "green"}, None],  # "blue" is not named; an attenuate has no caption
               [{"blue": "red"}, {"blue": "green", "green": "blue"}]]
    described = describe_slots(rules, captions, changes)
    assert described == [["a blue cube left of a red ball", "a green cube left of a blue ball"], [None, None],
                         ["a red ball left of a green cube", "a green ball left of a blue cube"]]
    images = F.normalize(torch.randn(3, 2, 4), dim=-1)
    made = torch.tensor([[True, True], [True, True], [True, False]])  # the edit itself failed in row 2, slot 1
    encoded = []

    def encode(texts):
        encoded.append(list(texts))
        return F.normalize(torch.randn(len(texts), 4), dim=-1)

    rows = pair_rows([EditedImages(images, made, described)], encode)
    assert encoded == [["a blue cube left of a red ball", "a green cube left of a blue ball",
                        "a red ball left of a green cube"]]  # one text pass, valid rows only, in row order
    assert rows.valid.tolist() == [[True, True], [False, False], [True, False]]
    assert torch.equal(rows.images, images)
    assert (rows.captions[~rows.valid] == 0).all() and (rows.captions[rows.valid].norm(dim=-1) > 0.99).all()


def _by_hand(images, captions, originals, valid, scale, real_images=None):
    keep = valid.nonzero().squeeze(1).tolist()
    total = 0.0
    for k in keep:
        i2t = [scale * images[k] @ captions[g] for g in keep] + [scale * images[k] @ originals[k]]
        t2i = [scale * captions[k] @ images[g] for g in keep]
        if real_images is not None:
            t2i.append(scale * captions[k] @ real_images[k])
        own = keep.index(k)
        total += 0.5 * (-torch.log_softmax(torch.stack(i2t), 0)[own] - torch.log_softmax(torch.stack(t2i), 0)[own])
    return total / len(keep)


def test_pair_loss_is_negclip_of_the_edited_pairs_over_valid_rows_only():
    torch.manual_seed(0)
    images, captions, originals = (F.normalize(torch.randn(5, 8), dim=-1) for _ in range(3))
    valid = torch.tensor([True, False, True, True, False])
    scale = torch.tensor(7.0)
    loss = pair_loss(images, captions, originals, valid, scale)
    torch.testing.assert_close(loss, _by_hand(images, captions, originals, valid, scale))
    # invalid rows may hold anything: they are neither rows nor columns
    garbage = captions.clone()
    garbage[~valid] = float("nan")
    torch.testing.assert_close(pair_loss(images, garbage, originals, valid, scale), loss)
    assert pair_loss(images, captions, originals, torch.zeros(5, dtype=torch.bool), scale) == 0
    real = F.normalize(torch.randn(5, 8), dim=-1)
    with_real = pair_loss(images, captions, originals, valid, scale, real_images=real)
    torch.testing.assert_close(with_real, _by_hand(images, captions, originals, valid, scale, real))
    assert with_real > loss


def test_the_sigmoid_pair_loss_has_one_term_per_pair_and_one_for_the_real_caption():
    torch.manual_seed(1)
    images, captions, originals = (F.normalize(torch.randn(4, 6), dim=-1) for _ in range(3))
    valid = torch.tensor([True, True, False, True])
    scale, bias = torch.tensor(5.0), torch.tensor(-2.0)
    keep = [0, 1, 3]
    total = 0.0
    for k in keep:
        for g in keep:
            z = 1.0 if g == k else -1.0
            total += -F.logsigmoid(z * (scale * images[k] @ captions[g] + bias))
        total += -F.logsigmoid(-(scale * images[k] @ originals[k] + bias))
    torch.testing.assert_close(pair_loss(images, captions, originals, valid, scale, logit_bias=bias), total / 3)


def _pairs_config(world, tmp_path, name="LACE-local pairs + column", **changes) -> TrainConfig:
    return with_changes(variant_config(train_config(
        model="lace-micro-32", data=str(world / "karpathy_coco.json"), output=str(tmp_path / "one"), steps=3,
        batch_size=8, lr=1e-3, warmup_steps=1, checkpoint_every=0, log_every=1, device="cpu",
        vocabulary=str(world / "vocabulary.yaml"), local=LocalEditConfig(layer="block1", locate_layer="block0",
                                                                         fit_images=24)), name), {**changes})


@pytest.mark.slow
def test_the_edited_rows_weight_scales_only_their_own_terms(world, tmp_path):
    # Pairs without columns at weight 0 is the plain run: the rows' term is the only thing the switch adds.
    zero = train(_pairs_config(world, tmp_path, "LACE-local pairs", edited_rows_weight=0.0), progress=False)
    plain = train(_pairs_config(world, tmp_path, "plain", output=str(tmp_path / "plain")), progress=False)
    assert_same_weights(zero.model.state_dict(), plain.model.state_dict())
    weighted = train(_pairs_config(world, tmp_path, "LACE-local pairs", output=str(tmp_path / "two")),
                     progress=False)
    assert weighted.last_metrics["pair_rows_valid"] > 0
    assert weighted.last_metrics["loss"] > weighted.last_metrics["plain_loss"]
    assert any(not torch.allclose(weighted.model.state_dict()[k], v, atol=1e-4)
               for k, v in plain.model.state_dict().items())


@pytest.mark.slow
def test_image_side_pairs_leave_the_text_tower_to_the_plain_loss(world, tmp_path):
    # One step: the text tower's update is its gradient's alone, so it equals plain's when the rows' term gives it
    # none; the image tower learns from the rows either way.
    def one_step(name, output, **changes):
        return train(_pairs_config(world, tmp_path, name, steps=1, output=str(tmp_path / output), **changes),
                     progress=False).model.state_dict()

    plain = one_step("plain", "plain")
    image_side = one_step("LACE-local pairs", "image-side", edited_rows_train_text=False)
    both = one_step("LACE-local pairs", "both")
    text = [k for k in plain if not k.startswith("model.visual") and k != "model.logit_scale"]
    visual = [k for k in plain if k.startswith("model.visual")]
    assert text and visual
    assert_same_weights({k: image_side[k] for k in text}, {k: plain[k] for k in text})
    assert any(not torch.equal(both[k], plain[k]) for k in text)
    assert any(not torch.equal(image_side[k], plain[k]) for k in visual)


@pytest.mark.slow
def test_pairs_one_process_and_two_processes_agree(world, tmp_path):
    config = _pairs_config(world, tmp_path)
    single = train(config, progress=False)
    metrics = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["pair_rows_valid"] > 0 and m["image_negatives_valid_rows"] > 0 for m in metrics)
    assert all(0 <= m["provenance_edited_caption_prefers_edited_image"] <= 1 for m in metrics)
    assert_same_weights(train_in_two_processes(config, tmp_path / "two"), single.model.state_dict())


@pytest.mark.parametrize("changes, field", [
    ({"edited_image_rows": True}, "edited_image_rows"),  # no image-side source
    ({"local_image_negatives": True, "edited_image_columns": False}, "edited_image_columns"),
    ({"local_image_negatives": True, "edited_image_rows": True, "vocabulary": None}, "vocabulary"),
    ({"local_image_negatives": True, "edited_image_rows": True, "edited_rows_weight": -1.0}, "edited_rows_weight"),
])
def test_impossible_pair_settings_are_refused_naming_the_field(changes, field):
    with pytest.raises(LaceInputError, match=field):
        with_changes(train_config(vocabulary="world"), {**changes}).validate()


def test_a_collision_is_a_valid_edits_caption_that_is_also_a_rule_made_negative_of_its_row():
    from lace.train.negatives import rule_collisions

    captions = [["a blue cube left of a red ball", None], ["a green cone", "a red cone"], ["a red ball", None]]
    valid = torch.tensor([[True, False], [False, True], [False, False]])
    edited = [EditedImages(torch.zeros(3, 2, 4), valid, captions)]
    rules = [["a blue cube left of a red ball"], ["a green cone"], ["a red ball"]]
    # row 0 collides; row 1's matching caption belongs to an edit that was not made; row 2 has no valid edit
    assert rule_collisions(edited, rules) == 1
