"""The SigLIP family trains: the loss follows the model's logit bias, the bias trains, resumes and exports,
and the exports load back in open_clip and transformers with the same embeddings."""

import json
import logging
from pathlib import Path

import open_clip
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from lace.cli import main
from lace.config import with_changes
from lace.encoders import load_encoder
from lace.errors import LaceInputError
from lace.io import read_json
from lace.train import train
from lace.train.checkpoints import latest_checkpoint
from lace.train.config import train_config
from tests.conftest import make_images
from tests.siglip_support import write_local_open_clip_siglip, write_tiny_siglip

WORLD_VOCABULARY = str(Path(__file__).resolve().parents[1] / "src/lace/data/world/vocabulary.yaml")
COLOURS = ["red", "green", "blue", "yellow"]
CAPTIONS = [f"a {c} {s} left of a {c2} star" for c in COLOURS for s in ("circle", "square") for c2 in ("pink", "cyan")]


@pytest.fixture
def pairs_csv(tmp_path: Path) -> Path:
    names = make_images(tmp_path / "data" / "images", 16)
    rows = [f"images/{name},a {COLOURS[i % 4]} square left of a {'circle' if i % 2 else 'star'}"
            for i, name in enumerate(names)]
    path = tmp_path / "data" / "pairs.csv"
    path.write_text("filepath,caption\n" + "\n".join(rows) + "\n")
    return path


def dictionary_of(encoder, folder: Path) -> str:
    """A vocabulary dictionary fitted on `encoder`'s own embeddings (the run's initial model), saved to `folder`."""
    from lace.concepts.directions import directions_from_templates
    from lace.concepts.vocabulary import load_vocabulary
    from lace.dictionary.concept_dictionary import ConceptDictionary

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        texts = encoder.encode_texts(CAPTIONS)
        images = encoder.encode_images(torch.rand(16, 3, 32, 32, generator=generator))
        directions = directions_from_templates(load_vocabulary(WORLD_VOCABULARY), encoder.encode_texts, texts.mean(0))
    dictionary = ConceptDictionary(mode="vocabulary", sparsity=4, directions=directions, batch_size=64).fit(images, texts)
    dictionary.save(folder)
    directions.save(folder)
    return str(folder)


def lace_flags(model: str, data: Path, out: Path, dictionary: str) -> list[str]:
    return ["train", "--model", model, "--data", str(data), "--out", str(out), "--steps", "4", "--batch-size", "8",
            "--lr", "2e-3", "--warmup-steps", "1", "--log-every", "1", "--checkpoint-every", "2", "--device", "cpu",
            "--seed", "3", "--no-progress", "--counterfactual-captions", "--counterfactual-images", "--dictionary",
            dictionary, "--caption-negatives", "--vocabulary", WORLD_VOCABULARY]


def train_resume_and_export(model: str, pairs_csv: Path, tmp_path: Path, caplog) -> tuple[dict, Path]:
    """`lace train` with LACE negatives (whole, and killed after step 2 then resumed), then `lace export`;
    returns the final weights and the export."""
    torch.manual_seed(3)  # the run's initial model, for the dictionary
    dictionary = dictionary_of(load_encoder(model), tmp_path / "dictionary")
    with caplog.at_level(logging.WARNING, logger="lace.train.loss_choice"):
        assert main(lace_flags(model, pairs_csv, tmp_path / "whole", dictionary)) == 0
    assert "training with the sigmoid loss" in caplog.text
    assert read_json(tmp_path / "whole" / "config.json")["loss"] == "sigmoid"
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["loss"] > m["plain_loss"] for m in metrics)  # the counterfactual terms are in the loss
    assert metrics[0]["caption_negatives_valid_rows"] > 0 and metrics[0]["image_negatives_valid_rows"] > 0
    assert metrics[-1]["logit_bias"] != pytest.approx(-10.0, abs=1e-4)  # the bias trains
    whole = load_file(str(latest_checkpoint(tmp_path / "whole").with_suffix(".safetensors")))

    config = train_config(model=model, data=str(pairs_csv), output=str(tmp_path / "killed"), steps=4, batch_size=8,
                         lr=2e-3, warmup_steps=1, log_every=1, checkpoint_every=2, device="cpu", seed=3,
                         counterfactual_captions=True, counterfactual_images=True, dictionary=dictionary,
                         caption_negatives=True, vocabulary=WORLD_VOCABULARY)

    def kill(number, indices):
        if number == 2:  # the first batch of step 3, after the step-2 checkpoint
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False, on_batch=kill)
    resumed = train(with_changes(config, {"resume": "latest"}), progress=False)
    bias_keys = [key for key in whole if key.endswith("logit_bias")]
    assert bias_keys
    for key, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, whole[key], rtol=0, atol=1e-6, msg=key)
    out = tmp_path / "model.pt"
    assert main(["export", "--run", str(tmp_path / "whole"), "--out", str(out)]) == 0
    return whole, out


