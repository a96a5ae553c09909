"""A checkpoint written on one device resumes on the other, exactly in fp32: the weights and the optimiser state
the resumed run starts from are bit for bit those saved, and it then trains as the writing device would."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from lace.config import with_changes
from lace.train import train
from tests.cuda.devices import CUDA, assert_gradients_close, exact_fp32
from tests.cuda.steps import arm_config, initial_encoder

WRITE_THEN_RESUME = [("cpu", "cpu"), pytest.param("cuda", "cpu", marks=CUDA.marks),
                     pytest.param("cpu", "cuda", marks=CUDA.marks)]


def _on_cpu(value):
    """A copy on the CPU of a tensor, or of every tensor inside a dict or list."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(item) for item in value)
    return value


def _assert_equal(found, expected, where: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert torch.equal(found.float(), expected.float()), where
    elif isinstance(expected, dict):
        assert found.keys() == expected.keys(), where
        for key in expected:
            _assert_equal(found[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        for i, (a, b) in enumerate(zip(found, expected, strict=True)):
            _assert_equal(a, b, f"{where}/{i}")
    else:
        assert found == expected, where


def _resume(config, device: str) -> tuple[dict, dict, dict]:
    """Resume `config`'s run on `device` for one more step: (weights and optimiser state it started from, its
    final weights)."""
    started: dict = {}
    encoder = initial_encoder(config.run.model)

    def before_step(optimizer, *_) -> None:  # the loaded state, before the first step moves it
        if "optimizer" not in started:
            started["optimizer"] = _on_cpu(optimizer.state_dict())

    def on_batch(number, indices):
        if "weights" not in started:
            started["weights"] = _on_cpu(encoder.state_dict())

    hook = register_optimizer_step_pre_hook(before_step)
    try:
        result = train(with_changes(config, {"device": device, "steps": 3, "resume": "latest"}), progress=False, encoder=encoder,
                       on_batch=on_batch)
    finally:
        hook.remove()
    return started["weights"], started["optimizer"], _on_cpu(result.model.state_dict())


@pytest.mark.parametrize(("written", "resumed"), WRITE_THEN_RESUME)
def test_a_checkpoint_resumes_exactly_on_the_other_device(written, resumed, world, tmp_path):
    config = arm_config("plain", world, tmp_path / "run", written, "fp32", steps=2, checkpoint_every=2)
    saved: dict = {}
    hook = register_optimizer_step_post_hook(lambda optimizer, *_: saved.__setitem__("optimizer",
                                                                                      _on_cpu(optimizer.state_dict())))
    try:
        with exact_fp32():
            first = train(config, progress=False, encoder=initial_encoder(config.run.model))
    finally:
        hook.remove()
    saved_weights = _on_cpu(first.model.state_dict())
    shutil.copytree(tmp_path / "run", tmp_path / "again")
    with exact_fp32():
        weights, optimizer, moved = _resume(config, resumed)
        _, _, stayed = _resume(with_changes(config, {"output": str(tmp_path / "again")}), written)
    _assert_equal(weights, saved_weights, "weights")
    _assert_equal(optimizer["state"], saved["optimizer"]["state"], "optimizer state")
    assert_gradients_close(moved, stayed, rtol=1e-4)  # the step after: as on the writing device, in fp32
