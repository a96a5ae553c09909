"""Bound concepts and the rebind edit, on a world whose embeddings carry a binding term.

Each embedding is the sum, over its objects, of an attribute vector, an object vector and
an attribute-object interaction vector, plus a modality offset and noise: "red square +
blue circle" and "blue square + red circle" differ only in their interaction terms, which
is exactly what a bag-of-concepts edit cannot reach.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import yaml

from lace.cli import main
from lace.concepts.bindings import (
    BindingDirections,
    BindingMatcher,
    binding_directions,
    load_bindings,
)
from lace.concepts.directions import directions_from_captions
from lace.concepts.labelled import (
    LabelledDictionary,
    load_labelled_dictionary,
    save_labelled_dictionary,
)
from lace.concepts.labelling import label_atoms
from lace.concepts.vocabulary import vocabulary_from_dict
from lace.data.world.captions import CocoPlan, realise_coco
from lace.dictionary import ConceptDictionary
from lace.edits import EDIT_KINDS, CounterfactualEditor, EditConfig
from lace.errors import LaceInputError
from lace.train.config import train_config
from lace.train.editor import run_editor
from tests.toy_concepts import write_store

VOCABULARY = {
    "name": "bound",
    "objects": ["circle", "square", "star", "heart"],
    "attributes": {"colour": ["red", "blue", "green", "yellow"], "size": ["small", "large"],
                   "texture": ["striped", "dotted"]},
    "relations": ["left of"],
}
OBJECTS, COLOURS = VOCABULARY["objects"], VOCABULARY["attributes"]["colour"]
DIM = 48
REBIND = EDIT_KINDS.index("rebind")


class BoundWorld:
    """Embeddings = offset + sum over objects of (colour + object + interaction) + noise."""

    def __init__(self, seed: int = 0, interaction: float = 0.8, noise: float = 0.02):
        generator = torch.Generator().manual_seed(seed)
        self.vocabulary = vocabulary_from_dict(VOCABULARY)
        basis = torch.randn(len(self.vocabulary) + 1, DIM, generator=generator) / DIM**0.5
        self.main = {concept.name: basis[i] for i, concept in enumerate(self.vocabulary.concepts)}
        self.interaction = {(a, o): interaction * torch.randn(DIM, generator=generator) / DIM**0.5
                            for a in COLOURS for o in OBJECTS}
        self.offset = {"image": 1.5 * basis[-1], "text": -1.5 * basis[-1]}
        self.noise = noise
        self.generator = generator

    def embed(self, scene: tuple[tuple[str, ...], ...], modality: str) -> torch.Tensor:
        """(d,) unit embedding of a scene given as ((colour, object[, size]), ...)."""
        vector = self.offset[modality].clone()
        for colour, obj, *size in scene:
            vector += self.main[colour] + self.main[obj] + self.interaction[(colour, obj)]
            vector += sum((self.main[word] for word in size), torch.zeros(DIM))
        vector += self.noise * torch.randn(DIM, generator=self.generator)
        return vector / vector.norm()

    def random_scenes(self, n: int) -> list[tuple[tuple[str, str, str], tuple[str, str, str]]]:
        """Two objects of different shapes and colours, each small or large."""
        sizes = VOCABULARY["attributes"]["size"]
        scenes = []
        for _ in range(n):
            objects = torch.randperm(len(OBJECTS), generator=self.generator)[:2].tolist()
            colours = torch.randperm(len(COLOURS), generator=self.generator)[:2].tolist()
            size = torch.randint(len(sizes), (2,), generator=self.generator).tolist()
            scenes.append(tuple((COLOURS[colours[i]], OBJECTS[objects[i]], sizes[size[i]]) for i in range(2)))
        return scenes


@pytest.fixture(scope="module")
def world():
    torch.manual_seed(0)
    world = BoundWorld()
    scenes = world.random_scenes(1200)
    texts = torch.stack([world.embed(scene, "text") for scene in scenes])
    images = torch.stack([world.embed(scene, "image") for scene in scenes])
    captions = [f"a {s1} striped {a1} {o1} to the left of a {s2} {a2} {o2}" for (a1, o1, s1), (a2, o2, s2) in scenes]
    directions = directions_from_captions(world.vocabulary, captions, texts)
    dictionary = ConceptDictionary(mode="vocabulary", directions=directions, sparsity=6).fit(images, texts)
    labelling = label_atoms(dictionary, directions, images, texts)
    bindings = binding_directions(world.vocabulary, captions, texts, groups=["colour"])
    return SimpleNamespace(world=world, captions=captions, texts=texts, images=images, directions=directions,
                           dictionary=dictionary, labelling=labelling, bindings=bindings)


def _editor(w, bindings=None, **options) -> CounterfactualEditor:
    return CounterfactualEditor(w.dictionary, w.labelling, w.directions, EditConfig(**options), bindings)


def _scene_batch(w, scene, n: int = 16, modality: str = "image") -> torch.Tensor:
    return torch.stack([w.world.embed(scene, modality) for _ in range(n)])


def _named(vocabulary, pairs: set[tuple[int, int]]) -> set[tuple[str, str]]:
    return {(vocabulary.concepts[a].name, vocabulary.concepts[o].name) for a, o in pairs}


def test_phrase_matching_binds_each_attribute_to_its_own_noun():
    vocabulary = vocabulary_from_dict(VOCABULARY)
    matcher = BindingMatcher(vocabulary)
    found = _named(vocabulary, matcher.bindings("a large striped red square to the left of a small blue circle"))
    assert found == {("large", "square"), ("striped", "square"), ("red", "square"),
                     ("small", "circle"), ("blue", "circle")}
    assert ("red", "circle") not in found and ("blue", "square") not in found
    # plurals, a same-group word in between, an attribute cut off by another word
    assert _named(vocabulary, matcher.bindings("two red squares")) == {("red", "square")}
    assert _named(vocabulary, matcher.bindings("a red blue star")) == {("blue", "star")}
    assert _named(vocabulary, matcher.bindings("a red and blue heart")) == {("blue", "heart")}
    assert _named(vocabulary, matcher.bindings("a square that is red")) == set()
    colour_only = BindingMatcher(vocabulary, groups=["colour"])
    assert _named(vocabulary, colour_only.bindings("a large red circle")) == {("red", "circle")}
    with pytest.raises(LaceInputError, match="groups"):
        BindingMatcher(vocabulary, groups=["weight"])


def test_shapes_world_captions_bind_as_the_scene_does():
    scene = {
        "objects": [{"shape": "square", "colour": "red", "size": "large", "texture": "striped"},
                    {"shape": "circle", "colour": "blue", "size": "small", "texture": "dotted"}],
        "relations": [{"subject": 0, "relation": "left of", "object": 1}],
    }
    vocabulary = vocabulary_from_dict(VOCABULARY)
    matcher = BindingMatcher(vocabulary)
    expected = {("large", "square"), ("striped", "square"), ("red", "square"),
                ("small", "circle"), ("dotted", "circle"), ("blue", "circle")}
    for template in (0.0, 0.3, 0.6, 0.9):
        for inverse in (False, True):
            plan = CocoPlan(template, inverse, (True, True), (True, True), (0.5,))
            caption = realise_coco(plan, scene)
            assert _named(vocabulary, matcher.bindings(caption)) == expected, caption


def test_binding_directions_recover_the_interaction(world):
    bindings = world.bindings
    assert bindings.groups == ["colour"] and len(bindings) == len(COLOURS) * len(OBJECTS)
    for direction in bindings.directions:
        norms = direction.norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms))

    # the binding contrast of the learned directions points along the true interaction contrast
    def contrast(term):
        return term("red", "square") + term("blue", "circle") - term("red", "circle") - term("blue", "square")

    learned = contrast(bindings.direction)
    truth = contrast(lambda a, o: world.world.interaction[(a, o)])
    assert torch.nn.functional.cosine_similarity(learned, truth, dim=0) > 0.85
    # without an interaction term the same contrast is only noise
    main_effects = contrast(lambda a, o: world.world.main[a] + world.world.main[o])
    assert main_effects.norm() < 1e-5


def test_rare_compounds_get_no_direction_and_bad_input_is_refused(world):
    captions = list(world.captions)
    captions[0] = "a green heart"
    rare = binding_directions(world.world.vocabulary, captions[:60], world.texts[:60], min_count=10)
    counts = torch.cat([c.flatten() for c in rare.counts])
    present = torch.cat([p.flatten() for p in rare.present])
    assert torch.equal(present, (counts >= 10) & (counts < 60))
    assert 0 < len(rare) < len(world.bindings)
    for a, attribute in enumerate(rare.attributes[0]):
        for o, obj in enumerate(rare.objects):
            assert (rare.direction(attribute, obj) is None) == (not bool(rare.present[0][a, o]))
    with pytest.raises(LaceInputError, match="one embedding per caption"):
        binding_directions(world.world.vocabulary, captions[:10], world.texts[:11])
    with pytest.raises(LaceInputError, match="binding"):
        binding_directions(world.world.vocabulary, ["a circle"] * 10, world.texts[:10])


def test_bindings_save_and_load_with_the_dictionary_folder(world, tmp_path):
    assert load_bindings(tmp_path) is None  # absent files: no bindings
    labelled = LabelledDictionary(world.dictionary, world.directions, world.labelling, world.bindings)
    save_labelled_dictionary(labelled, tmp_path)
    assert (tmp_path / "bindings.json").is_file() and (tmp_path / "binding_directions.safetensors").is_file()
    loaded = load_labelled_dictionary(tmp_path).bindings
    assert isinstance(loaded, BindingDirections)
    assert loaded.names() == world.bindings.names() and loaded.attributes == world.bindings.attributes
    for before, after in zip(world.bindings.directions, loaded.directions):
        torch.testing.assert_close(before, after)
    assert all(torch.equal(a, b) for a, b in zip(world.bindings.counts, loaded.counts))
    # the training editor picks them up from the folder and can rebind
    config = train_config(dictionary=str(tmp_path), edit=EditConfig(kinds=("swap", "rebind"))).validate()
    editor = run_editor(config, SimpleNamespace(embed_dim=DIM))
    assert editor.can_rebind and editor.config.kinds == ("swap", "rebind")
    with pytest.raises(LaceInputError, match="edit.*kinds"):
        train_config(edit=EditConfig(kinds=("bind",))).validate()


def test_rebind_moves_towards_the_rebound_scene(world):
    editor = _editor(world, bindings=world.bindings)
    original = _scene_batch(world, (("red", "square"), ("blue", "circle")))
    truth = _scene_batch(world, (("blue", "square"), ("red", "circle")))
    edited = editor.apply(original, "image", "rebind:red=blue")
    records = edited.records
    assert records.proposed.all() and records.passed_check.all() and edited.valid.all()
    assert (records.kind == REBIND).all()
    names = world.directions.names
    assert {names[i] for i in records.source.flatten().tolist()} == {"red"}
    assert {names[i] for i in records.target.flatten().tolist()} == {"blue"}
    # red was read as bound to the square, blue to the circle
    assert [names[i] for i in records.objects[0, 0].tolist()] == ["square", "circle"]
    row = records.to_dicts(editor.unit_names)[0]
    assert row["kind"] == "rebind" and row["objects"] == ["square", "circle"]
    # a rebind changes no concept weight
    torch.testing.assert_close(records.source_weight_after, records.source_weight_before)
    rebound = edited.embeddings[:, 0]
    before_truth = (original * truth).sum(-1)
    after_truth = (rebound * truth).sum(-1)
    assert (after_truth > before_truth).all()
    assert ((rebound * original).sum(-1) < 1 - 1e-3).all()
    assert after_truth.mean() - before_truth.mean() > 0.05
    # the same rebind named the other way round reads the same binding
    reverse = editor.apply(original, "image", "rebind:blue=red")
    assert [names[i] for i in reverse.records.objects[0, 0].tolist()] == ["circle", "square"]
    torch.testing.assert_close(reverse.embeddings, edited.embeddings, atol=1e-5, rtol=1e-5)


def test_rebind_of_text_embeddings_in_training_mode(world):
    editor = _editor(world, bindings=world.bindings, kinds=("rebind",))
    texts = world.texts[:100]
    edits = editor.counterfactuals(texts, "text", 3, torch.Generator().manual_seed(0))
    records = edits.records
    assert records.proposed.float().mean() > 0.9 and edits.valid[records.proposed].float().mean() > 0.9
    assert (records.kind[records.proposed] == REBIND).all()
    groups = world.directions.group_ids()
    attributes = records.proposed
    assert (groups[records.source[attributes]] == groups[records.target[attributes]]).all()
    assert (records.source[attributes] != records.target[attributes]).all()
    objects = records.objects[attributes]
    assert (objects[:, 0] != objects[:, 1]).all()
    assert {world.directions.kinds[i] for i in objects.flatten().tolist()} == {"object"}


def test_single_object_or_single_attribute_proposes_no_rebind(world):
    editor = _editor(world, bindings=world.bindings, kinds=("rebind",))
    one_object = _scene_batch(world, (("red", "square"),), 8)
    one_colour = _scene_batch(world, (("red", "square"), ("red", "circle")), 8)
    two_of_each = _scene_batch(world, (("red", "square"), ("blue", "circle")), 8)
    edits = editor.counterfactuals(torch.cat([one_object, one_colour, two_of_each]), "image", 2,
                                   torch.Generator().manual_seed(0))
    proposed = edits.records.proposed
    assert not proposed[:16].any() and proposed[16:].all()
    assert (edits.records.kind[:16] == -1).all()


def test_without_bindings_rebind_proposes_nothing_and_named_rebind_is_refused(world):
    editor = _editor(world, kinds=("rebind",))
    assert not editor.can_rebind
    edits = editor.counterfactuals(world.images[:20], "image", 2, torch.Generator().manual_seed(0))
    assert not edits.records.proposed.any() and not edits.valid.any()
    with pytest.raises(LaceInputError, match="binding directions"):
        editor.apply(world.images[:2], "image", "rebind:red=blue")
    with_bindings = _editor(world, bindings=world.bindings)
    with pytest.raises(LaceInputError, match="two attributes"):
        with_bindings.apply(world.images[:2], "image", "rebind:circle=square")
    with pytest.raises(LaceInputError, match="same type"):
        with_bindings.apply(world.images[:2], "image", "rebind:red=large")
    with pytest.raises(LaceInputError, match="rebind:source=target"):
        with_bindings.apply(world.images[:2], "image", "rebind:red")


def test_controls_have_the_same_step_sizes(world):
    editor = _editor(world, bindings=world.bindings, kinds=("rebind",))
    images = world.images[:64]
    edits = editor.counterfactuals(images, "image", 3, torch.Generator().manual_seed(3))
    random_edit = editor.random_control(images, "image", 3, torch.Generator().manual_seed(3))
    arithmetic = editor.concept_arithmetic(images, "image", 3, torch.Generator().manual_seed(3))
    for control in (random_edit, arithmetic):
        assert torch.equal(control.records.kind, edits.records.kind)
        assert torch.equal(control.valid, edits.valid)
        torch.testing.assert_close(control.records.step_size, edits.records.step_size)
    plan = editor._plan(images, "image", 3, torch.Generator().manual_seed(3))
    random_step = editor._control_step(plan, "random", torch.Generator().manual_seed(1))
    torch.testing.assert_close(random_step.norm(dim=-1), plan.step.norm(dim=-1), atol=1e-5, rtol=1e-5)
    # a rebind is made of directions already: its concept-arithmetic twin is the edit itself
    torch.testing.assert_close(arithmetic.embeddings, edits.embeddings)
    proposed = edits.records.proposed
    assert edits.records.passed_check[proposed].float().mean() > random_edit.records.passed_check[proposed].float().mean()


def test_gradient_flows_to_the_input(world):
    editor = _editor(world, bindings=world.bindings, kinds=("rebind",))
    z = world.texts[:16].clone().requires_grad_(True)
    edits = editor.counterfactuals(z, "text", 2, torch.Generator().manual_seed(0))
    assert edits.valid.any()
    (edits.embeddings[edits.valid] * torch.randn(DIM)).sum().backward()
    assert z.grad is not None and z.grad.abs().sum() > 0 and torch.isfinite(z.grad).all()


def test_existing_edit_kinds_are_unchanged_by_bindings(world):
    images = world.images[:48]
    code_kinds = ("attenuate", "swap", "transplant")
    plain = _editor(world).counterfactuals(images, "image", 4, torch.Generator().manual_seed(11))
    bound = _editor(world, bindings=world.bindings, kinds=code_kinds).counterfactuals(
        images, "image", 4, torch.Generator().manual_seed(11))
    torch.testing.assert_close(bound.embeddings, plain.embeddings, atol=0, rtol=0)
    assert torch.equal(bound.records.kind, plain.records.kind) and torch.equal(bound.valid, plain.valid)
    # with rebind asked for (it is opt-in) every kind is drawn, and code edits stay what they were
    mixed = _editor(world, bindings=world.bindings, kinds=EDIT_KINDS).counterfactuals(images, "image", 8, torch.Generator().manual_seed(2))
    drawn = {EDIT_KINDS[k] for k in mixed.records.kind[mixed.records.proposed].tolist()}
    assert drawn == set(EDIT_KINDS)
    transplant = _editor(world, bindings=world.bindings).apply(images, "image", "transplant:red=green")
    reference = _editor(world).apply(images, "image", "transplant:red=green")
    torch.testing.assert_close(transplant.embeddings, reference.embeddings, atol=0, rtol=0)


def test_dict_fit_writes_bindings_unless_told_not_to(world, tmp_path, capsys):
    store = tmp_path / "store"
    n_texts = world.texts.shape[0]
    write_store(store, world.images.numpy(), world.texts.numpy(), {
        "image_ids": list(range(n_texts)), "text_ids": list(range(n_texts)), "captions": world.captions,
        "text_image_index": list(range(n_texts)), "model": "bound", "data": "bound",
    })
    (tmp_path / "vocabulary.yaml").write_text(yaml.safe_dump(VOCABULARY))
    common = ["dict", "fit", "--embeddings", str(store), "--sparsity", "6", "--mode", "vocabulary",
              "--vocabulary", str(tmp_path / "vocabulary.yaml"), "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "with")]) == 0
    assert main([*common, "--no-bindings", "--out", str(tmp_path / "without")]) == 0
    assert "binding directions for" in capsys.readouterr().out
    with_bindings = load_labelled_dictionary(tmp_path / "with")
    assert with_bindings.bindings is not None and not (tmp_path / "without" / "bindings.json").exists()
    assert load_labelled_dictionary(tmp_path / "without").bindings is None
    # every colour-shape compound plus size and texture ones, named as "<attribute> <object>"
    assert {f"{a} {o}" for a in COLOURS for o in OBJECTS} <= set(with_bindings.bindings.names())
    row = next(i for i, caption in enumerate(world.captions) if " red " in caption and " blue " in caption)
    assert main(["edit", "--dict", str(tmp_path / "with"), "--embeddings", str(store), "--image", str(row),
                 "--edit", "rebind:red=blue", "--k", "3"]) == 0
    assert "effect check passed" in capsys.readouterr().out
