"""Binding benchmarks made from scene graphs, in the SugarCrepe families.

Each item edits one factor of a scene and gives both sides of the change: the negative
caption (the positive's words with the edit) and the negative scene, which renders with
the positive's noise and clutter, so only the edited factor differs in pixels.

Families:
- replace_attribute: one object's colour becomes a colour not in the scene;
- replace_object: one object's shape becomes a shape not in the scene;
- replace_relation: a stated relation becomes another one (the pair is re-arranged about
  its midpoint, keeping its distances);
- swap_attribute: two objects exchange colours;
- swap_object: two objects exchange shapes, colours stay in place;
- swap_relation (two-object scenes): the objects exchange places; the caption's noun
  phrases trade slots ("A left of B" -> "B left of A").
"""

from __future__ import annotations

import numpy as np

from lace.data.world.captions import CocoPlan, draw_coco_plan, realise_coco
from lace.data.world.config import INVERSE_RELATION, WorldConfig
from lace.data.world.scene import AXES, center_range, layout_is_valid, set_center, stated_relations

FAMILIES = (
    "replace_attribute",
    "replace_object",
    "replace_relation",
    "swap_attribute",
    "swap_object",
    "swap_relation",
)
SWAP_FAMILIES = ("swap_attribute", "swap_object", "swap_relation")


def _replacements(objects: list[dict], field: str, values: tuple[str, ...]) -> list[dict]:
    """Each object's `field` replaced by every value no object in the scene has."""
    used = {o[field] for o in objects}
    return [
        {"object": i, "field": field, "from": o[field], "to": value}
        for i, o in enumerate(objects)
        for value in values
        if value not in used
    ]


def candidate_edits(scene: dict, family: str, config: WorldConfig) -> list[dict]:
    """Every edit of `family` that applies to `scene`, as JSON-ready dicts."""
    objects = scene["objects"]
    n = len(objects)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if family == "replace_attribute":
        return _replacements(objects, "colour", config.colours)
    if family == "replace_object":
        return _replacements(objects, "shape", config.shapes)
    if family == "replace_relation":
        return [
            {"relation": k, "field": "relation", "from": r["relation"], "to": other}
            for k, r in enumerate(scene["relations"])
            for other in config.relations
            if other != r["relation"]
        ]
    if family in ("swap_attribute", "swap_object"):
        field = "colour" if family == "swap_attribute" else "shape"
        return [{"objects": [i, j], "field": field} for i, j in pairs]
    if family == "swap_relation":
        return [{"objects": [0, 1], "field": "center"}] if n == 2 else []
    raise ValueError(f"unknown benchmark family {family!r}; expected one of {FAMILIES}")


def _rearrange_pair(scene: dict, k: int, target: str, config: WorldConfig) -> None:
    """Move relation k's two objects about their midpoint so that the relation reads `target`."""
    relation = scene["relations"][k]
    a, b = scene["objects"][relation["subject"]], scene["objects"][relation["object"]]
    axis, _ = AXES[relation["relation"]]
    offset = [b["center"][0] - a["center"][0], b["center"][1] - a["center"][1]]
    distance, minor = abs(offset[axis]), offset[1 - axis]
    new_axis, sign = AXES[target]
    new_offset = [0.0, 0.0]
    new_offset[new_axis] = sign * distance
    new_offset[1 - new_axis] = minor
    mid = [(a["center"][d] + b["center"][d]) / 2 for d in (0, 1)]
    low, high = center_range(config)
    shift = []
    for d in (0, 1):
        lo, hi = sorted((mid[d] - new_offset[d] / 2, mid[d] + new_offset[d] / 2))
        # Slide the pair back onto the canvas if the turn pushed it over an edge.
        shift.append(max(low - lo, 0.0) + min(high - hi, 0.0))
    set_center(a, mid[0] - new_offset[0] / 2 + shift[0], mid[1] - new_offset[1] / 2 + shift[1])
    set_center(b, mid[0] + new_offset[0] / 2 + shift[0], mid[1] + new_offset[1] / 2 + shift[1])


def copy_scene(scene: dict) -> dict:
    """A copy whose objects and relations can be edited without touching `scene`."""
    objects = [
        {
            **obj,
            "center": list(obj["center"]),
            "bbox": list(obj["bbox"]),
            "shade": list(obj["shade"]),
        }
        for obj in scene["objects"]
    ]
    return {**scene, "objects": objects, "relations": [dict(r) for r in scene["relations"]]}


def apply_edit(scene: dict, family: str, edit: dict, config: WorldConfig) -> dict | None:
    """The edited copy of `scene`, or None when the edit would break the layout or change more
    than the one stated relation."""
    edited = copy_scene(scene)
    objects = edited["objects"]
    if family in ("replace_attribute", "replace_object"):
        objects[edit["object"]][edit["field"]] = edit["to"]
    elif family in ("swap_attribute", "swap_object"):
        i, j = edit["objects"]
        field = edit["field"]
        objects[i][field], objects[j][field] = objects[j][field], objects[i][field]
    elif family == "swap_relation":
        i, j = edit["objects"]
        ci, cj = objects[i]["center"], objects[j]["center"]
        set_center(objects[i], *cj)
        set_center(objects[j], *ci)
    elif family == "replace_relation":
        _rearrange_pair(edited, edit["relation"], edit["to"], config)
    relations = stated_relations(objects)
    expected = [dict(r) for r in scene["relations"]]
    if family == "replace_relation":
        expected[edit["relation"]]["relation"] = edit["to"]
    elif family == "swap_relation":
        for stated in expected:  # a two-object scene's one relation turns round
            stated["relation"] = INVERSE_RELATION[stated["relation"]]
    if not layout_is_valid(objects, config) or relations != expected:
        return None
    edited["relations"] = relations
    return edited


def benchmark_items(
    scene: dict,
    rng: np.random.Generator,
    config: WorldConfig,
    families: tuple[str, ...] = FAMILIES,
) -> list[dict]:
    """Up to `config.benchmark_items_per_family` binding items per family for one scene.

    Each item: {"family", "edit", "caption", "negative_caption", "negative_scene"}. The caption
    describes `scene`, the negative caption describes `negative_scene`, and the two captions
    come from one plan, so they differ only in the edited words.
    """
    items = []
    n_objects = len(scene["objects"])
    for family in families:
        candidates = candidate_edits(scene, family, config)
        kept = 0
        for k in rng.permutation(len(candidates)):
            if kept == config.benchmark_items_per_family:
                break
            negative_scene = apply_edit(scene, family, candidates[int(k)], config)
            if negative_scene is None:
                continue
            plan: CocoPlan = draw_coco_plan(rng, n_objects, config)
            negative_plan = plan.flipped() if family == "swap_relation" else plan
            items.append(
                {
                    "family": family,
                    "edit": candidates[int(k)],
                    "caption": realise_coco(plan, scene),
                    "negative_caption": realise_coco(negative_plan, negative_scene),
                    "negative_scene": negative_scene,
                }
            )
            kept += 1
    return items


def winoground_item(scene: dict, items: list[dict], rng: np.random.Generator) -> dict | None:
    """Pick one swap item of the scene: both captions use the same words, bound differently."""
    swaps = [item for item in items if item["family"] in SWAP_FAMILIES]
    if not swaps:
        return None
    families = sorted({item["family"] for item in swaps})
    family = families[int(rng.integers(len(families)))]
    return next(item for item in swaps if item["family"] == family)
