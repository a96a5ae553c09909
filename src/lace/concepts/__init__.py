"""Typed concept vocabularies, concept directions, binding (compound) directions and atom labelling.
Names load on first use."""

from lace.lazy import lazy_exports

_EXPORTS = {
    "AtomLabelling": "lace.concepts.labelling",
    "BindingDirections": "lace.concepts.bindings",
    "Concept": "lace.concepts.vocabulary",
    "ConceptDirections": "lace.concepts.directions",
    "Vocabulary": "lace.concepts.vocabulary",
    "binding_directions": "lace.concepts.bindings",
    "calibrate_tau_align": "lace.concepts.labelling",
    "directions_from_captions": "lace.concepts.directions",
    "directions_from_templates": "lace.concepts.directions",
    "label_atoms": "lace.concepts.labelling",
    "load_bindings": "lace.concepts.bindings",
    "load_vocabulary": "lace.concepts.vocabulary",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
