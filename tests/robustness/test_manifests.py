"""One flipped bit in the body of each kind of folder lace writes is caught by its SHA-256 manifest, naming the
file; `--no-verify` (`verification(False)`) reads it as it is; a folder without a manifest loads with a warning.

The bit is flipped where the file stays readable (the low bit of a float's last mantissa byte, or of a digit
in JSON), so that only the checksum can tell: without it the damage would be read as data.
"""

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from lace.cli import main
from lace.concepts.labelled import load_labelled_dictionary
from lace.data import read_dataset
from lace.data.world.folder import read_scenes, read_world_config
from lace.embeddings import EmbeddingStore
from lace.encoders.towers.features import _cached, _save_array
from lace.encoders.towers.top_features import _load, _write_description, offsets_path
from lace.errors import LaceInputError
from lace.experiment.stages import StageRunner
from lace.manifest import MANIFEST, entry_manifest, verification
from tests.conftest import tiny_world
from tests.toy_concepts import write_toy_store


def flip_float_bit(path: Path, item_bytes: int = 4) -> None:
    """Flip the lowest bit of the first byte of an element near the end of a little-endian float array file
    (the data of .npy and .safetensors files ends the file): the value moves by one unit in its last place."""
    data = bytearray(path.read_bytes())
    data[len(data) - 3 * item_bytes] ^= 0x01
    path.write_bytes(bytes(data))


def flip_digit_bit(path: Path) -> None:
    """Flip the lowest bit of a digit in the second half of a text file (it stays a digit: still valid JSON)."""
    data = bytearray(path.read_bytes())
    position = next(i for i in range(len(data) * 2 // 3, len(data)) if 0x30 <= data[i] <= 0x39)
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """An embedding store, a labelled dictionary, tower feature caches, a world and a stage record."""
    root = tmp_path_factory.mktemp("manifests")
    write_toy_store(root, 120)
    assert main(["dict", "fit", "--embeddings", str(root / "store"), "--atoms", "12", "--sparsity", "4", "--mode",
                 "vocabulary", "--vocabulary", str(root / "vocabulary.yaml"), "--no-progress",
                 "--out", str(root / "dictionary")]) == 0
    rng = np.random.default_rng(0)
    _save_array(root / "towers" / "image-tower-key.npy", rng.random((6, 1280), dtype=np.float32), {"rows": 6})
    top = root / "towers" / "image-top-key.npy"
    np.save(top, rng.random((6, 192, 7, 7)).astype(np.float16))
    _write_description(top, {"shape": [6, 192, 7, 7]})
    text_top = root / "towers" / "text-top-key.npy"
    np.save(text_top, rng.random((12, 384)).astype(np.float16))
    np.save(offsets_path(text_top), np.arange(0, 14, 2, dtype=np.int64))
    _write_description(text_top, {"captions": 6})
    tiny_world(root / "world", 24, (0.5, 0.2, 0.1, 0.2))
    StageRunner(root / "study", log=lambda _: None).run("base", "k1", lambda: {"recall": 0.123456, "n": 40})
    return root


def _stage(folder: Path):
    return StageRunner(folder, log=lambda _: None).cached("base", "k1")


# kind -> (folder, damaged file, how to flip it, loader)
CASES = {
    "dictionary": ("dictionary", "dictionary.safetensors", flip_float_bit, load_labelled_dictionary),
    "dictionary directions": ("dictionary", "concept_directions.safetensors", flip_float_bit,
                              load_labelled_dictionary),
    "embedding store": ("store", "image_embeddings.npy", flip_float_bit, EmbeddingStore.open),
    "tower feature cache": ("towers", "image-tower-key.npy", flip_float_bit,
                            lambda f: _cached(f / "image-tower-key.npy", 6, 1280, compute=None, description={})),
    "tower-top image maps": ("towers", "image-top-key.npy", lambda p: flip_float_bit(p, 2),
                             lambda f: _load(f / "image-top-key.npy", 6, "image maps")),
    "tower-top token states": ("towers", "text-top-key.npy", lambda p: flip_float_bit(p, 2),
                               lambda f: _load(f / "text-top-key.npy", 12, "token states")),
    "world config": ("world", "world.json", flip_digit_bit, read_world_config),
    "world scenes": ("world", "scenes_train.jsonl", flip_digit_bit, lambda f: read_scenes(f, "train")),
    "world captions": ("world", "annotations/captions_train_coco.json", flip_digit_bit,
                       lambda f: read_dataset(f / "annotations" / "captions_train_coco.json")),
    "study stage": ("study", "stages/base.json", flip_digit_bit, _stage),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_a_flipped_bit_is_caught_naming_the_file_and_no_verify_reads_it(pristine, tmp_path, kind):
    folder_name, file, flip, load = CASES[kind]
    folder = tmp_path / folder_name
    shutil.copytree(pristine / folder_name, folder)
    load(folder)  # the pristine copy loads
    before = (folder / file).read_bytes()
    flip(folder / file)
    assert (folder / file).read_bytes() != before
    with pytest.raises(LaceInputError, match="its SHA-256 does not match") as refused:
        load(folder)
    assert str(folder / file) in str(refused.value), refused.value
    with verification(False):
        load(folder)  # read as data: what the manifest is there to prevent


def test_no_verify_flag_reads_a_damaged_store(pristine, tmp_path, capsys):
    shutil.copytree(pristine / "store", tmp_path / "store")
    shutil.copy(pristine / "vocabulary.yaml", tmp_path / "vocabulary.yaml")
    flip_float_bit(tmp_path / "store" / "text_embeddings.npy")
    argv = ["dict", "fit", "--embeddings", str(tmp_path / "store"), "--atoms", "12", "--sparsity", "4", "--mode",
            "vocabulary", "--vocabulary", str(tmp_path / "vocabulary.yaml"), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "refused")]) == 2
    assert "text_embeddings.npy: damaged: its SHA-256 does not match manifest.json" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "read"), "--no-verify"]) == 0


