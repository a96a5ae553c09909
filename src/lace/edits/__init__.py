"""Counterfactual edits: attenuate, swap, transplant of sparse concept codes, rebind along compound
directions, and their controls; `build_editor(labelled, EditConfig)` makes the editor."""

from lace.edits.build import build_editor
from lace.edits.config import EditConfig
from lace.edits.editor import CounterfactualEditor
from lace.edits.records import EDIT_KINDS, Counterfactuals, EditRecords
from lace.edits.report import edit_report
from lace.edits.spec import EditSpec, parse_edit

__all__ = [
    "EDIT_KINDS",
    "CounterfactualEditor",
    "Counterfactuals",
    "EditConfig",
    "EditRecords",
    "EditSpec",
    "build_editor",
    "edit_report",
    "parse_edit",
]
