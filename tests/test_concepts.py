"""Vocabularies, concept directions and atom labelling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lace.concepts import (
    ConceptDirections,
    calibrate_tau_align,
    directions_from_captions,
    directions_from_templates,
    label_atoms,
    load_vocabulary,
)
from lace.concepts.directions import mention_matrix
from lace.concepts.labelling import AtomLabelling, concept_weights, editable_concepts, usage_profile
from lace.concepts.vocabulary import vocabulary_from_dict
from lace.dictionary import ConceptDictionary
from lace.errors import LaceInputError
from tests.toy_concepts import toy_directions, toy_embeddings, toy_vocabulary

WORLD_VOCABULARY = Path(__file__).resolve().parents[1] / "src" / "lace" / "data" / "world" / "vocabulary.yaml"


def test_natural_vocabulary_has_the_advertised_sizes():
    vocabulary = load_vocabulary("natural")
    groups = vocabulary.groups()
    assert len(groups["object"]) >= 300
    assert {"grass", "snow", "beach", "water", "mountain", "street", "sheep", "zebra"} <= set(groups["object"])
    assert {"colour", "material", "size", "pattern"} <= set(groups)
    assert 45 <= len(groups["relation"]) <= 70
    assert vocabulary.get("on").kind == "relation"  # YAML 1.1 would have read it as True
    assert vocabulary.same_type("red", "blue") and not vocabulary.same_type("red", "wooden")
    assert not vocabulary.same_type("sheep", "red")


@pytest.mark.skipif(not WORLD_VOCABULARY.is_file(), reason="world vocabulary not generated")
def test_world_vocabulary_loads():
    vocabulary = load_vocabulary(WORLD_VOCABULARY)
    assert vocabulary.of_kind("object") and vocabulary.of_kind("attribute")


def test_vocabulary_errors(tmp_path):
    path = tmp_path / "v.yaml"
    path.write_text("name: empty\nobjects: []\n")
    with pytest.raises(LaceInputError, match="at least one typed concept"):
        load_vocabulary(path)
    path.write_text("- red\n- circle\n")
    with pytest.raises(LaceInputError, match="mapping"):
        load_vocabulary(path)
    path.write_text("objects: [red]\nattributes:\n  colour: [red]\n")
    with pytest.raises(LaceInputError, match="once"):
        load_vocabulary(path)
    with pytest.raises(LaceInputError, match="concept"):
        toy_vocabulary().index("zebra")
    with pytest.raises(LaceInputError, match="not found"):
        load_vocabulary(tmp_path / "missing.yaml")


def test_mentions_match_whole_words_and_plurals():
    vocabulary = vocabulary_from_dict(
        {"objects": ["car", "person", "box", "teddy bear", "bear", "strawberry"], "relations": ["on top of"]}
    )
    captions = ["Two cars and a cart", "people on top of boxes", "a teddy bear", "strawberries", "carpet"]
    rows, concepts = mention_matrix(vocabulary, captions)
    found = {(int(r), vocabulary.names[int(c)]) for r, c in zip(rows, concepts)}
    assert found == {
        (0, "car"), (1, "person"), (1, "on top of"), (1, "box"), (2, "teddy bear"), (2, "bear"), (3, "strawberry"),
    }


def test_caption_mean_directions_point_at_the_concept():
    directions = toy_directions()
    texts, codes = toy_embeddings(directions, 600, -2.0, seed=2, return_codes=True)
    captions = [" and ".join(n for n, w in zip(directions.names, row) if w > 0) for row in codes]
    found = directions_from_captions(toy_vocabulary(), captions, texts.numpy(), min_count=5)
    # relations are never mentioned, so they get no direction
    assert found.source == "captions" and found.names == directions.names[:10]
    for name, direction in zip(found.names, found.directions):
        cosines = directions.directions @ direction
        assert int(cosines.argmax()) == directions.index(name)


def test_template_directions_average_prompts_and_centre():
    directions = toy_directions()

    def encode_texts(texts: list[str]) -> torch.Tensor:  # a stand-in encoder: the concept named in the prompt
        rows = [directions.directions[[n in t for n in directions.names].index(True)] + 0.5 for t in texts]
        return torch.nn.functional.normalize(torch.stack(rows), dim=1)

    mean_text = torch.full((32,), 0.1)
    found = directions_from_templates(toy_vocabulary(), encode_texts, mean_text)
    assert found.names == directions.names
    torch.testing.assert_close(found.directions.norm(dim=1), torch.ones(len(found)))
    assert (torch.diagonal(found.directions @ directions.directions.T) > 0.3).all()


def test_labelling_of_a_vocabulary_dictionary_is_exact_and_calibrated(tmp_path):
    directions = toy_directions()
    images = toy_embeddings(directions, 300, 2.0, seed=1)
    texts = toy_embeddings(directions, 300, -2.0, seed=2)
    dictionary = ConceptDictionary(mode="vocabulary", directions=directions, sparsity=4).fit(images, texts)
    labelling = label_atoms(dictionary, directions, images, texts)
    assert labelling.atom_concept.tolist() == list(range(len(directions)))
    torch.testing.assert_close(labelling.atom_alignment, torch.ones(len(directions)))
    assert 0 < labelling.tau_align < 1
    assert labelling.aligned().all()
    # objects carry weight ~1 or ~0.5, sizes ~0.3: typical codes keep that order
    assert labelling.atom_typical_code[directions.index("circle")] > labelling.atom_typical_code[directions.index("small")]
    labelling.save(tmp_path)
    loaded = AtomLabelling.load(tmp_path)
    torch.testing.assert_close(loaded.atom_typical_code, labelling.atom_typical_code)
    directions.save(tmp_path)
    assert ConceptDirections.load(tmp_path).names == directions.names


def test_calibrated_threshold_separates_real_from_chance_alignment():
    directions = toy_directions()
    generator = torch.Generator().manual_seed(5)
    isotropic = torch.nn.functional.normalize(torch.randn(2000, 32, generator=generator), dim=1)
    random_atoms = torch.nn.functional.normalize(torch.randn(200, 32, generator=generator), dim=1)
    tau = calibrate_tau_align(random_atoms, isotropic, len(directions), quantile=0.95)
    # atoms that match nothing: about 5% pass the threshold by chance
    chance_alignment = (random_atoms @ directions.directions.T).max(1).values
    assert 0.0 <= (chance_alignment >= tau).float().mean() <= 0.15
    # atoms that are concept directions (slightly perturbed) all pass
    real_atoms = torch.nn.functional.normalize(directions.directions + 0.1 * torch.randn(12, 32, generator=generator), dim=1)
    assert ((real_atoms @ directions.directions.T).max(1).values >= tau).all()


def test_editable_concepts_follow_tau_use():
    weights = torch.tensor([[1.0, 0.3, 0.1, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(
        editable_concepts(weights, 0.25), torch.tensor([[True, True, False, False], [False, False, False, False]])
    )
    ownership = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    torch.testing.assert_close(concept_weights(torch.tensor([[0.2, 0.3, 0.4]]), ownership), torch.tensor([[0.5, 0.4]]))
    profile = usage_profile(weights, (0.25, 0.5))
    assert profile[0.25]["share_two_or_more"] == 0.5 and profile[0.5]["share_two_or_more"] == 0.0


def test_one_plural_table_for_directions_bindings_and_rule_edits():
    from lace.concepts.bindings import BindingMatcher
    from lace.edits.captions import RuleNegatives

    vocabulary = vocabulary_from_dict({"objects": ["wolf", "cactus", "sheep", "potato"], "attributes": {"colour": ["grey"]}})
    captions = ["two wolves", "three cacti", "sheep grazing", "potatoes and potatos"]
    rows, concepts = mention_matrix(vocabulary, captions)
    found = {(int(r), vocabulary.names[int(c)]) for r, c in zip(rows, concepts)}
    assert found == {(0, "wolf"), (1, "cactus"), (2, "sheep"), (3, "potato")}
    rules = RuleNegatives(vocabulary)
    assert [[(m.concept, m.is_plural) for m in rules.mentions(c)] for c in captions[:2]] == [
        [("wolf", True)], [("cactus", True)]]
    matcher = BindingMatcher(vocabulary)
    grey, wolf = vocabulary.names.index("grey"), vocabulary.names.index("wolf")
    assert matcher.bindings("two grey wolves") == {(grey, wolf)}


def test_image_mentions_count_each_images_captions_naming_each_concept_once():
    from functools import partial

    from lace.concepts.directions import mention_matrix
    from lace.concepts.image_mentions import flat_captions, image_mentions
    from lace.concepts.vocabulary import load_vocabulary
    from lace.local.editor import group_mentions

    vocabulary = load_vocabulary("natural")
    per_image = [["a red dog and a red cat", "a dog"], [], ["a teddy", "bear on a red table"]]
    captions, owner = flat_captions(per_image)
    assert captions == ["a red dog and a red cat", "a dog", "a teddy", "bear on a red table"]
    assert owner.tolist() == [0, 0, 2, 2]
    counts = image_mentions(captions, owner, 3, partial(mention_matrix, vocabulary), len(vocabulary.concepts))
    column = {name: i for i, name in enumerate(vocabulary.names)}
    assert counts[0, column["red"]] == 1 and counts[0, column["dog"]] == 2 and counts[0, column["cat"]] == 1
    assert counts[1].sum() == 0 and counts[2, column["red"]] == 1
    assert counts[2, column["teddy bear"]] == 0  # no phrase across two captions
    mentions, names = group_mentions(vocabulary, "object", per_image)
    assert not mentions[2, names.index("teddy bear")] and mentions[2, names.index("bear")]
    assert image_mentions([], [], 2, partial(mention_matrix, vocabulary), 4).shape == (2, 4)
