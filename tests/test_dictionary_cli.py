"""`lace dict fit`, `lace dict inspect` and `lace edit` on a toy embedding store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lace.cli import main
from tests.test_cli_first_hour import one_line_error
from tests.toy_concepts import TOY_VOCABULARY, write_store, write_toy_store


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dict_cli")
    image_codes = write_toy_store(folder, 200)
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
        "labelling.json", "labelling.safetensors", "fit_config.json", "manifest.json",
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


def test_dict_inspect_refuses_to_replace_a_png_without_overwrite(fitted, tmp_path, capsys):
    folder, _ = fitted
    png = tmp_path / "atoms.png"
    png.write_text("a file the user had\n")
    args = ["dict", "inspect", "--dict", str(folder / "dict"), "--embeddings", str(folder / "store"),
            "--index", "0", "--png", str(png)]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert str(png) in error and "--png" in error and "--overwrite" in error
    assert png.read_text() == "a file the user had\n"
    assert main([*args, "--overwrite"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_dict_inspect_png_or_edit_without_index_is_one_line_naming_index(fitted, tmp_path, capsys):
    folder, _ = fitted
    png = tmp_path / "atoms.png"
    base = ["dict", "inspect", "--dict", str(folder / "dict"), "--embeddings", str(folder / "store")]
    for extra, flag in ((["--png", str(png)], "--png"), (["--edit", "transplant:circle=star"], "--edit")):
        error = one_line_error(capsys, [*base, *extra])
        assert flag in error and "--index" in error, error
        assert capsys.readouterr().out == ""  # refused before listing the atoms
    assert not png.exists()


@pytest.mark.slow
def test_edit_png_draws_the_first_sources_with_each_rows_target_count(fitted, tmp_path, capsys):
    from PIL import Image

    from lace.concepts.labelled import load_labelled_dictionary
    from lace.report.edit_grid import edit_grid_rows

    folder, image_codes = fitted
    names = TOY_VOCABULARY["objects"] + [w for ws in TOY_VOCABULARY["attributes"].values() for w in ws]
    # one caption per image naming its concepts, and a small picture per image
    captions = [" and ".join(n for n, w in zip(names, row) if w > 0) for row in image_codes]
    paths = []
    for i in range(len(captions)):
        paths.append(str(tmp_path / f"{i}.png"))
        Image.new("RGB", (8, 8), (i % 256, 40, 90)).save(paths[-1])
    from lace.embeddings import EmbeddingStore

    images = np.array(EmbeddingStore.open(folder / "store").image_embeddings)
    write_store(tmp_path / "store", images, images, {
        "image_ids": list(range(len(captions))), "text_ids": list(range(len(captions))), "captions": captions,
        "text_image_index": list(range(len(captions))), "model": "toy", "data": "toy", "image_paths": paths,
    })
    png = tmp_path / "grid.png"
    args = ["edit", "--dict", str(folder / "dict"), "--embeddings", str(tmp_path / "store"),
            "--edit", "transplant:circle=star", "--png", str(png), "--sources", "3", "--strengths", "1,4", "--k", "5"]
    assert main(args) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(args) == 2  # no clobbering without --overwrite

    shows_star = image_codes[:, names.index("star")] > 0
    candidates = [i for i, row in enumerate(image_codes) if row[names.index("circle")] > 0 and not shows_star[i]]
    rows = edit_grid_rows(load_labelled_dictionary(folder / "dict"), images, candidates, shows_star.numpy(),
                          "transplant:circle=star", strengths=(1.0, 4.0), n_sources=3, k=5)
    sources = list(dict.fromkeys(row["source"] for row in rows))
    assert len(sources) == 3 and sources == sorted(sources) and sources[0] == candidates[0]
    assert len(rows) == 3 * 5
    for row in rows:
        assert row["source"] not in row["neighbours"] and len(row["neighbours"]) == 5
        assert row["target_count"] == int(shows_star[row["neighbours"]].sum())
    by_label = {}
    for row in rows:
        by_label.setdefault(row["label"], []).append(row["target_count"])
    assert sum(by_label["circle->star x4"]) > sum(by_label["random, same size x4"])
    assert sum(by_label["circle->star x4"]) > sum(by_label["before"])
    printed = capsys.readouterr().out
    assert f"image {sources[0]}: circle->star x4:" in printed


@pytest.mark.slow
def test_edit_grid_stage_reports_each_rows_target_count(fitted, tmp_path):
    from PIL import Image

    from lace.concepts.labelled import load_labelled_dictionary
    from lace.experiment.edit_grids import edit_grid_stage
    from lace.report.document import Report
    from lace.report.experiment_tables import add_edit_grid
    from tests.test_demo import check_grid_in_report

    folder, image_codes = fitted
    names = TOY_VOCABULARY["objects"] + [w for ws in TOY_VOCABULARY["attributes"].values() for w in ws]
    captions = [" and ".join(n for n, w in zip(names, row) if w > 0) for row in image_codes]
    from lace.embeddings import EmbeddingStore

    images = np.array(EmbeddingStore.open(folder / "store").image_embeddings)
    grid = edit_grid_stage(load_labelled_dictionary(folder / "dict"), images, captions, range(len(captions)),
                           "transplant:circle=star", lambda i: Image.new("RGB", (8, 8), (i % 256, 40, 90)),
                           tmp_path / "figures" / "grid.png", strengths=(1.0, 4.0), n_sources=3, k=5,
                           image_names=[f"toy_{i:03d}.png" for i in range(len(captions))])
    shows_star = image_codes[:, names.index("star")] > 0
    first = next(i for i, row in enumerate(image_codes) if row[names.index("circle")] > 0 and not shows_star[i])
    assert grid["figure"] == "grid.png" and grid["rows"][0]["source"] == first
    # each row names its source image and caption, in the figure and in the table
    assert grid["rows"][0]["image"] == f"toy_{first:03d}.png" and grid["rows"][0]["caption"] == captions[first]
    for row in grid["rows"]:
        assert row["target_count"] == int(shows_star[row["neighbours"]].sum())
    report = Report("grid")
    add_edit_grid(report, "circle=star", grid)
    check_grid_in_report(grid, report.markdown(tmp_path))
