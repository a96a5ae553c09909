"""Edits inside the towers: concepts coded per position at a layer L, swapped between objects,
and the layers above L run on the edited features (METHOD.md section 4b).

`build_local_editor(LocalEditConfig(...), clip, pixels, captions, normalise, vocabulary)` fits the editor.
Names load on first use.
"""

from lace.lazy import lazy_exports

_EXPORTS = {"LocalEditConfig": "lace.local.config", "build_local_editor": "lace.local.build"}
__all__ = [
    "LocalEditConfig",
    "build_local_editor",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
