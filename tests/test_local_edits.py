import copy

import numpy as np
import pytest
import torch

from lace.concepts.vocabulary import vocabulary_from_dict
from lace.data.world import (
    WorldConfig,
    caption_scene,
    colour_shape_combinations,
    render_scene,
    sample_scene,
)
from lace.data.world.config import PALETTE
from lace.data.world.scene import sample_rng
from lace.local.editor import EditSlots, fit_local_editor, fit_recolour_editor
from lace.local.edits import binding_swap, random_control, transplant
from lace.local.objects import FoundObjects, find_objects
from lace.local.reader import PositionConceptReader
from lace.local.recolour import (
    RecolourRegression,
    grey_preserving_map,
    halo,
    near_object,
    ridge_change,
)
from lace.local.towers import ImageTowerSplit
from lace.local.transport import GaussianTransport, neighbourhood_rows, neighbourhoods

GRID = (4, 4)


def _concept_maps(n_images, generator, channels=128, noise=0.05, level=3.0):
    """Hand-built layer-2 maps (4 x 4): concept c at a position is `level` along channel c, plus noise."""
    concepts = torch.stack([torch.randperm(4, generator=generator)[:2] for _ in range(n_images)])  # (N, 2)
    places = torch.stack([torch.randperm(16, generator=generator)[:2] for _ in range(n_images)])  # (N, 2)
    features = noise * torch.randn(n_images, 16, channels, generator=generator)
    coverage = torch.zeros(n_images, 2, 16)
    for k in range(2):
        features[torch.arange(n_images), places[:, k], concepts[:, k]] += level
        coverage[torch.arange(n_images), k, places[:, k]] = 1.0
    return features, concepts, coverage


@pytest.mark.parametrize("covariance", [False, True])
def test_swap_on_a_hand_built_map_matches_the_swapped_map_after_pooling(resnet, covariance):
    generator = torch.Generator().manual_seed(0)
    train, concepts, coverage = _concept_maps(400, generator)
    transport = GaussianTransport(n_buckets=1, window=1, covariance=covariance).fit(train, GRID, concepts, coverage, 4)
    features, concepts, coverage = _concept_maps(3, generator, noise=0.0)
    objects = FoundObjects(concepts, coverage, torch.ones(3, 2, dtype=torch.bool))
    step, valid = binding_swap(transport, features, GRID, objects)
    swapped = features.clone()
    for k, other in ((0, 1), (1, 0)):
        at = coverage[:, k].argmax(dim=1)
        swapped[torch.arange(3), at] = 3.0 * torch.nn.functional.one_hot(concepts[:, other], 128).float()
    split = ImageTowerSplit(resnet.model, "layer2")
    split.grid = GRID
    with torch.no_grad():
        assert valid.all()
        torch.testing.assert_close(features + step, swapped, atol=0.1, rtol=0)
        edited, original, target = split.upper(features + step), split.upper(features), split.upper(swapped)
        # The pooled change is the one the swapped map makes, and it is not nothing.
        assert ((edited - target).norm(dim=1) < 0.25 * (original - target).norm(dim=1)).all()


def test_random_control_has_the_same_size_at_the_same_positions():
    generator = torch.Generator().manual_seed(0)
    step = torch.zeros(2, 3, 9, 16)
    step[0, :, [1, 4]] = torch.randn(3, 2, 16, generator=generator)
    control = random_control(step, generator)
    torch.testing.assert_close(control.norm(dim=-1), step.norm(dim=-1))
    assert torch.equal(control.norm(dim=-1) > 0, step.norm(dim=-1) > 0)
    assert (torch.nn.functional.cosine_similarity(control, step, dim=-1)[step.norm(dim=-1) > 0].abs() < 0.9).all()


def test_transplant_needs_an_absent_concept():
    generator = torch.Generator().manual_seed(1)
    train, concepts, coverage = _concept_maps(400, generator)
    transport = GaussianTransport(n_buckets=1, window=1).fit(train, GRID, concepts, coverage, 4)
    features, concepts, coverage = _concept_maps(4, generator, noise=0.0)
    objects = FoundObjects(concepts, coverage, torch.ones(4, 2, dtype=torch.bool))
    present = concepts[:, 1]
    absent = torch.tensor([next(c for c in range(4) if c not in row.tolist()) for row in concepts])
    which = torch.zeros(4, dtype=torch.long)
    _, valid_present = transplant(transport, features, GRID, objects, which, present)
    step, valid_absent = transplant(transport, features, GRID, objects, which, absent)
    assert not valid_present.any() and valid_absent.all()
    moved = (step.norm(dim=-1) > 0.1).float()  # (B, P): only the first object's position
    torch.testing.assert_close(moved, coverage[:, 0])


