"""`measure_fidelity` (`lace fidelity`) end to end on a tiny world, its pooled-embedding arms, and its
refusal of a damaged world or a missing dictionary."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from lace.concepts.directions import directions_from_captions
from lace.concepts.labelled import LabelledDictionary, save_labelled_dictionary
from lace.concepts.labelling import label_atoms
from lace.concepts.vocabulary import load_vocabulary
from lace.data.readers import read_dataset
from lace.dictionary import ConceptDictionary
from lace.encoders import load_encoder
from lace.errors import LaceInputError
from lace.experiment.fidelity import FidelityConfig, fidelity_markdown, measure_fidelity
from lace.experiment.pooled_fidelity import (
    POOLED_METHODS,
    embedding_random_step,
    paired_caption_edit,
)
from lace.local.config import LearntOperatorConfig
from tests.conftest import tiny_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_world(tmp_path_factory.mktemp("fidelity") / "world", 120, (0.6, 0.2, 0.1, 0.1))


@pytest.mark.slow
def test_fidelity_reports_each_layer_with_its_random_control(world):
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-rn-32").eval()
    config = FidelityConfig(world=str(world), layers=("layer1",), methods=("recolour_regression", "learnt_recolour"),
                            text_layers=("block0",), n_items=10, n_train=60, n_probe=12, renderer_masks=True,
                            learnt=LearntOperatorConfig(hidden=8, steps=5, rows_per_pair=16, positions_per_step=32))
    results = measure_fidelity(encoder, config, log=lambda *_: None)
    json.dumps(results)  # written as fidelity.json
    assert 0 <= results["rendered_probe_auc"] <= 1
    for method in ("recolour_regression", "learnt_recolour"):  # every operator beside its random control and probe
        swap = results["image"]["layer1"]["methods"][method]["swap"]
        assert 0 <= swap["probe_auc"] <= 1 and -1 <= swap["random_control"]["direction_agreement"] <= 1
    assert "probe_auc" not in results["image"]["layer1"]["methods"]["recolour_regression (renderer masks)"]["swap"]
    fit = results["image"]["layer1"]["operator_fit"]["learnt_recolour"]
    assert fit["ridge_reconstruction"] >= 0 and fit["learnt_reconstruction"] >= 0
    for placement in ("recolour_regression", "recolour_regression (renderer masks)", "learnt_recolour"):
        for kind in ("swap", "transplant"):
            measured = results["image"]["layer1"]["methods"][placement][kind]
            assert measured["n"] == 10 and 0 < measured["valid_share"] <= 1
            for arm in ("edit", "random_control"):
                assert -1 <= measured[arm]["direction_agreement"] <= 1
                assert 0 <= measured[arm]["prefers_edited_caption"] <= 1
    caption_swap = results["text"]["block0"]
    assert 0 < caption_swap["valid_share"] <= 1 and -1 <= caption_swap["direction_agreement"] <= 1
    text = fidelity_markdown(results)
    assert "| layer1 |" in text and "recolour_regression" in text and "| block0 |" in text
    assert "| layer1 | learnt_recolour |" in text and "probe AUC" in text


def test_lace_fidelity_passes_its_flags_and_refuses_to_clobber(world, tmp_path, monkeypatch):
    from lace.cli import main
    from lace.experiment import fidelity

    seen = []
    monkeypatch.setattr(fidelity, "measure_fidelity", lambda encoder, config: seen.append(config) or {"image": {}})
    monkeypatch.setattr(fidelity, "fidelity_markdown", lambda results: "table\n")
    out = tmp_path / "fidelity"
    flags = ["fidelity", "--world", str(world), "--out", str(out), "--layers", "stem,layer2", "--n-items", "7",
             "--pooled", "lace", "--dictionary", "dict", "--renderer-masks", "--seed", "3", "--learnt-hidden", "8",
             "--learnt-adversarial-weight", "0.5", "--n-probe", "9"]
    assert main(flags) == 0
    (config,) = seen
    assert (config.learnt.hidden, config.learnt.adversarial_weight, config.n_probe) == (8, 0.5, 9)
    assert (config.world, config.layers, config.n_items, config.pooled, config.dictionary) == (
        str(world), ("stem", "layer2"), 7, ("lace",), "dict")
    assert config.renderer_masks and config.seed == 3
    assert json.loads((out / "fidelity.json").read_text()) == {"image": {}}
    assert main(flags) == 2 and len(seen) == 1  # a written folder is kept without --overwrite
    assert main([*flags, "--overwrite"]) == 0 and len(seen) == 2
    assert main(["fidelity", "--out", str(tmp_path / "other")]) == 2


def test_a_damaged_world_json_names_the_file(world, tmp_path):
    damaged = tmp_path / "world"
    damaged.mkdir()
    for path in world.iterdir():
        (damaged / path.name).symlink_to(path)
    (damaged / "world.json").unlink()
    (damaged / "world.json").write_text("{not json")
    encoder = load_encoder("lace-micro-rn-32").eval()
    with pytest.raises(LaceInputError, match="world.json"):
        measure_fidelity(encoder, FidelityConfig(world=str(damaged), layers=("layer1",), n_items=4, n_train=8),
                         log=lambda *_: None)


@pytest.fixture(scope="module")
def dictionary(world, tmp_path_factory):
    """A labelled dictionary of the tiny world's embeddings, every atom aligned (tau_align -1) so edits propose."""
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-rn-32").eval()
    train = read_dataset(world / "karpathy_coco.json", split="train")
    captions = [caption for record in train.records for caption in record.captions]
    with torch.no_grad():
        images = encoder.encode_images(torch.stack([encoder.preprocess(train.load_image(i)) for i in range(len(train))]))
        texts = encoder.encode_texts(captions)
    directions = directions_from_captions(load_vocabulary(world / "vocabulary.yaml"), captions, texts, min_count=1)
    fitted = ConceptDictionary(n_atoms=64, sparsity=6, mode="vocabulary", directions=directions).fit(images, texts)
    labelling = label_atoms(fitted, directions, images, texts, tau_align=-1.0)
    folder = tmp_path_factory.mktemp("dictionary")
    save_labelled_dictionary(LabelledDictionary(fitted, directions, labelling), folder)
    return folder


