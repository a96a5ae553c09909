"""The pairs layout on cached tower-top inputs: each LACE-local edit of the cached maps a row of its own, positive with
the caption its edit describes, whose token states are made through the text tower below the cut."""

from __future__ import annotations

import copy
import json
from functools import partial

import numpy as np
import pytest
import torch

from lace.config import config_to_dict, with_changes
from lace.encoders.towers import fresh_token_states
from lace.encoders.towers.model import TowersDualEncoder
from lace.encoders.towers.top import TowersTop
from lace.encoders.towers.top_features import encode_captions
from lace.errors import LaceInputError
from lace.experiment.stages import stage_key
from lace.experiment.variants import variant_config
from lace.study.config import TOP_ARMS, TopsStudyConfig
from lace.study.flickr8k_top_arms import arm_train_config
from lace.train import train
from lace.train.data import TopPairs
from lace.train.pairs import pair_rows
from tests.test_local_maps import COLOURS, coloured_maps
from tests.towers_support import (
    CUT_CHANNELS,
    CUT_GRID,
    TINY_FINETUNE,
    make_coloured_flickr8k,
    token_states,
    top_trainer,
)

PAIRS_ARMS = ("LACE-local pairs", "LACE-local pairs + column", "LACE-local pairs + caption negatives",
              "LACE-local pairs + real-image negative")
COLUMN_ARMS = ("LACE-local pairs + column", "LACE-local pairs + real-image negative")
"""The pairs arms whose edits are also negative columns of the real caption."""
N_IMAGES = 8


def first_caption(first: str, second: str) -> str:
    return f"a {first} dog next to a {second} ball"


def second_caption(first: str, second: str) -> str:
    return f"a {second} ball and a {first} dog"


def image_colours() -> list[tuple[str, str]]:
    """The two colours of each of the N_IMAGES cached maps (`coloured_maps`' objects 0 and 1)."""
    _, colours, _ = coloured_maps(N_IMAGES, seed=2, channels=CUT_CHANNELS, grid=CUT_GRID)
    return [(COLOURS[a], COLOURS[b]) for a, b in colours.tolist()]


class SpyStates:
    """A state encoder that records the captions it is asked for."""

    def __init__(self, encoder: TowersDualEncoder):
        self.encoder, self.asked = encoder, []

    def __call__(self, captions: list[str]):
        self.asked.append(list(captions))
        return fresh_token_states(self.encoder, captions)


def coloured_pairs(state_encoder, **changes) -> TopPairs:
    """N_IMAGES cached maps of two coloured objects, each with two captions naming both colours (token-state rows 2i
    and 2i + 1 are image i's); the rule-made negative of caption 2i is caption 2i with its colours exchanged, which is
    what the binding swap of image i describes, and caption 2i + 1 has none."""
    maps, _, _ = coloured_maps(N_IMAGES, seed=2, channels=CUT_CHANNELS, grid=CUT_GRID)
    colours = image_colours()
    texts = [make(*pair) for pair in colours for make in (first_caption, second_caption)]
    negative_of_caption = np.full(2 * N_IMAGES, -1)
    negative_of_caption[::2] = np.arange(N_IMAGES)
    inputs = {"negative_states": token_states(N_IMAGES, seed=1), "negative_of_caption": negative_of_caption,
              "caption_texts": texts, "negative_texts": [first_caption(b, a) for a, b in colours],
              "state_encoder": state_encoder, **changes}
    return TopPairs(maps.numpy().astype(np.float16), token_states(2 * N_IMAGES), np.arange(2 * N_IMAGES),
                    np.repeat(np.arange(N_IMAGES), 2), **inputs)


def train_arm(top: TowersTop, arm: str, tmp_path, map_editor, texts: bool = True):
    """Train a copy of `top` on `coloured_pairs` (with its own state encoder, or with no texts at all)."""
    model = copy.deepcopy(top)
    given = {} if texts else {"caption_texts": None, "negative_texts": None}
    pairs = coloured_pairs(partial(fresh_token_states, model.encoder) if texts else None, **given)
    config = variant_config(with_changes(TINY_FINETUNE.train_config(), {"model": "lace-towers", "vocabulary": "natural", "output": str(tmp_path / f"{arm}-{texts}".replace(" ", "-")), "checkpoint_every": 0, "log_every": 1}), arm)
    result = train(config, dataset=pairs, progress=False, encoder=model, local_editor=map_editor)
    return model, [json.loads(line) for line in result.metrics_path.read_text().splitlines()]


