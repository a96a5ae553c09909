"""Truncated or altered files of every kind lace reads give a `LaceInputError` naming the file, never a
crash from deep inside a library or silently wrong data.

One pristine copy of each artifact is made per module; each case copies it, damages one file and loads it.
Damage: `truncated` (first half kept), `empty`, `header` (bytes 8-40 inverted: the part of the file that
says what follows) and, for JSON, `altered` (valid JSON of the wrong shape: a list where an object is
expected, and the other way round).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lace.cli import main
from lace.concepts.labelled import load_labelled_dictionary
from lace.data import read_dataset
from lace.data.world.folder import read_scenes, read_world_config
from lace.embeddings import EmbeddingStore
from lace.encoders.towers.features import _cached
from lace.encoders.towers.top_features import _load
from lace.errors import LaceInputError
from lace.eval.benchmarks import get_benchmark
from lace.train.checkpoints import load_checkpoint, resolve_checkpoint, save_checkpoint
from tests.conftest import tiny_world
from tests.toy_concepts import write_toy_store

DAMAGE = ("truncated", "empty", "header")


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "header":
        path.write_bytes(data[:8] + bytes(b ^ 0xFF for b in data[8:40]) + data[40:])
    elif how == "altered":  # valid JSON, wrong shape
        value = json.loads(data)
        path.write_text(json.dumps([value] if isinstance(value, dict) else {"items": value}))
    else:
        raise ValueError(how)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A checkpoint, a labelled dictionary, an embedding store, tower caches and a shapes world."""
    root = tmp_path_factory.mktemp("pristine")
    save_checkpoint(root / "run", 1, {"w": torch.randn(4, 4)}, {"step": 1, "rng": torch.get_rng_state()})
    write_toy_store(root, 120)
    assert main(["dict", "fit", "--embeddings", str(root / "store"), "--atoms", "12", "--sparsity", "4", "--mode",
                 "vocabulary", "--vocabulary", str(root / "vocabulary.yaml"), "--no-progress",
                 "--out", str(root / "dictionary")]) == 0
    (root / "towers").mkdir()
    np.save(root / "towers" / "image-tower-key.npy", np.random.default_rng(0).random((6, 1280), dtype=np.float32))
    np.save(root / "towers" / "text-top-key-offsets.npy", np.arange(0, 14, 2, dtype=np.int64))
    tiny_world(root / "world", 24, (0.5, 0.2, 0.1, 0.2))
    return root


# (artifact folder, file inside it, loader of the folder)
def _checkpoint(folder):
    return load_checkpoint(resolve_checkpoint(folder, "latest"), folder)


CASES = {
    "checkpoint weights": ("run", "checkpoints/step_0000001.safetensors", _checkpoint),
    "checkpoint state": ("run", "checkpoints/step_0000001.state.pt", _checkpoint),
    "checkpoint manifest": ("run", "checkpoints/step_0000001.json", _checkpoint),
    "checkpoint pointer": ("run", "checkpoints/latest", _checkpoint),
    "dictionary cfg": ("dictionary", "cfg.json", load_labelled_dictionary),
    "dictionary atoms": ("dictionary", "dictionary.safetensors", load_labelled_dictionary),
    "dictionary quality": ("dictionary", "quality.json", load_labelled_dictionary),
    "dictionary concepts": ("dictionary", "concepts.json", load_labelled_dictionary),
    "dictionary directions": ("dictionary", "concept_directions.safetensors", load_labelled_dictionary),
    "dictionary labelling": ("dictionary", "labelling.json", load_labelled_dictionary),
    "dictionary labelling tensors": ("dictionary", "labelling.safetensors", load_labelled_dictionary),
    "store images": ("store", "image_embeddings.npy", EmbeddingStore.open),
    "store texts": ("store", "text_embeddings.npy", EmbeddingStore.open),
    "store index": ("store", "index.json", EmbeddingStore.open),
    "tower features": ("towers", "image-tower-key.npy", lambda f: _cached(f / "image-tower-key.npy", 6, 1280, compute=None,
                                                                      description={})),
    "tower-top offsets": ("towers", "text-top-key-offsets.npy",
                          lambda f: _load(f / "text-top-key-offsets.npy", 7, "token offsets")),
    "world captions": ("world", "annotations/captions_train_coco.json",
                       lambda f: read_dataset(f / "annotations" / "captions_train_coco.json")),
    "world karpathy": ("world", "karpathy_coco.json", lambda f: read_dataset(f / "karpathy_coco.json", split="test")),
    "world config": ("world", "world.json", read_world_config),
    "world scenes": ("world", "scenes_train.jsonl", lambda f: read_scenes(f, "train")),
    "world benchmark": ("world", "benchmarks/test.json", lambda f: get_benchmark("world").load(f)),
    "world winoground": ("world", "benchmarks/test_winoground.json", lambda f: get_benchmark("world").load(f)),
}
JSON_CASES = [name for name, (_, file, _) in CASES.items() if file.endswith(".json")]


def check_refused(pristine: Path, tmp_path: Path, name: str, how: str) -> None:
    folder_name, file, load = CASES[name]
    folder = tmp_path / folder_name
    shutil.copytree(pristine / folder_name, folder)
    load(folder)  # the pristine copy loads
    damage(folder / file, how)
    with pytest.raises(LaceInputError) as refused:
        load(folder)
    assert Path(file).name in str(refused.value), f"the error does not name the file: {refused.value}"


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("name", list(CASES))
def test_damaged_file_is_refused_naming_it(pristine, tmp_path, name, how):
    check_refused(pristine, tmp_path, name, how)


@pytest.mark.parametrize("name", JSON_CASES)
def test_json_of_the_wrong_shape_is_refused_naming_it(pristine, tmp_path, name):
    check_refused(pristine, tmp_path, name, "altered")


@pytest.mark.parametrize("name", ["checkpoint weights", "checkpoint state"])
def test_checkpoint_with_a_changed_byte_inside_is_refused(pristine, tmp_path, name):
    """Checkpoints carry SHA-256s in their manifest, so even one byte changed past the header is caught."""
    folder_name, file, load = CASES[name]
    shutil.copytree(pristine / folder_name, tmp_path / folder_name)
    path = tmp_path / folder_name / file
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(LaceInputError, match=f"{Path(file).name}: checkpoint is damaged"):
        load(tmp_path / folder_name)