def test_pooled_arms_report_each_family_beside_their_random_control(world, dictionary):
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-rn-32").eval()
    config = FidelityConfig(world=str(world), layers=(), text_layers=(), n_items=10, n_train=8,
                            pooled=POOLED_METHODS, dictionary=str(dictionary))
    results = measure_fidelity(encoder, config, log=lambda *_: None)
    json.dumps(results)
    assert set(results["pooled"]) == set(POOLED_METHODS)
    for method, figures in results["pooled"].items():
        for kind in ("swap", "transplant"):
            measured = figures[kind]
            assert measured["n"] == 10 and 0 <= measured["valid_share"] <= 1
            if measured["valid_share"] > 0:
                for arm in ("edit", "random_control"):
                    assert -1 <= measured[arm]["direction_agreement"] <= 1
                    assert -1 <= measured[arm]["cos_edit_rendered"] <= 1
                    assert 0 <= measured[arm]["prefers_edited_caption"] <= 1
    assert results["pooled"]["paired_caption_directions"]["swap"]["valid_share"] == 1.0
    # concept arithmetic mirrors the slots of the dictionary edits it is the control of
    for kind in ("swap", "transplant"):
        assert (results["pooled"]["lace"][kind]["valid_share"]
                == results["pooled"]["concept_arithmetic"][kind]["valid_share"])
    assert max(results["pooled"]["lace"][kind]["valid_share"] for kind in ("swap", "transplant")) > 0
    for kind in ("swap", "transplant"):  # every invalid row has one reason
        measured = results["pooled"]["lace"][kind]
        assert sum(measured["invalid_shares"].values()) + measured["valid_share"] == pytest.approx(1.0)
    text = fidelity_markdown(results)
    for method in POOLED_METHODS:
        assert f"| {method} | swap |" in text and f"| {method} | transplant |" in text


def test_paired_caption_edit_is_the_caption_change_moved_onto_the_image():
    u, v_pos, v_neg = torch.eye(3)[None, 0], torch.eye(3)[None, 1], torch.eye(3)[None, 2]
    expected = torch.tensor([[1.0, -1.0, 1.0]]) / 3**0.5  # normalise(u + v_neg - v_pos) by hand
    torch.testing.assert_close(paired_caption_edit(u, v_pos, v_neg), expected)


def test_pooled_random_control_has_the_edits_norm():
    u = F.normalize(torch.randn(5, 16, generator=torch.Generator().manual_seed(1)), dim=-1)
    u_edit = F.normalize(u + 0.3 * torch.randn(5, 16, generator=torch.Generator().manual_seed(2)), dim=-1)
    step = u_edit - u
    control = embedding_random_step(step, torch.Generator().manual_seed(3))
    torch.testing.assert_close(control.norm(dim=-1), step.norm(dim=-1))
    assert F.cosine_similarity(control, step, dim=-1).abs().max() < 0.9


def test_dictionary_arms_without_a_dictionary_name_the_field(world):
    encoder = load_encoder("lace-micro-rn-32").eval()
    with pytest.raises(LaceInputError, match="field 'dictionary'.*lace"):
        measure_fidelity(encoder, FidelityConfig(world=str(world), layers=(), text_layers=(), pooled=("lace",)),
                         log=lambda *_: None)
    with pytest.raises(LaceInputError, match="field 'pooled'"):
        measure_fidelity(encoder, FidelityConfig(world=str(world), layers=(), pooled=("lace_local",)),
                         log=lambda *_: None)
