"""One-way neighbours and mutual k-NN between images and captions.

A pair of nearest neighbours is one-way when A's nearest match does not point back at
A. Captions are counted at the image level: a caption whose top image's top caption is
another caption of the same image is reciprocal, since the image could not have
pointed at every one of its captions at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lace.eval.metrics import as_numpy


def one_way_flags(
    image_to_text: np.ndarray | torch.Tensor,
    text_to_image: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
) -> dict[str, np.ndarray]:
    """Which top-1 neighbours are one-way, from (N_img, >= 1) and (N_txt, >= 1) top-k lists.

    Returns:
        image: (N_img,) bool, the image's top-1 caption's top-1 image is a different image;
        text: (N_txt,) bool, the caption's top-1 image's top-1 caption belongs to another image.
    """
    image_to_text, text_to_image = as_numpy(image_to_text)[:, 0], as_numpy(text_to_image)[:, 0]
    owner = np.asarray(text_image_index, dtype=np.int64)
    images = np.arange(len(image_to_text))
    return {"image": text_to_image[image_to_text] != images, "text": owner[image_to_text[text_to_image]] != owner}


def one_way_rates(
    image_to_text: np.ndarray | torch.Tensor,
    text_to_image: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
) -> dict[str, float]:
    """Shares of one-way top-1 neighbours (`one_way_flags`): of images (`image`) and of captions (`text`)."""
    return {name: float(flags.mean()) for name, flags in one_way_flags(image_to_text, text_to_image,
                                                                        text_image_index).items()}


def mutual_knn_overlap(
    image_to_text: np.ndarray | torch.Tensor, text_to_image: np.ndarray | torch.Tensor, k: int = 10
) -> dict[str, float]:
    """Mutual k-NN pairs (image in the caption's top-k AND caption in the image's top-k).

    Returns the number of mutual pairs as a share of the image-side slots (N_img * k)
    and of the caption-side slots (N_txt * k).
    """
    image_to_text, text_to_image = as_numpy(image_to_text)[:, :k], as_numpy(text_to_image)[:, :k]
    images = np.arange(len(image_to_text))[:, None, None]
    # (N_img, k, k): does caption image_to_text[i, a] list image i in its top-k?
    points_back = (text_to_image[image_to_text] == images).any(axis=2)
    mutual_pairs = float(points_back.sum())
    return {
        "image": mutual_pairs / (image_to_text.shape[0] * image_to_text.shape[1]),
        "text": mutual_pairs / (text_to_image.shape[0] * text_to_image.shape[1]),
    }