def test_reader_finds_concepts_where_captions_cannot_say():
    generator = torch.Generator().manual_seed(2)
    features, concepts, coverage = _concept_maps(600, generator, channels=8, noise=0.1)
    mentions = torch.zeros(600, 4, dtype=torch.bool)
    mentions[torch.arange(600)[:, None], concepts] = True
    reader = PositionConceptReader(steps=300).fit(features, mentions)
    objects = find_objects(reader, features[:50])
    assert objects.valid.all()
    assert (objects.concept.sort(dim=1).values == concepts[:50].sort(dim=1).values).all()
    at = objects.coverage.argmax(dim=2)  # (50, 2) position each found object covers most
    truth = {(row, int(c), int(p)) for row in range(50) for c, p in zip(concepts[row], coverage[row].argmax(dim=1))}
    found = {(row, int(c), int(p)) for row in range(50) for c, p in zip(objects.concept[row], at[row])}
    assert len(found & truth) / len(truth) > 0.9


def _world_batch(n):
    config = WorldConfig(n_images=64, image_size=32, clutter=2)
    combinations = colour_shape_combinations(config)
    scenes = [sample_scene(sample_rng(0, "train", i, 0), config, "train", combinations, i) for i in range(n)]
    captions = [[caption_scene(scene, sample_rng(0, "train", i, 1), "coco", config)] for i, scene in enumerate(scenes)]
    images = [np.asarray(render_scene(scene, config)) for scene in scenes]
    pixels = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255.0
    vocabulary = vocabulary_from_dict({"name": "w", "objects": list(config.shapes),
                                       "attributes": {"colour": list(config.colours)}, "relations": []})
    return pixels, captions, vocabulary


def test_gradients_reach_layers_below_and_above_the_cut(resnet):
    pixels, captions, vocabulary = _world_batch(48)
    editor = fit_local_editor(resnet.model, pixels, captions, vocabulary, "layer1",
                              transport=GaussianTransport(n_buckets=2, window=1, min_positions=1),
                              reader=PositionConceptReader(steps=50))
    resnet.model.zero_grad()
    negatives = editor.negatives(resnet.model, pixels[:6], n_edits=3)
    assert negatives.embeddings.shape == (6, 3, resnet.embed_dim) and negatives.valid.shape == (6, 3)
    assert negatives.kinds == ["swap", "transplant", "transplant"]
    torch.testing.assert_close(negatives.embeddings.norm(dim=-1), torch.ones(6, 3))
    negatives.embeddings.sum().backward()
    visual = resnet.model.visual
    assert visual.conv1.weight.grad.abs().sum() > 0  # below L (stem)
    assert visual.layer1[0].conv1.weight.grad.abs().sum() > 0  # the block that makes L
    assert visual.layer2[0].conv1.weight.grad.abs().sum() > 0  # above L
    assert visual.attnpool.c_proj.weight.grad.abs().sum() > 0
    resnet.model.zero_grad()


def test_grey_preserving_map_repaints_one_colour_and_keeps_greys():
    red, blue = torch.tensor([0.86, 0.12, 0.12]), torch.tensor([0.14, 0.29, 0.88])
    colour_map = grey_preserving_map(red, blue)
    torch.testing.assert_close(colour_map @ red, blue)
    for level in (0.0, 0.4, 0.9):
        grey = torch.full((3,), level)
        torch.testing.assert_close(colour_map @ grey, grey)
    with pytest.raises(ValueError, match="grey"):
        grey_preserving_map(torch.full((3,), 0.5), blue)


