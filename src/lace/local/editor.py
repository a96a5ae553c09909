"""Image-side local counterfactuals for training: (B, M, d) unit negatives with gradient and a (B, M) mask.

    editor = fit_recolour_editor(encoder.model, raw_train_pixels, normalise, train_captions, vocabulary,
                                 layer="layer1", prototypes=colour_rgb)
    negatives = editor.negatives(encoder.model, pixels, n_edits=2)  # pixels: model input
    negatives.embeddings  # (B, M, d) unit, gradient through the layers above and below L
    negatives.valid       # (B, M) bool: rows without a valid edit get no extra negative there
    negatives.original    # (B, d) the unedited images' embeddings, from the same pass

Slot 0 is the binding swap (the two found objects exchange their concepts); slots 1 .. M-1
transplant a concept no object has onto one object's positions (objects alternate).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from lace.concepts.directions import mention_matrix
from lace.concepts.image_mentions import flat_captions, image_mentions
from lace.concepts.vocabulary import Vocabulary
from lace.local.edits import binding_swap, effect_check, random_control, transplant
from lace.local.learnt import LearntRecolour
from lace.local.objects import FoundObjects, find_objects, resize_objects
from lace.local.reader import PositionConceptReader
from lace.local.recolour import RecolourRegression
from lace.local.towers import ImageTowerSplit, region_features
from lace.local.transport import GaussianTransport
from lace.row_random import Randomness, uniform


@dataclass
class LocalNegatives:
    """embeddings (B, M, d) unit; valid (B, M) bool; kinds: the edit of each slot; objects found;
    original (B, d) the unedited images' unit embeddings from the same pass; changes (B, M, 2) long, the
    concepts each slot changed (`EditSlots.changes`)."""

    embeddings: Tensor
    valid: Tensor
    kinds: list[str]
    objects: FoundObjects
    original: Tensor
    changes: Tensor


@dataclass
class EditSlots:
    """M edits of B rows' region features: steps (B, M, P, C) to add; valid (B, M) bool; kinds: each slot's edit
    ("swap" or "transplant"); changes (B, M, 2) long concept indices: for a swap the two concepts the objects
    exchange, for a transplant the object's concept and the one it becomes."""

    steps: Tensor
    valid: Tensor
    kinds: list[str]
    changes: Tensor


def slot_changes(kinds: list[str], changes: Tensor, concept_names: list[str]) -> list[list[dict[str, str]]]:
    """(B, M, 2) concept indices of `kinds`' slots -> per row and slot, the concept names each becomes
    ({"red": "blue", "blue": "red"} for a swap, {"red": "green"} for a transplant)."""
    rows = []
    for pairs in changes.tolist():
        row = []
        for kind, (source, target) in zip(kinds, pairs):
            a, b = concept_names[source], concept_names[target]
            row.append({a: b, b: a} if kind == "swap" else {a: b})
        rows.append(row)
    return rows


