"""Training data: (pixels, caption) pairs in a seeded global order, sharded over processes.

The order depends only on the seed and the dataset size, never on the switches of a run,
so ablations see the same pairs in the same batches. Global micro-batch g of epoch e
holds positions `b*B .. (b+1)*B` of epoch e's permutation (last partial batch dropped);
process r of W takes the r-th contiguous slice of B/W pairs. One caption per image per
epoch is drawn from the same seed, and each sample's augmentation is seeded by
(seed, epoch, image), so workers, resumption and sharding change nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from lace.data import ImageTextDataset
from lace.errors import LaceInputError


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


EDIT_STREAM, LOCAL_STREAM = 2, 5
"""Seed streams of per-row draws beside the data order (0) and augmentation (1): dictionary edits, local transplants."""


def row_seeds(seed: int, keys: list[tuple[int, int]], stream: int) -> list[int]:
    """One seed per row from (epoch, image index), in seed stream `stream`: independent of how the batch is
    split over processes."""
    return [_seed(seed, stream, epoch, index) for epoch, index in keys]


@dataclass(frozen=True)
class Sample:
    """What the loader asks for: which image, which of its captions, in which epoch."""

    index: int
    caption: int
    epoch: int


class TrainingOrder:
    """The seeded global order of pairs, as micro-batches of `batch_size` (global).

    `n_captions[i]` is the number of captions of image i.
    """

    def __init__(self, n_captions: Sequence[int], batch_size: int, seed: int):
        self.n_captions = np.asarray(n_captions, dtype=np.int64)
        self.batch_size = batch_size
        self.seed = seed
        if len(self.n_captions) < batch_size:
            raise LaceInputError(
                f"training data: {len(self.n_captions)} usable images, fewer than one batch of {batch_size}; "
                "lower --batch-size or add data"
            )
        self.batches_per_epoch = len(self.n_captions) // batch_size
        self._cached_epoch: tuple[int, np.ndarray, np.ndarray] | None = None

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if self._cached_epoch is None or self._cached_epoch[0] != epoch:
            rng = np.random.default_rng(_seed(self.seed, 0, epoch))
            permutation = rng.permutation(len(self.n_captions))
            captions = rng.integers(0, 2**62, size=len(self.n_captions)) % self.n_captions
            self._cached_epoch = (epoch, permutation, captions)
        return self._cached_epoch[1], self._cached_epoch[2]

    def micro_batch(self, number: int, rank: int = 0, world_size: int = 1) -> list[Sample]:
        """Samples of global micro-batch `number` that process `rank` of `world_size` loads."""
        epoch, within = divmod(number, self.batches_per_epoch)
        permutation, captions = self._epoch(epoch)
        per_rank = self.batch_size // world_size
        start = within * self.batch_size + rank * per_rank
        return [Sample(int(i), int(captions[i]), epoch) for i in permutation[start : start + per_rank]]


class RankBatches:
    """Batch sampler over micro-batches `start .. stop - 1` of the order, for one process."""

    def __init__(self, order: TrainingOrder, start: int, stop: int, rank: int = 0, world_size: int = 1):
        self.order, self.start, self.stop, self.rank, self.world_size = order, start, stop, rank, world_size

    def __iter__(self) -> Iterator[list[Sample]]:
        for number in range(self.start, self.stop):
            yield self.order.micro_batch(number, self.rank, self.world_size)

    def __len__(self) -> int:
        return self.stop - self.start


class ImagePairs(Dataset):
    """Images read through an `ImageTextDataset`, transformed by the model's training transform.

    An unreadable image gives None when `skip_unreadable` (the batch drops it and counts
    it), else the reader's `LaceInputError` propagates.
    """

    def __init__(self, dataset: ImageTextDataset, transform: Callable[[Image.Image], Tensor], seed: int,
                 skip_unreadable: bool = True, cache_images: bool = False):
        self.dataset = dataset
        self.transform = transform
        self.seed = seed
        self.skip_unreadable = skip_unreadable
        self.cache_images = cache_images
        self._cache: dict[int, Image.Image] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def n_captions(self) -> list[int]:
        return [len(record.captions) for record in self.dataset.records]

    def _image(self, index: int) -> Image.Image:
        if index in self._cache:
            return self._cache[index]
        image = self.dataset.load_image(index)
        if self.cache_images:
            self._cache[index] = image
        return image

    def __getitem__(self, sample: Sample) -> tuple[Tensor, str, int] | None:
        try:
            image = self._image(sample.index)
        except LaceInputError:
            if self.skip_unreadable:
                return None
            raise
        # Seed the (random) training transform per sample, so augmentation does not depend
        # on workers, on resumption or on anything else drawn from the global generator.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_seed(self.seed, 1, sample.epoch, sample.index))
            pixels = self.transform(image)
        return pixels, self.dataset.records[sample.index].captions[sample.caption], sample.index


class TensorPairs(Dataset):
    """Preprocessed pixels held in memory with their captions (no augmentation).

    pixels: (N, 3, H, W) float tensor, already in the model's input format.
    captions: N captions, or N sequences of captions (one is drawn per image per epoch).
    """

    def __init__(self, pixels: Tensor, captions: Sequence[str] | Sequence[Sequence[str]]):
        if pixels.ndim != 4 or len(captions) != pixels.shape[0]:
            raise LaceInputError(
                f"in-memory training data: expected pixels (N, 3, H, W) and N captions, "
                f"got pixels {tuple(pixels.shape)} and {len(captions)} captions"
            )
        self.pixels = pixels
        self.captions = [(c,) if isinstance(c, str) else tuple(c) for c in captions]
        if any(not c for c in self.captions):
            raise LaceInputError("in-memory training data: every image needs at least one caption")

    def __len__(self) -> int:
        return self.pixels.shape[0]

    @property
    def n_captions(self) -> list[int]:
        return [len(c) for c in self.captions]

    def __getitem__(self, sample: Sample) -> tuple[Tensor, str, int]:
        return self.pixels[sample.index], self.captions[sample.index][sample.caption], sample.index


def caption_rows_by_image(caption_image_index: np.ndarray, n_images: int) -> list[np.ndarray]:
    """For each image, the rows of its captions."""
    order = np.argsort(caption_image_index, kind="stable")
    bounds = np.searchsorted(caption_image_index[order], np.arange(n_images + 1))
    return [order[bounds[i]:bounds[i + 1]] for i in range(n_images)]


class _CachedPairs(Dataset):
    """Cached pairs of N images and their captions: each image's caption rows (`rows_of_image`), none empty."""

    def __init__(self, caption_image_index: np.ndarray, n_images: int, what: str):
        self.rows_of_image = caption_rows_by_image(np.asarray(caption_image_index), n_images)
        if any(len(rows) == 0 for rows in self.rows_of_image):
            raise LaceInputError(f"{what}: every image needs at least one caption")

    def __len__(self) -> int:
        return len(self.rows_of_image)

    @property
    def n_captions(self) -> list[int]:
        return [len(rows) for rows in self.rows_of_image]


