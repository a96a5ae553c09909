"""lace-towers: weight loading, tower sanity, the DualEncoder contract, regimes, checkpoints."""

from __future__ import annotations

import pytest
import timm
import torch
from PIL import Image
from skimage import data as skimage_data

from lace.encoders import load_encoder
from lace.encoders.towers import image_tower, save_heads_checkpoint
from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
from lace.errors import LaceInputError
from tests.conftest import tiny_world

IMAGENET_CATS = {281, 282, 285}  # tabby, tiger cat, Egyptian cat


@pytest.fixture(scope="module")
def encoder() -> TowersDualEncoder:
    torch.manual_seed(0)
    return load_encoder("lace-towers").eval()


@pytest.fixture(scope="module")
def source_weights() -> dict[str, torch.Tensor]:
    return torch.load(image_tower.weights_path(), map_location="cpu", weights_only=True)


def test_key_map_places_every_source_tensor_on_a_timm_tensor_of_the_same_shape(source_weights):
    model = timm.create_model("efficientnet_lite0", pretrained=False, **image_tower.ARCHITECTURE_OPTIONS)
    target = model.state_dict()
    mapping = image_tower.lite0_key_map(list(source_weights), [len(stage) for stage in model.blocks])
    assert set(mapping) == set(source_weights)
    assert sorted(mapping.values()) == sorted(target)  # one-to-one onto every parameter and buffer
    for source_key, timm_key in mapping.items():
        assert source_weights[source_key].shape == target[timm_key].shape, (source_key, timm_key)
    assert mapping["_blocks.0._project_conv.weight"] == "blocks.0.0.conv_pw.weight"
    assert mapping["_blocks.1._project_conv.weight"] == "blocks.1.0.conv_pwl.weight"
    assert mapping["_blocks.15._expand_conv.weight"] == "blocks.6.0.conv_pw.weight"
    assert mapping["_fc.bias"] == "classifier.bias"


def test_loading_copies_the_source_tensors(source_weights, encoder):
    loaded = encoder.image_tower.model.state_dict()
    torch.testing.assert_close(loaded["blocks.5.3.conv_dw.weight"], source_weights["_blocks.14._depthwise_conv.weight"])
    torch.testing.assert_close(loaded["bn2.running_var"], source_weights["_bn1.running_var"])


def test_key_map_and_loader_fail_loudly(source_weights):
    with pytest.raises(LaceInputError, match="_blocks.0._se_reduce"):
        image_tower.lite0_key_map(["_blocks.0._se_reduce.weight"], [1, 2, 2, 3, 3, 4, 1])
    with pytest.raises(LaceInputError, match="no timm counterpart"):
        image_tower.lite0_key_map(["_head_extra.weight"], [1, 2, 2, 3, 3, 4, 1])
    model = timm.create_model("efficientnet_lite0", pretrained=False, **image_tower.ARCHITECTURE_OPTIONS)
    incomplete = dict(source_weights)
    del incomplete["_conv_head.weight"]
    with pytest.raises(LaceInputError, match="conv_head.weight"):
        image_tower.load_lite0_weights(model, incomplete)
    reshaped = dict(source_weights)
    reshaped["_fc.bias"] = torch.zeros(10)
    with pytest.raises(LaceInputError, match="shape mismatch"):
        image_tower.load_lite0_weights(model, reshaped)


def test_image_tower_labels_a_known_photo_of_a_cat(encoder):
    pixels = encoder.preprocess(Image.fromarray(skimage_data.chelsea())).unsqueeze(0)  # (1, 3, 224, 224)
    assert pixels.shape == (1, 3, 224, 224)
    with torch.no_grad():
        probabilities = encoder.image_tower.classify(pixels.contiguous(memory_format=torch.channels_last)).softmax(-1)[0]
    assert int(probabilities.argmax()) in IMAGENET_CATS
    assert float(probabilities[sorted(IMAGENET_CATS)].sum()) > 0.8
    coffee = encoder.preprocess(Image.fromarray(skimage_data.coffee())).unsqueeze(0)
    with torch.no_grad():
        assert int(encoder.image_tower.classify(coffee).argmax()) == 967  # espresso


