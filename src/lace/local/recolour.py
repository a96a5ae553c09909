"""A recolouring operator at L, learnt from grey-preserving colour re-mappings of training images.

What a position's features become when its object changes colour depends on the object's shape,
texture and coverage of the position and on its neighbours, in ways a mean difference or a
Gaussian transport of one concept's positions onto another's does not capture (see the fidelity
tables). The tower itself can show the real change, without masks and without a scene graph: a
colour map of the pixels `x -> M x` that keeps every grey fixed and sends the prototype colour of
concept a exactly to that of concept b repaints every a-coloured object as b and leaves grey
backgrounds and clutter as they were. The pair (features of x, features of M x) at the positions
the reader finds concept a on is then a true counterfactual at L, and a ridge regression per
ordered pair (a, b) from a position's neighbourhood to its change learns the recolouring:
`step_p = [n_p, 1] W_ab`. At edit time the operator moves the positions of one object (found from
features) and their halo (the neighbouring positions, whose receptive fields see the object).

The prototypes (G, 3) are the colour names' RGB values: knowledge of the vocabulary, not of scenes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lace.local.objects import FoundObjects, find_objects, resize_objects
from lace.local.reader import PositionConceptReader
from lace.local.towers import ImageTowerSplit, region_features
from lace.local.transport import neighbourhood_rows, neighbourhoods


def grey_preserving_map(source: Tensor, target: Tensor) -> Tensor:
    """(3, 3) M with M g = g for every grey g and M source = target (RGB in [0, 1])."""
    grey = torch.ones(3) / 3**0.5
    off_grey = (torch.eye(3) - torch.outer(grey, grey)) @ source
    if off_grey.norm() < 1e-6:
        raise ValueError("source colour is grey: no colour map can tell it from the background")
    weight = off_grey / (off_grey @ source)
    return torch.eye(3) + torch.outer(target - source, weight)


def halo(coverage: Tensor, grid: tuple[int, int]) -> Tensor:
    """(..., P) coverage -> (..., P) the largest coverage in each position's 3x3 neighbourhood."""
    shape = coverage.shape
    maps = coverage.reshape(-1, 1, *grid)
    return F.max_pool2d(maps, 3, 1, 1).reshape(shape)


def near_object(coverage: Tensor, grid: tuple[int, int], min_coverage: float) -> Tensor:
    """(..., P) coverage -> (..., P) bool `halo(coverage, grid) > min_coverage`: the positions with a position
    covered more than `min_coverage` in their 3x3 neighbourhood, found as the covered positions dilated by one
    position down and up, then across (a 3x3 maximum exceeds the bound where one of its entries does)."""
    covered = (coverage > min_coverage).reshape(-1, *grid)  # (N, H, W)
    down = covered.clone()
    down[:, 1:] |= covered[:, :-1]
    down[:, :-1] |= covered[:, 1:]
    near = down.clone()
    near[:, :, 1:] |= down[:, :, :-1]
    near[:, :, :-1] |= down[:, :, 1:]
    return near.reshape(coverage.shape)


