"""What `lace train` tells a person while it runs (docs/logging.md): a start line naming the data and the arm, a
plain line per logged step with or without bars, no carriage returns off a terminal, no bars of the dependencies
under --no-progress, the step a resumed run carries on from; and metrics.jsonl's figures against references."""

import dataclasses
import io
import json
import math
import sys
from pathlib import Path

import open_clip
import pytest
import torch

from lace.cli import main
from lace.encoders import load_encoder
from lace.io import read_json
from lace.progress import bar
from lace.train import TensorPairs, train
from lace.train.config import train_config
from lace.train.config.arm import ArmConfig
from lace.train.metrics import MetricWindow, step_record
from lace.train.metrics_writer import ARM_SWITCHES, arm_name
from tests.conftest import make_images
from tests.siglip_support import write_tiny_siglip

VOCABULARY = str(Path(__file__).resolve().parents[1] / "src/lace/data/world/vocabulary.yaml")
COLOURS = ["red", "green", "blue", "yellow"]
PLAIN_KEYS = ["step", "epoch", "loss", "plain_loss", "lr", "logit_scale", "samples_per_second",
              "caption_negatives_valid_rows", "image_negatives_valid_rows", "samples_seen", "skipped_images"]


@pytest.fixture
def pairs_csv(tmp_path: Path) -> Path:
    """16 small images, a second caption for every fourth one: 20 rows."""
    names = make_images(tmp_path / "data" / "images", 16)
    rows = [f"images/{name},a {COLOURS[i % 4]} square left of a circle" for i, name in enumerate(names)]
    rows += [f"images/{name},a small {COLOURS[i % 4]} star" for i, name in enumerate(names) if i % 4 == 0]
    path = tmp_path / "data" / "pairs.csv"
    path.write_text("filepath,caption\n" + "\n".join(rows) + "\n")
    return path


def lace_train(data: Path, out: Path, *flags: str, model: str = "lace-micro-32") -> int:
    return main(["train", "--model", model, "--data", str(data), "--out", str(out), "--batch-size", "8",
                 "--lr", "2e-3", "--warmup-steps", "1", "--device", "cpu", "--seed", "3", *flags])


def step_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("step ")]


def test_start_line_names_the_data_its_rows_and_images_the_model_and_the_arm(pairs_csv, tmp_path, capsys):
    assert lace_train(pairs_csv, tmp_path / "run", "--steps", "2", "--no-progress", "--caption-negatives",
                      "--vocabulary", VOCABULARY) == 0
    rows = pairs_csv.read_text().splitlines()[1:]
    images = {row.split(",")[0] for row in rows}
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"train: data {pairs_csv} ({len(rows)} rows, {len(images)} images); model lace-micro-32; "
                     "arm caption_negatives; 2 steps of 8 pairs")


def test_a_plain_line_every_logged_step_under_no_progress(pairs_csv, tmp_path, capsys):
    run = tmp_path / "run"
    assert lace_train(pairs_csv, run, "--steps", "4", "--log-every", "1", "--no-progress") == 0
    lines = step_lines(capsys.readouterr().out)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line.split()[1] for line in lines] == ["1/4", "2/4", "3/4", "4/4"]
    for line, record in zip(lines, records, strict=True):
        assert f"loss {record['loss']:.4f}" in line and f"epoch {record['epoch']:.2f}" in line


def test_each_line_is_printed_when_its_step_is_logged_not_at_the_end(pairs_csv, tmp_path, capsys):
    seen_before_batch = []

    def on_batch(number: int, indices: list[int]) -> None:
        seen_before_batch.append(len(step_lines(capsys.readouterr().out)))

    config = train_config(model="lace-micro-32", data=str(pairs_csv), output=str(tmp_path / "run"), steps=3,
                         batch_size=8, log_every=1, device="cpu", seed=3)
    train(config, progress=False, on_batch=on_batch)
    assert seen_before_batch == [0, 1, 1]  # step 1's line before step 2's batch, step 2's before step 3's


