"""The one measuring function: registered measurements run in order and merge their figures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lace.errors import LaceInputError
from lace.eval.hubness import k_occurrence
from lace.eval.measure import MEASURES, MeasureConfig, MeasuredSplit, measure, register
from lace.eval.neighbours import cross_neighbours


def _split(n_images: int = 12, per_image: int = 2) -> MeasuredSplit:
    generator = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(n_images, 8, generator=generator), dim=1)
    index = np.repeat(np.arange(n_images), per_image)
    texts = F.normalize(images[index] + 0.3 * torch.randn(len(index), 8, generator=generator), dim=1)
    return MeasuredSplit(images, texts, index)


def test_a_registered_measurement_runs_with_its_inputs(monkeypatch):
    monkeypatch.setitem(MEASURES, "first_image_norm", None)
    seen = {}

    @register("first_image_norm")
    def first_image_norm(split, config, inputs):
        seen.update(inputs)
        return {"first_image_norm": float(split.images[0].norm()) * inputs["scale"]}

    figures = measure(_split(), MeasureConfig(("first_image_norm", "n_k"), k=3), scale=2.0)
    assert figures["first_image_norm"] == pytest.approx(2.0) and seen == {"scale": 2.0}
    assert list(figures) == ["first_image_norm", "nk/i2t", "nk/t2i"]


def test_n_k_is_counted_one_way_and_sums_to_queries_times_k():
    split = _split()
    figures = measure(split, MeasureConfig(("n_k",), k=3))
    forward, _ = cross_neighbours(split.images, split.texts, 3)
    assert figures["nk/i2t"] == k_occurrence(forward.indices, split.texts.shape[0], 3).tolist()
    assert sum(figures["nk/i2t"]) == 12 * 3 and sum(figures["nk/t2i"]) == 24 * 3


def test_unknown_measurement_and_missing_input_name_the_field():
    with pytest.raises(LaceInputError, match="measures"):
        measure(_split(), MeasureConfig(("hubris",)))
    with pytest.raises(LaceInputError, match="editor"):
        measure(_split(), MeasureConfig(("counterfactual_brittleness",)))
