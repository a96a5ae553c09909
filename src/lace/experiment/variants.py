"""Named training variants, each a delta on a `TrainConfig`: the one table every experiment uses.

Adding a training arm is one entry here. A delta maps `TrainConfig` keys (the fields of its `arm` part, by the
names YAML takes for them) to values; a nested config (the editor's `edit`) takes a mapping of its own fields,
merged over the base's (`lace.config.with_changes`).
"""

from __future__ import annotations

from typing import Any

from lace.config import with_changes
from lace.errors import input_error

METHOD_EDITS = ("attenuate", "swap", "transplant")

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    # the text-only baseline: rule-made caption edits (NegCLIP style) as image->text negatives
    "caption negatives": {"caption_negatives": True},
    "LACE": {"counterfactual_captions": True, "counterfactual_images": True},
    "LACE + caption negatives": {"counterfactual_captions": True, "counterfactual_images": True,
                                 "caption_negatives": True},
    "LACE captions only": {"counterfactual_captions": True},
    "LACE images only": {"counterfactual_images": True},
    "LACE without rebind": {"counterfactual_captions": True, "counterfactual_images": True,
                            "edit": {"kinds": METHOD_EDITS}},
    # does the dictionary earn its place: the same edits moved along plain concept directions
    "concept-arithmetic negatives": {"counterfactual_captions": True, "counterfactual_images": True,
                                     "counterfactual_source": "concept_arithmetic"},
    # AHNPL-style: each rule-made caption's change moved onto the image, as a text->image negative
    "paired-caption directions": {"paired_caption_directions": True},
    # edits inside the image tower (lace.local): binding swaps and transplants at local_layer
    "LACE-local": {"local_image_negatives": True},
    "LACE-local + caption negatives": {"local_image_negatives": True, "caption_negatives": True},
    "LACE-local + caption swaps": {"local_image_negatives": True, "local_caption_swaps": True},
    # the pairs layout (TripletCLIP's): each edit a row of its own, positive with the caption it describes
    "LACE-local pairs": {"local_image_negatives": True, "edited_image_rows": True, "edited_image_columns": False},
    "LACE-local pairs + column": {"local_image_negatives": True, "edited_image_rows": True},
    "LACE-local pairs + caption negatives": {"local_image_negatives": True, "edited_image_rows": True,
                                             "edited_image_columns": False, "caption_negatives": True},
    "LACE-local pairs + column + caption negatives": {"local_image_negatives": True, "edited_image_rows": True,
                                                      "caption_negatives": True},
    # the pairs layout as validation chose it (docs/results.md): the described caption also rejects the real image
    "LACE-local pairs + real-image negative": {"local_image_negatives": True, "edited_image_rows": True,
                                               "edited_rows_real_image_negative": True},
    "LACE-local pairs + real-image negative + caption negatives": {
        "local_image_negatives": True, "edited_image_rows": True, "edited_rows_real_image_negative": True,
        "caption_negatives": True},
    # the same with the learnt operator (lace.local.learnt): the ridge's change plus a network trained also
    # against a real-vs-edited discriminator at the layer
    "LACE-local learnt pairs + real-image negative": {
        "local_image_negatives": True, "edited_image_rows": True, "edited_rows_real_image_negative": True,
        "local": {"operator": "learnt"}},
    # the same, image side only: the edits' rows train the image tower, the captions enter them as constants
    "LACE-local image-side pairs": {"local_image_negatives": True, "edited_image_rows": True,
                                     "edited_rows_real_image_negative": True, "edited_rows_train_text": False},
    "LACE-local image-side pairs + caption negatives": {
        "local_image_negatives": True, "edited_image_rows": True, "edited_rows_real_image_negative": True,
        "edited_rows_train_text": False, "caption_negatives": True},
    # artefact symmetry (lace.local.symmetric): the chosen pairs arm with the real image, wherever the loss compares
    # it with an edit, replaced by a counterpart made through the same operator path
    "LACE-local symmetric pairs (round trip)": {
        "local_image_negatives": True, "edited_image_rows": True, "edited_rows_real_image_negative": True,
        "local": {"symmetric": "round_trip"}},
    "LACE-local symmetric pairs (round trip) + caption negatives": {
        "local_image_negatives": True, "edited_image_rows": True, "edited_rows_real_image_negative": True,
        "local": {"symmetric": "round_trip"}, "caption_negatives": True},
    # both fixes together: the round-trip counterpart made by the learnt operator
    "LACE-local learnt symmetric pairs (round trip)": {
        "local_image_negatives": True, "edited_image_rows": True, "edited_rows_real_image_negative": True,
        "local": {"symmetric": "round_trip", "operator": "learnt"}},
    "LACE-local symmetric pairs (nuisance)": {
        "local_image_negatives": True, "edited_image_rows": True, "edited_rows_real_image_negative": True,
        "local": {"symmetric": "nuisance"}},
    "LACE-local symmetric pairs (no-op)": {
        "local_image_negatives": True, "edited_image_rows": True, "edited_rows_real_image_negative": True,
        "local": {"symmetric": "no_op"}},
    "LACE pairs": {"counterfactual_captions": True, "counterfactual_images": True, "edited_image_rows": True},
    # shapes world only: the renderer's real colour-swapped image of each training scene
    "ceiling (rendered swaps)": {"rendered_negatives": True},
    "ceiling pairs": {"rendered_negatives": True, "edited_image_rows": True, "edited_image_columns": False},
}

