"""Ctrl-C (SIGINT) stops `lace train`, `lace embed` and `lace dict fit` with resumable state and prints the
command that carries on; that command finishes, with the uninterrupted result."""

import shlex
import signal

import numpy as np
import torch
from safetensors.torch import load_file

from lace.cli import main
from lace.embeddings import EmbeddingStore
from lace.train.checkpoints import latest_checkpoint
from tests.robustness.faults import KillPoint, run_killed
from tests.robustness.test_kill_embed_and_dict import (  # noqa: F401
    dict_argv,
    embed_argv,
    embed_in_process,
    toy_store,
)
from tests.test_train import WORLD_VOCABULARY, pairs_csv  # noqa: F401 (fixtures)


def printed_resume_command(stderr: str) -> list[str]:
    """The arguments of the `lace ...` line printed under 'resume with:'."""
    lines = stderr.splitlines()
    command = shlex.split(lines[lines.index("resume with:") + 1])
    assert command[0] == "lace"
    return command[1:]


def test_sigint_during_training_saves_the_step_and_prints_the_resume_command(pairs_csv, tmp_path, capfd):  # noqa: F811
    flags = ["--model", "lace-micro-32", "--data", str(pairs_csv), "--steps", "6", "--batch-size", "8", "--lr", "2e-3",
             "--warmup-steps", "1", "--checkpoint-every", "0", "--device", "cpu", "--seed", "3", "--no-progress",
             "--caption-negatives", "--vocabulary", WORLD_VOCABULARY]
    assert main(["train", *flags, "--out", str(tmp_path / "whole")]) == 0
    run = tmp_path / "run"
    capfd.readouterr()
    # Ctrl-C inside the third step's micro-batch: the step finishes and is saved
    code = run_killed(["train", *flags, "--out", str(run), "--overwrite"],
                      KillPoint("lace.train.loop", "Trainer._micro_step", 3), signal.SIGINT)
    stderr = capfd.readouterr().err
    assert code == 130, stderr
    assert "finishing this step and saving a checkpoint" in stderr
    assert "lace train: interrupted; saved checkpoint step_0000003" in stderr
    assert latest_checkpoint(run).stem == "step_0000003"  # checkpoint_every 0: only Ctrl-C wrote it
    argv = printed_resume_command(stderr)
    assert argv[-2:] == ["--resume", "latest"] and "--overwrite" not in argv
    assert main(argv) == 0
    weights = load_file(str(latest_checkpoint(run).with_suffix(".safetensors")))
    reference = load_file(str(latest_checkpoint(tmp_path / "whole").with_suffix(".safetensors")))
    assert latest_checkpoint(run).stem == "step_0000006"
    assert all(torch.equal(weights[k], reference[k]) for k in reference)


def test_sigint_during_embedding_keeps_the_work_and_the_printed_command_finishes(tiny_coco, tmp_path, capfd):
    out = tmp_path / "store"
    code = run_killed(embed_argv(tiny_coco, out), KillPoint("lace.embeddings", "embed_texts", 1), signal.SIGINT)
    assert code == 130
    stderr = capfd.readouterr().err
    assert "lace embed: interrupted; the rows embedded so far are kept" in stderr
    assert (tmp_path / ".store.tmp" / "rank00000" / "progress.json").is_file()
    assert embed_in_process(printed_resume_command(stderr)) == 0
    assert embed_in_process(embed_argv(tiny_coco, tmp_path / "whole")) == 0
    store, whole = EmbeddingStore.open(out), EmbeddingStore.open(tmp_path / "whole")
    assert np.array_equal(store.image_embeddings, whole.image_embeddings)
    assert np.array_equal(store.text_embeddings, whole.text_embeddings)


def test_sigint_during_dictionary_fit_leaves_no_folder_and_the_printed_command_finishes(toy_store, tmp_path,  # noqa: F811
                                                                                         capfd):
    out = tmp_path / "dictionary"
    argv = [*dict_argv(toy_store, out), "--overwrite"]
    code = run_killed(argv, KillPoint("lace.concepts.labelled", "save_labelled_dictionary", 1), signal.SIGINT)
    assert code == 130
    stderr = capfd.readouterr().err
    assert "lace dict: interrupted; no half-written output is left" in stderr
    assert not out.exists() or not any(out.iterdir())
    resume = printed_resume_command(stderr)
    assert "--overwrite" not in resume
    assert main(resume) == 0
    assert (out / "labelling.safetensors").is_file() and (out / "fit_config.json").is_file()
