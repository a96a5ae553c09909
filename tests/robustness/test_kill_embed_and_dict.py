"""`lace embed` and `lace dict fit` killed with SIGKILL at seeded points: no output that looks complete is
left, and running the same command again gives the uninterrupted result."""

import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import lace.embeddings
from lace.cli import main
from lace.concepts.labelled import load_labelled_dictionary
from lace.embeddings import EmbeddingStore
from lace.errors import LaceInputError
from lace.io import read_json
from tests.robustness.faults import KillPoint, run_killed
from tests.toy_concepts import write_toy_store

SEED = 16


def embed_argv(data, out) -> list[str]:
    return ["embed", "--model", "lace-micro-32", "--pretrained", "none", "--data", str(data), "--device", "cpu",
            "--batch-size", "4", "--no-progress", "--out", str(out)]


def embed_in_process(argv: list[str]) -> int:
    torch.manual_seed(0)  # the random weights of `--pretrained none`, as the killed children had them
    return main(argv)


def test_embed_killed_twice_then_rerun_gives_the_same_store(tiny_coco, tmp_path):
    assert embed_in_process(embed_argv(tiny_coco, tmp_path / "whole")) == 0
    reference = EmbeddingStore.open(tmp_path / "whole")
    rng = random.Random(SEED)
    # inside the image pass, inside the text pass, or at one of the renames (progress records, the store)
    points = [KillPoint("lace.embeddings", "embed_images", 1), KillPoint("lace.embeddings", "embed_texts", 1),
              KillPoint("lace.io", "os.replace", rng.randint(1, 9))]
    out = tmp_path / "killed"
    for point in [points[rng.randrange(2)], points[2]]:
        assert run_killed(embed_argv(tiny_coco, out), point) == -9, point
        with pytest.raises(LaceInputError, match="file not found"):
            EmbeddingStore.open(out)  # nothing that looks like a store
    assert embed_in_process(embed_argv(tiny_coco, out)) == 0
    store = EmbeddingStore.open(out)
    assert np.array_equal(store.image_embeddings, reference.image_embeddings)
    assert np.array_equal(store.text_embeddings, reference.text_embeddings)
    assert store.index == reference.index
    assert not out.with_name(f".{out.name}.tmp").exists()


def test_embed_carries_on_after_the_images_it_recorded(tiny_coco, tmp_path, monkeypatch):
    reference_dir = tmp_path / "whole"
    assert embed_in_process(embed_argv(tiny_coco, reference_dir)) == 0
    out = tmp_path / "killed"
    # renames: the work folder's record, the shard's empty record, then the record after the images
    assert run_killed(embed_argv(tiny_coco, out), KillPoint("lace.embeddings", "embed_texts", 1)) == -9
    calls = []
    real = lace.embeddings.embed_images
    monkeypatch.setattr(lace.embeddings, "embed_images", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert embed_in_process(embed_argv(tiny_coco, out)) == 0
    assert calls == [], "the images embedded before the kill were embedded again"
    assert np.array_equal(EmbeddingStore.open(out).image_embeddings,
                          EmbeddingStore.open(reference_dir).image_embeddings)


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dict_kill")
    write_toy_store(folder, 120)
    return folder


def dict_argv(folder, out) -> list[str]:
    return ["dict", "fit", "--embeddings", str(folder / "store"), "--atoms", "12", "--sparsity", "4",
            "--mode", "vocabulary", "--vocabulary", str(folder / "vocabulary.yaml"), "--no-progress", "--out", str(out)]


def test_dict_fit_killed_twice_then_rerun_gives_the_same_dictionary(toy_store, tmp_path):
    assert main(dict_argv(toy_store, tmp_path / "whole")) == 0
    rng = random.Random(SEED)
    out = tmp_path / "killed"
    # before the fit, or at one of the renames that write its eight files and move the folder into place
    for point in [KillPoint("lace.experiment.dictionary", "fit_labelled_dictionary", 1),
                  KillPoint("lace.io", "os.replace", rng.randint(1, 9))]:
        assert run_killed(dict_argv(toy_store, out), point) == -9, point
        assert not out.exists() or not any(out.iterdir()), f"files left in {out} after a kill at {point}"
        with pytest.raises(LaceInputError):
            load_labelled_dictionary(out)
    assert main(dict_argv(toy_store, out)) == 0  # the same command, no --overwrite needed
    whole = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert sorted(p.name for p in out.iterdir()) == whole
    for name in whole:
        if name.endswith(".safetensors"):
            mine, theirs = load_file(str(out / name)), load_file(str(tmp_path / "whole" / name))
            assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine), name
        elif name not in ("fit_config.json", "manifest.json"):  # the output folder; the hashes of timed files
            assert untimed(read_json(out / name)) == untimed(read_json(tmp_path / "whole" / name)), name
    assert not out.with_name(f".{out.name}.tmp").exists()


def untimed(record: dict) -> dict:
    """A JSON record without its wall-clock figures."""
    return {k: v for k, v in record.items() if not k.endswith("seconds")}
