"""Tower tops on cached intermediates: equal to the full towers, gradient from local edits,
the float16 cache, and checkpoints that `load_encoder` reads."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from transformers import BertConfig, BertModel

from lace.data import read_csv
from lace.encoders import load_encoder
from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
from lace.encoders.towers.text_tower import mean_pool
from lace.encoders.towers.top import (
    IMAGE_CUT_SHAPE,
    ImageTop,
    TextTop,
    TowersTop,
    image_below_top,
    save_top_checkpoint,
    text_below_top,
)
from lace.encoders.towers.top_features import (
    TokenStates,
    cached_image_top_features,
    cached_text_top_features,
    encode_captions,
)
from lace.study.config import HeadsTraining
from lace.study.flickr8k_top import TopSplit, embed_top_split
from lace.study.heads import train_summary
from lace.train.config import train_config
from lace.train.data import TopPairs
from tests.conftest import randomise_batch_norms


@pytest.fixture(scope="module")
def tiny_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("test_efficientnet", pretrained=False, num_classes=0)
    randomise_batch_norms(model)
    return model.eval()


@pytest.fixture(scope="module")
def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    return BertModel(config, add_pooling_layer=False).eval()


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.tensor([[2, 7, 9, 11, 3], [2, 5, 3, 0, 0], [2, 8, 8, 3, 0]])
    return tokens, (tokens != 0).long()


def test_image_top_on_the_cut_map_equals_the_whole_network(tiny_cnn):
    pixels = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        whole = tiny_cnn.forward_head(tiny_cnn.forward_features(pixels), pre_logits=True)
        for stages in (1, 2):
            top = ImageTop(tiny_cnn, top_stages=stages)
            torch.testing.assert_close(top(image_below_top(tiny_cnn, pixels, stages)), whole)


def test_text_top_on_cached_token_states_equals_the_whole_model(tiny_bert):
    tokens, mask = _tokens()
    with torch.no_grad():
        whole = mean_pool(tiny_bert(input_ids=tokens, attention_mask=mask).last_hidden_state, mask)
        for layers in (1, 2):
            states = text_below_top(tiny_bert, tokens, mask, layers)
            torch.testing.assert_close(TextTop(tiny_bert, layers)(states, mask), whole)
            # padding states never matter: garbage there leaves the pooled features unchanged
            garbage = states + (1 - mask).unsqueeze(-1) * 5.0
            torch.testing.assert_close(TextTop(tiny_bert, layers)(garbage, mask), whole)


def test_an_edit_at_some_positions_reaches_the_top_layers_and_changes_the_pooled_output(tiny_cnn):
    top = ImageTop(tiny_cnn, top_stages=1)
    cached = image_below_top(tiny_cnn, torch.randn(2, 3, 64, 64)).detach()
    where = torch.zeros_like(cached[:, :1])
    where[0, :, 0, :1] = 1.0  # one position of the first image
    step = torch.zeros(1, cached.shape[1], 1, 1, requires_grad=True)
    pooled = top(cached + where * step)
    pooled.square().sum().backward()
    assert step.grad.abs().sum() > 0
    assert top.stages[0][0].conv_pw.weight.grad.abs().sum() > 0
    assert top.conv_head.weight.grad.abs().sum() > 0
    with torch.no_grad():
        edited = top(cached + where * torch.randn_like(step))
        torch.testing.assert_close(edited[1], top(cached)[1])  # the other image is untouched
        assert (edited[0] - top(cached)[0]).abs().max() > 1e-4


def test_an_edit_at_some_tokens_reaches_the_top_layers_and_never_leaks_to_padding(tiny_bert):
    top = TextTop(tiny_bert, 2)
    top.zero_grad()
    tokens, mask = _tokens()
    states = text_below_top(tiny_bert, tokens, mask, 2).detach().requires_grad_(True)
    top(states, mask).square().sum().backward()
    assert states.grad[0, 1:3].abs().sum() > 0  # real tokens receive gradient
    assert states.grad[1, 3:].abs().sum() == 0  # padding does not
    assert top.layers[0].attention.self.query.weight.grad.abs().sum() > 0
    assert top.layers[-1].output.dense.weight.grad.abs().sum() > 0


def test_token_states_batch_pads_ragged_rows_with_their_masks():
    states = np.arange(12, dtype=np.float16).reshape(6, 2)
    bank = TokenStates(states=states, offsets=np.array([0, 1, 4, 6]))
    padded, mask = bank.batch([1, 0])
    assert padded.shape == (2, 3, 2) and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    torch.testing.assert_close(padded[0], torch.tensor(states[1:4], dtype=torch.float32))
    assert padded[1, 1:].abs().sum() == 0


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    (folder / "images").mkdir()
    lines = ["image,caption"]
    for colour in ("red", "green", "blue"):
        Image.new("RGB", (120, 90), colour).save(folder / "images" / f"{colour}.jpg")
        lines += [f"{colour}.jpg,a plain {colour} picture of a wall", f"{colour}.jpg,{colour}"]
    (folder / "captions.csv").write_text("\n".join(lines) + "\n")
    return read_csv(folder / "captions.csv", image_root=folder / "images")


@pytest.mark.slow
def test_cached_intermediates_train_tops_that_load_encoder_reads_back(photos, tmp_path):
    torch.manual_seed(0)
    encoder = TowersDualEncoder(TowersConfig(embed_dim=16, head_hidden_dim=32, head_dropout=0.1))
    maps = cached_image_top_features(encoder, photos, tmp_path, batch_size=2, num_workers=0)
    tokens = cached_text_top_features(encoder, photos.captions, tmp_path, batch_size=4)
    assert maps.shape == (3, *IMAGE_CUT_SHAPE) and maps.dtype == np.float16
    assert len(tokens) == 6 and tokens.offsets[-1] == tokens.states.shape[0]
    again = cached_image_top_features(encoder, photos, tmp_path)
    assert again.filename == maps.filename  # read back, not recomputed

    top = TowersTop(encoder)
    split = TopSplit("train", maps, tokens, np.arange(6), np.asarray(photos.caption_image_index))
    images_before, texts_before = embed_top_split(top, split)
    with torch.no_grad():  # the float16 cache gives the tower's own embeddings
        pixels = torch.stack([encoder.preprocess(photos.load_image(i)) for i in range(3)])
        torch.testing.assert_close(images_before, encoder.encode_images(pixels), atol=2e-3, rtol=0)
        torch.testing.assert_close(texts_before, encoder.encode_texts(photos.captions), atol=2e-3, rtol=0)

    with torch.no_grad():  # length-sorted chunks give what one padded batch gives
        rows = np.array([5, 0, 3, 1])
        torch.testing.assert_close(encode_captions(top, tokens, rows, chunk=2), top.encode_text_states(*tokens.batch(rows)))

    block = encoder.image_tower.blocks[-1].conv_pwl.weight
    layer = encoder.text_tower.layers[-2].output.dense.weight
    lower = encoder.text_tower.layers[-3].output.dense.weight
    before = [block.detach().clone(), layer.detach().clone(), lower.detach().clone()]
    config = train_config(model="lace-towers", lr=1e-3, pretrained_lr_scale=0.1, epochs=3, batch_size=3,
                         warmup_steps=1, grad_clip_norm=None, precision="fp32", device="cpu", checkpoint_every=0,
                         log_every=1)
    pairs = TopPairs(split.image_maps, split.token_states, split.caption_rows, split.caption_image_index)
    summary = train_summary(config, False, dataset=pairs, encoder=top)
    assert summary["steps"] == 3
    assert not torch.equal(block, before[0]) and not torch.equal(layer, before[1])
    assert torch.equal(lower, before[2])  # below the cut nothing moves

    path = save_top_checkpoint(top, tmp_path / "top.safetensors")
    loaded = load_encoder("lace-towers", pretrained=str(path)).eval()
    assert loaded.unlocked_blocks == (1, 2)
    images_after, texts_after = embed_top_split(top, split)
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode_images(pixels), images_after, atol=2e-3, rtol=0)
        torch.testing.assert_close(loaded.encode_texts(photos.captions), texts_after, atol=2e-3, rtol=0)


@pytest.mark.slow
def test_the_base_trains_only_heads_on_a_seeded_share_of_the_training_images(tmp_path):
    from lace.study.flickr8k_top import base_images, heads_base, top_splits
    from tests.test_flickr8k import make_flickr8k

    root = make_flickr8k(tmp_path / "flickr8k", n_images=14, captions_per_image=2)
    base_rows, rest_rows = base_images(10, 0.5)
    assert len(base_rows) == 5 and sorted([*base_rows, *rest_rows]) == list(range(10))
    assert np.array_equal(base_images(10, 0.5)[0], base_rows)  # seeded
    top = TowersTop(TowersDualEncoder(TowersConfig(embed_dim=8, head_hidden_dim=16)).eval())
    splits = top_splits(str(root), str(tmp_path / "cache"), top.encoder, progress=False)
    pretrained = {name: tensor.clone() for name, tensor in top.encoder.state_dict().items()}
    heads = HeadsTraining(hidden_dim=16, dropout=0.1, embed_dim=8, epochs=2, batch_size=4, warmup_steps=1)
    summary = heads_base(top, splits["train"].subset(np.arange(min(5, len(splits["train"].image_maps))), "base"), heads)
    assert summary["steps"] >= 1
    state = top.encoder.state_dict()
    for name in ("image_tower.model.blocks.6.0.conv_pwl.weight", "text_tower.model.encoder.layer.5.output.dense.weight"):
        assert torch.equal(state[name], pretrained[name])  # a heads-only base: the tops stay pretrained
    assert top.encoder.unlocked_blocks == top.unlocked_blocks  # the tops unlock again for the fine-tunes
