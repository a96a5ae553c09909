"""`lace train` killed with SIGKILL at seeded points, resumed each time, ends on the uninterrupted weights, bit for bit.

The run uses every source of randomness a LACE run has: the data order and caption draw, per-sample
rule-made captions, the editor's counterfactual edits (per-sample generators) and a dictionary refresh
whose pool spans more micro-batches than a refresh interval, with gradient accumulation.
"""

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lace.cli import main
from lace.train.checkpoints import complete_checkpoints, latest_checkpoint
from tests.robustness.faults import KillPoint, lace_run_folder, run_killed
from tests.test_train import WORLD_VOCABULARY

KILLS = 3
SEED = 16


@pytest.fixture(scope="module")
def lace_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A folder with 24 images and their captions, a fitted dictionary, and `lace train` flags of a LACE run."""
    folder = lace_run_folder(tmp_path_factory.mktemp("kill_resume"))
    flags = ["--model", "lace-micro-32", "--data", str(folder / "pairs.csv"), "--steps", "6", "--batch-size", "8",
             "--grad-accumulation", "2", "--lr", "2e-3", "--warmup-steps", "1", "--log-every", "1",
             "--checkpoint-every", "1", "--keep-checkpoints", "2", "--device", "cpu", "--seed", "3", "--no-progress",
             "--counterfactual-captions", "--counterfactual-images", "--dictionary", str(folder / "dictionary"),
             "--vocabulary", WORLD_VOCABULARY, "--caption-negatives", "--refresh-dictionary-every", "2",
             "--refresh-pool-size", "40"]
    return folder, flags


def kill_points(rng: random.Random) -> list[KillPoint]:
    """Seeded kills: inside a training micro-batch, or between the renames that commit a checkpoint."""
    points = []
    for number in range(KILLS):
        if number % 2 == 0:
            points.append(KillPoint("lace.train.loop", "Trainer._micro_step", rng.randint(2, 6)))
        else:  # a checkpoint is four renames: weights, state, manifest, then the `latest` pointer
            points.append(KillPoint("lace.io", "os.replace", rng.randint(2, 12)))
    return points


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(latest_checkpoint(run).with_suffix(".safetensors")))


@pytest.mark.slow
def test_sigkill_at_seeded_points_then_resume_matches_the_uninterrupted_run_bit_for_bit(lace_run):
    folder, flags = lace_run
    assert main(["train", *flags, "--out", str(folder / "whole")]) == 0
    reference = final_weights(folder / "whole")

    run = folder / "killed"
    resumed_from = []
    for number, point in enumerate(kill_points(random.Random(SEED))):
        first = number == 0 or latest_checkpoint(run) is None
        argv = ["train", *flags, "--out", str(run)] + (["--overwrite"] if first else ["--resume", "latest"])
        assert run_killed(argv, point) == -9, f"the run was not killed at {point}"
        assert latest_checkpoint(run) is None or latest_checkpoint(run).is_file()  # `latest` names a whole checkpoint
        resumed_from.append(latest_checkpoint(run).stem if latest_checkpoint(run) else None)
    assert any(resumed_from), "no kill came after a checkpoint: the kill points never tested a resume"
    assert main(["train", *flags, "--out", str(run), "--resume", "latest"]) == 0

    weights = final_weights(run)
    assert weights.keys() == reference.keys()
    different = {k: float((weights[k] - reference[k]).abs().max()) for k in weights if not torch.equal(weights[k], reference[k])}
    assert not different, f"resumed weights differ from the uninterrupted run: {different}"
    assert [m.stem for m in complete_checkpoints(run)] == ["step_0000005", "step_0000006"]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    whole = [json.loads(line) for line in (folder / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 7))
    assert [m["loss"] for m in metrics] == [m["loss"] for m in whole]
    assert metrics[-1]["samples_seen"] == whole[-1]["samples_seen"] == 6 * 2 * 8