class FeaturePairs(_CachedPairs):
    """Cached tower features of images and captions, for training the heads of a `lace-towers` model.

    image_features: (N_img, F_img); text_features: (N_txt, F_txt); caption_image_index: (N_txt,) the
    image of each caption. negative_features (N_txt, F_txt) and negative_valid (N_txt,) bool: the
    cached features of one rule-made negative per caption (optional; `caption_negatives` needs them).
    """

    def __init__(self, image_features: Tensor, text_features: Tensor, caption_image_index: np.ndarray,
                 negative_features: Tensor | None = None, negative_valid: Tensor | None = None):
        if text_features.shape[0] != len(caption_image_index) or (
                negative_features is not None and negative_features.shape[0] != text_features.shape[0]):
            raise LaceInputError(
                f"cached training features: expected one image index (and negative) per caption row, got "
                f"{text_features.shape[0]} captions and {len(caption_image_index)} image indices"
            )
        super().__init__(caption_image_index, image_features.shape[0], "cached training features")
        self.image_features, self.text_features = image_features, text_features
        self.negative_features, self.negative_valid = negative_features, negative_valid

    def __getitem__(self, sample: Sample) -> tuple[int, int]:
        return sample.index, int(self.rows_of_image[sample.index][sample.caption])

    def collate(self, samples: list[tuple[int, int]]) -> FeatureBatch:
        """The feature rows of a micro-batch's (image, caption row) pairs."""
        image_rows = torch.tensor([s[0] for s in samples])
        caption_rows = torch.tensor([s[1] for s in samples])
        negatives = valid = None
        if self.negative_features is not None:
            negatives, valid = self.negative_features[caption_rows], self.negative_valid[caption_rows]
        return FeatureBatch(self.image_features[image_rows], self.text_features[caption_rows],
                            image_rows.tolist(), negatives, valid)


