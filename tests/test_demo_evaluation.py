"""The demo's evaluations share what one model's evaluation reads first: prepared once, their figures unchanged."""

import json

import torch

from lace.demo.evaluation import evaluate_on_world, prepare_world_evaluation
from lace.encoders import load_encoder
from lace.eval import brittleness, embedding_cache

MODEL = "lace-micro-rn-32"


def _figures(results: dict) -> dict:
    """`evaluate_on_world`'s results without their timings, as results.json holds them."""
    return json.loads(json.dumps({split: {name: value for name, value in figures.items() if name != "seconds"}
                                  for split, figures in results.items()}))


def test_a_prepared_evaluation_decodes_and_edits_nothing_and_keeps_every_figure(shapes_world, monkeypatch):
    vocabulary = str(shapes_world / "vocabulary.yaml")
    torch.manual_seed(0)
    encoder = load_encoder(MODEL)
    alone = _figures(evaluate_on_world(encoder, "base", shapes_world, vocabulary, seed=0, pixels={}, inputs={}))

    brittleness._rule_edit_sets.clear()
    pixels, inputs = {}, {}
    prepare_world_evaluation(shapes_world, vocabulary, load_encoder(MODEL), seed=0, pixels=pixels, inputs=inputs)
    decoded, edit_sets = dict(pixels), dict(brittleness._rule_edit_sets)
    assert decoded and edit_sets and set(inputs) == {"val", "test", "test_comp"}

    def no_image_read(key):
        raise AssertionError(f"an image read after the preparation: {key}")

    monkeypatch.setattr(embedding_cache, "load_image", no_image_read)
    prepared = _figures(evaluate_on_world(encoder, "base", shapes_world, vocabulary, seed=0, pixels=pixels,
                                          inputs=inputs))
    assert prepared == alone
    assert pixels.keys() == decoded.keys() and all(pixels[name] is decoded[name] for name in decoded)
    assert brittleness._rule_edit_sets == edit_sets  # the rule edits made ahead were the ones measured with