@pytest.mark.slow
def test_tiny_open_clip_siglip_trains_resumes_and_exports(pairs_csv, tmp_path, caplog):
    weights, out = train_resume_and_export("lace-micro-sigmoid-32", pairs_csv, tmp_path, caplog)
    clip = open_clip.create_model("lace-micro-sigmoid-32", pretrained=str(out)).eval()
    torch.testing.assert_close(clip.logit_bias, weights["model.logit_bias"])
    encoder = load_encoder("lace-micro-sigmoid-32", str(out)).eval()
    pixels = torch.randn(3, 3, 32, 32)
    captions = ["a red square", "a blue circle left of a star", "two stars"]
    tokens = open_clip.get_tokenizer("lace-micro-sigmoid-32")(captions)  # open_clip's own tokenizer: the built-in BPE
    torch.testing.assert_close(tokens, encoder.tokenize(captions))
    with torch.no_grad():
        torch.testing.assert_close(F.normalize(clip.encode_image(pixels), dim=-1), encoder.encode_images(pixels))
        torch.testing.assert_close(F.normalize(clip.encode_text(tokens), dim=-1), encoder.encode_tokens(tokens))
        # open_clip's own SigLIP logits use the exported scale and bias
        _, _, scale, bias = clip(pixels, tokens)
    torch.testing.assert_close(bias, encoder.logit_bias)
    torch.testing.assert_close(scale, encoder.logit_scale.exp())


