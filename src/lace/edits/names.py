"""Errors that name a concept an edit cannot act on, with the concepts it can act on and the closest to the word
given, so that a user picks an editable one without reading the dictionary."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from lace.errors import LaceInputError

LISTED_CONCEPTS = 40
"""How many editable concepts an error lists."""


def closest_concept(word: str, names: Sequence[str]) -> str | None:
    """The name of `names` closest in spelling to `word` (difflib's ratio), None when `names` is empty."""
    found = difflib.get_close_matches(word, names, n=1, cutoff=0.0)
    return found[0] if found else None


def concept_error(word: str, why: str, editable: Sequence[str]) -> LaceInputError:
    """`edit: concept '<word>' <why>; editable concepts (n): ...; closest to '<word>': '<name>'`."""
    closest = closest_concept(word, editable)
    if closest is None:
        return LaceInputError(f"edit: concept {word!r} {why}; no concept owns an aligned atom, so none can be edited")
    listed = ", ".join(editable[:LISTED_CONCEPTS])
    more = f", ... ({len(editable) - LISTED_CONCEPTS} more)" if len(editable) > LISTED_CONCEPTS else ""
    return LaceInputError(f"edit: concept {word!r} {why}; editable concepts ({len(editable)}): {listed}{more}; "
                          f"closest to {word!r}: {closest!r}")
