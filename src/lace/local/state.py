"""A fitted `LocalImageEditor` as plain tensors and numbers, and back.

    state = editor_state(editor)       # a dict a checkpoint holds (torch.save, read with weights_only=True)
    same = editor_from_state(state)    # makes the edits `editor` makes, bit for bit

The reader and the operator (`RecolourRegression`, `LearntRecolour` or `GaussianTransport`) save their own learnt tensors
(`state_dict` / `from_state`); the editor adds its layers, concept names, effect check and the state of its own
generator (the transplant draws and random controls made without a per-row generator).
"""

from __future__ import annotations

import torch

from lace.local.editor import LocalImageEditor
from lace.local.learnt import LearntRecolour
from lace.local.reader import PositionConceptReader
from lace.local.recolour import RecolourRegression
from lace.local.transport import GaussianTransport

OPERATORS = {cls.__name__: cls for cls in (RecolourRegression, LearntRecolour, GaussianTransport)}


def editor_state(editor: LocalImageEditor) -> dict:
    """The fitted editor as a dict of tensors, strings, numbers and nested dicts of them."""
    operator = type(editor.transport).__name__
    if operator not in OPERATORS:
        raise TypeError(f"editor_state: expected an operator in {sorted(OPERATORS)}, got {operator}")
    return {"layer": editor.layer, "locate_layer": editor.locate_layer, "concept_names": list(editor.concept_names),
            "check_effect": editor.check_effect, "generator": editor.generator.get_state(),
            "reader": editor.reader.state_dict(), "operator": operator, "transport": editor.transport.state_dict()}


def editor_from_state(state: dict) -> LocalImageEditor:
    """The editor `editor_state` saved, with its generator where it was."""
    editor = LocalImageEditor(state["layer"], PositionConceptReader.from_state(state["reader"]),
                              OPERATORS[state["operator"]].from_state(state["transport"]), state["concept_names"],
                              check_effect=state["check_effect"], locate_layer=state["locate_layer"])
    editor.generator.set_state(torch.as_tensor(state["generator"]))
    return editor


__all__ = ["editor_from_state", "editor_state"]