class RecolourRegression:
    """Per ordered concept pair, a ridge regression from a position's neighbourhood to its change.

    window: neighbourhood side; ridge: weight of the ridge penalty relative to the mean diagonal of
    the normal matrix; min_coverage: positions whose neighbourhood coverage is at most this are not
    moved. Learned state: `weights_` {(a, b): (window^2 C + 1, C)}, `counts_` {(a, b): positions},
    `n_concepts_` G.
    """

    def __init__(self, window: int = 3, ridge: float = 1e-3, min_coverage: float = 0.02):
        self.window = window
        self.ridge = ridge
        self.min_coverage = min_coverage

    def fit(self, clip: torch.nn.Module, layer: str, raw_pixels: Tensor, normalise, reader: PositionConceptReader,
            prototypes: Tensor, locate_layer: str | None = None, batch_size: int = 500) -> RecolourRegression:
        """raw_pixels (N, 3, H, W) in [0, 1]; normalise: raw -> model input; prototypes (G, 3) RGB in [0, 1]."""
        examples = recolour_examples(clip, layer, raw_pixels, normalise, reader, prototypes, locate_layer,
                                     self.window, self.min_coverage, batch_size)
        return self.fit_examples(examples, len(prototypes))

    def fit_examples(self, examples, n_concepts: int) -> RecolourRegression:
        """Fit on `recolour_examples`' (source, target, neighbourhoods (n, D), change (n, C)) of G concepts."""
        self.weights_, self.counts_ = {}, {}
        self._stacked_weights = None
        self.n_concepts_ = n_concepts
        solved_for = None
        for source, target, described, change in examples:
            if described is not solved_for:  # one normal matrix per source concept, factored once for its targets
                inputs = torch.cat([described, described.new_ones(len(described), 1)], dim=1).double()
                gram = inputs.T @ inputs
                penalty = self.ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=torch.float64,
                                                                          device=gram.device)
                factors = torch.linalg.lu_factor(gram + penalty)  # what linalg.solve factors each time, bit for bit
                solved_for = described
            self.weights_[source, target] = torch.linalg.lu_solve(*factors, inputs.T @ change.double()).float()
            self.counts_[source, target] = len(described)
        return self

    def state_dict(self) -> dict:
        """The fitted regression as plain tensors and numbers: the K learnt pairs (K, 2) long, their weights
        (K, D + 1, C) and position counts (K,), in the fit's order."""
        pairs = list(self.weights_)
        weights = torch.stack([self.weights_[pair] for pair in pairs]) if pairs else torch.zeros(0)
        return {"window": self.window, "ridge": self.ridge, "min_coverage": self.min_coverage,
                "n_concepts": self.n_concepts_, "pairs": torch.tensor(pairs, dtype=torch.long).reshape(-1, 2),
                "weights": weights, "counts": torch.tensor([self.counts_[pair] for pair in pairs], dtype=torch.long)}

    @classmethod
    def from_state(cls, state: dict) -> RecolourRegression:
        """The fitted regression `state_dict()` describes, its weights as they were saved."""
        regression = cls(state["window"], state["ridge"], state["min_coverage"])
        pairs = [tuple(pair) for pair in state["pairs"].tolist()]
        regression.n_concepts_ = int(state["n_concepts"])
        regression.weights_ = dict(zip(pairs, state["weights"]))
        regression.counts_ = dict(zip(pairs, state["counts"].tolist()))
        regression._stacked_weights = None
        return regression

    def _stacked(self) -> Tensor:
        """(G G, D + 1, C) every ordered pair's weights, row a G + b for (a, b); zero for pairs never learnt."""
        if getattr(self, "_stacked_weights", None) is None:
            some = next(iter(self.weights_.values()))
            stacked = some.new_zeros(self.n_concepts_ * self.n_concepts_, *some.shape)
            for (source, target), weights in self.weights_.items():
                stacked[source * self.n_concepts_ + target] = weights
            self._stacked_weights = stacked
        return self._stacked_weights

    def change(self, inputs: Tensor, pair: Tensor) -> Tensor:
        """Neighbourhood rows (K, D) grouped by their pair codes (K,) a G + b, sorted -> the regression's change
        (K, C) of each row (`ridge_change`)."""
        return ridge_change(self._stacked().to(inputs.device), inputs, pair)

    def move(self, features: Tensor, grid: tuple[int, int], coverage: Tensor, source: Tensor,
             target: Tensor) -> Tensor:
        """The step (B, P, C) that recolours each image's object (coverage (B, P)) from `source` to `target` (B,).

        Only the positions near the object move, so only their neighbourhoods are gathered, and each concept
        pair's regression runs once on all of its positions (pairs never learnt have zero weights: no move).
        """
        return move_near_object(self.change, features, grid, coverage, source, target, self.window,
                                self.min_coverage, self.n_concepts_)


def ridge_change(stacked: Tensor, inputs: Tensor, pair: Tensor) -> Tensor:
    """(G G, D + 1, C) stacked ridge weights, neighbourhood rows (K, D) and their sorted pair codes (K,) -> the
    change (K, C): each pair's regression run once on all of its rows."""
    codes, counts = pair.unique_consecutive(return_counts=True)
    codes, counts = codes.tolist(), counts.tolist()
    if torch.is_grad_enabled() and (inputs.requires_grad or stacked.requires_grad):
        moved = [part @ stacked[code, :-1] + stacked[code, -1] for code, part in zip(codes, inputs.split(counts))]
        return torch.cat(moved) if moved else inputs.new_zeros(0, stacked.shape[-1])
    # without gradient, each pair's product is written in place (the same products and sums, no copies)
    change = inputs.new_empty(len(inputs), stacked.shape[-1])
    matrices, offsets = stacked[:, :-1].unbind(), stacked[:, -1].unbind()  # (D, C) and (C,) per pair, as views
    for code, part, out in zip(codes, inputs.split(counts), change.split(counts)):
        torch.mm(part, matrices[code], out=out).add_(offsets[code])
    return change