def test_the_rows_positives_are_the_captions_their_edits_describe_through_the_text_top(top, map_editor, tmp_path):
    spy = SpyStates(top.encoder)
    pairs = coloured_pairs(spy)
    trainer = top_trainer(top, "LACE-local pairs", tmp_path, pairs, local_editor=map_editor)
    batch = pairs.collate([pairs[sample] for sample in trainer.order.micro_batch(0)])
    kinds = map_editor.edit(torch.from_numpy(pairs.image_maps[:1].astype(np.float32)), 2).kinds
    assert kinds == ["swap", "transplant"]
    (rows_source,) = [source for source in trainer.sources if source.name == "pairs rows"]
    with torch.no_grad():
        micro, negatives = trainer.embed(batch, 0)
        rows = pair_rows(negatives.edited, rows_source.encode_texts)
    V = micro.V
    assert negatives.image_negatives is None  # the pairs alone: no columns of the real caption
    colours = image_colours()
    expected = []
    for b, caption_row in enumerate(batch.caption_rows):
        first, second = colours[batch.indices[b]]
        make = first_caption if caption_row % 2 == 0 else second_caption
        assert pairs.caption_texts[caption_row] == make(first, second)
        for m, kind in enumerate(kinds):
            if not rows.valid[b, m]:
                continue
            text = negatives.edited[0].captions[b][m]
            if kind == "swap":  # both colours exchanged
                assert text == make(second, first)
            else:  # one colour replaced by one the image does not show
                others = [c for c in COLOURS if c not in (first, second)]
                assert text in [make(c, second) for c in others] + [make(first, c) for c in others]
            expected.append(text)
    assert expected and rows.valid[:, 0].any()
    assert spy.asked == [expected]  # one pass below the cut, over the valid rows' captions only, in row order
    with torch.no_grad():
        reference = top.encode_text_states(*fresh_token_states(top.encoder, expected))
        torch.testing.assert_close(rows.captions[rows.valid], reference)
        torch.testing.assert_close(V, encode_captions(top, pairs.token_states, batch.caption_rows))