def test_no_carriage_returns_when_the_output_is_not_a_terminal(pairs_csv, tmp_path, capsys):
    assert lace_train(pairs_csv, tmp_path / "run", "--steps", "3", "--log-every", "1") == 0  # bars asked for
    captured = capsys.readouterr()
    assert "\r" not in captured.out and "\r" not in captured.err
    assert len(step_lines(captured.out)) == 3


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream, drawn", [(Terminal, True), (io.StringIO, False)])
def test_bars_are_drawn_on_a_terminal_only(monkeypatch, stream, drawn):
    err = stream()
    monkeypatch.setattr(sys, "stderr", err)
    assert sum(1 for _ in bar(range(5), desc="work")) == 5  # counts, drawn or not
    assert ("\r" in err.getvalue()) == drawn
    quiet = stream()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert sum(1 for _ in bar(range(5), enabled=False)) == 5
    assert quiet.getvalue() == ""


def test_no_progress_silences_the_hugging_face_loading_bar(pairs_csv, tmp_path, capsys):
    pytest.importorskip("transformers")
    from huggingface_hub.utils import are_progress_bars_disabled

    model = write_tiny_siglip(tmp_path / "siglip")
    capsys.readouterr()  # saving the model draws transformers' own bar
    before = are_progress_bars_disabled()
    assert lace_train(pairs_csv, tmp_path / "run", "--steps", "1", "--no-progress",
                      model=f"hf-siglip:{model}") == 0
    captured = capsys.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert "\r" not in captured.err + captured.out
    assert step_lines(captured.out)
    assert are_progress_bars_disabled() == before  # the library's setting is given back after the run


def test_hugging_face_models_load_without_a_bar_off_a_terminal(tmp_path, capsys):
    pytest.importorskip("transformers")
    model = write_tiny_siglip(tmp_path / "siglip")
    capsys.readouterr()
    load_encoder(f"hf-siglip:{model}")  # as every command loads it (embed, eval, train)
    captured = capsys.readouterr()
    assert "Loading weights" not in captured.err and "\r" not in captured.err


def test_a_resumed_run_says_where_it_carries_on_and_records_its_new_steps(pairs_csv, tmp_path, capsys):
    run = tmp_path / "run"
    flags = ("--log-every", "1", "--checkpoint-every", "2", "--no-progress")
    assert lace_train(pairs_csv, run, "--steps", "2", *flags) == 0
    assert read_json(run / "config.json")["steps"] == 2
    capsys.readouterr()
    assert lace_train(pairs_csv, run, "--steps", "4", "--resume", "latest", *flags) == 0
    output = capsys.readouterr().out
    assert output.splitlines()[0].endswith("4 steps of 8 pairs; resumed from step 2")
    assert [line.split()[1] for line in step_lines(output)] == ["3/4", "4/4"]
    assert read_json(run / "config.json")["steps"] == 4
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def test_metrics_match_references_computed_apart(tmp_path):
    """The first logged loss is open_clip's ClipLoss of the untrained model on the first batch; the schedule,
    epochs and counters follow from the settings alone."""
    torch.manual_seed(0)
    pixels = torch.randn(16, 3, 32, 32)
    captions = [f"a {COLOURS[i % 4]} square number {i}" for i in range(16)]
    batches = []
    config = train_config(model="lace-micro-32", output=str(tmp_path / "run"), steps=3, batch_size=8, lr=1e-3,
                         warmup_steps=1, log_every=1, checkpoint_every=0, device="cpu", seed=5)
    train(config, dataset=TensorPairs(pixels, captions), progress=False, on_batch=lambda n, i: batches.append(i))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [list(record) for record in records] == [PLAIN_KEYS] * 3
    torch.manual_seed(5)  # the trainer seeds the initial weights with the run's seed
    model = load_encoder("lace-micro-32", None)
    first = batches[0]
    with torch.no_grad():
        images, texts = model.encode_images(pixels[first]), model.encode_texts([captions[i] for i in first])
        expected = open_clip.loss.ClipLoss()(images, texts, model.logit_scale.exp()).item()
    assert records[0]["loss"] == pytest.approx(expected, rel=1e-5)
    assert records[0]["plain_loss"] == pytest.approx(expected, rel=1e-5)
    # open_clip's schedule for steps 0, 1, 2: one warm-up step, then cosine over the other two
    cosine = [1e-3 * 1 / 1, 0.5 * (1 + math.cos(math.pi * 0 / 2)) * 1e-3, 0.5 * (1 + math.cos(math.pi * 1 / 2)) * 1e-3]
    for step, (record, lr) in enumerate(zip(records, cosine), start=1):
        assert record["step"] == step and record["lr"] == pytest.approx(lr)
        assert record["epoch"] == pytest.approx(step / 2)  # 16 images, batches of 8
        assert record["samples_seen"] == 8 * step and record["skipped_images"] == 0
        assert record["caption_negatives_valid_rows"] == 0 and record["image_negatives_valid_rows"] == 0