def test_manifests_are_written_last_and_list_every_file(pristine):
    """The dictionary lists each of its files; the world lists its images too; each cache entry has its own."""
    import json

    listed = json.loads((pristine / "dictionary" / MANIFEST).read_text())["files"]
    on_disk = {p.name for p in (pristine / "dictionary").iterdir() if p.name != MANIFEST}
    assert set(listed) == on_disk
    world = json.loads((pristine / "world" / MANIFEST).read_text())["files"]
    assert any(name.endswith(".png") for name in world) and "world.json" in world
    entry = json.loads(entry_manifest(pristine / "towers" / "text-top-key.npy").read_text())["files"]
    assert set(entry) == {"text-top-key.npy", "text-top-key-offsets.npy", "text-top-key.json"}


@pytest.mark.parametrize("kind", ["dictionary", "embedding store", "tower feature cache", "world config",
                                  "study stage"])
def test_a_folder_without_a_manifest_loads_with_a_warning(pristine, tmp_path, caplog, kind):
    folder_name, _, _, load = CASES[kind]
    folder = tmp_path / folder_name
    shutil.copytree(pristine / folder_name, folder)
    for manifest in [*folder.rglob(MANIFEST), *folder.rglob("*.manifest.json")]:
        manifest.unlink()
    with caplog.at_level(logging.WARNING, logger="lace.manifest"):
        load(folder)
    assert "read without a SHA-256 check" in caplog.text


def test_a_datasets_own_manifest_json_is_left_alone(tmp_path):
    """`read_dataset` checks a file against a lace manifest nearby, and ignores a `manifest.json` of another
    format (a dataset may ship one)."""
    (tmp_path / "manifest.json").write_text('{"version": 3, "files": ["pairs.csv"]}')
    (tmp_path / "pairs.csv").write_text("filepath,caption\na.png,a red circle\n")
    assert len(read_dataset(tmp_path / "pairs.csv").records) == 1