class TopPairs(_CachedPairs):
    """Cached inputs of trainable tower tops (`lace.encoders.towers.top`): the maps entering the image top and the
    token states entering the text top, for training tops and heads without running the towers below the cut.

    image_maps: (N_img, C, H, W) (float16 memory maps are read per batch); token_states: ragged cached token
    states (`TokenStates`) holding these captions among others; caption_rows: (N_txt,) the rows of this
    set's captions in `token_states`; caption_image_index: (N_txt,) the image of each caption.
    negative_states and negative_of_caption (len(token_states),) int64: one rule-made negative per caption,
    the negative of token-state row r being `negative_states` row `negative_of_caption[r]` (-1: none).

    What writing the captions of image edits needs (the pairs layout, `edited_image_rows`, and the provenance
    figures), optional: caption_texts, the text of each `token_states` row; negative_texts, of each `negative_states`
    row; state_encoder, n new captions -> (n, L, h) float32 token states entering the text top and their (n, L) 0/1
    mask, through the locked layers below the cut (`functools.partial(lace.encoders.towers.fresh_token_states,
    encoder)`).
    """

    def __init__(self, image_maps: np.ndarray, token_states, caption_rows: np.ndarray, caption_image_index: np.ndarray,
                 negative_states=None, negative_of_caption: np.ndarray | None = None,
                 caption_texts: Sequence[str] | None = None, negative_texts: Sequence[str] | None = None,
                 state_encoder: Callable[[list[str]], tuple[Tensor, Tensor]] | None = None):
        caption_rows, caption_image_index = np.asarray(caption_rows), np.asarray(caption_image_index)
        if image_maps.ndim != 4 or caption_rows.shape != caption_image_index.shape:
            raise LaceInputError(
                f"cached tower-top inputs: expected maps (N, C, H, W) and one image index per caption row, got maps "
                f"{tuple(image_maps.shape)}, {caption_rows.shape[0]} caption rows and {caption_image_index.shape[0]} "
                "image indices")
        for name, texts, states in (("caption_texts", caption_texts, token_states),
                                    ("negative_texts", negative_texts, negative_states)):
            if texts is not None and (states is None or len(texts) != len(states)):
                raise LaceInputError(f"cached tower-top inputs: field '{name}': expected one text per token-state row "
                                     f"({len(states) if states is not None else 'no token states'}), got {len(texts)}")
        super().__init__(caption_image_index, image_maps.shape[0], "cached tower-top inputs")
        self.image_maps, self.token_states, self.caption_rows = image_maps, token_states, caption_rows
        self.negative_states, self.negative_of_caption = negative_states, negative_of_caption
        self.caption_texts, self.negative_texts, self.state_encoder = caption_texts, negative_texts, state_encoder

    def missing_for_descriptions(self, rule_made: bool) -> list[str]:
        """The fields writing the captions of image edits needs and this set lacks: `caption_texts` and
        `state_encoder`, and `negative_texts` when the arm makes rule-made captions (`rule_made`)."""
        names = ["caption_texts", "state_encoder", *(["negative_texts"] if rule_made else [])]
        return [name for name in names if getattr(self, name) is None]

    def __getitem__(self, sample: Sample) -> tuple[int, int]:
        return sample.index, int(self.caption_rows[self.rows_of_image[sample.index][sample.caption]])

    def collate(self, samples: list[tuple[int, int]]) -> TopBatch:
        """The cached maps (float32) and the token-state rows of a micro-batch's (image, caption) pairs."""
        image_rows = [s[0] for s in samples]
        maps = torch.from_numpy(np.asarray(self.image_maps[np.asarray(image_rows)], dtype=np.float32))
        return TopBatch(maps, np.array([s[1] for s in samples], dtype=np.int64), image_rows)


@dataclass
class TopBatch:
    """maps (B, C, H, W) float32; caption_rows (B,) token-state rows of the captions; indices: B image rows."""

    maps: Tensor
    caption_rows: np.ndarray
    indices: list[int]
    skipped: int = 0


@dataclass
class FeatureBatch:
    """image_features (B, F_img); text_features (B, F_txt); indices: B image rows;
    negative_features (B, F_txt) and negative_valid (B,): one rule-made negative per caption, or None."""

    image_features: Tensor
    text_features: Tensor
    indices: list[int]
    negative_features: Tensor | None = None
    negative_valid: Tensor | None = None
    skipped: int = 0


@dataclass
class Batch:
    """pixels (B, 3, H, W); captions B strings; indices (B,) dataset rows; skipped: dropped images."""

    pixels: Tensor
    captions: list[str]
    indices: list[int]
    skipped: int


def pair_keys(batch: Batch | FeatureBatch | TopBatch) -> tuple[Tensor, Tensor]:
    """(B,) image keys and (B,) caption keys of a batch: equal keys mean the same image (dataset row)
    or the same caption (its text, for cached features the bytes of its feature row, for cached token
    states its row)."""
    if isinstance(batch, TopBatch):
        return torch.tensor(batch.indices, dtype=torch.long), torch.from_numpy(batch.caption_rows)
    if isinstance(batch, FeatureBatch):
        captions = [row.numpy().tobytes() for row in batch.text_features.detach().cpu()]
    else:
        captions = [caption.encode("utf-8") for caption in batch.captions]
    caption_keys = [int.from_bytes(hashlib.blake2b(caption, digest_size=8).digest(), "little", signed=True)
                    for caption in captions]
    return torch.tensor(batch.indices, dtype=torch.long), torch.tensor(caption_keys, dtype=torch.long)


def collate(samples: list[tuple[Tensor, str, int] | None]) -> Batch:
    """Stack the readable samples; count the unreadable ones."""
    kept = [s for s in samples if s is not None]
    if not kept:
        raise LaceInputError("training data: no image of a whole batch could be read")
    return Batch(
        pixels=torch.stack([s[0] for s in kept]),
        captions=[s[1] for s in kept],
        indices=[s[2] for s in kept],
        skipped=len(samples) - len(kept),
    )
