"""LACE-local in training: negatives made inside the towers (`lace.local`), drawn per sample.

The image editor is fitted once, before the first step, on the first `local_fit_images` training
images and their captions (the reader finds objects from the features; the renderer is never asked).
Its random choices (which absent concept a transplant brings) are drawn per sample from
(seed, epoch, image), so one process and several draw the same negatives for the same rows.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.transforms import Normalize

from lace.concepts.vocabulary import Vocabulary
from lace.data.world.config import PALETTE
from lace.errors import input_error
from lace.local.editor import LocalImageEditor, fit_local_editor, fit_recolour_editor
from lace.local.objects import FoundObjects
from lace.local.text import caption_swap_negatives, single_token_ids
from lace.local.transport import GaussianTransport
from lace.train.config import TrainConfig

GROUP = "colour"


class SampleSeededLocalEditor(LocalImageEditor):
    """A `LocalImageEditor` whose transplant targets come from per-row seeds (`row_seeds`, set before each call)."""

    @classmethod
    def from_editor(cls, editor: LocalImageEditor) -> SampleSeededLocalEditor:
        seeded = cls(editor.layer, editor.reader, editor.transport, editor.concept_names,
                     check_effect=editor.check_effect, locate_layer=editor.locate_layer)
        seeded.row_seeds: list[int] = []
        return seeded

    def _absent_concepts(self, objects: FoundObjects) -> Tensor:
        """(B,) a random concept no found object has, drawn from row b's own seed."""
        if len(self.row_seeds) != objects.concept.shape[0]:
            raise ValueError(f"row_seeds: expected {objects.concept.shape[0]} seeds, got {len(self.row_seeds)}")
        scores = torch.stack([torch.rand(len(self.concept_names), generator=torch.Generator().manual_seed(seed))
                              for seed in self.row_seeds])
        scores.scatter_(1, objects.concept, -1.0)
        return scores.argmax(dim=1)


def fit_training_editor(config: TrainConfig, clip: torch.nn.Module, pixels: Tensor, captions: list[list[str]],
                        normalise: Normalize, vocabulary: Vocabulary) -> SampleSeededLocalEditor:
    """The local image editor of a run, fitted on (N, 3, H, W) model-input pixels and each image's captions."""
    was_training = clip.training
    clip.eval()
    try:
        if config.local_operator == "recolour":
            names = vocabulary.groups().get(GROUP, [])
            unknown = [name for name in names if name not in PALETTE]
            if not names or unknown:
                raise input_error("train config", "local_operator",
                                  f"mean_shift unless every {GROUP} of the vocabulary is a shapes-world colour",
                                  unknown or "no colour group")
            prototypes = torch.tensor([PALETTE[name] for name in names]).float() / 255.0
            raw = pixels * torch.tensor(normalise.std).view(1, 3, 1, 1) + torch.tensor(normalise.mean).view(1, 3, 1, 1)
            editor = fit_recolour_editor(clip, raw, normalise, captions, vocabulary, config.local_layer, prototypes,
                                         GROUP, locate_layer=config.local_locate_layer, seed=config.seed)
        else:
            editor = fit_local_editor(clip, pixels, captions, vocabulary, config.local_layer, GROUP,
                                      transport=GaussianTransport(n_buckets=1, window=1, covariance=False),
                                      seed=config.seed, locate_layer=config.local_locate_layer)
    finally:
        clip.train(was_training)
    return SampleSeededLocalEditor.from_editor(editor)


class LocalImagePass:
    """The image pass of a LACE-local training step, run as the encoder's `encode_images`: (B, 3, H, W) model-input
    pixels -> U (B, d), the unedited embeddings of the editor's one pass through the tower; that pass's edited
    images are kept as `negatives` (B, M, d) unit, with gradient, and `valid` (B, M).

    seeds: one per row (`row_seeds`), which draw each row's transplant targets.
    """

    def __init__(self, editor: SampleSeededLocalEditor, clip: torch.nn.Module, n_edits: int, seeds: list[int]):
        self.editor, self.clip, self.n_edits, self.seeds = editor, clip, n_edits, seeds
        self.negatives: Tensor | None = None
        self.valid: Tensor | None = None

    def __call__(self, pixels: Tensor) -> Tensor:
        self.editor.row_seeds = self.seeds
        made = self.editor.negatives(self.clip, pixels, self.n_edits)
        self.negatives, self.valid = made.embeddings, made.valid.to(pixels.device)
        return made.original


def group_token_ids(tokenize, vocabulary: Vocabulary) -> Tensor:
    """(G,) token ids of the colour names (-1 for names the tokenizer splits)."""
    return single_token_ids(tokenize, list(vocabulary.groups().get(GROUP, [])))


def local_caption_negatives(clip: torch.nn.Module, tokens: Tensor, concept_ids: Tensor,
                            layer: str) -> tuple[Tensor, Tensor]:
    """(B, T) caption tokens -> (B, 1, d) caption-side binding swaps at `layer` and (B, 1) validity."""
    return caption_swap_negatives(clip, tokens, concept_ids, layer)
