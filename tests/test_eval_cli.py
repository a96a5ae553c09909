"""`lace eval` end to end on a tiny generated world with a random-init model; `lace compare`."""

import json

import pytest
import torch

from lace.cli import main
from lace.data.world import WorldConfig, generate_world


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("world")
    config = WorldConfig(n_images=40, image_size=32, split_fractions=(0.5, 0.1, 0.3, 0.1),
                         benchmark_items_per_family=1, coco_captions=2)
    generate_world(config, folder, overwrite=True, progress=False)
    return folder


def run_eval(world, out, *extra):
    torch.manual_seed(0)
    return main(["eval", "--model", "lace-micro-32", "--pretrained", "none", "--device", "cpu",
                 "--benchmarks", "world,retrieval", "--world", str(world),
                 "--data", str(world / "karpathy_coco.json"), "--split", "test",
                 "--out", str(out), "--no-progress", *extra])


def test_lace_eval_writes_a_complete_results_file_and_compare_reads_two(tiny_world, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert run_eval(tiny_world, tmp_path / "a.json", "--cache-dir", str(cache)) == 0
    results = json.loads((tmp_path / "a.json").read_text())
    assert results["model"] == "lace-micro-32"
    assert set(results["benchmarks"]) == {"world", "retrieval"}
    world = results["benchmarks"]["world"]
    for key in ("i2t/all", "t2i/all", "i2t/swap_attribute", "t2i/replace_object",
                "winoground/text", "winoground/image", "winoground/group"):
        assert 0.0 <= world[key] <= 1.0, key
    assert set(results["benchmarks"]["retrieval"]) == {f"{d}/R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)}
    diagnostics = results["diagnostics"]
    for key in ("hubness/i2t/skewness", "hubness/t2i/robin_hood", "one_way/image", "one_way/text",
                "mutual_knn/image", "isotropic/one_way/image", "brittleness/rule/all"):
        assert diagnostics[key] is not None, key
    assert diagnostics["n_images"] == 12 and diagnostics["n_captions"] == 24
    assert results["config"]["world_split"] == "test"
    assert len(list(cache.glob("*.npz"))) == 1

    # refuses to clobber; the cached second run gives the same figures
    assert run_eval(tiny_world, tmp_path / "a.json") == 2
    assert "exists" in capsys.readouterr().err
    assert run_eval(tiny_world, tmp_path / "b.json", "--cache-dir", str(cache), "--no-baseline") == 0
    second = json.loads((tmp_path / "b.json").read_text())
    assert second["benchmarks"] == results["benchmarks"]
    assert "isotropic/one_way/image" not in second["diagnostics"]

    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--png", str(tmp_path / "chart.png")]) == 0
    table = capsys.readouterr().out
    assert "| metric | a | b | Δ b |" in table
    assert "| world/i2t/all |" in table and "+0.000" in table
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lace_eval_names_the_missing_flag(tiny_world, tmp_path, capsys):
    code = main(["eval", "--model", "lace-micro-32", "--pretrained", "none", "--device", "cpu",
                 "--benchmarks", "sugarcrepe", "--out", str(tmp_path / "r.json"), "--no-progress"])
    assert code == 2
    assert "--sugarcrepe-root" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_compare_rejects_a_file_that_is_not_results(tmp_path, capsys):
    (tmp_path / "x.json").write_text(json.dumps({"model": "m"}))
    assert main(["compare", str(tmp_path / "x.json")]) == 2
    assert "benchmarks" in capsys.readouterr().err


def test_compare_refuses_to_replace_its_outputs_without_overwrite(tmp_path, capsys):
    for name, score in (("a", 0.25), ("b", 0.5)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"benchmarks": {"world": {"i2t/all": score}}}))
    inputs = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    for flag, name in (("--out", "table.md"), ("--png", "chart.png")):
        kept = tmp_path / name
        kept.write_bytes(b"a file the user had\n")
        assert main(["compare", *inputs, flag, str(kept)]) == 2
        error = capsys.readouterr().err
        assert str(kept) in error and flag in error and "--overwrite" in error
        assert kept.read_bytes() == b"a file the user had\n"
        assert main(["compare", *inputs, flag, str(kept), "--overwrite"]) == 0
        assert kept.read_bytes() != b"a file the user had\n"
    assert "| world/i2t/all | 0.250 | 0.500 | +0.250 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_refuses_to_write_over_one_of_its_inputs_even_with_overwrite(tmp_path, capsys):
    inputs = []
    for name, score in (("a", 0.25), ("b", 0.5)):
        inputs.append(tmp_path / f"{name}.json")
        inputs[-1].write_text(json.dumps({"benchmarks": {"world": {"i2t/all": score}}}))
    kept = [path.read_bytes() for path in inputs]
    for flag in ("--out", "--png"):
        for target in (inputs[0], tmp_path / "." / "b.json"):
            assert main(["compare", *map(str, inputs), flag, str(target), "--overwrite"]) == 2
            captured = capsys.readouterr()
            assert flag in captured.err and target.name in captured.err and "input" in captured.err
            assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""  # refused before any work
    assert [path.read_bytes() for path in inputs] == kept


