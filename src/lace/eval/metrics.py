"""Scoring rules of retrieval and the compositional benchmarks, as pure functions.

Every function takes similarity scores (or top-k lists) and returns shares in [0, 1].
"Beats" means strictly greater: a tie is a failure, so a constant model scores 0 on
pairwise tests rather than a flattering 0.5. A NaN score never beats anything, so its item
is a failure too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lace.eval.neighbours import DEFAULT_CHUNK, cross_neighbours


def as_numpy(x) -> np.ndarray:
    """A tensor (any device, with or without gradient) or array-like as a numpy array."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def recall_hits(
    image_to_text: np.ndarray | torch.Tensor,
    text_to_image: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
    ks: Sequence[int] = (1, 5, 10),
) -> dict[str, np.ndarray]:
    """Per query, whether it finds a positive in its top k, both ways; an image's captions are all its positives.

    Args:
        image_to_text: (N_img, >= max ks) caption rows ranked for each image.
        text_to_image: (N_txt, >= max ks) image rows ranked for each caption.
        text_image_index: (N_txt,) the image row of each caption.

    Returns:
        `i2t/R@k`: (N_img,) bool, at least one of the image's captions is in its top k;
        `t2i/R@k`: (N_txt,) bool, the caption's image is in its top k.
    """
    image_to_text, text_to_image = as_numpy(image_to_text), as_numpy(text_to_image)
    owner = np.asarray(text_image_index, dtype=np.int64)
    n_images = image_to_text.shape[0]
    # a list as long as its whole gallery is complete for any k
    for name, table, gallery in (("image_to_text", image_to_text, len(owner)), ("text_to_image", text_to_image, n_images)):
        if table.shape[1] < min(max(ks), gallery):
            raise ValueError(f"{name} holds {table.shape[1]} neighbours; recall@{max(ks)} needs {max(ks)}")
    image_hits = owner[image_to_text] == np.arange(n_images)[:, None]  # (N_img, k)
    text_hits = text_to_image == owner[:, None]  # (N_txt, k)
    hits = {f"i2t/R@{k}": image_hits[:, :k].any(axis=1) for k in ks}
    hits.update({f"t2i/R@{k}": text_hits[:, :k].any(axis=1) for k in ks})
    return hits


def recall_from_neighbours(
    image_to_text: np.ndarray | torch.Tensor,
    text_to_image: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
    ks: Sequence[int] = (1, 5, 10),
) -> dict[str, float]:
    """Recall@k both ways from top-k index lists (`recall_hits`): `i2t/R@k`, the share of images with at least one
    of their captions in the top k; `t2i/R@k`, the share of captions whose image is in the top k."""
    return {name: float(found.mean()) for name, found in
            recall_hits(image_to_text, text_to_image, text_image_index, ks).items()}


def recall_at_k(
    scores: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
    ks: Sequence[int] = (1, 5, 10),
) -> dict[str, float]:
    """Recall@k from a full (N_img, N_txt) score matrix; several captions per image are all positives."""
    scores = torch.as_tensor(as_numpy(scores)).float()
    k = min(max(ks), scores.shape[1])
    image_to_text = scores.topk(k, dim=1).indices
    text_to_image = scores.T.topk(min(max(ks), scores.shape[0]), dim=1).indices
    return recall_from_neighbours(image_to_text, text_to_image, text_image_index, ks)


def retrieval_recall(
    image_embeddings: np.ndarray | torch.Tensor,
    text_embeddings: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
    ks: Sequence[int] = (1, 5, 10),
    chunk: int = DEFAULT_CHUNK,
) -> dict[str, float]:
    """Recall@k from (N_img, d) and (N_txt, d) unit vectors, never holding the full score matrix."""
    forward, backward = cross_neighbours(image_embeddings, text_embeddings, max(ks), chunk=chunk)
    return recall_from_neighbours(forward.indices, backward.indices, text_image_index, ks)