def test_recolour_editor_moves_only_the_found_object_and_its_halo(resnet):
    pixels, captions, vocabulary = _world_batch(48)
    prototypes = torch.tensor([PALETTE[name] for name in vocabulary.groups()["colour"]]).float() / 255.0
    normalise = resnet.preprocess.transforms[-1]
    editor = fit_recolour_editor(resnet.model, pixels, normalise, captions, vocabulary, "layer1", prototypes,
                                 locate_layer="layer1")
    assert editor.transport.weights_  # some concept pairs were learnt from repainted images
    split = ImageTowerSplit(resnet.model, "layer1")
    with torch.no_grad():
        features = split.regions(split.lower(normalise(pixels[:8])))
    objects = editor.locate(resnet.model, normalise(pixels[:8]), features, split.grid)
    step, _ = binding_swap(editor.transport, features, split.grid, objects)
    near = halo(objects.coverage.amax(dim=1), split.grid) > editor.transport.min_coverage  # (B, P)
    assert (step.norm(dim=-1)[~near] == 0).all()


def test_original_embeddings_from_the_editor_pass_equal_the_encoder(resnet):
    pixels, captions, vocabulary = _world_batch(32)
    editor = fit_local_editor(resnet.model, pixels, captions, vocabulary, "layer1",
                              transport=GaussianTransport(n_buckets=1, window=1, min_positions=1),
                              reader=PositionConceptReader(steps=30))
    with torch.no_grad():
        negatives = editor.negatives(resnet.model, pixels[:5], n_edits=2)
        torch.testing.assert_close(negatives.original, resnet.encode_images(pixels[:5]))
    assert negatives.embeddings.shape == (5, 2, resnet.embed_dim)


def test_neighbourhood_rows_are_the_unfolded_neighbourhoods():
    generator = torch.Generator().manual_seed(4)
    features = torch.randn(3, 20, 5, generator=generator)  # (B, P, C) on a 4 x 5 grid
    rows, positions = torch.tensor([0, 2, 2, 1, 0]), torch.tensor([0, 19, 7, 4, 15])
    for window in (1, 3):
        expected = neighbourhoods(features, (4, 5), window)[rows, positions]
        assert torch.equal(neighbourhood_rows(features, (4, 5), window, rows, positions), expected)  # a copy, exact
    described = neighbourhoods(features, (4, 5), 3)  # (B, P, 9 C): the centre is the middle C
    torch.testing.assert_close(described[..., 4 * 5 : 5 * 5], features)
    torch.testing.assert_close(described[:, 6, :5], features[:, 0])  # above-left of (1, 1) is (0, 0)
    assert (described[:, 0, :5] == 0).all()  # above-left of (0, 0) is padding
    by_unfold = torch.nn.functional.unfold(features.transpose(1, 2).reshape(3, 5, 4, 5), 3, padding=1)  # (B, 5 x 9, P)
    torch.testing.assert_close(described, by_unfold.reshape(3, 5, 9, 20).permute(0, 3, 2, 1).reshape(3, 20, 45))


def test_recolour_move_is_the_regression_of_each_pair_at_the_halo_only():
    generator = torch.Generator().manual_seed(5)
    grid, channels, n_concepts = (4, 4), 3, 3
    operator = RecolourRegression(min_coverage=0.1)
    operator.n_concepts_ = n_concepts
    operator.weights_ = {pair: torch.randn(9 * channels + 1, channels, generator=generator)
                         for pair in [(0, 1), (1, 0), (2, 0)]}  # (1, 2), (0, 2), (2, 1) never learnt
    features = torch.randn(6, 16, channels, generator=generator)
    coverage = (torch.rand(6, 16, generator=generator) > 0.8).float()
    source, target = torch.tensor([0, 1, 2, 1, 0, 2]), torch.tensor([1, 0, 0, 2, 2, 1])
    step = operator.move(features, grid, coverage, source, target)
    inputs = torch.cat([neighbourhoods(features, grid, 3), torch.ones(6, 16, 1)], dim=2)  # (B, P, D + 1)
    near = halo(coverage, grid) > 0.1
    for b in range(6):
        weights = operator.weights_.get((int(source[b]), int(target[b])), torch.zeros(9 * channels + 1, channels))
        torch.testing.assert_close(step[b], (inputs[b] @ weights) * near[b, :, None])
    assert (step[3:].abs().sum() == 0) and (step[:3].abs().sum() > 0)


