"""Images through an encoder's evaluation transform as one stack: the tensors of one image at a time, bit for bit."""

import numpy as np
import torch
from PIL import Image

from lace.encoders import load_encoder
from lace.encoders.preprocess import _stack_plan, preprocess_images


def _images(n: int, size: int, mode: str = "RGB") -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).convert(mode) for _ in range(n)]


def test_a_stack_of_images_at_the_transforms_size_equals_one_image_at_a_time():
    preprocess = load_encoder("lace-micro-rn-32").preprocess
    assert _stack_plan(preprocess) is not None  # open_clip's evaluation transform is done as one stack
    images = _images(37, 32)
    stacked = preprocess_images(preprocess, images)
    assert stacked.shape == (37, 3, 32, 32) and stacked.is_contiguous()
    assert torch.equal(stacked, torch.stack([preprocess(image) for image in images]))


def test_other_sizes_modes_and_transforms_go_one_image_at_a_time():
    preprocess = load_encoder("lace-micro-rn-32").preprocess
    for images in (_images(5, 40), _images(3, 32, "L"), [*_images(2, 32), *_images(2, 48)]):
        assert torch.equal(preprocess_images(preprocess, images), torch.stack([preprocess(image) for image in images]))

    def halves(image):
        return torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 2

    assert _stack_plan(halves) is None
    images = _images(4, 32)
    assert torch.equal(preprocess_images(halves, images), torch.stack([halves(image) for image in images]))
