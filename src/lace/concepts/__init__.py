"""Typed concept vocabularies, concept directions, binding (compound) directions and atom labelling."""

from lace.concepts.bindings import BindingDirections, binding_directions, load_bindings
from lace.concepts.directions import (
    ConceptDirections,
    directions_from_captions,
    directions_from_templates,
)
from lace.concepts.labelling import AtomLabelling, calibrate_tau_align, label_atoms
from lace.concepts.vocabulary import Concept, Vocabulary, load_vocabulary

__all__ = [
    "AtomLabelling",
    "BindingDirections",
    "Concept",
    "ConceptDirections",
    "Vocabulary",
    "binding_directions",
    "calibrate_tau_align",
    "directions_from_captions",
    "directions_from_templates",
    "label_atoms",
    "load_bindings",
    "load_vocabulary",
]
