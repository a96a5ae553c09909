"""`lace eval --dictionary`: counterfactual brittleness and edit retrieval, end to end on a tiny world."""

import json

import numpy as np
import pytest
import torch

from lace.cli import main
from lace.concepts.vocabulary import load_vocabulary
from lace.data.world import WorldConfig, generate_world
from lace.embeddings import EmbeddingStore
from tests.toy_concepts import write_store

MODEL = ["--model", "lace-micro-32", "--pretrained", "none", "--device", "cpu"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny world, the random-init model's embedding store of its train split, a dictionary fitted on it."""
    folder = tmp_path_factory.mktemp("eval_dictionary")
    config = WorldConfig(n_images=200, image_size=32, split_fractions=(0.6, 0.1, 0.2, 0.1),
                         benchmark_items_per_family=1, coco_captions=2)
    generate_world(config, folder / "world", overwrite=True, progress=False)
    torch.manual_seed(0)  # the same random init as every eval below
    assert main(["embed", *MODEL, "--data", str(folder / "world" / "karpathy_coco.json"), "--split", "train",
                 "--out", str(folder / "store"), "--no-progress"]) == 0
    assert main(["dict", "fit", "--embeddings", str(folder / "store"), "--atoms", "32", "--sparsity", "4",
                 "--epochs", "3", "--batch-size", "256", "--min-mentions", "2", "--device", "cpu",
                 "--vocabulary", str(folder / "world" / "vocabulary.yaml"),
                 "--out", str(folder / "dict"), "--no-progress"]) == 0
    return folder


def run_eval(folder, out, *extra):
    torch.manual_seed(0)
    return main(["eval", *MODEL, "--benchmarks", "retrieval", "--world", str(folder / "world"),
                 "--data", str(folder / "world" / "karpathy_coco.json"), "--split", "test",
                 "--cache-dir", str(folder / "cache"), "--out", str(out), "--no-progress", *extra])


def test_eval_with_a_dictionary_reports_counterfactual_brittleness_and_edit_retrieval(fitted, tmp_path):
    assert run_eval(fitted, tmp_path / "auto.json", "--dictionary", str(fitted / "dict")) == 0
    diagnostics = json.loads((tmp_path / "auto.json").read_text())["diagnostics"]
    assert diagnostics["brittleness/rule/all"] is not None  # the old figures stay
    assert diagnostics["brittleness/counterfactual/n_triples"] > 0
    for key in ("counterfactual", "counterfactual_random", "counterfactual_arithmetic"):
        assert 0.0 <= diagnostics[f"brittleness/{key}/all"] <= 1.0, key

    # automatic transplants: same-type concepts that the test captions mention, each with source images
    pairs = sorted({key.split("/")[1] for key in diagnostics if key.startswith("edit_retrieval/")}
                   - {"mean", "pairs", "auto_pairs_left_out"})
    assert len(pairs) == diagnostics["edit_retrieval/pairs"] > 0
    vocabulary = load_vocabulary(str(fitted / "world" / "vocabulary.yaml"))
    for pair in pairs:
        source, target = pair.split("=")
        assert vocabulary.same_type(source, target), pair
        figures = {key.split("/", 2)[2]: value for key, value in diagnostics.items()
                   if key.startswith(f"edit_retrieval/{pair}/")}
        assert figures["candidates"] > 0
        assert 0 < figures["edited"] <= figures["proposed"] <= figures["candidates"]  # a pair editing nothing: left out
        for edit in ("transplant", "random", "arithmetic"):
            value = figures[f"{edit}/target"]
            assert (value is None) == (figures["edited"] == 0), (pair, edit)
            assert value is None or 0.0 <= value <= 1.0
        assert "keep" in " ".join(figures)
    edited = [pair for pair in pairs if diagnostics[f"edit_retrieval/{pair}/edited"] > 0]
    for edit in ("transplant", "random", "arithmetic"):
        mean = diagnostics[f"edit_retrieval/mean/{edit}/target"]
        if edited:
            expected = np.mean([diagnostics[f"edit_retrieval/{pair}/{edit}/target"] for pair in edited])
            assert mean == pytest.approx(expected)
        else:
            assert mean is None

    # naming the same pairs with repeated --transplant gives the same figures
    named = [argument for pair in pairs for argument in ("--transplant", pair)]
    assert run_eval(fitted, tmp_path / "named.json", "--dictionary", str(fitted / "dict"), *named) == 0
    again = json.loads((tmp_path / "named.json").read_text())
    assert again["config"]["transplants"] == pairs
    assert {k: v for k, v in again["diagnostics"].items() if k.startswith("edit_retrieval/")} == {
        k: v for k, v in diagnostics.items() if k.startswith("edit_retrieval/") and "auto_pairs_left_out" not in k}


def test_eval_refuses_a_transplant_across_types(fitted, tmp_path, capsys):
    code = run_eval(fitted, tmp_path / "r.json", "--dictionary", str(fitted / "dict"), "--transplant", "square=red")
    assert code == 2
    assert "same type" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_eval_refuses_a_dictionary_of_another_dimension(fitted, tmp_path, capsys):
    store = EmbeddingStore.open(fitted / "store")
    rng = np.random.default_rng(0)

    def unit(rows):
        table = rng.standard_normal((rows, 16)).astype(np.float32)
        return table / np.linalg.norm(table, axis=1, keepdims=True)

    index = json.loads((fitted / "store" / "index.json").read_text())
    write_store(tmp_path / "store16", unit(store.image_embeddings.shape[0]), unit(store.text_embeddings.shape[0]), index)
    assert main(["dict", "fit", "--embeddings", str(tmp_path / "store16"), "--atoms", "8", "--sparsity", "2",
                 "--min-mentions", "2", "--device", "cpu", "--tau-align", "0",
                 "--vocabulary", str(fitted / "world" / "vocabulary.yaml"),
                 "--out", str(tmp_path / "dict16"), "--no-progress"]) == 0
    capsys.readouterr()
    assert run_eval(fitted, tmp_path / "r.json", "--dictionary", str(tmp_path / "dict16")) == 2
    error = capsys.readouterr().err
    assert "dimension 16" in error and "dimension 64" in error and "dict16" in error
    assert not (tmp_path / "r.json").exists()
