"""The concept dictionary of the base model: fitted on train embeddings, labelled with
caption-mean concept directions, and checked against shuffled directions."""

from __future__ import annotations

from pathlib import Path

import torch

from lace.concepts.labelled import (
    LabelledDictionary,
    concept_directions_for_store,
    save_labelled_dictionary,
)
from lace.eval.edit_retrieval import caption_concepts
from lace.experiment.dictionary import DictionaryConfig, fit_labelled_dictionary
from lace.study.features import SplitFeatures

# Concepts worth showing first when they own a good atom: scenes and animals photographed often.
PREFERRED_CONCEPTS = ("dog", "grass", "snow", "beach", "water", "horse", "man", "woman", "child", "bicycle",
                      "ball", "mountain", "rock", "street", "pool", "red", "blue")


def fit_dictionary(
    train_images: torch.Tensor, train_texts: torch.Tensor, train: SplitFeatures, config: DictionaryConfig,
    folder: Path, progress: bool = False, log=print,
) -> LabelledDictionary:
    """Fit `config`'s dictionary on (N_img, d) and (N_txt, d) base train embeddings, labelled with caption-mean
    directions of the train captions (concepts that `config.min_mentions` captions name); save it to `folder`."""
    directions = concept_directions_for_store(config.vocabulary, train.captions, train_texts, None,
                                              config.min_mentions, log)
    labelled = fit_labelled_dictionary(train_images, train_texts, directions, config, progress=progress, log=log)
    save_labelled_dictionary(labelled, folder)
    return labelled


def best_atom_cosines(atoms: torch.Tensor, directions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of C unit directions (C, d): its best atom among (K, d) and their cosine, (C,) each."""
    unit_atoms = atoms / atoms.norm(dim=1, keepdim=True).clamp_min(1e-12)
    cosine = directions @ unit_atoms.T  # (C, K)
    best, atom = cosine.max(dim=1)
    return atom, best


def shuffled_directions(directions: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Each direction's coordinates permuted at random (same norm and value spread, no meaning)."""
    generator = torch.Generator().manual_seed(seed)
    rows = [row[torch.randperm(row.shape[0], generator=generator)] for row in directions]
    return torch.stack(rows)


def alignment_figures(labelled: LabelledDictionary, n_shuffles: int = 5) -> dict:
    """Per concept: best atom and cosine, against the mean best cosine of shuffled directions."""
    atoms = labelled.dictionary.atoms_.float()
    directions = labelled.directions.directions.float()
    atom, best = best_atom_cosines(atoms, directions)
    shuffled = torch.stack([best_atom_cosines(atoms, shuffled_directions(directions, seed))[1]
                            for seed in range(n_shuffles)]).mean(0)
    labelling = labelled.labelling
    aligned = labelling.aligned()
    return {
        "quality": labelled.dictionary.quality_,
        "tau_align": labelling.tau_align,
        "aligned_atoms": int(aligned.sum()),
        "n_atoms": int(atoms.shape[0]),
        "concepts_owning_aligned_atoms": len(set(labelling.atom_concept[aligned].tolist())),
        "n_concepts": len(labelled.directions),
        "atom_labels": [labelled.directions.names[int(c)] for c in labelling.atom_concept],
        "mean_best_cosine": float(best.mean()),
        "mean_best_cosine_shuffled": float(shuffled.mean()),
        "share_best_at_least_0.5": float((best >= 0.5).float().mean()),
        "share_best_at_least_0.5_shuffled": float((shuffled >= 0.5).float().mean()),
        "concepts": [
            {"concept": name, "kind": labelled.directions.kinds[c], "mentions": (labelled.directions.counts or [None] * len(directions))[c],
             "best_atom": int(atom[c]), "best_cosine": float(best[c]), "shuffled_best_cosine": float(shuffled[c])}
            for c, name in enumerate(labelled.directions.names)
        ],
    }


def top_examples(
    labelled: LabelledDictionary, test_images: torch.Tensor, test_texts: torch.Tensor, test: SplitFeatures,
    rules, alignment: dict, n_concepts: int, n_images: int = 6, n_captions: int = 3,
) -> list[dict]:
    """For the best-aligned concepts (preferred ones first): the test images and captions
    that use their best atom most, and how many of those images' captions name the concept."""
    concepts = {entry["concept"]: entry for entry in alignment["concepts"]}
    ranked = sorted(concepts.values(), key=lambda e: -e["best_cosine"])
    chosen = [concepts[name] for name in PREFERRED_CONCEPTS if name in concepts and concepts[name]["best_cosine"] >= 0.3]
    chosen += [e for e in ranked if e not in chosen and e["kind"] == "object"]
    chosen = chosen[:n_concepts]
    image_codes = labelled.dictionary.transform(test_images, "image", dense=True)  # (N_img, K)
    text_codes = labelled.dictionary.transform(test_texts, "text", dense=True)  # (N_txt, K)
    mentions, names = caption_concepts(test.captions_per_image, rules)
    column = {name: i for i, name in enumerate(names)}
    examples = []
    for entry in chosen:
        k = entry["best_atom"]
        image_rows = torch.argsort(image_codes[:, k], descending=True)[:n_images]
        image_rows = image_rows[image_codes[image_rows, k] > 0]
        caption_rows = torch.argsort(text_codes[:, k], descending=True)[:n_captions]
        caption_rows = caption_rows[text_codes[caption_rows, k] > 0]
        named = None
        if entry["concept"] in column and len(image_rows):
            named = float(mentions[image_rows, column[entry["concept"]]].float().mean())
        base_rate = float(mentions[:, column[entry["concept"]]].float().mean()) if entry["concept"] in column else None
        examples.append({
            **entry,
            "image_paths": [test.image_paths[int(i)] for i in image_rows],
            "captions": [test.captions[int(i)] for i in caption_rows],
            "top_images_naming_concept": named,
            "test_images_naming_concept": base_rate,
        })
    return examples

