"""Tower features: batched extraction, the on-disk cache, and heads-only training on cached features."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from PIL import Image

from lace.data import read_csv
from lace.data.dataset import ImageTextDataset, ImageTextRecord
from lace.encoders import load_encoder
from lace.encoders.towers import features as tower_features
from lace.encoders.towers import onnx_runtime
from lace.encoders.towers.onnx_runtime import RUNTIMES
from lace.errors import LaceInputError
from lace.losses import clip_loss

COLOURS = ["red", "green", "blue", "yellow", "white", "black"]


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    return load_encoder("lace-towers").eval()


@pytest.fixture
def photos(tmp_path):
    """Six JPEGs of different sizes (one large enough for draft decoding) and a captions CSV."""
    images = tmp_path / "images"
    images.mkdir()
    rows = []
    for i, colour in enumerate(COLOURS):
        size = (900, 700) if i == 0 else (160 + 20 * i, 120 + 10 * i)
        Image.new("RGB", size, colour).save(images / f"{colour}.jpg", quality=90)
        rows += [(f"{colour}.jpg", f"a plain {colour} picture"), (f"{colour}.jpg", f"{colour}")]
    path = tmp_path / "captions.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([("image", "caption"), *rows])
    return read_csv(path, image_root=images)


def test_batched_workers_match_one_image_at_a_time(encoder, photos):
    batched = tower_features.compute_image_tower_features(encoder, photos, batch_size=4, num_workers=2)
    assert batched.shape == (6, 1280) and batched.dtype == np.float32
    with torch.no_grad():
        one_by_one = torch.cat([
            encoder.image_tower_features(encoder.preprocess(photos.load_image(i)).unsqueeze(0))
            for i in range(len(photos))
        ])
    # The large JPEG is decoded at a reduced scale (draft), so allow a small difference there.
    torch.testing.assert_close(torch.from_numpy(batched[1:]), one_by_one[1:], atol=1e-4, rtol=1e-4)
    cosine = torch.nn.functional.cosine_similarity(torch.from_numpy(batched[:1]), one_by_one[:1])
    assert float(cosine) > 0.99


def test_length_sorted_text_batches_match_single_captions(encoder, photos):
    captions = photos.captions
    batched = tower_features.compute_text_tower_features(encoder, captions, batch_size=5, runtime="torch")
    with torch.no_grad():
        single = torch.cat([encoder.text_tower_features(encoder.tokenize([c])) for c in captions])
    torch.testing.assert_close(torch.from_numpy(batched), single, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(onnx_runtime.default_runtime("image") != "onnxruntime", reason="onnxruntime is not installed")
def test_onnxruntime_and_torch_give_the_same_features(encoder, photos):
    cosine = lambda a, b: float(torch.nn.functional.cosine_similarity(torch.from_numpy(a), torch.from_numpy(b)).min())
    images = {runtime: tower_features.compute_image_tower_features(encoder, photos, batch_size=4, num_workers=0,
                                                                  runtime=runtime) for runtime in RUNTIMES["image"]}
    texts = {runtime: tower_features.compute_text_tower_features(encoder, photos.captions, batch_size=5,
                                                                runtime=runtime) for runtime in RUNTIMES["text"]}
    assert cosine(images["onnxruntime"], images["torch"]) > 1 - 1e-4
    assert cosine(texts["onnxruntime"], texts["torch"]) > 1 - 1e-4
    assert cosine(texts["torch-bf16"], texts["torch"]) > 1 - 1e-4
    assert not np.array_equal(texts["torch-bf16"], texts["torch"])  # bfloat16 really ran
    with pytest.raises(LaceInputError, match="text tower runtime"):
        tower_features.compute_text_tower_features(encoder, photos.captions, runtime="tensorflow")
    with pytest.raises(LaceInputError, match="image tower runtime"):  # no bf16 image runtime: cosine 0.998 only
        tower_features.compute_image_tower_features(encoder, photos, num_workers=0, runtime="torch-bf16")


def test_full_decoding_is_cached_under_its_own_key(encoder, tmp_path):
    """Draft decoding changes the features of large JPEGs, so a full decode must never read its cache."""
    rows = np.random.default_rng(0).integers(0, 256, (700, 900, 3), dtype=np.uint8)
    Image.fromarray(rows).save(tmp_path / "large.jpg", quality=90)
    Image.fromarray(rows[:200, :240]).save(tmp_path / "small.jpg", quality=90)
    photos = ImageTextDataset([ImageTextRecord(name, tmp_path / f"{name}.jpg", ("a photo",))
                               for name in ("large", "small")], "test")
    draft = tower_features.cached_image_tower_features(encoder, photos, tmp_path, num_workers=0, runtime="torch")
    full = tower_features.cached_image_tower_features(encoder, photos, tmp_path, num_workers=0, runtime="torch",
                                                      draft=False)
    assert len(list(tmp_path.glob("image-tower-*.npy"))) == 2
    assert not np.allclose(draft[0], full[0], atol=1e-3)  # 900 x 700: decoded at half scale in draft mode
    np.testing.assert_array_equal(draft[1], full[1])  # 240 x 200: draft mode does nothing


def test_cache_round_trip_reads_the_file_the_second_time(encoder, photos, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = (tower_features.cached_image_tower_features(encoder, photos, cache, batch_size=4, num_workers=0),
             tower_features.cached_text_tower_features(encoder, photos.captions, cache))
    files = sorted(p.name for p in cache.iterdir())
    assert len([f for f in files if f.endswith(".npy")]) == 2 and len(files) == 6  # each with .json and manifest

    def fail(*args, **kwargs):
        raise AssertionError("computed again instead of reading the cache")

    monkeypatch.setattr(tower_features, "compute_image_tower_features", fail)
    monkeypatch.setattr(tower_features, "compute_text_tower_features", fail)
    second = (tower_features.cached_image_tower_features(encoder, photos, cache),
              tower_features.cached_text_tower_features(encoder, photos.captions, cache))
    assert all(isinstance(features, np.memmap) for features in second)
    np.testing.assert_array_equal(second[0], first[0])
    np.testing.assert_array_equal(second[1], first[1])
    assert second[1].shape == (12, 384)
    with pytest.raises(AssertionError, match="computed again"):  # other captions: another key
        tower_features.cached_text_tower_features(encoder, ["a different caption"], cache)


def test_changed_tower_weights_change_the_cache_key(encoder):
    before = tower_features.tower_fingerprint(encoder.text_tower)
    layer = encoder.text_tower.layers[-1].output.dense
    original = layer.bias.detach().clone()
    with torch.no_grad():
        layer.bias.add_(1.0)
        changed = tower_features.tower_fingerprint(encoder.text_tower)
        layer.bias.copy_(original)
    assert changed != before
    assert tower_features.tower_fingerprint(encoder.text_tower) == before


def test_damaged_cache_file_is_named(encoder, photos, tmp_path):
    cache = tmp_path / "cache"
    tower_features.cached_text_tower_features(encoder, photos.captions, cache)
    (path,) = cache.glob("text-tower-*.npy")
    path.write_bytes(b"not numpy")
    with pytest.raises(LaceInputError, match=path.name):
        tower_features.cached_text_tower_features(encoder, photos.captions, cache)


def test_missing_image_is_named(encoder, photos):
    photos.records[2].image_path.unlink()
    with pytest.raises(LaceInputError, match="blue.jpg: image file not found"):
        tower_features.compute_image_tower_features(encoder, photos, num_workers=0)


def test_heads_train_on_cached_features_and_towers_stay_fixed(encoder, photos, tmp_path):
    cached_images = tower_features.cached_image_tower_features(encoder, photos, tmp_path / "cache", num_workers=0)
    cached_texts = tower_features.cached_text_tower_features(encoder, photos.captions, tmp_path / "cache")
    image_rows = torch.tensor(photos.caption_image_index)
    image_features = torch.from_numpy(np.array(cached_images))[image_rows]  # (12, 1280)
    text_features = torch.from_numpy(np.array(cached_texts))  # (12, 384)
    tower_before = tower_features.tower_fingerprint(encoder.image_tower)
    torch.manual_seed(0)
    encoder.train()
    optimiser = torch.optim.Adam([p for p in encoder.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(15):
        U, V, scale = encoder.forward_features(image_features[::2], text_features[::2])  # one caption per image
        loss = clip_loss(U, V, scale)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    encoder.eval()
    assert losses[-1] < 0.5 * losses[0]
    assert tower_features.tower_fingerprint(encoder.image_tower) == tower_before
