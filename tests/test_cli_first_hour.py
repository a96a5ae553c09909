"""A researcher's first hour with `lace`, from the command line: what `lace train` writes loads wherever a model
is taken, and every file lace writes is as readable as the umask allows."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lace.cli import COMMANDS, build_parser, main
from tests.conftest import make_images

MODEL = "lace-micro-32"
WORLD_VOCABULARY = str(Path(__file__).resolve().parents[1] / "src/lace/data/world/vocabulary.yaml")
COLOURS = ["red", "green", "blue", "yellow"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 2-step `lace train` run of lace-micro-32 on 20 images, with its CSV beside it."""
    folder = tmp_path_factory.mktemp("first_hour")
    names = make_images(folder / "images", 20)
    rows = [f"images/{name},a {COLOURS[i % 4]} square left of a circle" for i, name in enumerate(names)]
    (folder / "pairs.csv").write_text("filepath,caption\n" + "\n".join(rows) + "\n")
    assert main(["train", "--model", MODEL, "--data", str(folder / "pairs.csv"), "--output", str(folder / "run"),
                 "--steps", "2", "--batch-size", "8", "--lr", "2e-3", "--warmup-steps", "1", "--checkpoint-every",
                 "1", "--device", "cpu", "--no-progress"]) == 0
    return folder


def embed(folder: Path, pretrained: str, out: Path, model: str = MODEL) -> int:
    return main(["embed", "--model", model, "--pretrained", pretrained, "--data", str(folder / "pairs.csv"),
                 "--out", str(out), "--device", "cpu", "--no-progress"])


def test_pretrained_takes_a_run_its_checkpoints_and_its_export(trained, tmp_path):
    run = trained / "run"
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "model.pt")]) == 0
    sources = {"run": str(run), "checkpoint": str(run / "checkpoints" / "step_0000002.safetensors"),
               "manifest": str(run / "checkpoints" / "step_0000002.json"), "export": str(tmp_path / "model.pt")}
    stores = {}
    for name, source in sources.items():
        assert embed(trained, source, tmp_path / name) == 0, name
        stores[name] = np.load(tmp_path / name / "image_embeddings.npy")
    for name in sources:
        np.testing.assert_allclose(stores[name], stores["run"], atol=1e-6, err_msg=name)
    earlier = tmp_path / "earlier"
    assert embed(trained, str(run / "checkpoints" / "step_0000001.safetensors"), earlier) == 0
    assert not np.allclose(np.load(earlier / "image_embeddings.npy"), stores["run"], atol=1e-4)
    # WiSE-FT mixes with one of the run's own checkpoints, and training goes on from any of them
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "mix.pt"), "--interpolate", "0.5",
                 "--base", sources["checkpoint"].replace("step_0000002", "step_0000001")]) == 0
    assert main(["train", "--model", MODEL, "--pretrained", sources["checkpoint"], "--data",
                 str(trained / "pairs.csv"), "--output", str(tmp_path / "again"), "--steps", "1", "--batch-size", "8",
                 "--device", "cpu", "--no-progress"]) == 0


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    return error


