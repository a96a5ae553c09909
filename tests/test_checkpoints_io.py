"""Checkpoint retention, output folders and the metrics log never lose what a run still needs."""

import json

import pytest
import torch

from lace.errors import LaceInputError
from lace.io import prepare_output_dir
from lace.train.checkpoints import (
    complete_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from lace.train.metrics import truncate_metrics as _truncate_metrics


def _save(run, step, keep):
    return save_checkpoint(run, step, {"w": torch.full((2,), float(step))}, {"step": step}, keep=keep)


def test_pruning_keeps_the_newest_checkpoints(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert [m.stem for m in complete_checkpoints(tmp_path)] == ["step_0000003", "step_0000004"]


def test_a_checkpoint_written_after_resuming_earlier_is_never_pruned(tmp_path):
    # A run kept steps 20, 30 and 40; it is resumed from 20, checkpoints at 25 and keeps 2.
    for step in (20, 30, 40):
        _save(tmp_path, step, keep=3)
    written = _save(tmp_path, 25, keep=2)
    assert latest_checkpoint(tmp_path) == written
    assert load_checkpoint(written).step == 25  # the checkpoint `latest` names is complete
    # the later checkpoints of the abandoned run are left for the resumed run to replace
    assert [m.stem for m in complete_checkpoints(tmp_path)] == [
        "step_0000020", "step_0000025", "step_0000030", "step_0000040"]
    _save(tmp_path, 30, keep=2)
    assert [m.stem for m in complete_checkpoints(tmp_path)] == ["step_0000025", "step_0000030", "step_0000040"]


def test_overwrite_refuses_the_working_folder_and_its_parents(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("keep me")
    monkeypatch.chdir(work)
    for target in (work, tmp_path, "."):
        with pytest.raises(LaceInputError, match="refusing to overwrite"):
            prepare_output_dir(target, overwrite=True)
    assert (work / "notes.txt").read_text() == "keep me"
    out = work / "out"
    out.mkdir()
    (out / "old.json").write_text("{}")
    assert not any(prepare_output_dir(out, overwrite=True).iterdir())


def test_resume_truncates_a_metrics_log_cut_short_mid_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    _truncate_metrics(path, 2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_output_folder_holding_an_input_is_refused(tmp_path):
    (tmp_path / "emb").mkdir()
    (tmp_path / "emb" / "index.json").write_text("{}")
    with pytest.raises(LaceInputError, match="holds the input"):
        prepare_output_dir(tmp_path, overwrite=True, inputs=(tmp_path / "emb",))
    assert (tmp_path / "emb" / "index.json").is_file()
