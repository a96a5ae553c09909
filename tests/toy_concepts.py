"""A toy concept world for dictionary, concept and edit tests: known directions, known codes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import yaml

from lace.concepts.directions import ConceptDirections
from lace.concepts.labelling import label_atoms
from lace.concepts.vocabulary import vocabulary_from_dict
from lace.dictionary import ConceptDictionary
from lace.edits import CounterfactualEditor, EditConfig
from lace.embeddings import IMAGE_FILE, INDEX_FILE, TEXT_FILE, EmbeddingStore
from lace.io import atomic_dir, atomic_write_json
from lace.manifest import write_manifest

TOY_VOCABULARY = {
    "name": "toy",
    "objects": ["circle", "square", "star", "heart"],
    "attributes": {"colour": ["red", "blue", "green", "yellow"], "size": ["small", "large"]},
    "relations": ["left of", "right of"],
}


def write_store(path: str | Path, image_embeddings: np.ndarray, text_embeddings: np.ndarray,
                index: dict) -> EmbeddingStore:
    """Write in-memory embeddings as an embedding store (atomically), as `lace embed` lays one out."""
    with atomic_dir(path) as tmp:
        np.save(tmp / IMAGE_FILE, np.ascontiguousarray(image_embeddings, dtype=np.float32))
        np.save(tmp / TEXT_FILE, np.ascontiguousarray(text_embeddings, dtype=np.float32))
        atomic_write_json(tmp / INDEX_FILE, index)
        write_manifest(tmp, (IMAGE_FILE, TEXT_FILE, INDEX_FILE))
    return EmbeddingStore.open(path)


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


def toy_fitted(n: int):
    """(directions, dictionary, labelling, images, texts): a vocabulary-mode dictionary (sparsity 4) fitted on
    n toy image and n toy caption embeddings (seeds 1 and 2), and its atom labels."""
    directions = toy_directions()
    images = toy_embeddings(directions, n, 2.0, seed=1)
    texts = toy_embeddings(directions, n, -2.0, seed=2)
    dictionary = ConceptDictionary(mode="vocabulary", directions=directions, sparsity=4).fit(images, texts)
    return directions, dictionary, label_atoms(dictionary, directions, images, texts), images, texts


def toy_editor(n: int):
    """(dictionary, editor, images, texts): `toy_fitted`'s dictionary behind a default `CounterfactualEditor`."""
    directions, dictionary, labelling, images, texts = toy_fitted(n)
    return dictionary, CounterfactualEditor(dictionary, labelling, directions, EditConfig()), images, texts


def write_toy_store(folder: Path, n_images: int) -> torch.Tensor:
    """Write an embedding store of n_images toy images and 2 n_images captions naming their concepts
    (`folder/store`) and the toy vocabulary (`folder/vocabulary.yaml`); return the images' (n_images, C) codes."""
    directions = toy_directions()
    images, image_codes = toy_embeddings(directions, n_images, 2.0, seed=1, return_codes=True)
    texts, text_codes = toy_embeddings(directions, 2 * n_images, -2.0, seed=2, return_codes=True)
    captions = [" and ".join(n for n, w in zip(directions.names, row) if w > 0) for row in text_codes]
    write_store(folder / "store", images.numpy(), texts.numpy(), {
        "image_ids": list(range(n_images)), "text_ids": list(range(2 * n_images)), "captions": captions,
        "text_image_index": [i % n_images for i in range(2 * n_images)], "model": "toy", "data": "toy",
    })
    (folder / "vocabulary.yaml").write_text(yaml.safe_dump(TOY_VOCABULARY))
    return image_codes