def pairwise_correct(positive_scores, negative_scores) -> np.ndarray:
    """Whether each item's positive scores strictly above its negative: (n,), (n,) -> (n,) bool."""
    positive, negative = as_numpy(positive_scores).astype(np.float64), as_numpy(negative_scores).astype(np.float64)
    if positive.shape != negative.shape:
        raise ValueError(f"score shapes differ: {positive.shape} vs {negative.shape}")
    return positive > negative


def pairwise_accuracy(positive_scores, negative_scores) -> float:
    """Share of items whose positive scores strictly above its negative: (n,), (n,) -> float."""
    correct = pairwise_correct(positive_scores, negative_scores)
    return float(correct.mean()) if correct.size else float("nan")


def group_accuracy(correct, groups, min_count: int = 1) -> dict[str, float]:
    """Accuracy within each group with at least `min_count` items: (n,) bool, (n,) labels."""
    correct, groups = np.asarray(correct, dtype=bool), np.asarray(groups)
    figures = {}
    for group in sorted(set(groups.tolist())):
        mask = groups == group
        if mask.sum() >= min_count:
            figures[str(group)] = float(correct[mask].mean())
    return figures


def macro_accuracy(correct, groups, min_count: int = 1) -> float:
    """Mean over groups (with at least `min_count` items) of the accuracy within each group."""
    per_group = group_accuracy(correct, groups, min_count)
    return float(np.mean(list(per_group.values()))) if per_group else float("nan")


def winoground_correct(scores) -> dict[str, np.ndarray]:
    """Per item, whether Winoground's three scores count it right: (n,) bool each, from (n, 2, 2) similarities
    `scores[i, c, m]` = s(caption_c, image_m).

    Text score: for each image the right caption wins, s(c0,i0) > s(c1,i0) and s(c1,i1) > s(c0,i1).
    Image score: for each caption the right image wins, s(c0,i0) > s(c0,i1) and s(c1,i1) > s(c1,i0).
    Group score: both at once.
    """
    s = as_numpy(scores).astype(np.float64)
    if s.ndim != 3 or s.shape[1:] != (2, 2):
        raise ValueError(f"expected (n, 2, 2) scores, got {s.shape}")
    text = (s[:, 0, 0] > s[:, 1, 0]) & (s[:, 1, 1] > s[:, 0, 1])
    image = (s[:, 0, 0] > s[:, 0, 1]) & (s[:, 1, 1] > s[:, 1, 0])
    return {"text": text, "image": image, "group": text & image}


def winoground_scores(scores) -> dict[str, float]:
    """Winoground's text, image and group scores: the shares of items `winoground_correct` finds right."""
    return {name: float(right.mean()) for name, right in winoground_correct(scores).items()}


def zeroshot_scores(scores, labels) -> dict[str, float]:
    """Zero-shot classification figures from (n, C) image-class scores and (n,) true class indices.

    As CLIP_benchmark reports them: `top1` and `top5` accuracy (`top5` is NaN with fewer
    than five classes) and `mean_per_class_recall`, the mean over the classes that occur
    in `labels` of the share of their images predicted right (scikit-learn's
    `balanced_accuracy_score`).
    """
    s = torch.as_tensor(as_numpy(scores)).double()
    truth = torch.as_tensor(as_numpy(labels)).long()
    if s.ndim != 2 or truth.shape != (s.shape[0],):
        raise ValueError(f"expected (n, C) scores and (n,) labels, got {tuple(s.shape)} and {tuple(truth.shape)}")
    if not len(truth):
        return {"top1": float("nan"), "top5": float("nan"), "mean_per_class_recall": float("nan")}
    predicted = s.argmax(dim=1)  # (n,) the first of tied classes
    top5 = (s.topk(5, dim=1).indices == truth[:, None]).any(dim=1) if s.shape[1] >= 5 else None  # (n,)
    recalls = [float((predicted[truth == c] == c).double().mean()) for c in truth.unique().tolist()]
    return {
        "top1": float((predicted == truth).double().mean()),
        "top5": float(top5.double().mean()) if top5 is not None else float("nan"),
        "mean_per_class_recall": float(np.mean(recalls)),
    }
