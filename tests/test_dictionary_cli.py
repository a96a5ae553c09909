"""`lace dict fit`, `lace dict inspect` and `lace edit` on a toy embedding store."""

from __future__ import annotations

import json

import pytest
import yaml

from lace.cli import main
from lace.embeddings import write_store
from tests.toy_concepts import TOY_VOCABULARY, toy_directions, toy_embeddings


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dict_cli")
    directions = toy_directions()
    images, image_codes = toy_embeddings(directions, 200, 2.0, seed=1, return_codes=True)
    texts, text_codes = toy_embeddings(directions, 400, -2.0, seed=2, return_codes=True)
    captions = [" and ".join(n for n, w in zip(directions.names, row) if w > 0) for row in text_codes]
    write_store(folder / "store", images.numpy(), texts.numpy(), {
        "image_ids": list(range(200)), "text_ids": list(range(400)), "captions": captions,
        "text_image_index": [i % 200 for i in range(400)], "model": "toy", "data": "toy",
    })
    (folder / "vocabulary.yaml").write_text(yaml.safe_dump(TOY_VOCABULARY))
    code = main(["dict", "fit", "--embeddings", str(folder / "store"), "--atoms", "12", "--sparsity", "4",
                 "--mode", "vocabulary", "--vocabulary", str(folder / "vocabulary.yaml"),
                 "--out", str(folder / "dict"), "--no-progress"])
    assert code == 0
    return folder, image_codes


def test_dict_fit_writes_a_labelled_dictionary(fitted, capsys):
    folder, _ = fitted
    written = sorted(p.name for p in (folder / "dict").iterdir())
    assert written == sorted([
        "cfg.json", "dictionary.safetensors", "quality.json", "concepts.json", "concept_directions.safetensors",
        "labelling.json", "labelling.safetensors", "fit_config.json",
    ])
    quality = json.loads((folder / "dict" / "quality.json").read_text())
    assert set(quality["image"]) >= {"fvu", "mean_cosine", "mean_l0", "dead_atom_share"}
    # refuses to overwrite without --overwrite
    assert main(["dict", "fit", "--embeddings", str(folder / "store"), "--out", str(folder / "dict")]) == 2


def test_dict_inspect_and_edit(fitted, capsys):
    folder, image_codes = fitted
    row = next(i for i, codes in enumerate(image_codes) if codes[0] > 0 and codes[2] == 0)  # a circle, no star
    png = folder / "atoms.png"
    assert main(["dict", "inspect", "--dict", str(folder / "dict"), "--embeddings", str(folder / "store"),
                 "--index", str(row), "--edit", "transplant:circle=star", "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    output = capsys.readouterr().out
    assert "proposed=True" in output and "circle" in output
    assert main(["edit", "--dict", str(folder / "dict"), "--embeddings", str(folder / "store"),
                 "--image", str(row), "--edit", "transplant:circle=star", "--k", "5"]) == 0
    output = capsys.readouterr().out
    assert "after edit" in output and "after random edit" in output
    assert main(["edit", "--dict", str(folder / "dict"), "--embeddings", str(folder / "store"),
                 "--image", str(row), "--edit", "transplant:red=star"]) == 2
