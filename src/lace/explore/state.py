"""What the explorer holds in memory: a dataset, and per model its embeddings, codes and neighbours.

Everything a page asks for is computed once at start (embeddings, dense codes, the image-caption
top-k lists both ways, k-occurrence, one-way flags, a 2-D map) or per request from these arrays
(an edit and its neighbours). Nothing here reads a path a client sent: images are read from the
dataset by row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from lace.concepts.directions import mention_matrix
from lace.concepts.labelled import LabelledDictionary
from lace.concepts.labelling import concept_weights, editable_concepts
from lace.concepts.vocabulary import Concept, Vocabulary
from lace.data.dataset import ImageTextDataset
from lace.edits import EditConfig, build_editor
from lace.edits.editor import CounterfactualEditor
from lace.embeddings import embed_images, embed_texts
from lace.encoders.base import DualEncoder
from lace.errors import input_error
from lace.eval.hubness import k_occurrence
from lace.eval.neighbours import cross_neighbours
from lace.eval.reciprocity import one_way_flags
from lace.explore.projection import project_2d

DEFAULT_K = 10
HUB_SIZE = 2.0
"""An item is a hub when it sits in at least HUB_SIZE x the mean number of the other modality's top-k
lists: `lace.eval.hubness.hubness_figures`' cut (HUB_SIZE x k) scaled to sets of unequal sizes (with
five captions per image an image is listed 5k times on average)."""


@dataclass
class ModelView:
    """One model's view of the dataset.

    image_embeddings (N_img, d) and text_embeddings (N_txt, d): unit rows; image_codes (N_img, K) and
    text_codes (N_txt, K): dense codes of `labelled`'s dictionary (None without a dictionary);
    image_to_text (N_img, k) and text_to_image (N_txt, k): top-k rows of the other modality, best first,
    with their cosines; image_occurrence (N_img,) and text_occurrence (N_txt,): N_k, how many of the other
    modality's top-k lists hold each item; image_one_way (N_img,) and text_one_way (N_txt,): the top-1
    neighbour's own top-1 points elsewhere (captions counted at the image level, as
    `lace.eval.reciprocity.one_way_rates`); map_xy (N_img + N_txt, 2): images then captions, each modality
    centred on its mean before the projection.
    """

    name: str
    encoder: DualEncoder | None
    labelled: LabelledDictionary | None
    image_embeddings: torch.Tensor
    text_embeddings: torch.Tensor
    image_to_text: torch.Tensor
    image_to_text_scores: torch.Tensor
    text_to_image: torch.Tensor
    text_to_image_scores: torch.Tensor
    image_occurrence: np.ndarray
    text_occurrence: np.ndarray
    image_one_way: np.ndarray
    text_one_way: np.ndarray
    map_xy: np.ndarray
    map_method: str
    image_codes: torch.Tensor | None = None
    text_codes: torch.Tensor | None = None
    _editors: dict[float, CounterfactualEditor] = field(default_factory=dict, repr=False)

    @property
    def k(self) -> int:
        return int(self.image_to_text.shape[1])

    def expected_occurrence(self, modality: str) -> float:
        """The mean N_k of an item of `modality`: the other modality's Q x k slots over this one's items."""
        n_images, n_texts = len(self.image_embeddings), len(self.text_embeddings)
        return n_texts * self.k / n_images if modality == "image" else n_images * self.k / n_texts

    def hubs(self, modality: str) -> np.ndarray:
        """(N,) bool: items of `modality` listed at least HUB_SIZE x the mean number of times."""
        occurrence = self.image_occurrence if modality == "image" else self.text_occurrence
        return occurrence >= HUB_SIZE * self.expected_occurrence(modality)

    def embeddings(self, modality: str) -> torch.Tensor:
        return self.image_embeddings if modality == "image" else self.text_embeddings

    def codes(self, modality: str) -> torch.Tensor | None:
        return self.image_codes if modality == "image" else self.text_codes

    def editor(self, strength: float) -> CounterfactualEditor:
        """The default editor at transplant `strength`, built once per strength (the effect check on)."""
        if self.labelled is None:
            raise input_error("edit", "model", f"a model with a dictionary ('{self.name}' has none)")
        if strength not in self._editors:
            self._editors[strength] = build_editor(self.labelled, EditConfig(strength=strength))
        return self._editors[strength]

    def weights_and_editable(self, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Concept weights (B, C), editable (B, C) and same-type compatibility (C, C) from codes (B, K)."""
        tables = self.editor(1.0).planner.tables(torch.device("cpu"))
        weights = concept_weights(codes, tables["ownership"])
        editable = editable_concepts(weights, EditConfig().tau_use) & tables["has_atoms"]
        return weights, editable, tables["compatible"]


