"""Default thresholds of atom labelling (the module docstring of `lace.concepts.labelling` says where they come
from), apart from the labelling itself so that configs read them without importing torch."""

DEFAULT_TAU_ALIGN = 0.3
"""Alignment an atom needs to own its concept when there is no data to calibrate tau_align on."""
DEFAULT_TAU_USE = 0.25
"""A concept is editable when its weight is at least tau_use x the embedding's largest concept weight."""