def test_compare_refuses_one_file_for_both_the_table_and_the_chart(tmp_path, capsys):
    source = tmp_path / "a.json"
    source.write_text(json.dumps({"benchmarks": {"world": {"i2t/all": 0.25}}}))
    target = tmp_path / "both.out"
    assert main(["compare", str(source), "--out", str(target), "--png", str(tmp_path / "." / "both.out")]) == 2
    captured = capsys.readouterr()
    assert "--out" in captured.err and "--png" in captured.err and "both.out" in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""  # refused before any work
    assert not target.exists()


def test_lace_eval_rerank_adds_each_fix_beside_the_plain_figures(tiny_world, tmp_path, capsys):
    bank = str(tiny_world / "karpathy_coco.json")
    assert run_eval(tiny_world, tmp_path / "r.json", "--rerank", "csls,qbnorm,dn", "--bank", bank,
                    "--bank-split", "train", "--bank-size", "8", "--no-baseline") == 0
    diagnostics = json.loads((tmp_path / "r.json").read_text())["diagnostics"]
    for fix in ("csls", "qbnorm", "dn"):
        for key in ("i2t/R@1", "t2i/R@1", "hubness/i2t/skewness", "hubness/t2i/skewness", "one_way/image"):
            assert diagnostics[f"rerank/{fix}/{key}"] is not None, (fix, key)
    assert diagnostics["i2t/R@1"] is not None  # the plain figures stay
    assert run_eval(tiny_world, tmp_path / "bad.json", "--rerank", "mutual") == 2
    assert "csls" in capsys.readouterr().err
    assert run_eval(tiny_world, tmp_path / "bad.json", "--rerank", "csls", "--bank", str(tmp_path / "none.json")) == 2
    assert "none.json" in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()


def test_lace_eval_knn_faiss_searches_through_faiss_with_the_exact_figures(tiny_world, tmp_path, capsys, monkeypatch):
    pytest.importorskip("faiss")
    from lace.eval import faiss_search

    searched = []
    original = faiss_search.faiss_topk

    def spy(queries, gallery, k, options):
        searched.append((options.backend, options.index, options.nprobe))
        return original(queries, gallery, k, options)

    monkeypatch.setattr(faiss_search, "faiss_topk", spy)
    assert run_eval(tiny_world, tmp_path / "exact.json", "--rerank", "csls", "--no-baseline") == 0
    assert searched == []  # exact search stays the default
    assert run_eval(tiny_world, tmp_path / "faiss.json", "--rerank", "csls", "--no-baseline",
                    "--knn", "faiss", "--knn-nprobe", "3") == 0
    assert searched and set(searched) == {("faiss", "flat", 3)}
    exact = json.loads((tmp_path / "exact.json").read_text())["diagnostics"]
    through_faiss = json.loads((tmp_path / "faiss.json").read_text())["diagnostics"]
    for key in ("i2t/R@1", "hubness/i2t/skewness", "mutual_knn/image", "rerank/csls/t2i/R@5"):
        assert through_faiss[key] == pytest.approx(exact[key], abs=1e-6), key
    assert run_eval(tiny_world, tmp_path / "bad.json", "--knn", "faiss", "--knn-index", "lsh") == 2
    assert "knn_index" in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()