def test_text_tower_matches_sentence_transformers_and_ranks_paraphrases_first(encoder):
    texts = ["a dog runs on grass", "a puppy running on a lawn", "a stock market report", "A cat."]
    with torch.no_grad():
        features = torch.nn.functional.normalize(encoder.text_tower_features(encoder.tokenize(texts)), dim=-1)
    similarity = features @ features.T
    assert similarity[0, 1] > similarity[0, 2] + 0.3
    import sentence_transformers  # here: two seconds of import that only this test needs

    from lace.encoders.towers.text_tower import model_folder

    reference = sentence_transformers.SentenceTransformer(str(model_folder()), device="cpu")
    expected = reference.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    torch.testing.assert_close(features, expected.cpu(), atol=1e-5, rtol=1e-4)


def test_encoder_returns_unit_vectors_of_the_shared_dimension(encoder):
    images = [Image.new("RGB", (300, 200), colour) for colour in ("red", "green", "blue")]
    pixels = torch.stack([encoder.preprocess(image) for image in images])
    with torch.no_grad():
        image_embeddings = encoder.encode_images(pixels)
        text_embeddings = encoder.encode_texts(["a red square", "green"])
        U, V, scale = encoder(pixels[:2], encoder.tokenize(["a red square", "green"]))
    assert image_embeddings.shape == (3, 256) and text_embeddings.shape == (2, 256)
    torch.testing.assert_close(image_embeddings.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(text_embeddings.norm(dim=-1), torch.ones(2))
    torch.testing.assert_close(U, image_embeddings[:2])
    torch.testing.assert_close(V, text_embeddings)
    assert float(scale) == pytest.approx(1 / 0.07, rel=1e-5)


def test_cached_feature_path_equals_the_pixel_path(encoder):
    pixels = torch.stack([encoder.preprocess(Image.new("RGB", (224, 224), c)) for c in ("orange", "purple")])
    with torch.no_grad():
        through_pixels = encoder.encode_images(pixels)
        through_features = encoder.head_image(encoder.image_tower_features(pixels))
    torch.testing.assert_close(through_features, through_pixels)


def test_linear_heads_and_config_validation():
    torch.manual_seed(0)
    linear = TowersDualEncoder(TowersConfig(embed_dim=32, head_hidden_dim=0))
    assert len(linear.image_head.layers) == 1 and linear.embed_dim == 32
    assert linear.head_text(torch.randn(4, 384)).shape == (4, 32)
    with pytest.raises(ValueError, match="head_dropout"):
        TowersConfig(head_dropout=1.5)


def test_locked_regime_trains_only_heads_and_scale(encoder):
    trainable = {name for name, p in encoder.named_parameters() if p.requires_grad}
    assert trainable and all(name.startswith(("image_head.", "text_head.", "_logit_scale")) for name in trainable)


def test_unlocking_top_blocks_lets_gradient_reach_them_and_no_lower():
    torch.manual_seed(0)
    model = TowersDualEncoder(TowersConfig(embed_dim=16, head_hidden_dim=0))
    model.unlock_top_blocks(1, 1)
    model.train()
    top_block, lower_block = model.image_tower.blocks[-1], model.image_tower.blocks[-2]
    assert top_block.training and not top_block.bn1.training  # BatchNorm statistics stay frozen
    assert model.text_tower.layers[-1].training and not model.text_tower.layers[-2].training
    pixels = torch.randn(2, 3, 224, 224)
    U, V, _scale = model(pixels, model.tokenize(["a dog", "a cat on a mat"]))
    (U * V).sum().backward()
    assert top_block.conv_pw.weight.grad is not None and top_block.conv_pw.weight.grad.abs().sum() > 0
    assert lower_block.conv_pw.weight.grad is None
    assert model.text_tower.layers[-1].output.dense.weight.grad is not None
    assert model.text_tower.layers[-2].output.dense.weight.grad is None
    with pytest.raises(ValueError, match="n_image"):
        model.unlock_top_blocks(17, 0)


def test_heads_checkpoint_round_trip_through_load_encoder(tmp_path):
    torch.manual_seed(0)
    model = TowersDualEncoder(TowersConfig(embed_dim=24, head_hidden_dim=64, head_dropout=0.1))
    model.unlock_top_blocks(1, 0)
    with torch.no_grad():
        model.logit_scale.fill_(3.0)
        model.image_tower.blocks[-1].conv_pwl.weight.mul_(1.5)  # stands in for a fine-tuned block
    path = save_heads_checkpoint(model, tmp_path / "heads.safetensors")
    loaded = load_encoder("lace-towers", pretrained=str(path)).eval()
    model.eval()
    assert loaded.config == model.config and loaded.unlocked_blocks == (1, 0)
    pixels = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode_images(pixels), model.encode_images(pixels))
        torch.testing.assert_close(loaded.encode_texts(["two dogs"]), model.encode_texts(["two dogs"]))
    assert loaded.logit_scale.item() == 3.0


