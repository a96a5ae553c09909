"""Provenance figures on hand-built batches whose answers are known, and the probe's AUC against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from lace.provenance import provenance_preferences, rank_auc, real_vs_edited_auc


def unit(*rows) -> torch.Tensor:
    return F.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


def test_a_model_that_reads_the_edit_wins_all_four_preferences():
    u, v = unit([1, 0, 0], [0, 1, 0]), unit([1, 0.1, 0], [0.1, 1, 0])
    u_edit, v_edit = unit([0, 0, 1], [0, 0, 1]), unit([0.1, 0, 1], [0, 0.1, 1])
    figures = provenance_preferences(u, v, u_edit, v_edit)
    assert {k: figures[k] for k in figures if k.startswith(("real", "edited"))} == {
        "real_image_prefers_its_caption": 1.0, "edited_image_prefers_edited_caption": 1.0,
        "real_caption_prefers_real_image": 1.0, "edited_caption_prefers_edited_image": 1.0}
    assert figures["edit_cosine"] == pytest.approx(0.0, abs=1e-6) and figures["n"] == 2


def test_the_provenance_shortcut_shows_as_edited_captions_preferring_real_images():
    """Edited images pushed away from every caption: both captions prefer the real image."""
    u = unit([1, 0, 0], [1, 0, 0])
    v = unit([1, 0.2, 0], [1, 0.2, 0])
    v_edit = unit([1, -0.2, 0], [1, -0.2, 0])  # the edit's caption, close to the real image too
    u_edit = unit([0, 0, 1], [0.5, -0.1, 1])  # edited images far from both
    figures = provenance_preferences(u, v, u_edit, v_edit)
    assert figures["real_caption_prefers_real_image"] == 1.0
    assert figures["edited_caption_prefers_edited_image"] == 0.0
    expected = float(((u * u_edit).sum(-1)).mean())
    assert figures["edit_cosine"] == pytest.approx(expected)


def test_rows_without_a_valid_edit_are_left_out():
    u, v = unit([1, 0], [1, 0], [0, 1]), unit([1, 0.1], [1, 0.1], [0, 1])
    u_edit, v_edit = unit([0, 1], [1, 0], [0, 1]), unit([0.1, 1], [1, 0.1], [0, 1])
    everything = provenance_preferences(u, v, u_edit, v_edit)
    first = provenance_preferences(u, v, u_edit, v_edit, valid=torch.tensor([True, False, False]))
    assert first["n"] == 1 and first["edited_image_prefers_edited_caption"] == 1.0
    assert everything["n"] == 3 and everything["edited_image_prefers_edited_caption"] == pytest.approx(1 / 3)
    none = provenance_preferences(u, v, u_edit, v_edit, valid=torch.zeros(3, dtype=torch.bool))
    assert none["n"] == 0 and np.isnan(none["edit_cosine"])


def test_rank_auc_equals_scikit_learn_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=200).astype(float)  # many ties
    labels = rng.random(200) < 0.4
    assert rank_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))
    with pytest.raises(ValueError, match="both classes"):
        rank_auc(scores, np.zeros(200, dtype=bool))


def test_the_probe_separates_a_provenance_offset_and_not_a_relabelled_copy():
    generator = torch.Generator().manual_seed(0)
    real = F.normalize(torch.randn(400, 16, generator=generator), dim=-1)
    offset = torch.zeros(16)
    offset[3] = 1.5  # every edit moves along one direction: provenance is linearly readable
    edited = F.normalize(real + offset, dim=-1)
    assert real_vs_edited_auc(real[:200], edited[:200], real[200:], edited[200:]) > 0.9
    same = F.normalize(torch.randn(400, 16, generator=generator), dim=-1)  # "edits" drawn as real ones are
    auc = real_vs_edited_auc(real[:200], same[:200], real[200:], same[200:])
    assert 0.35 < auc < 0.65
