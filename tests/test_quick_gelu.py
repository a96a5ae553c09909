"""QuickGELU is kept from OpenAI-trained weights through training, `lace export` and loading.

No weights are downloaded: a random-init tiny model stands in for OpenAI's, its checkpoint
marked as QuickGELU-trained by a side JSON exactly as `lace export` writes one.
"""

import json
from pathlib import Path

import open_clip
import torch

from lace.encoders import load_encoder
from lace.encoders.open_clip_encoder import quick_gelu_for, uses_quick_gelu
from lace.io import read_json
from lace.train import export_run, train
from tests.test_train import config_for, pairs_csv  # noqa: F401  (fixture)

MODEL = "lace-micro-32"


def embeddings(encoder) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    pixels = torch.randn(2, 3, 32, 32)
    encoder.eval()
    with torch.no_grad():
        return encoder.encode_images(pixels), encoder.encode_texts(["a red square", "two blue stars"])


def quick_gelu_checkpoint(tmp_path: Path) -> Path:
    """Random weights saved as a checkpoint whose side JSON records QuickGELU training."""
    path = tmp_path / "start.pt"
    torch.manual_seed(1)
    torch.save(open_clip.create_model(MODEL).state_dict(), path)
    (tmp_path / "start.pt.json").write_text(json.dumps({"model": MODEL, "quick_gelu": True}))
    return path


def test_the_registry_decides_for_tags_without_downloading():
    assert quick_gelu_for("ViT-B-32", "openai") is True
    assert quick_gelu_for("RN50", "openai") is True
    assert quick_gelu_for("ViT-B-32", "laion2b_s34b_b79k") is False
    assert quick_gelu_for("ViT-B-32-quickgelu", None) is True
    assert quick_gelu_for(MODEL, None) is False
    assert quick_gelu_for("hf-hub:timm/anything", "x") is False  # its own config decides; nothing is fetched


def test_a_quick_gelu_checkpoint_loads_with_quick_gelu_and_the_activation_changes_embeddings(tmp_path):
    start = quick_gelu_checkpoint(tmp_path)
    encoder = load_encoder(MODEL, str(start))
    assert encoder.quick_gelu and uses_quick_gelu(encoder.model)
    reference = open_clip.create_model(MODEL, pretrained=str(start), force_quick_gelu=True)
    gelu = open_clip.create_model(MODEL, pretrained=str(start))
    assert not uses_quick_gelu(gelu)
    images, _ = embeddings(encoder)
    reference.eval()
    gelu.eval()
    with torch.no_grad():
        torch.manual_seed(0)
        pixels = torch.randn(2, 3, 32, 32)
        expected = torch.nn.functional.normalize(reference.encode_image(pixels), dim=-1)
        plain = torch.nn.functional.normalize(gelu.encode_image(pixels), dim=-1)
    torch.testing.assert_close(images, expected)
    assert (images - plain).abs().max() > 1e-4  # GELU would have changed the result


def test_training_and_export_keep_quick_gelu_and_loading_the_export_restores_it(pairs_csv, tmp_path):  # noqa: F811
    start = quick_gelu_checkpoint(tmp_path)
    result = train(config_for(pairs_csv, tmp_path / "run", steps=2, pretrained=str(start)), progress=False)
    assert uses_quick_gelu(result.model.model)
    out = tmp_path / "model.safetensors"
    export_run(tmp_path / "run", out)
    assert read_json(str(out) + ".json")["quick_gelu"] is True
    restored = load_encoder(MODEL, str(out))
    assert restored.quick_gelu and uses_quick_gelu(restored.model)
    for got, want in zip(embeddings(restored), embeddings(result.model)):
        torch.testing.assert_close(got, want)


def test_a_run_from_gelu_weights_exports_gelu(pairs_csv, tmp_path):  # noqa: F811
    train(config_for(pairs_csv, tmp_path / "run", steps=1), progress=False)
    out = tmp_path / "model.pt"
    export_run(tmp_path / "run", out)
    assert read_json(str(out) + ".json")["quick_gelu"] is False
    assert not uses_quick_gelu(load_encoder(MODEL, str(out)).model)
