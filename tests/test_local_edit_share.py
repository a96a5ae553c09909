"""LACE-local editing a share of each micro-batch's rows (`LocalEditConfig.edit_share`): the first rows are edited as
a whole-batch pass edits them, the others get no local negative, and a training run's valid rows follow the share."""

import copy
import json

import pytest
import torch

from lace.config import with_changes
from lace.errors import LaceInputError
from lace.experiment.variants import variant_config
from lace.local import LocalEditConfig
from lace.local.editor import EditSlots, fit_local_editor
from lace.local.reader import PositionConceptReader
from lace.local.transport import GaussianTransport
from lace.train import train
from lace.train.local_arm import LocalImagePass, edited_rows
from tests.test_local_edits import _world_batch
from tests.test_train_arms import _local_config


def test_edited_rows_is_the_share_rounded_up_and_at_least_one():
    assert edited_rows(128, 1.0) == 128
    assert edited_rows(128, 0.25) == 32
    assert edited_rows(10, 0.25) == 3
    assert edited_rows(3, 0.01) == 1


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_zero_to_one_is_refused_by_name(share):
    with pytest.raises(LaceInputError, match="edit_share"):
        LocalEditConfig(edit_share=share).validate()


def _row_steps(features, grid, n_edits, objects, generator=None):
    """Large edits that depend on each row's own features only (the same whichever rows share its batch)."""
    steps = torch.stack([(slot + 1.0) * 3 * torch.sin(features.detach() * (slot + 2)) for slot in range(n_edits)], 1)
    rows = torch.arange(features.shape[0])
    changes = torch.stack([rows % 4, (rows + 1) % 4], dim=1)[:, None].expand(-1, n_edits, -1)
    return EditSlots(steps, torch.ones(features.shape[0], n_edits, dtype=torch.bool), ["swap"] * n_edits, changes)


def test_a_share_edits_the_first_rows_as_a_whole_batch_pass_does_and_leaves_the_others_out(resnet):
    pixels, captions, vocabulary = _world_batch(24)
    editor = fit_local_editor(resnet.model, pixels, captions, vocabulary, "layer1",
                              transport=GaussianTransport(n_buckets=1, window=1, min_positions=1),
                              reader=PositionConceptReader(steps=20))
    editor.steps = _row_steps
    every, share = copy.deepcopy(resnet).train(), copy.deepcopy(resnet).train()
    whole = LocalImagePass(editor, every.model, 2, list(range(8)))
    part = LocalImagePass(editor, share.model, 2, list(range(8)), edit_share=0.25)  # the first two rows
    U_whole, U_part = whole(pixels[:8]), part(pixels[:8])
    torch.testing.assert_close(U_part, U_whole)  # the unedited embeddings do not depend on the share
    assert part.negatives.shape == whole.negatives.shape == (8, 2, resnet.embed_dim)
    assert (whole.negatives[:2] - U_whole[:2, None]).norm(dim=-1).min() > 0.01  # the edits changed something
    torch.testing.assert_close(part.negatives[:2], whole.negatives[:2])
    assert part.valid[:2].all() and not part.valid[2:].any()
    assert (part.negatives[2:] == 0).all()
    assert part.changes[:2] == whole.changes[:2]
    assert part.changes[2:] == [[None, None]] * 6


@pytest.fixture(scope="module")
def world(shapes_world):
    """The session's 48-scene shapes world (read only)."""
    return shapes_world


@pytest.mark.slow
def test_the_arm_that_ships_trains_with_half_its_rows_edited(world, tmp_path):
    config = variant_config(_local_config(world, tmp_path), "LACE-local pairs + real-image negative")
    config = with_changes(config, {"steps": 2, "local": {"edit_share": 0.5}})
    train(config, progress=False)
    metrics = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    for figure in ("image_negatives_valid_rows", "pair_rows_valid"):
        assert all(0 < m[figure] <= 0.5 for m in metrics), (figure, metrics)
