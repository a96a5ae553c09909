"""LACE-local's image editor kept up with the tower it edits: refits every `local.refresh_every` steps and its
fidelity every `local.fidelity_every` steps (shapes world only).

The editor (reader and operator, `lace.local.build_local_editor`) is fitted on the tower's own features; as the
tower trains they move, and a stale editor finds fewer objects and moves them less faithfully. Every R steps,
after optimiser step k R, every process refits it on the first `local.fit_images` training images through the
tower as that step left it (the same weights in every process, in eval mode), so the edits of step k R + 1 onward
come from the new editor. The fit leaves the run's random stream as it was (`lace.train.sources.local_images.LocalImageEdits`).

Resume: a refit is a deterministic function of the weights at its step, but a later checkpoint no longer holds
those weights. The checkpoint therefore holds the fitted editor itself, as plain tensors
(`lace.local.state.editor_state`, read back with `weights_only=True`), from the first refit on, with the count
of refits: a resumed run rebuilds that editor bit for bit and uses it until the next refit, as the uninterrupted
run does. Before the first refit the editor in use is the one fitted on the starting weights, which a resumed run
fits again before it loads the checkpoint, so nothing is stored for it. (The stored editor is mostly the
operator: the recolour regression keeps a (9 C + 1, C) matrix per ordered pair of the group's G concepts, small
at a ResNet's layer1, of the order of the model's own size at a wide ViT block.)

Fidelity: every N steps, after any refit of that step, the main process measures the editor the next step uses,
on the current tower, on the first `local.fidelity_items` swap_attribute items of the val split of the world the
training data lies in (`lace.local.fidelity.swap_fidelity`: direction agreement of its binding swaps
with the rendered swaps). It runs in eval mode, without gradient, on a forked random stream and without any
collective: the other processes go on and wait for it in the next step's collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from lace.errors import input_error
from lace.local.config import LocalEditConfig
from lace.local.editor import LocalImageEditor
from lace.local.fidelity import benchmark_items, family_data, item_pixels, swap_fidelity
from lace.local.state import editor_from_state, editor_state
from lace.train.config import TrainConfig
from lace.train.rendered import world_of

FIDELITY_SPLIT = "val"
FIDELITY_FAMILY = "swap_attribute"


class FidelityProbe:
    """The fidelity of an editor's binding swaps on fixed benchmark items of a shapes world.

    encoder: the `DualEncoder` being trained (its `model` is what the editor edits); items: the benchmark items;
    their images and rendered negatives are read once, onto the encoder's device; seed: the random controls' seed.
    """

    def __init__(self, encoder, world: Path, items: list[dict], seed: int):
        self.encoder, self.items, self.seed = encoder, items, seed
        self.pixels = {key: pixels.to(encoder.device) for key, pixels in item_pixels(encoder, world, items).items()}

    def measure(self, editor: LocalImageEditor) -> dict[str, float]:
        """`local_fidelity_direction` (mean cos(u_edit - u, u_rendered - u) over the valid swaps), the same for the
        same-size random step (`local_fidelity_control_direction`) and the share of items with a valid swap
        (`local_fidelity_valid`); a figure without valid rows is left out. The encoder's train/eval mode and the
        random stream are left as they were."""
        encoder, device = self.encoder, self.encoder.device
        was_training = encoder.training
        encoder.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                data = family_data(encoder, self.pixels, self.items)
                figures = swap_fidelity(encoder.model, editor, data, torch.Generator().manual_seed(self.seed))
        finally:
            encoder.train(was_training)
        named = {"local_fidelity_direction": figures["edit"]["direction_agreement"],
                 "local_fidelity_control_direction": figures["random_control"]["direction_agreement"],
                 "local_fidelity_valid": figures["valid_share"]}
        return {name: value for name, value in named.items() if value is not None}


def fidelity_probe(config: TrainConfig, encoder, measures: bool) -> FidelityProbe | None:
    """The probe of `config.negatives.local.fidelity_every` (None when 0, or in a process that does not measure). Every
    process reads the world's items, so a bad world stops them all before the first step; only the measuring one
    (the main process) reads their images."""
    if not config.negatives.local.fidelity_every:
        return None
    world = world_of(config.run.data, needed_by="local.fidelity_every")
    items = benchmark_items(world, FIDELITY_SPLIT, FIDELITY_FAMILY, config.negatives.local.fidelity_items)
    if not items:
        raise input_error(world, "benchmarks", f"{FIDELITY_FAMILY} items in the {FIDELITY_SPLIT} split when "
                          "local.fidelity_every is on", 0)
    return FidelityProbe(encoder, world, items, config.run.seed) if measures else None


class LocalEditorUpkeep:
    """Refits and fidelity of a pixels run's local editor; the trainer calls `after_step` after each optimiser
    step, adds `metrics()` to each metrics line and `state()` to each checkpoint, and `restore`s on resume.

    fit: fits a new editor on the current tower (the trainer's own fit, random stream untouched);
    probe: the main process's `FidelityProbe` (None elsewhere, or with fidelity_every 0).
    """

    def __init__(self, config: LocalEditConfig, fit: Callable[[], LocalImageEditor],
                 probe: FidelityProbe | None = None):
        self.refresh_every, self.fidelity_every = config.refresh_every, config.fidelity_every
        self.fit, self.probe = fit, probe
        self.refreshes = 0
        self.figures: dict[str, float] = {}

    def after_step(self, step: int, editor: LocalImageEditor) -> tuple[LocalImageEditor, bool]:
        """After optimiser step `step`: the editor of the steps that follow (refitted when `step` is a multiple of
        refresh_every) and whether the fidelity was due at `step` (alike in every process: the step then logs)."""
        if self.refresh_every and step % self.refresh_every == 0:
            editor = self.fit()
            self.refreshes += 1
        due = bool(self.fidelity_every) and step % self.fidelity_every == 0
        if due and self.probe is not None:
            self.figures = self.probe.measure(editor)
        return editor, due

    def metrics(self) -> dict[str, float]:
        """The metrics line's figures: `local_editor_refreshes`, the refits so far (when refreshing), and the
        fidelity measured since the previous line (once)."""
        figures, self.figures = self.figures, {}
        return {**({"local_editor_refreshes": self.refreshes} if self.refresh_every else {}), **figures}

    def state(self, editor: LocalImageEditor) -> dict:
        """What a checkpoint keeps: the refits so far and, once there was one, the editor in use."""
        return {"refreshes": self.refreshes, "editor": editor_state(editor) if self.refreshes else {}}

    def restore(self, state: dict | None, editor: LocalImageEditor) -> LocalImageEditor:
        """The editor in use at the checkpoint whose `state()` is `state` (None: a checkpoint written without
        one); editor: the one fitted on the starting weights, in use until the first refit."""
        if not state:
            return editor
        self.refreshes = int(state["refreshes"])
        return editor_from_state(state["editor"]) if self.refreshes else editor
