"""`lace edit` and its neighbours when something is wrong, from the command line: a dictionary and a store of
different dimensions, a concept that cannot be edited, an edit that finds nothing to edit, the command that writes
a dictionary, output folders of failed runs, and `lace eval` without an image-caption set for its diagnostics."""

import json

import numpy as np
import torch

from lace.cli import main
from lace.concepts.labelled import load_labelled_dictionary
from lace.edits import build_editor, parse_edit
from lace.embeddings import EmbeddingStore
from lace.eval.dictionary_diagnostics import owned_concepts
from tests.test_eval_dictionary import MODEL, fitted  # noqa: F401  (the module's world, store and dictionary)
from tests.test_eval_skip_missing import write_sugarcrepe
from tests.test_image_policy import user_csv  # noqa: F401  (a CSV of images)
from tests.toy_concepts import write_store


def edit(folder, *extra):
    return main(["edit", "--dictionary", str(folder / "dict"), "--embeddings", str(folder / "store"), *extra])


def editable_and_not(folder):
    labelled = load_labelled_dictionary(folder / "dict")
    owned = owned_concepts(labelled).tolist()
    editable = [name for name, own in zip(labelled.directions.names, owned) if own]
    return build_editor(labelled), editable, [name for name, own in zip(labelled.directions.names, owned) if not own]


def test_a_store_of_another_dimension_names_both_folders(fitted, tmp_path, capsys):  # noqa: F811
    store = EmbeddingStore.open(fitted / "store")
    rng = np.random.default_rng(0)
    tables = [rng.standard_normal((rows, 16)).astype(np.float32) for rows in
              (store.image_embeddings.shape[0], store.text_embeddings.shape[0])]
    index = json.loads((fitted / "store" / "index.json").read_text())
    write_store(tmp_path / "store16", *[t / np.linalg.norm(t, axis=1, keepdims=True) for t in tables], index)
    _, editable, _ = editable_and_not(fitted)
    code = main(["edit", "--dictionary", str(fitted / "dict"), "--embeddings", str(tmp_path / "store16"),
                 "--image", "0", "--edit", f"attenuate:{editable[0]}"])
    assert code == 2
    error = capsys.readouterr().err
    assert str(fitted / "dict") in error and str(tmp_path / "store16") in error
    assert "dimension 64" in error and "dimension 16" in error and "lace dict fit" in error


def test_a_concept_that_cannot_be_edited_lists_those_that_can_and_the_closest(fitted, capsys):  # noqa: F811
    _, editable, not_editable = editable_and_not(fitted)
    assert editable
    misspelt = editable[0][:-1] + "x" + editable[0][-1]
    assert edit(fitted, "--image", "0", "--edit", f"attenuate:{misspelt}") == 2
    error = capsys.readouterr().err
    assert "known concepts" in error and f"closest to '{misspelt}': '{editable[0]}'" in error
    assert all(name in error for name in editable[:10])
    assert not_editable  # the tiny dictionary leaves most concepts without an aligned atom
    assert edit(fitted, "--image", "0", "--edit", f"attenuate:{not_editable[0]}") == 2
    error = capsys.readouterr().err
    assert "cannot be edited" in error and f"editable concepts ({len(editable)})" in error


def test_an_edit_that_finds_nothing_to_edit_says_so_and_exits_2(fitted, capsys):  # noqa: F811
    editor, editable, _ = editable_and_not(fitted)
    store = EmbeddingStore.open(fitted / "store")
    z = torch.from_numpy(np.array(store.image_embeddings, dtype=np.float32))
    spec = parse_edit(f"attenuate:{editable[0]}")
    records = editor.apply(z, "image", spec).records.to_dicts(editor.unit_names)
    image = next(i for i, record in enumerate(records) if not record["proposed"])
    assert edit(fitted, "--image", str(image), "--edit", f"attenuate:{editable[0]}") == 2
    error = capsys.readouterr().err
    assert f"finds nothing to edit on image {image}" in error and f"no '{editable[0]}'" in error


def test_train_without_a_dictionary_names_the_command_and_leaves_no_folder(user_csv, tmp_path, capsys):  # noqa: F811
    (tmp_path / "runs").mkdir()
    run = tmp_path / "runs" / "new" / "lace"
    code = main(["train", *MODEL, "--data", str(user_csv), "--out", str(run), "--steps", "2", "--batch-size", "4",
                 "--counterfactual-captions", "--no-progress"])
    assert code == 2
    assert "`lace dict fit` writes one" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "new").exists() and (tmp_path / "runs").is_dir()  # only what the run made


def test_a_failed_dictionary_fit_leaves_no_output_folder(fitted, tmp_path, capsys):  # noqa: F811
    code = main(["dict", "fit", "--embeddings", str(fitted / "store"), "--atoms", "8", "--device", "cpu",
                 "--vocabulary", str(tmp_path / "no_such_vocabulary.yaml"), "--out", str(tmp_path / "dict"),
                 "--no-progress"])
    assert code == 2
    assert "no_such_vocabulary.yaml" in capsys.readouterr().err
    assert not (tmp_path / "dict").exists()


def test_eval_without_data_says_why_there_are_no_diagnostics(tmp_path, capsys):
    write_sugarcrepe(tmp_path / "sugarcrepe", with_missing=False)
    torch.manual_seed(0)
    assert main(["eval", *MODEL, "--benchmarks", "sugarcrepe", "--sugarcrepe-root", str(tmp_path / "sugarcrepe"),
                 "--out", str(tmp_path / "r.json"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["diagnostics"] == {} and "--data" in results["diagnostics_skipped"]
    assert "diagnostics skipped: no image-caption set" in capsys.readouterr().out