@dataclass
class ExploreSession:
    """The dataset and one or two models (the second for side-by-side comparison).

    image_mentions (N_img, C) and text_mentions (N_txt, C): whether an image's captions (or a caption)
    name each concept of the first model's dictionary (empty without one).
    """

    dataset: ImageTextDataset
    models: list[ModelView]
    concept_names: list[str]
    text_mentions: np.ndarray
    image_mentions: np.ndarray
    captions: list[str] = field(default_factory=list)
    text_image_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def n_images(self) -> int:
        return len(self.dataset)

    def model(self, index: int) -> ModelView:
        if not 0 <= index < len(self.models):
            raise input_error("request", "model", f"a model index in 0..{len(self.models) - 1}", index)
        return self.models[index]

    def check_image(self, image: int) -> int:
        if not 0 <= image < self.n_images:
            raise input_error("request", "image", f"an image id in 0..{self.n_images - 1}", image)
        return image

    def check_caption_row(self, row: int) -> int:
        if not 0 <= row < len(self.captions):
            raise input_error("request", "caption_id", f"a caption id in 0..{len(self.captions) - 1}", row)
        return row

    def concept_index(self, name: str) -> int:
        if name not in self.concept_names:
            raise input_error("request", "concept", f"one of the {len(self.concept_names)} known concepts", name)
        return self.concept_names.index(name)


def build_model_view(name: str, encoder: DualEncoder, labelled: LabelledDictionary | None,
                     dataset: ImageTextDataset, k: int = DEFAULT_K, progress: bool = True,
                     log: Callable[[str], None] = print) -> ModelView:
    """Embed `dataset` with `encoder` (tqdm bars), then `model_view_from_embeddings`."""
    captions = dataset.captions
    log(f"{name}: embedding {len(dataset)} images and {len(captions)} captions")
    images = torch.from_numpy(embed_images(encoder, dataset, progress=progress))
    texts = torch.from_numpy(embed_texts(encoder, captions, progress=progress))
    return model_view_from_embeddings(name, encoder, labelled, images, texts, dataset.caption_image_index, k, log)


def model_view_from_embeddings(name: str, encoder: DualEncoder | None, labelled: LabelledDictionary | None,
                               images: torch.Tensor, texts: torch.Tensor, text_image_index, k: int = DEFAULT_K,
                               log: Callable[[str], None] = print) -> ModelView:
    """The view of (N_img, d) and (N_txt, d) unit embeddings: top-k lists both ways in chunks
    (`lace.eval.neighbours.cross_neighbours`), N_k, one-way flags, the 2-D map and, with a dictionary of
    the same dimension, dense codes. `encoder` (None: typed captions are refused) embeds typed captions."""
    forward, backward = cross_neighbours(images, texts, k)
    one_way = one_way_flags(forward.indices, backward.indices, text_image_index)
    # each modality centred on its own mean, as the dictionary codes them: the map shows how images and
    # captions interleave rather than the gap between the two clouds
    xy, method = project_2d(torch.cat([images - images.mean(0), texts - texts.mean(0)]).numpy())
    view = ModelView(
        name=name, encoder=encoder, labelled=labelled, image_embeddings=images, text_embeddings=texts,
        image_to_text=forward.indices, image_to_text_scores=forward.scores,
        text_to_image=backward.indices, text_to_image_scores=backward.scores,
        image_occurrence=k_occurrence(backward.indices, len(images)),
        text_occurrence=k_occurrence(forward.indices, len(texts)),
        image_one_way=one_way["image"], text_one_way=one_way["text"],
        map_xy=xy, map_method=method,
    )
    if labelled is not None and labelled.dictionary.atoms_.shape[1] == images.shape[1]:
        view.image_codes = labelled.dictionary.transform(images, "image", dense=True)
        view.text_codes = labelled.dictionary.transform(texts, "text", dense=True)
    elif labelled is not None:
        log(f"{name}: dictionary dimension {labelled.dictionary.atoms_.shape[1]} does not match the model's "
            f"{images.shape[1]}; codes and edits are off for this model")
        view.labelled = None
    return view


def build_session(dataset: ImageTextDataset, models: list[ModelView]) -> ExploreSession:
    """The session over `dataset`; concept mentions come from the first model with a dictionary."""
    captions = dataset.captions
    labelled = next((view.labelled for view in models if view.labelled is not None), None)
    names = [] if labelled is None else list(labelled.directions.names)
    owner = np.asarray(dataset.caption_image_index, dtype=np.int64)
    text_mentions = np.zeros((len(captions), len(names)), dtype=bool)
    if labelled is not None:
        directions = labelled.directions
        vocabulary = Vocabulary("explore", [Concept(name, kind, group) for name, kind, group
                                            in zip(directions.names, directions.kinds, directions.groups)])
        rows, concepts = mention_matrix(vocabulary, captions)
        text_mentions[rows, concepts] = True
    image_mentions = np.zeros((len(dataset), len(names)), dtype=bool)
    np.logical_or.at(image_mentions, owner, text_mentions)
    return ExploreSession(dataset, models, names, text_mentions, image_mentions, captions, owner)
