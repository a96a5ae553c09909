"""A toy concept world for dictionary, concept and edit tests: known directions, known codes."""

from __future__ import annotations

import torch

from lace.concepts.directions import ConceptDirections
from lace.concepts.vocabulary import vocabulary_from_dict

TOY_VOCABULARY = {
    "name": "toy",
    "objects": ["circle", "square", "star", "heart"],
    "attributes": {"colour": ["red", "blue", "green", "yellow"], "size": ["small", "large"]},
    "relations": ["left of", "right of"],
}


def toy_vocabulary():
    return vocabulary_from_dict(TOY_VOCABULARY, where="toy")


def toy_directions(dim: int = 32, seed: int = 0) -> ConceptDirections:
    """Near-orthogonal unit directions, one per toy concept."""
    vocabulary = toy_vocabulary()
    generator = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(dim, dim, generator=generator))[0][: len(vocabulary)]
    return ConceptDirections(
        vocabulary.names, [c.kind for c in vocabulary.concepts], [c.group for c in vocabulary.concepts], basis.contiguous()
    )


def toy_embeddings(directions: ConceptDirections, n: int, modality_shift: float, seed: int = 0,
                   noise: float = 0.05, return_codes: bool = False):
    """(n, d) unit embeddings: two objects, one colour, one size with distinct weights, an offset, noise."""
    generator = torch.Generator().manual_seed(seed)
    dim = directions.directions.shape[1]
    groups = {}
    for i, group in enumerate(directions.groups):
        groups.setdefault(group, []).append(i)
    codes = torch.zeros(n, len(directions))
    for group, weights in (("object", (1.0, 0.5)), ("colour", (0.6,)), ("size", (0.3,))):
        members = torch.tensor(groups[group])
        order = torch.rand(n, len(members), generator=generator).argsort(1)
        for slot, weight in enumerate(weights):
            chosen = members[order[:, slot]]
            codes[torch.arange(n), chosen] = weight * (1 + 0.1 * torch.rand(n, generator=generator))
    offset = torch.zeros(dim)
    offset[-1] = modality_shift
    z = codes @ directions.directions + noise * torch.randn(n, dim, generator=generator) + offset
    z = z / z.norm(dim=1, keepdim=True)
    return (z, codes) if return_codes else z