def move_near_object(change_of, features: Tensor, grid: tuple[int, int], coverage: Tensor, source: Tensor,
                     target: Tensor, window: int, min_coverage: float, n_concepts: int) -> Tensor:
    """The step (B, P, C) of an operator whose `change_of(inputs (K, D), pair (K,)) -> (K, C)` gives the change
    of each position near an object (its halo above `min_coverage`) from its `window` neighbourhood, the rows
    grouped by their sorted pair codes `source G + target`; every other position stays."""
    with torch.no_grad():
        values = features.detach().float()
        step = torch.zeros_like(values)
        rows, positions = near_object(coverage, grid, min_coverage).nonzero(as_tuple=True)  # (K,), (K,)
        pair = source[rows] * n_concepts + target[rows]  # (K,)
        pair, order = pair.sort()
        rows, positions = rows[order], positions[order]
        inputs = neighbourhood_rows(values, grid, window, rows, positions)  # (K, D), grouped by pair
        if len(rows):
            step[rows, positions] = change_of(inputs, pair)
    return step.to(features.dtype)


def recolour_examples(clip: torch.nn.Module, layer: str, raw_pixels: Tensor, normalise,
                      reader: PositionConceptReader, prototypes: Tensor, locate_layer: str | None = None,
                      window: int = 3, min_coverage: float = 0.02, batch_size: int = 500,
                      own_targets: Tensor | None = None):
    """The tower's own counterfactuals at `layer` of an open_clip image tower (`colour_map_examples`).

    raw_pixels (N, 3, H, W) in [0, 1]; normalise: raw -> model input; prototypes (G, 3) RGB in [0, 1];
    own_targets (G, 3): instead of the other concepts, one target colour per source a, yielded as concept G + a.
    """
    split = ImageTowerSplit(clip, layer)

    def features_of(raw: Tensor) -> Tensor:
        with torch.no_grad():
            return torch.cat([split.regions(split.lower(normalise(raw[i : i + batch_size])))
                              for i in range(0, len(raw), batch_size)])

    original = features_of(raw_pixels)
    grid = split.grid
    locate = locate_layer or layer
    located, located_grid = (original, grid) if locate == layer else region_features(
        clip, normalise(raw_pixels), locate, batch_size)
    objects = resize_objects(find_objects(reader, located), located_grid, grid)
    yield from colour_map_examples(features_of, raw_pixels, original, objects, grid, prototypes, window,
                                   min_coverage, own_targets)


def colour_map_examples(features_of, raw_pixels: Tensor, original: Tensor, objects: FoundObjects,
                        grid: tuple[int, int], prototypes: Tensor, window: int = 3, min_coverage: float = 0.02,
                        own_targets: Tensor | None = None):
    """The tower's own counterfactuals at a cut: for each source concept a and target b, the `window`
    neighbourhoods (n, D) of the positions near the objects found as a (one object per image), and their change
    (n, C) when a grey-preserving colour map repaints a as b. Yields (a, b, neighbourhoods, change), the
    neighbourhoods one tensor for every b of an a.

    features_of: raw pixels (n, 3, H, W) in [0, 1] -> (n, P, C) region features at the cut, without gradient;
    original (N, P, C) = features_of(raw_pixels); objects: those found on them (on the cut's grid);
    prototypes (G, 3) RGB in [0, 1], NaN for a concept without a colour: a concept without one, or a grey one (no
    grey-preserving map can tell it from grey backgrounds), is never a source, and one without a colour never a
    target; own_targets (G, 3): instead of the other concepts, one target colour per source a, yielded as G + a.
    """
    described = neighbourhoods(original, grid, window)
    for source in range(len(prototypes)):
        if not paintable(prototypes[source]):
            continue
        has = (objects.concept == source) & objects.valid  # (N, n)
        rows = has.any(dim=1).nonzero().squeeze(1)
        if len(rows) == 0:
            continue
        which = has[rows].float().argmax(dim=1)
        near = near_object(objects.coverage[rows, which], grid, min_coverage)  # (n, P)
        inputs = described[rows][near]
        targets = ([(target, prototypes[target]) for target in range(len(prototypes))
                    if target != source and not prototypes[target].isnan().any()]
                   if own_targets is None else [(len(prototypes) + source, own_targets[source])])
        for target, colour in targets:
            colour_map = grey_preserving_map(prototypes[source].cpu(), colour.cpu()).to(raw_pixels)
            repainted = torch.einsum("ij,njhw->nihw", colour_map, raw_pixels[rows]).clamp(0, 1)
            yield source, target, inputs, (features_of(repainted) - original[rows])[near]


def paintable(colour: Tensor) -> bool:
    """Whether a grey-preserving colour map can repaint (3,) RGB `colour`: it is known (not NaN) and not grey."""
    if colour.isnan().any():
        return False
    grey = torch.ones(3, dtype=colour.dtype, device=colour.device) / 3**0.5
    return bool((colour - (colour @ grey) * grey).norm() >= 1e-6)
