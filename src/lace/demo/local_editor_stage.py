"""LACE-local's image editor fitted once per seed on the base and shared by every local arm of the demo.

A local arm's trainer fits its editor before the first step on the first `local.fit_images` training images
through the tower it starts from (`lace.train.sources.local_images`). Every local arm of a demo starts from the
same base with the same images and seed, so the editor is the same: the demo fits it once, as a stage of its own
(one thread, like the fine-tunes), saves it (`lace.local.state.editor_state`) and passes it to each local arm's
`train(local_editor=...)`. Refits during training (`local.refresh_every`) are still each run's own.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.encoders import load_encoder
from lace.experiment.variants import VARIANTS
from lace.io import atomic_path
from lace.local import build_local_editor
from lace.local.config import LocalEditConfig
from lace.local.editor import LocalImageEditor
from lace.local.state import editor_from_state, editor_state
from lace.train import TensorPairs


def editor_file(out: Path, seed: int) -> Path:
    """Where demo run `out` keeps the local editor of fine-tune seed `seed`."""
    return out / "models" / f"local-editor-seed{seed}.pt"


def fit_shared_editor(local: LocalEditConfig, model: str, base_path: Path, pairs: TensorPairs, vocabulary: str,
                      seed: int, path: Path) -> dict:
    """Fit the editor a local arm of seed `seed` would fit before its first step (the base in eval mode, the first
    `local.fit_images` of the train `pairs`), save it to `path`; return what it was fitted on."""
    encoder = load_encoder(model, str(base_path))
    count = min(local.fit_images, len(pairs))
    captions = [list(captions) for captions in pairs.captions[:count]]
    editor = build_local_editor(local, encoder.model, pairs.pixels[:count], captions,
                                encoder.preprocess.transforms[-1], load_vocabulary(vocabulary), seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(editor_state(editor), tmp)
    return {"fit_images": count, "concepts": list(editor.concept_names), "file": path.name}


def load_shared_editor(path: Path) -> LocalImageEditor:
    """The editor `fit_shared_editor` saved at `path` (read with `weights_only=True`)."""
    return editor_from_state(torch.load(path, weights_only=True))


KNOBS_THE_FIT_IGNORES = frozenset({"symmetric"})
"""Local knobs `lace.local.build_local_editor` does not read: they act during training only (the symmetric kinds'
counterparts are made with the fitted editor), so an arm that sets only these fits the editor every local arm fits."""


def edits_locally(arm: str) -> bool:
    """Whether arm `arm` edits images inside the tower with an editor fitted as the demo's own local settings fit it
    (so its trainer takes the shared editor); an arm that sets knobs the fit reads (the learnt operator) fits its own."""
    own_knobs = set(VARIANTS[arm].get("local", {}))
    return bool(VARIANTS[arm].get("local_image_negatives")) and own_knobs <= KNOBS_THE_FIT_IGNORES
