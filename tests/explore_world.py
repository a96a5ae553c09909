"""The explorer's test session: the demo's first three stages on a tiny world, and two models over it."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from lace.concepts.labelled import load_labelled_dictionary
from lace.config import with_changes
from lace.data import read_dataset
from lace.demo import DemoConfig
from lace.demo.config import DEMO_DICTIONARY, DEMO_FINETUNE
from lace.demo.pipeline import Foundation, demo_model_and_dictionary
from lace.encoders import load_encoder
from lace.explore.state import ExploreSession, build_model_view, build_session

TINY = DemoConfig(world_images=240, base_steps=30, batch_size=32,
                  dictionary=replace(DEMO_DICTIONARY, atoms=16, sparsity=3),
                  finetune=with_changes(DEMO_FINETUNE, {"steps": 3, "n_edits": 2}), progress=False)
K = 5


@functools.cache
def shared_foundation() -> Foundation:
    """The tiny demo's world, base and dictionary, made once per test process in a folder removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="lace-explore-"))
    atexit.register(shutil.rmtree, folder, True)
    torch.manual_seed(0)
    return demo_model_and_dictionary(TINY, folder, log=lambda _: None)


@functools.cache
def shared_session() -> ExploreSession:
    """The tiny demo's base with its dictionary, and a random model of the same architecture to compare
    (made once per test process: the server and browser tests share it)."""
    foundation = shared_foundation()
    dataset = read_dataset(foundation.world_dir / "karpathy_coco.json")
    labelled = load_labelled_dictionary(foundation.dictionary_dir)
    base = build_model_view("demo base", foundation.encoder, labelled, dataset, k=K, progress=False, log=lambda _: None)
    torch.manual_seed(0)
    random = build_model_view("random init", load_encoder(TINY.model), labelled, dataset, k=K, progress=False,
                              log=lambda _: None)
    return build_session(dataset, [base, random])