ROLES: dict[str, tuple[str, ...]] = {
    "plain": ("plain",),
    "text_only": ("caption negatives",),
    "as_specified": ("LACE",),
    "best": ("LACE-local", "LACE-local pairs", "LACE-local pairs + column", "LACE-local pairs + real-image negative",
             "LACE-local image-side pairs", "LACE pairs", "LACE-local symmetric pairs (round trip)",
             "LACE-local symmetric pairs (nuisance)", "LACE-local symmetric pairs (no-op)",
             "LACE-local learnt pairs + real-image negative",
             "LACE-local learnt symmetric pairs (round trip)"),
    "ceiling": ("ceiling (rendered swaps)", "ceiling pairs"),
}
"""The part arms play in the targets (`lace.experiment.claims`), role -> the arms that can play it: plain, the
text-only baseline, LACE as the method specifies it, the LACE arms the best is chosen from on validation, and the
ceilings. Reports pick arms by role, never by a piece of their name."""

CHOSEN_BEST = "LACE-local symmetric pairs (round trip)"
"""The arm of `ROLES["best"]` that validation chose (docs/results.md, "Realistic counterfactuals";
docs/realistic-draws.md: 2 base draws x 3 seeds): the best LACE arm a report runs when it runs one only."""

ROLE_NAMES = {"plain": "plain", "text_only": "caption negatives", "as_specified": "LACE",
              "best": "the best LACE arm", "ceiling": "the ceiling",
              "best_with_text_only": "the best LACE arm + caption negatives"}
"""How a target names a role whose arm did not run."""


def with_caption_negatives(name: str) -> str | None:
    """The variant that is `name` with rule-made caption negatives added, or None."""
    wanted = {**VARIANTS[name], "caption_negatives": True}
    return next((other for other, changes in VARIANTS.items() if changes == wanted and other != name), None)


def variant_config(base: Any, name: str) -> Any:
    """The `TrainConfig` (or any config with the same fields) of variant `name` from `base`."""
    if name not in VARIANTS:
        raise input_error("variants", "name", f"one of {list(VARIANTS)}", name)
    return with_changes(base, VARIANTS[name])


def uses_rendered(name: str) -> bool:
    """Whether variant `name` needs the world's rendered counterfactuals."""
    return bool(VARIANTS[name].get("rendered_negatives"))


def uses_local(name: str) -> bool:
    """Whether variant `name` makes negatives inside the towers (`lace.local`)."""
    return bool(VARIANTS[name].get("local_image_negatives") or VARIANTS[name].get("local_caption_swaps"))


def uses_counterfactuals(name: str) -> bool:
    """Whether variant `name` trains with counterfactual embeddings (needs an editor)."""
    changes = VARIANTS[name]
    return bool(changes.get("counterfactual_captions") or changes.get("counterfactual_images"))


def negative_sources(name: str) -> int:
    """How many kinds of negatives variant `name` makes each step (plain: 0): a rough order of its cost a step,
    so that runs side by side can start the costliest first."""
    return sum(value is True for value in VARIANTS[name].values())


def check_variants(names, where: str, field: str = "variants") -> None:
    """Refuse names that are not in `VARIANTS`."""
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise input_error(where, field, f"names from {list(VARIANTS)}", unknown)
