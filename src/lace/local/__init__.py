"""Edits inside the towers: concepts coded per position at a layer L, swapped between objects,
and the layers above L run on the edited features (METHOD.md section 4b)."""
