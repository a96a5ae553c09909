import json

import numpy as np
import pytest
import torch

from lace.cli import main
from lace.data import read_dataset
from lace.embeddings import EmbeddingStore, extract_embeddings
from lace.encoders import load_encoder
from lace.errors import LaceInputError
from lace.manifest import verification
from tests.distributed_support import in_two_processes


def test_extraction_round_trip_is_memory_mapped_and_matches_direct_encoding(tiny_coco, tmp_path):
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-32")
    dataset = read_dataset(tiny_coco)
    store = extract_embeddings(encoder, dataset, tmp_path / "store", model_name="lace-micro-32",
                               batch_size=4, progress=False)
    assert isinstance(store.image_embeddings, np.memmap)
    assert store.image_embeddings.shape == (6, encoder.embed_dim)
    assert store.text_embeddings.shape == (12, encoder.embed_dim)
    assert store.captions == dataset.captions
    assert list(store.text_image_index) == dataset.caption_image_index
    with torch.no_grad():
        direct_text = encoder.encode_texts(dataset.captions[:3]).numpy()
        direct_image = encoder.encode_images(encoder.preprocess(dataset.load_image(5))[None]).numpy()
    np.testing.assert_allclose(store.text_embeddings[:3], direct_text, atol=1e-5)
    np.testing.assert_allclose(store.image_embeddings[5:], direct_image, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(store.image_embeddings, axis=1), 1, atol=1e-5)
    assert not list(tmp_path.glob(".store*")), "temporary folders are cleaned up"


def test_store_refuses_inconsistent_index(tiny_coco, tmp_path):
    encoder = load_encoder("lace-micro-32")
    extract_embeddings(encoder, read_dataset(tiny_coco), tmp_path / "s", model_name="m", progress=False)
    index = json.loads((tmp_path / "s" / "index.json").read_text())
    index["captions"] = index["captions"][:-1]
    (tmp_path / "s" / "index.json").write_text(json.dumps(index))
    with pytest.raises(LaceInputError, match="index.json: damaged"):
        EmbeddingStore.open(tmp_path / "s")  # the manifest catches the edit first
    with verification(False), pytest.raises(LaceInputError, match="disagree"):
        EmbeddingStore.open(tmp_path / "s")


def test_cli_embed_in_process_and_refuses_to_clobber(tiny_coco, tmp_path, capsys):
    out = tmp_path / "emb"
    argv = ["embed", "--model", "lace-micro-32", "--pretrained", "none", "--data", str(tiny_coco),
            "--out", str(out), "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    first = np.load(out / "image_embeddings.npy")
    assert main(argv) == 2
    assert "not empty" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(out / "image_embeddings.npy"), first)
    assert main(argv + ["--overwrite"]) == 0


def test_cli_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "embed" in capsys.readouterr().out


def _seeded_main(argv: list[str]) -> None:
    """`lace <argv>` with the random init seeded as in the one-process run."""
    torch.manual_seed(0)
    assert main(argv) == 0


@pytest.mark.slow
def test_two_ranks_shard_and_merge(tiny_coco, tmp_path):
    """Two processes of a job (forked from the tests' fork server, in the environment torchrun gives its
    workers) each embed a shard; rank 0 merges them into the store one process writes."""
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    common = ["--model", "lace-micro-32", "--pretrained", "none", "--data", str(tiny_coco), "--no-progress",
              "--device", "cpu"]
    # Same seed in both runs: open_clip's random init is seeded here and in each rank.
    torch.manual_seed(0)
    assert main(["embed", *common, "--out", str(single)]) == 0
    in_two_processes(_seeded_main, ["embed", *common, "--out", str(sharded)])
    a, b = EmbeddingStore.open(single), EmbeddingStore.open(sharded)
    np.testing.assert_allclose(a.image_embeddings, b.image_embeddings, atol=1e-5)
    np.testing.assert_allclose(a.text_embeddings, b.text_embeddings, atol=1e-5)
    assert a.index["captions"] == b.index["captions"]
