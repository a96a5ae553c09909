"""Typed concept vocabularies, concept directions and atom labelling."""

from lace.concepts.directions import (
    ConceptDirections,
    directions_from_captions,
    directions_from_templates,
)
from lace.concepts.labelling import AtomLabelling, calibrate_tau_align, label_atoms
from lace.concepts.vocabulary import Concept, Vocabulary, load_vocabulary

__all__ = [
    "AtomLabelling",
    "Concept",
    "ConceptDirections",
    "Vocabulary",
    "calibrate_tau_align",
    "directions_from_captions",
    "directions_from_templates",
    "label_atoms",
    "load_vocabulary",
]
