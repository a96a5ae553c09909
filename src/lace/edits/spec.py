"""Named edits written as text: "transplant:sheep=zebra", "swap:red=blue", "attenuate:dog",
"rebind:red=blue" (red and blue trade the objects they are bound to)."""

from __future__ import annotations

from dataclasses import dataclass

from lace.edits.records import EDIT_KINDS
from lace.errors import input_error


@dataclass(frozen=True)
class EditSpec:
    """kind: one of EDIT_KINDS; source: concept name; target: concept name (None for attenuate)."""

    kind: str
    source: str
    target: str | None = None


def parse_edit(text: str, where: str = "--edit") -> EditSpec:
    """Parse "kind:source[=target]"; the target is required for swap, transplant and rebind."""
    kind, separator, rest = text.partition(":")
    kind = kind.strip()
    if not separator or kind not in EDIT_KINDS:
        raise input_error(where, None, f"'kind:source[=target]' with kind one of {EDIT_KINDS}", text)
    source, equals, target = (part.strip() for part in rest.partition("="))
    if not source:
        raise input_error(where, "source", "a concept name after the colon", text)
    if kind == "attenuate":
        if equals:
            raise input_error(where, "target", "no target for attenuate ('attenuate:concept')", text)
        return EditSpec(kind, source, None)
    if not equals or not target:
        raise input_error(where, "target", f"'{kind}:source=target'", text)
    if target == source:
        raise input_error(where, "target", "a target different from the source", text)
    return EditSpec(kind, source, target)


def parse_pair(text: str, where: str = "target") -> tuple[str, str]:
    """Parse "source=target" (the named-target form of `CounterfactualEditor`)."""
    source, equals, target = (part.strip() for part in text.partition("="))
    if not equals or not source or not target:
        raise input_error(where, None, "'random', 'hard' or a named pair 'source=target'", text)
    return source, target
