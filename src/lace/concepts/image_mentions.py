"""Which concepts each image's captions name: one count per (image, concept), built one way for every caller.

A caption matcher gives (caption, concept) pairs (`mention_matrix` on a vocabulary, or the rule editor's
phrase reading in `lace.eval.edit_retrieval.caption_concepts`); `image_mentions` counts, per image, the
captions naming each concept, and callers threshold the counts: at least one caption (edit retrieval, the
local editors' readers), at least three (the study's concepts an edit should keep), or a share of the image's
captions (the study's caption-derived zero-shot task).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Matcher = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]
"""captions -> (rows, concepts) int64 index arrays, one pair per caption and concept it names."""


def flat_captions(captions_per_image: Sequence[Sequence[str]]) -> tuple[list[str], np.ndarray]:
    """Every caption, image by image, and (N_txt,) int64 the row of each caption's image."""
    captions = [caption for captions in captions_per_image for caption in captions]
    owner = np.repeat(np.arange(len(captions_per_image), dtype=np.int64), [len(c) for c in captions_per_image])
    return captions, owner


def image_mentions(captions: Sequence[str], caption_image_index: Sequence[int] | np.ndarray, n_images: int,
                   match: Matcher, n_concepts: int) -> np.ndarray:
    """(N_img, C) int64: how many of each image's captions name each concept (a caption counts once per concept).

    captions: N_txt captions; caption_image_index: (N_txt,) the row of each caption's image, in 0..n_images-1;
    match: the caption matcher (see `Matcher`), its concepts in 0..n_concepts-1.
    """
    counts = np.zeros((n_images, n_concepts), dtype=np.int64)
    if not len(captions):
        return counts
    rows, concepts = (np.asarray(a, dtype=np.int64) for a in match(captions))
    pairs = np.unique(np.stack([rows, concepts]), axis=1)  # (2, P): each caption-concept pair once
    owner = np.asarray(caption_image_index, dtype=np.int64)
    np.add.at(counts, (owner[pairs[0]], pairs[1]), 1)
    return counts