def test_tiny_hugging_face_siglip_trains_resumes_and_exports(pairs_csv, tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    folder = write_tiny_siglip(tmp_path / "hf-siglip")
    model = f"hf-siglip:{folder}"
    weights, out = train_resume_and_export(model, pairs_csv, tmp_path, caplog)
    assert read_json(str(out) + ".json")["model"] == model
    siglip = transformers.SiglipModel.from_pretrained(folder).eval()
    siglip.load_state_dict(torch.load(out, weights_only=True))
    torch.testing.assert_close(siglip.logit_bias, weights["model.logit_bias"])
    encoder = load_encoder(model).eval()
    encoder.model.load_state_dict(torch.load(out, weights_only=True))
    pixels = torch.randn(3, 3, 32, 32)
    captions = ["a red square", "a blue circle left of a star", "two stars"]
    inputs = transformers.AutoTokenizer.from_pretrained(folder)(captions, padding="max_length", return_tensors="pt")
    torch.testing.assert_close(inputs["input_ids"], encoder.tokenize(captions))
    with torch.no_grad():
        output = siglip(input_ids=inputs["input_ids"], pixel_values=pixels)
        torch.testing.assert_close(output.image_embeds, encoder.encode_images(pixels))
        torch.testing.assert_close(output.text_embeds, encoder.encode_tokens(inputs["input_ids"]))
        U, V = encoder.encode_images(pixels), encoder.encode_tokens(inputs["input_ids"])
    # transformers' logits are the trained model's s u.v + b
    torch.testing.assert_close(output.logits_per_image, encoder.logit_scale.exp() * U @ V.T + encoder.logit_bias)


def test_loss_clip_on_a_bias_model_warns_and_leaves_the_bias(pairs_csv, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="lace.train.loss_choice"):
        assert main(["train", "--model", "lace-micro-sigmoid-32", "--loss", "clip", "--data", str(pairs_csv), "--out",
                     str(tmp_path / "clip"), "--steps", "2", "--batch-size", "8", "--lr", "1e-3", "--device", "cpu",
                     "--no-progress", "--log-every", "1"]) == 0
    assert "logit bias" in caplog.text and "does not use the bias" in caplog.text
    assert read_json(tmp_path / "clip" / "config.json")["loss"] == "clip"
    metrics = [json.loads(line) for line in (tmp_path / "clip" / "metrics.jsonl").read_text().splitlines()]
    assert [m["logit_bias"] for m in metrics] == [-10.0, -10.0]
    assert "model.logit_bias" in load_file(str(latest_checkpoint(tmp_path / "clip").with_suffix(".safetensors")))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lace.train.loss_choice"):
        assert main(["train", "--model", "lace-micro-32", "--data", str(pairs_csv), "--out", str(tmp_path / "plain"),
                     "--steps", "1", "--batch-size", "8", "--device", "cpu", "--no-progress"]) == 0
    assert caplog.text == "" and read_json(tmp_path / "plain" / "config.json")["loss"] == "clip"
    with pytest.raises(LaceInputError, match="field 'loss'.*logit bias"):
        train(train_config(model="lace-micro-32", data=str(pairs_csv), output=str(tmp_path / "refused"), steps=1,
                          batch_size=8, device="cpu", loss="sigmoid"), progress=False)
    with pytest.raises(LaceInputError, match="loss"):
        train_config(loss="softmax").validate()


def test_a_full_size_siglip_whose_tokenizer_is_not_here_says_what_is_missing(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    with pytest.raises(LaceInputError) as raised:
        load_encoder("ViT-B-16-SigLIP2", "none")
    message = str(raised.value)
    assert "ViT-B-16-SigLIP2" in message and "'timm/ViT-B-16-SigLIP2'" in message
    assert "local-dir:<folder>" in message and "HF_HOME" in message
    with pytest.raises(LaceInputError, match="hf-siglip:<folder>"):
        load_encoder("hf-siglip:google/siglip-base-patch16-224")


def test_pretrained_siglip_weights_that_are_not_here_say_so(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    # open_clip's tokenizer is built in for ViT-B-32, so the first network call is for the weights of the tag
    with pytest.raises(LaceInputError, match="weights of pretrained tag 'openai'.*--pretrained <checkpoint file>"):
        load_encoder("ViT-B-32", "openai")


def test_an_open_clip_siglip_in_a_local_folder_reads_its_tokenizer_there(pairs_csv, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the folder must be enough
    folder = write_local_open_clip_siglip(tmp_path / "local")
    model = f"local-dir:{folder}"
    encoder = load_encoder(model)
    assert type(encoder._tokenizer.tokenizer).__name__ == "HFTokenizer"
    tokens = encoder.tokenize(["a red square", "a blue circle left of a star"])
    assert tokens.shape == (2, 16) and tokens[0, :4].tolist() == [3, 6, 14, 1]  # padded to the context, </s> added
    assert encoder.logit_bias.item() == -10.0
    assert main(["train", "--model", model, "--data", str(pairs_csv), "--out", str(tmp_path / "run"), "--steps", "2",
                 "--batch-size", "8", "--lr", "1e-3", "--device", "cpu", "--no-progress", "--log-every", "1"]) == 0
    assert read_json(tmp_path / "run" / "config.json")["loss"] == "sigmoid"
