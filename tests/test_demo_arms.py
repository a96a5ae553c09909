"""`lace demo --full` runs the pairs layout's arms, each keyed by what it reads."""

from dataclasses import replace

import pytest

from lace.config import with_changes
from lace.demo import DemoConfig
from lace.demo.config import CORE_VARIANTS, DEMO_FINETUNE, FULL_VARIANTS
from lace.demo.pipeline import _own_keys
from lace.errors import LaceInputError
from lace.experiment.variants import (
    CHOSEN_BEST,
    ROLES,
    VARIANTS,
    uses_rendered,
    variant_config,
    with_caption_negatives,
)

PAIRS_ARMS = ("LACE-local pairs", "LACE-local pairs + column", "LACE-local pairs + caption negatives", "ceiling pairs")


def test_the_full_demo_runs_the_pairs_arms_and_the_default_demo_does_not():
    full = DemoConfig(full=True).variants
    assert set(PAIRS_ARMS) <= set(full) and len(set(full)) == len(full)
    assert DemoConfig().variants == CORE_VARIANTS
    # the default's arms by role: plain, the text-only baseline, LACE as specified, the best LACE arm validation
    # chose (one of the arms that can play it) and that arm with caption negatives
    plain, text_only, as_specified, best, best_with_captions = CORE_VARIANTS
    assert (plain, text_only, as_specified) == (ROLES["plain"][0], ROLES["text_only"][0], ROLES["as_specified"][0])
    assert best == CHOSEN_BEST in ROLES["best"] and best_with_captions == with_caption_negatives(best)
    assert variant_config(DEMO_FINETUNE.train_config(), best_with_captions).arm.caption_negatives
    assert not set(CORE_VARIANTS) & set(FULL_VARIANTS) and "LACE + caption negatives" in full
    for arm in PAIRS_ARMS:
        trained = variant_config(DEMO_FINETUNE.train_config(), arm)
        assert trained.arm.edited_image_rows and trained.arm.edited_image_columns == (arm == "LACE-local pairs + column")
        with_changes(trained, {"vocabulary": "vocabulary.yaml"}).validate()  # the demo gives every fine-tune its vocabulary


def test_the_demo_sets_the_pairs_switches_and_leaves_their_weight_a_knob():
    with pytest.raises(LaceInputError, match="edited_image_rows"):
        DemoConfig(finetune=with_changes(DEMO_FINETUNE, {"edited_image_rows": True}))
    with pytest.raises(LaceInputError, match="edited_image_columns"):
        DemoConfig(finetune=with_changes(DEMO_FINETUNE, {"edited_image_columns": False}))
    assert DemoConfig(finetune=with_changes(DEMO_FINETUNE, {"edited_rows_weight": 0.5})).finetune.negatives.edited_rows_weight == 0.5


def test_the_local_pairs_arms_are_keyed_by_the_local_editor_and_the_ceiling_pairs_read_the_renderings():
    config = DemoConfig(full=True)
    other = replace(config, finetune=with_changes(config.finetune, {"local": replace(config.finetune.negatives.local, n_edits=3)}))
    for arm in PAIRS_ARMS[:3]:
        assert _own_keys(config, arm, "lace") != _own_keys(other, arm, "lace")
    assert _own_keys(config, "ceiling pairs", "lace") == _own_keys(other, "ceiling pairs", "lace") == [None]
    assert uses_rendered("ceiling pairs") and not any(uses_rendered(arm) for arm in PAIRS_ARMS[:3])


def test_every_variant_can_be_named_in_a_comma_separated_flag():
    """`--only-variants` and `--arms` split on commas, so no arm's name may hold one."""
    from lace.cli import main

    assert not [name for name in VARIANTS if "," in name]
    assert main(["demo", "--only-variants", "plain,no such arm", "--out", "unused"]) == 2
