"""Local edits on cached feature maps (`lace.local.maps`) in a hand-built world of coloured objects:
the binding swap exchanges two objects' colours at their own positions only, the random control
matches its size position by position, and reseeding repeats the edits."""

from __future__ import annotations

import pytest
import torch

from lace.local.maps import MapEditor, fit_map_editor, maps_of, regions_of

COLOURS = ["red", "green", "blue", "yellow"]
GRID = (4, 4)
LEVEL = 3.0


def coloured_maps(n_images: int, seed: int, channels: int = 8, grid: tuple[int, int] = GRID, noise: float = 0.05):
    """Maps (N, C, H, W) with two objects each: object k covers two neighbouring positions of row k's band,
    and shows colour c as `LEVEL` along channel c; the rest is small noise.

    Returns maps, colours (N, 2) long, masks (N, 2, H * W) bool of each object's positions.
    """
    generator = torch.Generator().manual_seed(seed)
    height, width = grid
    colours = torch.stack([torch.randperm(len(COLOURS), generator=generator)[:2] for _ in range(n_images)])  # (N, 2)
    regions = noise * torch.randn(n_images, height * width, channels, generator=generator)  # (N, P, C)
    masks = torch.zeros(n_images, 2, height * width, dtype=torch.bool)
    for row in range(n_images):
        for k in range(2):
            band = k * (height // 2) + int(torch.randint(height // 2, (1,), generator=generator))
            left = int(torch.randint(width - 1, (1,), generator=generator))
            places = [band * width + left, band * width + left + 1]
            regions[row, places, colours[row, k]] += LEVEL
            masks[row, k, places] = True
    return maps_of(regions, grid), colours, masks


def mentions_of(colours: torch.Tensor) -> torch.Tensor:
    """(N, 2) colour indices -> (N, G) bool: the colours each image's captions would name."""
    mentions = torch.zeros(len(colours), len(COLOURS), dtype=torch.bool)
    mentions[torch.arange(len(colours))[:, None], colours] = True
    return mentions


def fit_coloured_editor(channels: int = 8, grid: tuple[int, int] = GRID, n_images: int = 300) -> MapEditor:
    maps, colours, _ = coloured_maps(n_images, seed=0, channels=channels, grid=grid)
    return fit_map_editor(maps, mentions_of(colours), COLOURS, seed=0)


@pytest.fixture(scope="module")
def editor() -> MapEditor:
    return fit_coloured_editor()


@pytest.fixture(scope="module")
def world():
    return coloured_maps(20, seed=1)


def test_regions_and_maps_are_inverse_reshapes():
    maps = torch.randn(2, 8, 3, 5)
    regions = regions_of(maps)
    assert regions.shape == (2, 15, 8)
    torch.testing.assert_close(regions[1, 2 * 5 + 4], maps[1, :, 2, 4])  # position (row 2, column 4)
    torch.testing.assert_close(maps_of(regions, (3, 5)), maps)


def test_binding_swap_exchanges_the_colours_at_each_objects_own_positions(editor, world):
    maps, colours, masks = world
    edits = editor.edit(maps, n_edits=1)
    assert edits.maps.shape == (20, 1, 8, *GRID) and edits.kinds == ["swap"]
    assert edits.valid[:, 0].float().mean() >= 0.9
    rows = edits.valid[:, 0].nonzero().flatten()
    before, after = regions_of(maps), regions_of(edits.maps[:, 0])  # (B, P, C)
    for row in rows.tolist():
        first, second = colours[row].tolist()
        for k, (was, now) in enumerate(((first, second), (second, first))):
            at = after[row, masks[row, k]]  # (2, C) the object's positions after the swap
            assert (at[:, now] > 0.8 * LEVEL).all() and (at[:, was].abs() < 0.2 * LEVEL).all()
        outside = ~masks[row].any(dim=0)
        torch.testing.assert_close(after[row, outside], before[row, outside])


def test_binding_swap_keeps_the_pooled_colours_but_moves_them_between_positions(editor, world):
    maps, _, masks = world
    edits = editor.edit(maps, n_edits=1)
    rows = edits.valid[:, 0]
    step = (regions_of(edits.maps[:, 0]) - regions_of(maps))[rows]  # (B', P, C)
    pooled_change = step.mean(dim=1).norm(dim=-1)  # (B',)
    position_change = step.norm(dim=-1)[masks[rows].any(dim=1)]  # each covered position's own change
    assert (position_change > 0.8 * LEVEL).all()  # about LEVEL * sqrt(2) at every covered position
    assert (pooled_change < 0.05 * LEVEL).all()  # the two objects' changes cancel after pooling


def test_transplant_gives_an_object_a_colour_no_object_has(editor, world):
    maps, colours, masks = world
    editor.reseed(0)
    edits = editor.edit(maps, n_edits=2)
    assert edits.kinds == ["swap", "transplant"] and edits.valid[:, 1].float().mean() >= 0.9
    after = regions_of(edits.maps[:, 1])
    for row in edits.valid[:, 1].nonzero().flatten().tolist():
        # slot 1 transplants onto the first found object (found objects come in order of presence)
        moved = colours[row].tolist().index(int(edits.objects.concept[row, 0]))
        shown = after[row, masks[row, moved]].mean(dim=0)  # (C,)
        new_colour = int(shown[: len(COLOURS)].argmax())
        assert new_colour not in colours[row].tolist() and shown[new_colour] > 0.8 * LEVEL
        kept = masks[row, 1 - moved] | ~masks[row].any(dim=0)  # the other object and the background
        torch.testing.assert_close(after[row, kept], regions_of(maps)[row, kept])


def test_random_control_has_the_real_edits_size_at_the_same_positions(editor, world):
    maps, _, _ = world
    editor.reseed(5)
    real = editor.edit(maps, n_edits=2)
    editor.reseed(5)
    control = editor.edit(maps, n_edits=2, control=True)
    real_step = regions_of(real.maps.flatten(0, 1)) - regions_of(maps.repeat_interleave(2, dim=0))  # (B M, P, C)
    control_step = regions_of(control.maps.flatten(0, 1)) - regions_of(maps.repeat_interleave(2, dim=0))
    torch.testing.assert_close(control_step.norm(dim=-1), real_step.norm(dim=-1), atol=1e-5, rtol=1e-5)
    assert torch.equal(control_step.norm(dim=-1) == 0, real_step.norm(dim=-1) == 0)
    assert (real_step.norm(dim=-1) > 0).any() and (real_step.norm(dim=-1) == 0).any()
    moved = real_step.norm(dim=-1) > 0
    cosine = torch.nn.functional.cosine_similarity(control_step, real_step, dim=-1)[moved]
    assert cosine.abs().mean() < 0.5  # random directions (about 0.28 in 8 dimensions), not the edit's own
    assert torch.equal(control.valid, real.valid)


def test_reseed_repeats_the_edits_exactly(editor, world):
    maps, _, _ = world
    editor.reseed(3)
    first = editor.edit(maps, n_edits=3, control=True)
    second = editor.edit(maps, n_edits=3, control=True)
    assert not torch.equal(first.maps, second.maps)  # the draws move on between calls
    editor.reseed(3)
    again = editor.edit(maps, n_edits=3, control=True)
    assert torch.equal(again.maps, first.maps) and torch.equal(again.valid, first.valid)
    editor.reseed(4)
    other_seed = editor.edit(maps, n_edits=3, control=True)
    assert not torch.equal(other_seed.maps[:, 0], first.maps[:, 0])  # the swap's control follows the seed


def test_bad_shapes_are_refused(editor, world):
    maps, colours, _ = world
    with pytest.raises(ValueError, match="grid"):
        editor.edit(torch.zeros(2, 8, 5, 5), n_edits=1)
    with pytest.raises(ValueError, match="n_edits"):
        editor.edit(maps, n_edits=0)
    with pytest.raises(ValueError, match="mentions"):
        fit_map_editor(maps, mentions_of(colours)[:, :3], COLOURS)