def test_training_pass_of_the_editor_is_the_plain_pass_for_the_originals(resnet):
    pixels, captions, vocabulary = _world_batch(32)
    editor = fit_local_editor(resnet.model, pixels, captions, vocabulary, "layer1",
                              transport=GaussianTransport(n_buckets=1, window=1, min_positions=1),
                              reader=PositionConceptReader(steps=30))
    generator = torch.Generator().manual_seed(6)

    def large_steps(features, grid, n_edits, objects, row_generator=None):  # whatever edits the tiny random tower finds
        steps = 3 * torch.randn(*features.shape[:1], n_edits, *features.shape[1:], generator=generator)
        return EditSlots(steps, torch.ones(features.shape[0], n_edits, dtype=torch.bool), ["swap"] * n_edits,
                         torch.zeros(features.shape[0], n_edits, 2, dtype=torch.long))

    editor.steps = large_steps
    training, plain = copy.deepcopy(resnet).train(), copy.deepcopy(resnet).train()
    negatives = editor.negatives(training.model, pixels[:8], n_edits=2)
    assert (negatives.embeddings - negatives.original[:, None]).norm(dim=-1).min() > 0.01
    torch.testing.assert_close(negatives.original, plain.encode_images(pixels[:8]))
    for (name, value), (_, expected) in zip(training.model.visual.named_buffers(), plain.model.visual.named_buffers()):
        torch.testing.assert_close(value, expected, msg=lambda m, name=name: f"{name}: {m}")


def test_window_transport_without_covariance_moves_the_centre_by_the_mean_difference():
    generator = torch.Generator().manual_seed(7)
    train, concepts, coverage = _concept_maps(300, generator, channels=6)
    transport = GaussianTransport(n_buckets=1, window=3, covariance=False, min_positions=1)
    transport.fit(train, GRID, concepts, coverage, 4)
    source, target = concepts[:5, 0], (concepts[:5, 0] + 1) % 4
    step = transport.move(train[:5], GRID, coverage[:5, 0], source, target)
    for b in range(5):
        centre = slice(4 * 6, 5 * 6)  # the position's own channels in its 3 x 3 neighbourhood
        expected = (transport.means_[target[b], 0, centre] - transport.means_[source[b], 0, centre]).float()
        moved = coverage[b, 0] > 0
        torch.testing.assert_close(step[b, moved], expected.expand(int(moved.sum()), -1))
        assert (step[b, ~moved] == 0).all()


def test_the_readers_fit_keeps_a_gradient_for_an_image_it_reads_the_wrong_way():
    # Every position reads "nothing" although the caption names the concept: the noisy-OR presence is about 0.
    # A clamped presence would give this image no gradient at all, and a fit could stay in that state.
    from lace.local.reader import _noisy_or_loss

    shown = torch.full((1, 9, 2), 1e-9, requires_grad=True)
    loss = _noisy_or_loss(shown, torch.tensor([[1.0, 0.0]]))
    loss.backward()
    assert torch.isfinite(loss) and shown.grad[..., 0].abs().min() > 1.0  # pushed up, strongly
    assert (shown.grad[..., 1] >= 0).all()  # the unmentioned concept is pushed down (or left)


def test_near_object_is_the_halo_above_the_bound():
    generator = torch.Generator().manual_seed(7)
    grid = (5, 6)
    coverage = torch.rand(4, 3, 30, generator=generator) * (torch.rand(4, 3, 30, generator=generator) > 0.85)
    coverage[0, 0, 7] = 0.1  # exactly at the bound: not above it
    for bound in (0.0, 0.1, 0.5):
        expected = halo(coverage, grid) > bound
        assert torch.equal(near_object(coverage, grid, bound), expected)
        assert torch.equal(near_object(coverage[:, 1], grid, bound), expected[:, 1])
    corner = torch.zeros(1, 30)
    corner[0, 0] = 1.0  # the top-left position reaches its right, lower and lower-right neighbours only
    assert near_object(corner, grid, 0.5).nonzero()[:, 1].tolist() == [0, 1, 6, 7]


def test_ridge_change_in_place_is_the_products_plus_offsets_bit_for_bit():
    generator = torch.Generator().manual_seed(8)
    stacked = torch.randn(9, 28, 3, generator=generator)  # (G G, D + 1, C), G = 3
    inputs = torch.randn(40, 27, generator=generator)
    pair = torch.randint(0, 9, (40,), generator=generator).sort().values
    expected = torch.cat([inputs[pair == code] @ stacked[code, :-1] + stacked[code, -1] for code in pair.unique()])
    with torch.no_grad():
        assert torch.equal(ridge_change(stacked, inputs, pair), expected)
    with_gradient = ridge_change(stacked, inputs.clone().requires_grad_(), pair)  # the autograd path
    assert with_gradient.requires_grad and torch.equal(with_gradient.detach(), expected)
