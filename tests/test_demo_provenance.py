"""The demo's provenance stage: every model measured with one local editor fitted on the base."""

import json

import pytest
import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.demo.provenance_stage import (
    PROBE_SPLITS,
    SOURCES,
    ProvenanceInstrument,
    fit_instrument,
    fit_instrument_shade,
    held_out_split,
    provenance_figures,
)
from lace.demo.world_data import world_pairs
from lace.edits.captions import RuleNegatives
from lace.encoders import load_encoder
from lace.local import LocalEditConfig
from lace.local.symmetric import symmetric_negatives
from lace.provenance import PREFERENCES, provenance_preferences, real_vs_edited_auc
from tests.conftest import tiny_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_world(tmp_path_factory.mktemp("provenance") / "world", 120, (0.5, 0.25, 0.25, 0.0))


def _instrument(world, encoder, calls):
    vocabulary = str(world / "vocabulary.yaml")
    decoded: dict = {}

    # an untrained ViT's blocks read the swaps it makes (an untrained ResNet's layer1 does not)
    config = LocalEditConfig(layer="block1", locate_layer="block0", fit_images=60)

    def fit():
        calls.append("fit")
        return fit_instrument(config, encoder, world_pairs(world, "train", "coco", encoder), vocabulary, seed=0)

    def fit_shade(editor):
        return fit_instrument_shade(config, encoder, world_pairs(world, "train", "coco", encoder), vocabulary, editor)

    return ProvenanceInstrument(fit, lambda split: held_out_split(world, split, encoder, decoded), vocabulary,
                                fit_shade)


@pytest.mark.slow
def test_the_stage_gives_shares_in_0_1_with_their_counts_for_the_edits_and_the_renderings(world):
    encoder = load_encoder("lace-micro-32")
    calls: list[str] = []
    instrument = _instrument(world, encoder, calls)
    figures = provenance_figures(encoder, instrument, progress=False)
    assert figures["images"] == {split: 30 for split in PROBE_SPLITS}
    for source in SOURCES:
        measured = figures[source]
        assert 0 < measured["n"] <= 30 and 2 <= min(measured["probe_rows"].values())
        for name in (*PREFERENCES, "probe_auc"):
            assert 0.0 <= measured[name] <= 1.0, (source, name)
        assert -1.0 <= measured["edit_cosine"] <= 1.0
    for kind in ("round_trip", "nuisance", "no_op"):  # the swaps against the symmetric counterparts, local only
        assert 0.0 <= figures["local"][f"probe_auc_{kind}"] <= 1.0 and f"probe_auc_{kind}" not in figures["rendered"]
    json.dumps(figures, allow_nan=False)  # results.json holds no NaN
    # one instrument for every model: a second model is measured without fitting again
    torch.manual_seed(1)
    other = provenance_figures(load_encoder("lace-micro-32"), instrument, progress=False)
    assert calls == ["fit"] and other["images"] == figures["images"]
    assert provenance_figures(encoder, instrument, progress=False) == figures  # deterministic


@pytest.mark.slow
def test_the_rendered_reference_is_provenance_preferences_of_the_rendered_swaps_by_hand(world):
    encoder = load_encoder("lace-micro-32").eval()
    instrument = _instrument(world, encoder, [])
    figures = provenance_figures(encoder, instrument, progress=False)["rendered"]
    held = instrument.splits_["test"]
    rules = RuleNegatives(load_vocabulary(world / "vocabulary.yaml"))
    texts = [rules.describe(caption, change) if change else None
             for caption, change in zip(held.captions, held.rendered_changes)]
    rows = [i for i, text in enumerate(texts) if text is not None and held.rendered_valid[i]]
    with torch.no_grad():
        u, v = encoder.encode_images(held.pixels[rows]), encoder.encode_texts([held.captions[i] for i in rows])
        u_edit, v_edit = encoder.encode_images(held.rendered[rows]), encoder.encode_texts([texts[i] for i in rows])
    expected = provenance_preferences(u, v, u_edit, v_edit)
    assert figures["n"] == expected["n"] == len(rows)
    for name in PREFERENCES:
        assert figures[name] == pytest.approx(expected[name]), name
    assert figures["edit_cosine"] == pytest.approx(expected["edit_cosine"], abs=1e-5)


@pytest.mark.slow
def test_the_symmetric_probes_are_the_probe_of_the_swaps_against_counterparts_made_by_hand(world):
    encoder = load_encoder("lace-micro-32").eval()
    instrument = _instrument(world, encoder, [])
    figures = provenance_figures(encoder, instrument, progress=False)["local"]
    embedded = {}
    for split in PROBE_SPLITS:
        pixels = instrument.splits_[split].pixels
        with torch.no_grad():
            swaps = instrument.editor_.negatives(encoder.model, pixels, n_edits=1)
            back = symmetric_negatives(instrument.editor_, encoder.model, pixels, 1, "round_trip")
        made = swaps.valid[:, 0]
        embedded[split] = (back.counterparts[made, 0], swaps.embeddings[made, 0], swaps.original[made])
    (train_back, train_edit, train_real), (test_back, test_edit, test_real) = (embedded[s] for s in PROBE_SPLITS)
    assert figures["probe_auc_round_trip"] == pytest.approx(
        real_vs_edited_auc(train_back, train_edit, test_back, test_edit), abs=1e-3)
    # the no-op counterpart is the real image through the same pass: its probe is the real-vs-edited one
    assert figures["probe_auc_no_op"] == pytest.approx(figures["probe_auc"], abs=0.02)
    assert figures["probe_auc"] == pytest.approx(real_vs_edited_auc(train_real, train_edit, test_real, test_edit),
                                                 abs=1e-3)