class Board:
    """Stands in for TensorBoard's `SummaryWriter` (not installed here): records every scalar."""

    def __init__(self):
        self.scalars, self.closed = [], False

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def close(self) -> None:
        self.closed = True


def test_tensorboard_gets_the_figures_metrics_jsonl_gets(pairs_csv, tmp_path, monkeypatch):
    board = Board()
    monkeypatch.setattr("lace.train.metrics_writer.open_tensorboard", lambda run_dir: board)
    config = train_config(model="lace-micro-32", data=str(pairs_csv), output=str(tmp_path / "run"), steps=2,
                         batch_size=8, log_every=1, device="cpu", seed=3, tensorboard=True)
    train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    expected = [(f"train/{key}", value, record["step"]) for record in records for key, value in record.items()
                if key != "step"]
    assert board.scalars == expected and board.closed


def test_window_adds_figures_by_name_over_micro_batches():
    window = MetricWindow()
    window.add({"loss": torch.tensor(2.0), "plain_loss": 1.0, "samples": 8, "skipped": 1, "caption_valid": 6.0})
    window.add({"loss": torch.tensor(4.0), "plain_loss": 3.0, "samples": 6, "skipped": 0, "caption_valid": 3.0,
                "provenance": {"edit_cosine": 1.8, "n": 2}})
    totals = window.totals(type("Single", (), {"enabled": False})())
    assert totals["micro_batches"] == 2 and totals["samples"] == 14 and totals["provenance_n"] == 2
    record = step_record(3, 1.5, totals, 2.0, {"lr": 0.1}, {"samples_seen": 14}, pair_rows=False,
                         rule_collisions=False)
    assert record["loss"] == 3.0 and record["plain_loss"] == 2.0
    assert record["samples_per_second"] == 7.0 and record["caption_negatives_valid_rows"] == 9 / 14
    assert record["provenance_edit_cosine"] == pytest.approx(0.9)
    with pytest.raises(KeyError, match="lose"):
        window.add({"lose": 1.0})


def test_the_arm_in_the_start_line_names_the_sources_a_config_switches_on_by_name():
    assert arm_name(train_config(model="lace-micro-32")) == "plain"
    config = train_config(model="lace-micro-32", caption_negatives=True, sources=("toy nudges",))
    assert arm_name(config) == "caption_negatives+toy nudges"


def test_every_switch_the_start_line_names_is_an_arm_config_switch_off_by_default():
    # arm_name reads them with getattr: a field renamed in ArmConfig alone would silently drop out of the line
    defaults = {field.name: field.default for field in dataclasses.fields(ArmConfig)}
    assert {name: defaults.get(name) for name in ARM_SWITCHES} == dict.fromkeys(ARM_SWITCHES, False)