class LocalImageEditor:
    """Binding swaps and transplants of one attribute group at layer `layer` of an open_clip image tower.

    reader: the fitted position reader of the group; transport: the fitted operator that moves positions
    from one concept to another (`GaussianTransport` or `RecolourRegression`);
    concept_names: the group's G concepts; check_effect: keep only edits the reader reads as done
    (only when the reader reads the edit layer itself); seed: seed of the transplant targets and of
    the random controls; locate_layer: the layer whose features the reader reads to find objects
    (None: the edit layer); their coverage is averaged onto the edit layer's grid.
    """

    def __init__(self, layer: str, reader: PositionConceptReader, transport: GaussianTransport | RecolourRegression,
                 concept_names: list[str], check_effect: bool = True, seed: int = 0,
                 locate_layer: str | None = None):
        self.layer = layer
        self.locate_layer = locate_layer or layer
        self.reader = reader
        self.transport = transport
        self.concept_names = list(concept_names)
        self.check_effect = check_effect
        self.generator = torch.Generator().manual_seed(seed)

    def locate(self, clip: torch.nn.Module, pixels: Tensor, features: Tensor, grid: tuple[int, int]) -> FoundObjects:
        """Objects of images (B, 3, H, W) whose region features at the edit layer are (B, P, C)."""
        if self.locate_layer == self.layer:
            return find_objects(self.reader, features)
        located, located_grid = region_features(clip, pixels, self.locate_layer)
        return resize_objects(find_objects(self.reader, located), located_grid, grid)

    def steps(self, features: Tensor, grid: tuple[int, int], n_edits: int, objects: FoundObjects,
              generator: Randomness = None) -> EditSlots:
        """Region features (B, P, C) and their objects -> the `EditSlots` of M = n_edits edits per row.

        generator: the draws of transplant targets (None: the editor's own generator; `RowGenerators`: one per row).
        """
        features = features.detach().contiguous()  # the steps carry no gradient; one layout makes every move cheaper
        steps, valid, kinds, changes = [], [], [], []
        swap_step, swap_valid = binding_swap(self.transport, features, grid, objects)
        check = self.check_effect and self.locate_layer == self.layer
        if check:
            edited = features + swap_step
            swap_valid = swap_valid & effect_check(self.reader, edited, objects.coverage[:, 0], objects.concept[:, 0],
                                                   objects.concept[:, 1])
        steps.append(swap_step)
        valid.append(swap_valid)
        kinds.append("swap")
        changes.append(objects.concept[:, :2])
        batch = features.shape[0]
        for slot in range(1, n_edits):
            which = torch.full((batch,), (slot - 1) % objects.concept.shape[1], dtype=torch.long,
                               device=features.device)
            new_concept = self._absent_concepts(objects, generator)
            step, ok = transplant(self.transport, features, grid, objects, which, new_concept)
            if check:
                rows = torch.arange(batch, device=features.device)
                ok = ok & effect_check(self.reader, features + step, objects.coverage[rows, which],
                                       objects.concept[rows, which], new_concept)
            steps.append(step)
            valid.append(ok)
            kinds.append("transplant")
            changes.append(torch.stack([objects.concept[torch.arange(batch, device=features.device), which],
                                        new_concept], dim=1))
        return EditSlots(torch.stack(steps, dim=1), torch.stack(valid, dim=1), kinds, torch.stack(changes, dim=1))

    def _absent_concepts(self, objects: FoundObjects, generator: Randomness = None) -> Tensor:
        """(B,) a random concept that no found object has."""
        shape = (objects.concept.shape[0], len(self.concept_names))
        # drawn on the generators' device (the same draws everywhere), then moved to the objects'
        scores = uniform(shape, generator if generator is not None else self.generator, objects.concept.device)
        scores.scatter_(1, objects.concept, -1.0)
        return scores.argmax(dim=1)

    def negatives(self, clip: torch.nn.Module, pixels: Tensor, n_edits: int, control: bool = False,
                  generator: Randomness = None, rows: int | None = None) -> LocalNegatives:
        """(B, 3, H, W) pixels -> `LocalNegatives`: (B, M) unit embeddings of the edits, M = n_edits, and the (B, d)
        unedited embeddings, all from one pass of the tower.

        The lower tower runs once; the upper layers run once on the B unedited and B x M edited maps
        together, with BatchNorm statistics taken from the unedited maps alone (`lace.local.batch_norm`):
        the unedited embeddings are the encoder's own (use them as U, so a training step runs the image
        tower once), and each edited map is normalised as its unedited map is.
        control: replace every step by the same-size random step at the same positions.
        generator: the draws of transplant targets (None: the editor's own; `RowGenerators`: one per row, so a
        row's edits do not depend on the rows it shares a batch with).
        rows: edit the first `rows` images only (None: all B); the other rows' upper layers run on their unedited
        maps alone, and embeddings, valid, objects and changes then hold the `rows` edited images only.
        """
        if n_edits < 1:
            raise ValueError(f"n_edits: expected >= 1, got {n_edits}")
        split = ImageTowerSplit(clip, self.layer)
        features = split.lower(pixels)  # (B, n_prefix + P, C), with gradient
        batch = features.shape[0]
        if rows is not None and not 1 <= rows <= batch:
            raise ValueError(f"rows: expected 1 .. {batch}, got {rows}")
        if rows is not None and rows < batch:
            pixels = pixels[:rows]
        edited_rows = features if rows is None or rows == batch else features[:rows]  # (R, n_prefix + P, C)
        regions = split.regions(edited_rows).detach().contiguous()  # what the editor reads: one copy for all of it
        objects = self.locate(clip, pixels, regions, split.grid)
        slots = self.steps(regions, split.grid, n_edits, objects, generator)
        steps = slots.steps  # (B, M, P, C)
        if control:
            steps = random_control(steps, self.generator)
        if split.n_prefix:
            steps = torch.cat([steps.new_zeros(*steps.shape[:2], split.n_prefix, steps.shape[-1]), steps], dim=2)
        edited = edited_rows.unsqueeze(1) + steps.to(features.dtype)  # (R, M, P_all, C)
        count = edited.shape[0]
        maps = torch.cat([features, edited.transpose(0, 1).reshape(count * n_edits, *features.shape[1:])])
        embeddings = split.upper(maps, reference_rows=batch)  # (B + R M, d): the originals, then slot by slot
        negatives = embeddings[batch:].reshape(n_edits, count, -1).transpose(0, 1)  # (R, M, d)
        return LocalNegatives(negatives, slots.valid, slots.kinds, objects, original=embeddings[:batch],
                              changes=slots.changes)


