"""Counterfactual edits: attenuate, swap, transplant of sparse concept codes, rebind along compound
directions, and their controls; `build_editor(labelled, EditConfig)` makes the editor. Names load on first use."""

from lace.lazy import lazy_exports

_EXPORTS = {
    "EDIT_KINDS": "lace.edits.config",
    "CounterfactualEditor": "lace.edits.editor",
    "Counterfactuals": "lace.edits.records",
    "EditConfig": "lace.edits.config",
    "EditRecords": "lace.edits.records",
    "EditSpec": "lace.edits.spec",
    "build_editor": "lace.edits.build",
    "edit_report": "lace.edits.report",
    "parse_edit": "lace.edits.spec",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