def test_exported_state_dict_loads_without_metadata(tmp_path, encoder):
    from safetensors.torch import save_file

    path = tmp_path / "export.safetensors"
    save_file(encoder.export_state_dict(), str(path))
    loaded = load_encoder("lace-towers", pretrained=str(path)).eval()
    assert loaded.config.embed_dim == 256 and loaded.config.head_hidden_dim == 2048
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode_texts(["a boat"]), encoder.encode_texts(["a boat"]))


def test_bad_checkpoints_name_the_file(tmp_path):
    with pytest.raises(LaceInputError, match="not found"):
        load_encoder("lace-towers", pretrained=str(tmp_path / "absent.safetensors"))
    other = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(2)}, other)
    with pytest.raises(LaceInputError, match="other.pt: not a lace-towers checkpoint"):
        load_encoder("lace-towers", pretrained=str(other))


def test_lace_eval_scores_a_heads_checkpoint_with_its_own_heads(tmp_path):
    """`lace eval --model lace-towers --pretrained heads.safetensors`, as `lace study flickr8k` saves them."""
    import json
    import math

    from lace.cli import main
    from lace.data import read_dataset
    from lace.eval.diagnostics import GeometryOptions, geometry_diagnostics
    from lace.eval.metrics import retrieval_recall

    world = tiny_world(tmp_path / "world", 24, (0.5, 0.1, 0.3, 0.1), benchmark_items_per_family=1, coco_captions=2)
    torch.manual_seed(0)
    model = TowersDualEncoder(TowersConfig(embed_dim=16, head_hidden_dim=32)).eval()
    heads = save_heads_checkpoint(model, tmp_path / "base.safetensors")
    data = world / "karpathy_coco.json"
    assert main(["eval", "--model", "lace-towers", "--pretrained", str(heads), "--device", "cpu",
                 "--benchmarks", "retrieval", "--data", str(data), "--split", "test", "--no-baseline",
                 "--out", str(tmp_path / "r.json"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "r.json").read_text())
    dataset = read_dataset(data, split="test")
    with torch.no_grad():
        pixels = torch.stack([model.preprocess(dataset.load_image(i)) for i in range(len(dataset))])
        images, texts = model.encode_images(pixels), model.encode_texts(dataset.captions)
    assert results["benchmarks"]["retrieval"] == pytest.approx(
        retrieval_recall(images, texts, dataset.caption_image_index))
    # the geometry (continuous figures such as the Robin Hood index) is that of these heads' embeddings
    geometry = geometry_diagnostics(images, texts, dataset.caption_image_index, GeometryOptions(baseline=False))
    geometry = {key: (value if math.isfinite(value) else None) for key, value in geometry.items()}  # JSON: null
    assert {key: results["diagnostics"][key] for key in geometry} == pytest.approx(geometry)
