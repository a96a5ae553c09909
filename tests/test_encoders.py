import json

import open_clip
import pytest
import torch
from PIL import Image

from lace.encoders import DualEncoder, load_encoder
from lace.encoders.open_clip_encoder import tiny_model_names
from lace.errors import LaceInputError


def _check_unit_outputs(encoder: DualEncoder, image_size: int) -> None:
    images = [Image.new("RGB", (image_size + 7, image_size), c) for c in ("red", "blue", "white")]
    pixels = torch.stack([encoder.preprocess(image) for image in images])
    with torch.no_grad():
        image_embeddings = encoder.encode_images(pixels)
        text_embeddings = encoder.encode_texts(["a red square", "a blue circle"])
    assert image_embeddings.shape == (3, encoder.embed_dim)
    assert text_embeddings.shape == (2, encoder.embed_dim)
    torch.testing.assert_close(image_embeddings.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(text_embeddings.norm(dim=-1), torch.ones(2))
    assert encoder.logit_scale.requires_grad


@pytest.mark.parametrize("name", tiny_model_names())
def test_lace_tiny_models_are_registered_and_unit_norm(name):
    torch.manual_seed(0)
    encoder = load_encoder(name, pretrained="none")
    size = encoder.model.visual.image_size  # an int for ResNet towers, a pair for ViTs
    _check_unit_outputs(encoder, size if isinstance(size, int) else size[0])


@pytest.mark.slow
def test_open_clip_vit_b_32_random_init():
    torch.manual_seed(0)
    encoder = load_encoder("ViT-B-32", pretrained=None)
    assert encoder.embed_dim == 512
    _check_unit_outputs(encoder, 224)


def test_forward_keeps_gradients_for_training():
    encoder = load_encoder("lace-micro-32")
    pixels = torch.randn(2, 3, 32, 32)
    image_embeddings, text_embeddings, scale = encoder(pixels, encoder.tokenize(["a", "b"]))
    (image_embeddings @ text_embeddings.T * scale).sum().backward()
    assert encoder.model.visual.conv1.weight.grad is not None
    assert encoder.model.token_embedding.weight.grad is not None


def test_local_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-32")
    path = tmp_path / "model.pt"
    torch.save(encoder.export_state_dict(), path)
    reloaded = load_encoder("lace-micro-32", pretrained=str(path))
    with torch.no_grad():
        torch.testing.assert_close(encoder.encode_texts(["a red square"]), reloaded.encode_texts(["a red square"]))
    direct = open_clip.create_model("lace-micro-32", pretrained=str(path))
    torch.testing.assert_close(direct.logit_scale, encoder.logit_scale)


def test_unknown_model_and_missing_checkpoint():
    with pytest.raises(LaceInputError, match="unknown model name 'ViT-Q-99'"):
        load_encoder("ViT-Q-99")
    with pytest.raises(LaceInputError, match="checkpoint file not found"):
        load_encoder("lace-micro-32", pretrained="/nowhere/model.pt")


def _write_clip_tokenizer(folder):
    """CLIP's BPE vocabulary, as shipped inside open_clip, in Hugging Face's file layout."""
    tokenizer = open_clip.SimpleTokenizer()
    renamed = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    vocab = {renamed.get(token, token): index for token, index in tokenizer.encoder.items()}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    merges = sorted(tokenizer.bpe_ranks, key=tokenizer.bpe_ranks.get)
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")


@pytest.mark.slow
def test_hugging_face_clip_tiny_random(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "max_position_embeddings": 32, "vocab_size": 49408},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    transformers.CLIPModel(config).save_pretrained(tmp_path)
    _write_clip_tokenizer(tmp_path)
    transformers.CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")).save_pretrained(tmp_path)
    encoder = load_encoder(f"hf-clip:{tmp_path}")
    assert encoder.embed_dim == 16
    _check_unit_outputs(encoder, 32)


def test_hugging_face_folder_without_config(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(LaceInputError, match="config.json"):
        load_encoder(f"hf-clip:{tmp_path}")


def test_tokenize_cache_matches_open_clip_tokenizer():
    encoder = load_encoder("lace-micro-32")
    texts = ["a red square", "a blue circle left of a red square", "a red square"]
    expected = open_clip.get_tokenizer("lace-micro-32")(texts)
    torch.testing.assert_close(encoder.tokenize(texts), expected)
    torch.testing.assert_close(encoder.tokenize(texts[::-1]), expected.flip(0))
