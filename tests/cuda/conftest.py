"""Fixtures of the device tests: a tiny shapes world and a LACE editor fitted on the runs' initial model."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_world
from tests.cuda.steps import SEED, lace_editor_for


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    return tiny_world(tmp_path_factory.mktemp("cuda") / "world", 48, (0.7, 0.1, 0.1, 0.1))


@pytest.fixture(scope="session")
def lace_editor(world):
    torch.manual_seed(SEED)
    return lace_editor_for(world)
