"""One training step of every arm family on each device: in fp32 its loss and gradients on a fixed batch match the
CPU's (tolerances in tests/cuda/devices.py), in bf16 autocast they are finite."""

from __future__ import annotations

import math

import pytest
import torch

from tests.cuda.devices import DEVICES, LOSS_RTOL, assert_gradients_close, exact_fp32
from tests.cuda.steps import ARMS, cpu_local_editor, one_step

LOCAL_ARMS = ("LACE-local", "pairs layout")
_references: dict[str, object] = {}


def _editors(arm: str, world, lace_editor):
    """The LACE editor for the LACE arm; for the local arms one local editor fitted on the CPU, so that both
    devices edit with the same one (fitting on the device is exercised by the bf16 test)."""
    editor = lace_editor if arm == "LACE" else None
    local = cpu_local_editor(world, ARMS[arm][1]) if arm in LOCAL_ARMS else None
    return editor, local


def _cpu_reference(arm: str, world, lace_editor, tmp_path_factory):
    if arm not in _references:
        editor, local = _editors(arm, world, lace_editor)
        _references[arm] = one_step(arm, world, tmp_path_factory.mktemp("cpu"), "cpu", "fp32", editor, local)
    return _references[arm]


@pytest.mark.parametrize("arm", list(ARMS))
@pytest.mark.parametrize("device", DEVICES)
def test_one_fp32_step_matches_the_cpu(arm, device, world, lace_editor, tmp_path, tmp_path_factory):
    reference = _cpu_reference(arm, world, lace_editor, tmp_path_factory)
    assert reference.gradients and math.isfinite(reference.loss)
    if arm != "plain":  # the arm's negatives are in the loss
        assert reference.loss != pytest.approx(reference.plain_loss, rel=1e-6)
    editor, local = _editors(arm, world, lace_editor)
    with exact_fp32():
        step = one_step(arm, world, tmp_path, device, "fp32", editor, local)
    assert step.loss == pytest.approx(reference.loss, rel=LOSS_RTOL)
    assert step.plain_loss == pytest.approx(reference.plain_loss, rel=LOSS_RTOL)
    assert_gradients_close(step.gradients, reference.gradients)


@pytest.mark.parametrize("arm", list(ARMS))
@pytest.mark.parametrize("device", DEVICES)
def test_one_bf16_step_is_finite(arm, device, world, lace_editor, tmp_path):
    # the local arms fit their editor on `device` here, as `lace train` does
    step = one_step(arm, world, tmp_path, device, "bf16", lace_editor if arm == "LACE" else None)
    assert math.isfinite(step.loss) and math.isfinite(step.plain_loss)
    assert step.gradients
    assert all(bool(torch.isfinite(g).all()) for g in step.gradients.values())
    assert any(bool(g.abs().sum() > 0) for g in step.gradients.values())
