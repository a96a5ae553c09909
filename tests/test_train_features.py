"""The trainer's path over cached tower features: heads of a `lace-towers` model, no towers run."""

import numpy as np
import pytest
import torch

from lace.encoders.towers import image_tower, text_tower
from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
from lace.errors import LaceInputError
from lace.train import train
from lace.train.config import train_config
from lace.train.data import FeaturePairs


def feature_pairs(with_negatives: bool) -> FeaturePairs:
    generator = torch.Generator().manual_seed(0)
    n_images, per_image = 12, 2
    images = torch.randn(n_images, image_tower.FEATURE_DIM, generator=generator)
    texts = torch.randn(n_images * per_image, text_tower.FEATURE_DIM, generator=generator)
    index = np.repeat(np.arange(n_images), per_image)
    if not with_negatives:
        return FeaturePairs(images, texts, index)
    valid = torch.arange(len(index)) % 2 == 0
    return FeaturePairs(images, texts, index, torch.randn(len(index), text_tower.FEATURE_DIM, generator=generator), valid)


def heads_run(tmp_path, name: str, pairs: FeaturePairs, **changes):
    torch.manual_seed(1)
    encoder = TowersDualEncoder(TowersConfig(embed_dim=8, head_hidden_dim=16, head_dropout=0.1))
    config = train_config(model="lace-towers", output=str(tmp_path / name), device="cpu", seed=3, lr=1e-2, steps=6,
                         batch_size=4, warmup_steps=1, log_every=1, vocabulary="natural", **changes)
    return encoder, train(config, dataset=pairs, progress=False, encoder=encoder)


@pytest.mark.slow
def test_heads_learn_from_cached_features_and_the_same_seed_repeats(tmp_path):
    pairs = feature_pairs(with_negatives=False)
    before = TowersDualEncoder(TowersConfig(embed_dim=8, head_hidden_dim=16, head_dropout=0.1)).state_dict()
    first, result = heads_run(tmp_path, "a", pairs)
    second, _ = heads_run(tmp_path, "b", pairs)
    assert result.steps == 6 and result.last_metrics["caption_negatives_valid_rows"] == 0.0
    head = "image_head." + next(k for k in first.image_head.state_dict())
    assert not torch.equal(first.state_dict()[head], before[head])
    for key, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[key]), key


def test_cached_rule_made_captions_are_negatives_where_valid(tmp_path):
    _, result = heads_run(tmp_path, "neg", feature_pairs(with_negatives=True), caption_negatives=True)
    lines = result.metrics_path.read_text().splitlines()
    assert len(lines) == 6
    # Half the captions have a valid rule-made negative; every batch draws some of each.
    assert 0.0 < result.last_metrics["caption_negatives_valid_rows"] < 1.0


def test_caption_negatives_without_their_features_are_refused(tmp_path):
    with pytest.raises(LaceInputError, match="caption_negatives"):
        heads_run(tmp_path, "refused", feature_pairs(with_negatives=False), caption_negatives=True)


def test_the_pairs_layout_is_refused_on_pooled_features_naming_the_field(tmp_path):
    # pooled features have no token states to write an edit's caption into
    with pytest.raises(LaceInputError, match="edited_image_rows.*need pixels or tokens"):
        heads_run(tmp_path, "pairs", feature_pairs(with_negatives=False), counterfactual_images=True,
                  edited_image_rows=True)