def test_fresh_token_states_are_the_cached_states_of_the_same_captions(top, tmp_path):
    from lace.encoders.towers.top_features import cached_text_top_features

    captions = ["a red dog next to a blue ball", "a dog", "two yellow balls on the grass near a green car"]
    cached = cached_text_top_features(top.encoder, captions, tmp_path)
    states, mask = fresh_token_states(top.encoder, captions)
    padded, cached_mask = cached.batch(range(len(captions)))
    assert torch.equal(mask, cached_mask)
    torch.testing.assert_close(states, padded, atol=2e-3, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(top.encode_text_states(states, mask), encode_captions(top, cached, [0, 1, 2]),
                                   atol=1e-3, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("arm", PAIRS_ARMS)
def test_a_pairs_arm_trains_the_tops_on_its_rows_and_logs_them(top, map_editor, tmp_path, arm):
    model, metrics = train_arm(top, arm, tmp_path, map_editor)
    assert len(metrics) == 2  # 8 images, one caption each per epoch, 4 a batch
    for step in metrics:
        assert 0 < step["pair_rows_valid"] <= 1 and step["loss"] > step["plain_loss"]
        assert 0 <= step["provenance_edited_caption_prefers_edited_image"] <= 1
        assert (step["image_negatives_valid_rows"] > 0) == (arm in COLUMN_ARMS)
        assert ("rule_collision_rows" in step) == (arm == "LACE-local pairs + caption negatives")
    plain, _ = train_arm(top, "plain", tmp_path, map_editor)
    layer = "encoder.text_tower.model.encoder.layer.5.output.dense.weight"  # the text top's last layer
    assert not torch.equal(dict(model.named_parameters())[layer], dict(plain.named_parameters())[layer])


def test_a_described_caption_that_is_also_the_rows_rule_made_negative_is_a_collision(top, map_editor, tmp_path):
    pairs = coloured_pairs(partial(fresh_token_states, top.encoder))
    trainer = top_trainer(top, "LACE-local pairs + caption negatives", tmp_path, pairs, local_editor=map_editor)
    batch = pairs.collate([pairs[sample] for sample in trainer.order.micro_batch(0)])
    with torch.no_grad():
        _, negatives = trainer.embed(batch, 0)
    swapped = negatives.edited[0].valid[:, 0] & torch.tensor([row[0] is not None for row in negatives.edited[0].captions])
    # caption 2i's rule-made negative is its colours exchanged, what a valid swap describes; caption 2i + 1 has none
    expected = int((swapped & torch.from_numpy(batch.caption_rows % 2 == 0)).sum())
    assert expected > 0 and negatives.rule_collisions == expected


@pytest.mark.slow
def test_a_columns_arm_trains_the_same_with_the_texts_and_logs_its_provenance_from_them(top, map_editor, tmp_path):
    with_texts, logged = train_arm(top, "LACE-local", tmp_path, map_editor)
    without, plain_logged = train_arm(top, "LACE-local", tmp_path, map_editor, texts=False)
    for key, value in with_texts.state_dict().items():
        assert torch.equal(value, without.state_dict()[key]), key  # the figures' text pass leaves the run as it was
    assert all(0 <= step["provenance_edited_image_prefers_edited_caption"] <= 1 for step in logged)
    assert not any(key.startswith("provenance_") for step in plain_logged for key in step)
    assert "pair_rows_valid" not in logged[-1]


@pytest.mark.parametrize("arm, dropped, field", [
    ("LACE-local pairs", {"caption_texts": None}, "caption_texts"),
    ("LACE-local pairs + column", {"state_encoder": None}, "state_encoder"),
    ("LACE-local pairs + caption negatives", {"negative_texts": None}, "negative_texts"),
])
def test_a_pairs_arm_without_what_it_describes_with_is_refused_naming_the_field(top, map_editor, tmp_path, arm,
                                                                                dropped, field):
    given = {"state_encoder": partial(fresh_token_states, top.encoder), **dropped}
    with pytest.raises(LaceInputError, match="edited_image_rows") as refused:
        top_trainer(top, arm, tmp_path, coloured_pairs(**given), local_editor=map_editor)
    assert field in str(refused.value)


def test_caption_texts_of_another_length_are_refused_naming_the_field():
    with pytest.raises(LaceInputError, match="caption_texts"):
        coloured_pairs(None, caption_texts=["a red dog"])


def test_the_tops_study_offers_the_pairs_arms_and_sets_their_switches(tmp_path, monkeypatch):
    import lace.study.flickr8k_top_arms as arms_module
    from lace.cli import main

    assert set(PAIRS_ARMS) <= set(TOP_ARMS)
    ran = []
    monkeypatch.setattr(arms_module, "run_tops_study", lambda config: ran.append(config) or {"split": config.split})
    data = make_coloured_flickr8k(tmp_path / "flickr8k", 4)
    assert main(["study", "flickr8k", "--tops", "--data", str(data), "--out", str(tmp_path / "study"),
                 "--arms", ",".join(PAIRS_ARMS), "--no-progress"]) == 0
    (config,) = ran
    assert config.arms == PAIRS_ARMS and config.validate() is config
    for arm in PAIRS_ARMS:
        made = arm_train_config(config, arm, seed=0, n_images=10, output=tmp_path)
        assert made.arm.edited_image_rows and made.arm.local_image_negatives
        assert made.arm.edited_image_columns == (arm in COLUMN_ARMS)
        assert made.arm.edited_rows_real_image_negative == arm.endswith("real-image negative")
    with pytest.raises(SystemExit):  # an arm's own switch, never a study-wide flag
        main(["study", "flickr8k", "--tops", "--data", str(data), "--out", str(tmp_path / "x"),
              "--finetune-edited-image-rows"])
    study = TopsStudyConfig(data="d", out="o")
    keys = {arm: stage_key(config_to_dict(arm_train_config(study, arm, 0, 10, tmp_path)))  # as run_tops_study keys them
            for arm in ("LACE-local", *PAIRS_ARMS)}
    assert len(set(keys.values())) == len(keys)  # each arm's training stage has a key of its own
