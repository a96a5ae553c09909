"""No host-device synchronisation inside the training step of any arm.

On a GPU, CUDA's own debug mode counts them (a value read back, a blocking copy) and the step must have none: the
issue's target. On the CPU, the calls that would synchronise on a GPU (`tests.cuda.syncs.HostReads`) are listed
by function, and only those known today are allowed (a new one fails; one that goes away is fine); each known one is
a synchronisation the GPU test reports. The step is the first of two, not a logged one (a logged step reads its figures back by design).
"""

from __future__ import annotations

import pytest
import torch

from lace.local.editor import slot_changes
from tests.cuda.devices import DEVICES
from tests.cuda.steps import ARMS, one_step
from tests.cuda.syncs import HostReads, step_syncs

# What each arm's step reads back today (on a GPU: a synchronisation each), by function
KNOWN_READS = {
    "LACE": {"dictionary/streaming.py:check_finite",  # the dictionary's input check, every encode
             "dictionary/sparse_coding.py:_refit_nonnegative"},  # stops early when no coefficient is negative
    "LACE-local": {"local/recolour.py:move_near_object",  # gathers the moved positions: sizes read back
                   "local/recolour.py:ridge_change",  # each concept pair's rows: their counts read back
                   "local/editor.py:slot_changes"},  # what each slot changed, as names, every step
}
KNOWN_READS["pairs layout"] = KNOWN_READS["LACE-local"] | {
    "train/pairs.py:pair_rows",  # which described captions to encode
    "losses.py:pair_loss",  # the valid rows, compacted
}


@pytest.mark.parametrize("arm", list(ARMS))
@pytest.mark.parametrize("device", DEVICES)
def test_the_training_step_reads_nothing_back(arm, device, world, lace_editor, tmp_path):
    with step_syncs(device) as (window, found):
        one_step(arm, world, tmp_path, device, "auto", lace_editor if arm == "LACE" else None, gradients=False,
                 on_batch=window.on_batch, steps=2, log_every=2)
    if device == "cuda":
        assert not found, f"synchronising CUDA operations in the step of {arm}: {found}"
    else:
        unknown = set(found) - KNOWN_READS.get(arm, set())
        assert not unknown, f"new reads back to the host in the step of {arm}: {sorted(unknown)}"


def test_the_cpu_count_finds_a_read_back_in_lace_by_its_function():
    reads = HostReads()
    with reads:
        slot_changes(["swap"], torch.tensor([[[0, 1]]]), ["red", "blue"])  # reads the changes as a list
        torch.ones(3).sum().item()  # outside lace's own source: still counted, as such
    assert reads.seen == {"local/editor.py:slot_changes": 1, "outside lace": 1}
