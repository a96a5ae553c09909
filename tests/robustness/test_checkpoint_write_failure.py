"""A checkpoint write that fails part-way (disk full) leaves the previous checkpoint the latest, and it loads."""

import errno
import os
from pathlib import Path

import pytest
import torch

from lace.config import with_changes
from lace.train import train
from lace.train.checkpoints import complete_checkpoints, latest_checkpoint, load_checkpoint
from tests.conftest import make_images
from tests.test_train import COLOURS, config_for, weights_of

# The files of checkpoint 2 in the order they are written, and which write of that name is step 2's.
FILES_OF_STEP_2 = ((".step_0000002.safetensors.", 1), (".step_0000002.state.pt.", 1), (".step_0000002.json.", 1),
                   (".latest.", 2))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """16 images with captions, and the weights of an uninterrupted 2-step run on them."""
    folder = tmp_path_factory.mktemp("write_failure")
    names = make_images(folder / "images", 16)
    (folder / "pairs.csv").write_text("filepath,caption\n" + "".join(
        f"images/{n},a {COLOURS[i % 4]} square\n" for i, n in enumerate(names)))
    whole = train(config_for(folder / "pairs.csv", folder / "whole", steps=2, checkpoint_every=1), progress=False)
    return folder / "pairs.csv", weights_of(whole)


def disk_full_on(prefix: str, occurrence: int):
    """An `os.fsync` that, at the `occurrence`-th temporary file named `prefix...`, cuts the file to half
    and fails as a full disk does; every other file is synced as usual."""
    real_fsync, seen = os.fsync, [0]

    def fsync(fd: int) -> None:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(prefix):
            seen[0] += 1
            if seen[0] == occurrence:
                os.ftruncate(fd, os.fstat(fd).st_size // 2)
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
        real_fsync(fd)

    return fsync


@pytest.mark.parametrize(("failing", "occurrence"), FILES_OF_STEP_2)
def test_failed_checkpoint_write_keeps_the_previous_latest_and_resumes(failing, occurrence, data, tmp_path,
                                                                        monkeypatch):
    pairs, reference = data
    run = tmp_path / "run"
    config = config_for(pairs, run, steps=2, checkpoint_every=1)
    with monkeypatch.context() as patch:
        patch.setattr("lace.io.os.fsync", disk_full_on(failing, occurrence))
        with pytest.raises(OSError, match="No space left"):
            train(config, progress=False)
    assert latest_checkpoint(run).stem == "step_0000001"
    assert load_checkpoint(latest_checkpoint(run), run).step == 1
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    complete = [m.stem for m in complete_checkpoints(run)]
    # only a failed `latest` update leaves step 2 whole (its manifest was written); `latest` still says step 1
    assert complete == ["step_0000001"] + (["step_0000002"] if failing == ".latest." else [])
    for manifest in complete_checkpoints(run):
        assert load_checkpoint(manifest, run).step == int(manifest.stem[5:])
    resumed = train(with_changes(config, {"resume": "latest"}), progress=False)
    assert resumed.steps == 2
    for key, value in weights_of(resumed).items():
        assert torch.equal(value, reference[key]), key
