"""The local image editor fitted on each device, as `lace train` fits it before its first step: every tensor it
makes lands on the pixels' device, and it reads the training images as the CPU-fitted one does."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.data import read_dataset
from lace.local import build_local_editor
from lace.row_random import RowGenerators
from tests.cuda.devices import DEVICES
from tests.cuda.steps import LOCAL, SEED, initial_encoder


def _fit(world, operator: str, device: str):
    encoder = initial_encoder("lace-micro-32").to(device)
    dataset = read_dataset(str(world / "karpathy_coco.json"), split="train")
    pixels = torch.stack([encoder.preprocess(dataset.load_image(i)) for i in range(LOCAL.fit_images)]).to(device)
    captions = [list(dataset.records[i].captions) for i in range(LOCAL.fit_images)]
    editor = build_local_editor(replace(LOCAL, operator=operator), encoder.model, pixels, captions,
                                encoder.preprocess.transforms[-1], load_vocabulary(str(world / "vocabulary.yaml")),
                                seed=SEED)
    return editor, encoder, pixels


@pytest.mark.parametrize("operator", ["recolour", "mean_shift"])
@pytest.mark.parametrize("device", DEVICES)
def test_local_editor_fits_and_edits_on_the_device(operator, device, world):
    reference, _, _ = _fit(world, operator, "cpu")
    editor, encoder, pixels = _fit(world, operator, device)
    assert editor.reader.weight_.device.type == device
    assert editor.reader.mention_loss_ == pytest.approx(reference.reader.mention_loss_, rel=1e-3)
    made = editor.negatives(encoder.model, pixels[:8], 2, generator=RowGenerators(list(range(8))))
    assert made.embeddings.device.type == device and made.valid.device.type == device
    assert bool(torch.isfinite(made.embeddings).all()) and bool(made.valid.any())
    cpu_made = reference.negatives(initial_encoder("lace-micro-32").model, pixels[:8].cpu(), 2,
                                   generator=RowGenerators(list(range(8))))
    agree = (made.valid.cpu() == cpu_made.valid).float().mean()
    assert agree >= 0.75  # the same edits found valid, up to positions at a threshold
