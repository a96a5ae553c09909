"""Request bodies of the explorer, validated with bounds: anything else is refused with a message."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lace.edits.records import EDIT_KINDS

MAX_CAPTION_CHARS = 300
MAX_CONCEPT_CHARS = 100
MAX_NEIGHBOURS = 50
MAX_STRENGTH = 8.0

EditKind = Literal[EDIT_KINDS]  # type: ignore[valid-type]


class QueryBody(BaseModel):
    """One query: exactly one of an image id, a caption id or a typed caption (checked by the server,
    which knows the ranges), under model `model` (0, or 1 when a second model is loaded)."""

    model_config = ConfigDict(extra="forbid")

    model: int = Field(0, ge=0, le=1)
    image: int | None = None
    caption_id: int | None = None
    caption: str | None = Field(None, max_length=MAX_CAPTION_CHARS)


class EditBody(QueryBody):
    """A named edit of the query: kind, source concept, target concept (none for attenuate), the
    transplant strength, the seed of the random control and the neighbours to list."""

    kind: EditKind
    source: str = Field(min_length=1, max_length=MAX_CONCEPT_CHARS)
    target: str | None = Field(None, max_length=MAX_CONCEPT_CHARS)
    strength: float = Field(1.0, gt=0.0, le=MAX_STRENGTH)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    k: int = Field(8, ge=1, le=MAX_NEIGHBOURS)

    def edit_text(self) -> str:
        """The edit as `lace.edits.parse_edit` reads it."""
        return f"{self.kind}:{self.source}" + (f"={self.target}" if self.target else "")