def test_pretrained_that_is_none_of_these_is_one_line_naming_what_was_found(trained, tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("read the paper\n")
    assert "a folder holding todo.txt" in one_line_error(capsys, embed_argv(trained, str(folder), tmp_path / "a"))
    assert "not model weights" in one_line_error(capsys, embed_argv(trained, str(folder / "todo.txt"), tmp_path / "b"))
    state = trained / "run" / "checkpoints" / "step_0000002.state.pt"
    assert "trainer state" in one_line_error(capsys, embed_argv(trained, str(state), tmp_path / "c"))
    mismatch = one_line_error(capsys, embed_argv(trained, str(trained / "run"), tmp_path / "d", model="lace-tiny"))
    assert "a run of 'lace-micro-32', not of --model 'lace-tiny'" in mismatch
    assert "not found" in one_line_error(capsys, embed_argv(trained, "runs/nowhere", tmp_path / "e"))


def embed_argv(folder: Path, pretrained: str, out: Path, model: str = MODEL) -> list[str]:
    return ["embed", "--model", model, "--pretrained", pretrained, "--data", str(folder / "pairs.csv"),
            "--out", str(out), "--device", "cpu", "--no-progress"]


def test_every_file_lace_writes_follows_the_umask(trained, tmp_path):
    previous = os.umask(0o022)
    try:
        out = tmp_path / "outputs"
        assert main(["train", "--model", MODEL, "--data", str(trained / "pairs.csv"), "--output", str(out / "run"),
                     "--steps", "1", "--batch-size", "8", "--device", "cpu", "--no-progress"]) == 0
        assert main(["export", "--run", str(out / "run"), "--out", str(out / "model.pt")]) == 0
        assert embed(trained, str(out / "model.pt"), out / "store") == 0
        assert main(["dict", "fit", "--embeddings", str(out / "store"), "--atoms", "8", "--sparsity", "2",
                     "--vocabulary", WORLD_VOCABULARY, "--out", str(out / "dict"), "--device", "cpu", "--no-progress"]) == 0
        for name in ("a", "b"):
            assert main(["eval", "--model", MODEL, "--pretrained", str(out / "model.pt"), "--device", "cpu",
                         "--benchmarks", "retrieval", "--data", str(trained / "pairs.csv"), "--no-progress",
                         "--out", str(out / f"{name}.json")]) == 0
        assert main(["compare", str(out / "a.json"), str(out / "b.json"), "--png", str(out / "compare.png"),
                     "--out", str(out / "report.md")]) == 0
    finally:
        os.umask(previous)
    modes = {path.relative_to(out).as_posix(): stat.S_IMODE(path.stat().st_mode) for path in out.rglob("*")}
    for expected in ("run/config.json", "model.pt", "model.pt.json", "a.json", "compare.png", "report.md",
                     "store/index.json"):
        assert expected in modes, sorted(modes)
    assert any(name.startswith("dict/") and name.endswith(".safetensors") for name in modes), sorted(modes)
    wrong = {name: oct(mode) for name, mode in modes.items()
             if mode != (0o755 if (out / name).is_dir() else 0o644)}
    assert not wrong, wrong


SOURCE = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("words", [["--help"], ["train", "--help"]])
def test_help_imports_neither_torch_nor_open_clip(words):
    code = ("import sys\nfrom lace.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print([m for m in ('torch', 'open_clip', 'lace.train.loop') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code, *words], check=False, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(SOURCE)})
    assert result.returncode == 0, result.stderr
    assert "usage: lace" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_command_list_is_what_each_command_says_of_itself():
    full = build_parser()
    subparsers = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert {action.dest: action.help for action in subparsers._choices_actions} == {
        name: summary for name, (_, summary) in COMMANDS.items()}


def test_an_unknown_flag_gets_the_commands_usage_and_the_closest_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--batchsize", "8", "--no-progress"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "usage: lace train" in error and "--batchsize: did you mean --batch-size?" in error
    with pytest.raises(SystemExit):
        main(["trian", "--help"])
    assert "did you mean train?" in capsys.readouterr().err


def test_open_clip_train_flags_and_a_tab_separated_csv(trained, tmp_path, caplog):
    rows = (trained / "pairs.csv").read_text().splitlines()[1:]
    tabbed = tmp_path / "tabbed.csv"  # tab-separated, named .csv, with columns of its own names
    tabbed.write_text("img\tcap\n" + "".join(f"{trained / row.split(',')[0]}\t{row.split(',')[1]}\n" for row in rows))
    common = ["train", "--model", MODEL, "--steps", "1", "--batch-size", "8", "--device", "cpu", "--no-progress"]
    assert main([*common, "--train-data", str(tabbed), "--csv-separator", "\\t", "--csv-img-key", "img",
                 "--csv-caption-key", "cap", "--wd", "0.05", "--workers", "0", "--threads", "1",
                 "--output", str(tmp_path / "open_clip_names")]) == 0
    config = json.loads((tmp_path / "open_clip_names" / "config.json").read_text())
    assert (config["data"], config["weight_decay"], config["csv_img_key"]) == (str(tabbed), 0.05, "img")
    # without --csv-separator the tabs are found and said; the old names keep working
    assert main([*common, "--data", str(tabbed), "--csv-img-key", "img", "--csv-caption-key", "cap",
                 "--weight-decay", "0.05", "--num-workers", "0", "--out", str(tmp_path / "old_names")]) == 0
    assert "read as tab-separated" in caplog.text


def test_an_epoch_is_a_pass_over_the_csv_rows(trained, tmp_path, capsys):
    rows = (trained / "pairs.csv").read_text().splitlines()
    doubled = tmp_path / "two_captions.csv"  # 20 images, two captions each: 40 rows
    doubled.write_text("\n".join([rows[0]] + [f"{trained / row.split(',')[0]},{caption}" for row in rows[1:]
                                               for caption in (row.split(",")[1], "a shape")]) + "\n")
    assert main(["train", "--model", MODEL, "--train-data", str(doubled), "--epochs", "1", "--batch-size", "8",
                 "--device", "cpu", "--no-progress", "--out", str(tmp_path / "run")]) == 0
    assert "trained 5 steps" in capsys.readouterr().out  # 40 rows / 8, not 20 images / 8


def test_pretrained_takes_a_hugging_face_folder(trained, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from tests.test_encoders import _write_clip_tokenizer

    folder = tmp_path / "hf"
    config = transformers.CLIPConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "max_position_embeddings": 32, "vocab_size": 49408},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=16)
    transformers.CLIPModel(config).save_pretrained(folder)
    _write_clip_tokenizer(folder)
    transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save_pretrained(folder)
    assert embed(trained, str(folder), tmp_path / "store", model="hf-clip") == 0
    assert np.load(tmp_path / "store" / "image_embeddings.npy").shape == (20, 16)
    capsys.readouterr()  # transformers' own bars
    error = one_line_error(capsys, embed_argv(trained, str(folder), tmp_path / "wrong"))
    assert "a Hugging Face clip folder" in error and "--model hf-clip" in error