def group_mentions(vocabulary: Vocabulary, group: str, captions_per_image: list[list[str]]) -> tuple[Tensor, list[str]]:
    """(N_img, G) bool: which concepts of attribute group `group` each image's captions name; and their names."""
    names = vocabulary.groups().get(group)
    if names is None:
        raise ValueError(f"group: expected one of {sorted(vocabulary.groups())}, got {group!r}")
    captions, owner = flat_captions(captions_per_image)
    counts = image_mentions(captions, owner, len(captions_per_image), partial(mention_matrix, vocabulary),
                            len(vocabulary.concepts))  # (N_img, all concepts)
    columns = [vocabulary.names.index(name) for name in names]
    return torch.from_numpy(counts[:, columns] >= 1), list(names)


def fit_recolour_editor(clip: torch.nn.Module, raw_pixels: Tensor, normalise, captions_per_image: list[list[str]],
                        vocabulary: Vocabulary, layer: str, prototypes: Tensor, group: str = "colour",
                        locate_layer: str | None = "layer1", recolour: RecolourRegression | LearntRecolour | None = None,
                        seed: int = 0) -> LocalImageEditor:
    """The editor with the most faithful operator measured: the reader (at `locate_layer`) finds objects and
    the recolouring regression learnt from grey-preserving colour maps moves them at `layer` (or `recolour`, an
    unfitted `RecolourRegression` or `lace.local.learnt.LearntRecolour`, fitted here on the same images).

    raw_pixels (N, 3, H, W) in [0, 1] training images; normalise: raw pixels -> model input;
    prototypes (G, 3) RGB in [0, 1] of the group's concepts.
    """
    editor = fit_local_editor(clip, normalise(raw_pixels), captions_per_image, vocabulary, layer, group,
                              transport=GaussianTransport(n_buckets=1, window=1, covariance=False), seed=seed,
                              locate_layer=locate_layer)
    operator = (recolour or RecolourRegression()).fit(clip, layer, raw_pixels, normalise, editor.reader, prototypes,
                                                      editor.locate_layer)
    return LocalImageEditor(layer, editor.reader, operator, editor.concept_names, seed=seed,
                            locate_layer=editor.locate_layer)


def fit_local_editor(clip: torch.nn.Module, pixels: Tensor, captions_per_image: list[list[str]],
                     vocabulary: Vocabulary, layer: str, group: str = "colour",
                     transport: GaussianTransport | None = None, reader: PositionConceptReader | None = None,
                     batch_size: int = 500, seed: int = 0, locate_layer: str | None = None,
                     fit_reader: bool = True) -> LocalImageEditor:
    """Fit the reader (at `locate_layer`, default `layer`) and the transport of `group` at `layer` on training
    images (N, 3, H, W) and their captions. fit_reader=False reuses an already fitted `reader`."""
    mentions, names = group_mentions(vocabulary, group, captions_per_image)
    locate_layer = locate_layer or layer
    features, grid = region_features(clip, pixels, layer, batch_size)
    located, located_grid = (features, grid) if locate_layer == layer else region_features(clip, pixels, locate_layer,
                                                                                           batch_size)
    reader = reader or PositionConceptReader(random_state=seed)
    if fit_reader:
        reader.fit(located, mentions)
    objects = resize_objects(find_objects(reader, located), located_grid, grid)
    coverage = objects.coverage * objects.valid[..., None]
    transport = (transport or GaussianTransport()).fit(features, grid, objects.concept, coverage, len(names))
    return LocalImageEditor(layer, reader, transport, names, seed=seed, locate_layer=locate_layer)
