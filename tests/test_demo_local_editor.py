"""The demo's local arms share one editor fitted on the base: they train exactly as when each fits its own."""

from dataclasses import replace

import pytest
import torch

from lace.concepts.labelled import load_labelled_dictionary
from lace.config import with_changes
from lace.demo import DemoConfig
from lace.demo.config import DEMO_DICTIONARY, DEMO_FINETUNE
from lace.demo.local_editor_stage import edits_locally, fit_shared_editor, load_shared_editor
from lace.demo.pipeline import _finetune, demo_model_and_dictionary
from lace.demo.world_data import world_pairs
from lace.encoders import load_encoder
from lace.experiment.protocol import Run
from lace.experiment.variants import CHOSEN_BEST, with_caption_negatives

TINY = DemoConfig(world_images=120, base_steps=6, batch_size=16, threads=1,
                  dictionary=replace(DEMO_DICTIONARY, atoms=16, sparsity=3),
                  finetune=with_changes(DEMO_FINETUNE, {"steps": 3, "local": {"fit_images": 60}}),
                  progress=False)


def _weights(path) -> dict[str, torch.Tensor]:
    return load_encoder(TINY.model, str(path)).model.state_dict()


@pytest.mark.slow  # the demo's world, base and dictionary, an editor and two fine-tunes
def test_a_local_arm_trained_with_the_shared_editor_matches_one_that_fits_its_own(tmp_path):
    foundation = demo_model_and_dictionary(TINY, tmp_path, log=lambda _: None)
    coco = world_pairs(foundation.world_dir, "train", "coco", load_encoder(TINY.model))
    labelled = load_labelled_dictionary(foundation.dictionary_dir)
    path = tmp_path / "editor.pt"
    fitted = fit_shared_editor(TINY.finetune.negatives.local, TINY.model, foundation.base_path, coco, foundation.vocabulary, 0,
                               path)
    assert fitted["fit_images"] == 60 and path.is_file() and fitted["concepts"]
    made = {}
    for name, editor in (("own", None), ("shared", lambda: load_shared_editor(path))):
        out = tmp_path / name
        result = _finetune(TINY, Run(CHOSEN_BEST, 0), coco, out, foundation.base_path, labelled,
                           foundation.vocabulary, local_editor=editor)
        figures = {key: value for key, value in result["last_metrics"].items() if key != "samples_per_second"}
        made[name] = (figures, _weights(Run(CHOSEN_BEST, 0).model_file(out, ".pt")))
    assert made["own"][0] == made["shared"][0]
    assert made["own"][0]["image_negatives_valid_rows"] > 0  # the editors edited: equal weights are not a no-op's
    own, shared = made["own"][1], made["shared"][1]
    assert own.keys() == shared.keys()
    assert all(torch.equal(own[key], shared[key]) for key in own)
    # and the arms did train: the weights moved from the base
    base = _weights(foundation.base_path)
    assert any(not torch.equal(base[key], own[key]) for key in own)


def test_only_the_arms_that_edit_inside_the_image_tower_take_the_shared_editor():
    assert edits_locally(CHOSEN_BEST) and edits_locally(with_caption_negatives(CHOSEN_BEST))
    assert edits_locally("LACE-local")
    assert not any(edits_locally(arm) for arm in ("plain", "caption negatives", "LACE", "ceiling (rendered swaps)"))
    # an arm whose own local knobs change the fit fits its own editor; the symmetric kinds act in training only
    assert not edits_locally("LACE-local learnt pairs + real-image negative")
    assert not edits_locally("LACE-local learnt symmetric pairs (round trip)")
    assert edits_locally("LACE-local symmetric pairs (round trip)") and edits_locally("LACE-local symmetric pairs (no-op)")
