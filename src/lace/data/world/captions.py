"""Captions from a small grammar, in two styles.

- `coco`: names every object with its colour (often size and texture) and every stated
  relation, in varied phrasing: "a large striped red square to the left of a blue circle".
- `web`: partial, like alt text: objects and attributes mentioned at random, in random
  order, relation words only sometimes, and now and then a wrong colour word.

COCO-like captions are drawn as a `CocoPlan` (every random choice) and then realised on a
scene, so that one plan realised on a scene and on its edited copy gives two captions that
differ only in the edited words. Binding benchmarks rely on that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from lace.data.world.config import INVERSE_RELATION, WorldConfig
from lace.errors import input_error

RELATION_PHRASES = {
    "left of": ("to the left of", "left of", "on the left of"),
    "right of": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}
PAIR_TEMPLATES = (
    "{a} {rel} {b}",
    "{a} is {rel} {b}",
    "there is {a} {rel} {b}",
    "{a} placed {rel} {b}",
)
SINGLE_TEMPLATES = ("{a}", "there is {a}", "{a} on a grey background", "a picture of {a}")
WEB_PREFIXES = ("picture of ", "image of ", "a photo of ", "stock image ")
WEB_JOINERS = (" and ", ", ", " ", " with ")


def _pick(options: tuple[str, ...], fraction: float) -> str:
    """Choose by a uniform number in [0, 1), so one draw serves option lists of any length."""
    return options[min(int(fraction * len(options)), len(options) - 1)]


def with_article(words: list[str]) -> str:
    article = "an" if words[0][0] in "aeiou" else "a"
    return " ".join([article, *words])


def noun_phrase(obj: dict, name_size: bool, name_texture: bool, colour: str | None = None) -> str:
    """'a large striped red square': article, optional size and texture, colour, shape."""
    words = ([obj["size"]] if name_size else []) + ([obj["texture"]] if name_texture else [])
    words += [colour or obj["colour"], obj["shape"]]
    return with_article(words)


@dataclass(frozen=True)
class CocoPlan:
    """Every random choice of one COCO-like caption, independent of the scene's content."""

    template: float
    """Uniform number choosing the sentence template."""
    inverse: bool
    """Two-object scenes: state the relation from object 1 to object 0 ("B right of A")."""
    name_size: tuple[bool, ...]
    """Per object index: whether its size word appears."""
    name_texture: tuple[bool, ...]
    """Per object index: whether its texture word appears."""
    relation_forms: tuple[float, ...]
    """Per stated relation: uniform number choosing its surface form."""

    def flipped(self) -> CocoPlan:
        """The same plan read from the other object: 'A left of B' becomes 'B right of A'."""
        return replace(self, inverse=not self.inverse)


def draw_coco_plan(rng: np.random.Generator, n_objects: int, config: WorldConfig) -> CocoPlan:
    """Draw a plan; the number of draws depends only on `n_objects`."""
    return CocoPlan(
        template=float(rng.random()),
        inverse=bool(rng.random() < 0.5) and n_objects == 2,
        name_size=tuple(bool(v) for v in rng.random(n_objects) < config.coco_size_prob),
        name_texture=tuple(bool(v) for v in rng.random(n_objects) < config.coco_texture_prob),
        relation_forms=tuple(float(v) for v in rng.random(max(n_objects - 1, 0))),
    )


def realise_coco(plan: CocoPlan, scene: dict) -> str:
    """Write the caption `plan` describes for `scene`."""
    objects = scene["objects"]
    phrases = [
        noun_phrase(o, plan.name_size[i], plan.name_texture[i]) for i, o in enumerate(objects)
    ]
    if len(objects) == 1:
        return _pick(SINGLE_TEMPLATES, plan.template).format(a=phrases[0])
    first, *rest = scene["relations"]
    subject, relation, target = first["subject"], first["relation"], first["object"]
    if plan.inverse:
        subject, relation, target = target, INVERSE_RELATION[relation], subject
    text = _pick(PAIR_TEMPLATES, plan.template).format(
        a=phrases[subject],
        rel=_pick(RELATION_PHRASES[relation], plan.relation_forms[0]),
        b=phrases[target],
    )
    # Longer chains hang each next object off the one just named: "..., which is above a ...".
    for k, stated in enumerate(rest, start=1):
        rel = _pick(RELATION_PHRASES[stated["relation"]], plan.relation_forms[k])
        text += f", which is {rel} {phrases[stated['object']]}"
    return text


def web_caption(scene: dict, rng: np.random.Generator, config: WorldConfig) -> str:
    """A partial, noisy caption: what a scraped alt text might say about the scene."""
    objects = scene["objects"]
    mentioned = [i for i in range(len(objects)) if rng.random() < config.web_object_prob]
    if not mentioned:
        mentioned = [int(rng.integers(len(objects)))]
    phrases = {}
    for i in mentioned:
        obj = objects[i]
        words = []
        if rng.random() < config.web_size_prob:
            words.append(obj["size"])
        if rng.random() < config.web_texture_prob:
            words.append(obj["texture"])
        if rng.random() < config.web_colour_prob:
            colour = obj["colour"]
            if rng.random() < config.web_colour_noise:
                wrong = [c for c in config.colours if c != colour]
                colour = wrong[int(rng.integers(len(wrong)))]
            words.append(colour)
        words.append(obj["shape"])
        phrases[i] = with_article(words) if rng.random() < 0.5 else " ".join(words)
    related = [r for r in scene["relations"] if r["subject"] in phrases and r["object"] in phrases]
    parts: list[str] = []
    if related and rng.random() < config.web_relation_prob:
        stated = related[int(rng.integers(len(related)))]
        subject, relation, target = stated["subject"], stated["relation"], stated["object"]
        if rng.random() < 0.5:
            subject, relation, target = target, INVERSE_RELATION[relation], subject
        rel = _pick(RELATION_PHRASES[relation], float(rng.random()))
        parts.append(f"{phrases.pop(subject)} {rel} {phrases.pop(target)}")
    rest = list(phrases.values())
    parts += [rest[k] for k in rng.permutation(len(rest))]
    parts = [parts[k] for k in rng.permutation(len(parts))]
    text = _pick(WEB_JOINERS, float(rng.random())).join(parts)
    if rng.random() < 0.2:
        text = _pick(WEB_PREFIXES, float(rng.random())) + text
    return text


def caption_scene(scene: dict, rng: np.random.Generator, style: str, config: WorldConfig) -> str:
    """One caption of `scene` in `style` ("web" or "coco"), drawn from `rng`."""
    if style == "coco":
        return realise_coco(draw_coco_plan(rng, len(scene["objects"]), config), scene)
    if style == "web":
        return web_caption(scene, rng, config)
    raise input_error("caption_scene", "style", "'web' or 'coco'", style)


def caption_tokens(caption: str) -> list[str]:
    """Lower-case word tokens, as the Karpathy split files list them."""
    return re.findall(r"[a-z0-9]+", caption.lower())
