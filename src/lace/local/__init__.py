"""Edits inside the towers: concepts coded per position at a layer L, swapped between objects,
and the layers above L run on the edited features (METHOD.md section 4b).

`build_local_editor(LocalEditConfig(...), clip, pixels, captions, normalise, vocabulary)` fits the editor.
"""

from lace.local.build import build_local_editor
from lace.local.config import LocalEditConfig

__all__ = ["LocalEditConfig", "build_local_editor"]
