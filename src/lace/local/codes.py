"""Sparse codes of per-position features at a layer L, atoms labelled by the concepts captions mention.

The coder is the project's dictionary estimator (online dictionary learning with batch OMP,
`lace.dictionary.learning`), run on the position rows of a tower's features at L, centred by
their mean but not normalised: at L a position's norm says how much is there, which is what
finds objects.

Atoms are labelled without new annotations: each atom is pushed through the position reader
(`lace.local.reader`, itself fitted only to which concepts the paired captions mention), and the
label is kept when the atom's activation tracks that concept's mentions over training images.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from lace.dictionary import learning
from lace.dictionary.sparse_coding import encode


class LocalConceptCodes:
    """Sparse coder of position features (N, C) with concept-labelled atoms.

    Parameters
    ----------
    n_atoms: K atoms.
    sparsity: s, the most non-zero codes per position.
    n_epochs: passes over the rows while learning.
    batch_size: rows per learning mini-batch.
    min_alignment: least correlation between an atom's per-image activation and its concept's
        mentions for the atom to carry the label.
    random_state: seed of the initial atoms and the batch order.

    Learned state: `mean_` (C,), `atoms_` (K, C) unit rows, after `label`: `concept_names_`
    (n_concepts names), `atom_concept_` (K,) long (-1: unlabelled), `atom_alignment_` (K,), `alignment_` (K, n_concepts)
    every atom's correlation with every concept's mentions.
    """

    def __init__(self, n_atoms: int = 64, sparsity: int = 4, n_epochs: int = 3, batch_size: int = 4096,
                 min_alignment: float = 0.2, random_state: int = 0):
        self.n_atoms = n_atoms
        self.sparsity = sparsity
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.min_alignment = min_alignment
        self.random_state = random_state

    def fit(self, rows: Tensor) -> LocalConceptCodes:
        """Learn atoms from position rows (N, C)."""
        if rows.ndim != 2 or rows.shape[0] < self.n_atoms:
            raise ValueError(f"rows: expected (N, C) with N >= n_atoms={self.n_atoms}, got {tuple(rows.shape)}")
        if not 1 <= self.sparsity <= self.n_atoms:
            raise ValueError(f"sparsity: expected 1..{self.n_atoms}, got {self.sparsity}")
        rows = rows.detach().float()
        self.mean_ = rows.mean(0)
        centred = rows - self.mean_
        generator = np.random.default_rng(self.random_state)
        initial = centred[torch.from_numpy(generator.choice(len(centred), self.n_atoms, replace=False))]
        state = learning.init_state(initial)
        n_batches = max(1, len(centred) // self.batch_size)

        def batches():
            for _ in range(self.n_epochs):
                order = torch.from_numpy(generator.permutation(len(centred)))
                for b in range(n_batches):
                    yield centred[order[b * self.batch_size : (b + 1) * self.batch_size]]

        learning.learn(state, batches(), self.sparsity)
        self.atoms_ = state.atoms
        return self

    def transform(self, features: Tensor) -> Tensor:
        """Dense non-negative codes (..., K) of features (..., C); no gradient."""
        shape = features.shape
        rows = features.detach().reshape(-1, shape[-1]).float() - self.mean_.to(features.device)
        codes = encode(rows, self.atoms_.to(features.device), self.sparsity, dense=True)
        return codes.reshape(*shape[:-1], self.n_atoms)

    def fvu(self, features: Tensor) -> float:
        """Fraction of the variance of position rows (..., C) the codes leave unexplained."""
        rows = features.detach().reshape(-1, features.shape[-1]).float() - self.mean_
        rebuilt = self.transform(features).reshape(-1, self.n_atoms) @ self.atoms_
        return float(((rows - rebuilt) ** 2).sum() / ((rows - rows.mean(0)) ** 2).sum())

    def label(self, reader, codes: Tensor, mentions: Tensor, concept_names: list[str]) -> LocalConceptCodes:
        """Label atoms by pushing each one through the position reader of a concept group.

        reader: a fitted `PositionConceptReader` for the G concepts `concept_names`; codes (N_img, P, K)
        of training images; mentions (N_img, G) bool, the concepts their captions name.
        Atom k, at its typical (median non-zero) coefficient on top of the mean feature, is read by the
        reader; it is labelled with the concept the reader finds most likely there. Its alignment is the
        correlation, over training images, between its largest activation in the image and the mention
        of that concept; atoms under `min_alignment` stay unlabelled.
        """
        codes = codes.detach().float()
        typical = torch.stack([values[values > 0].median() if (values > 0).any() else values.new_zeros(())
                               for values in codes.reshape(-1, self.n_atoms).T])  # (K,)
        read = reader.probabilities(self.mean_ + typical[:, None] * self.atoms_)  # (K, 1 + G)
        concept = read[:, 1:].argmax(dim=1)
        activation = codes.amax(dim=1).double()
        activation = (activation - activation.mean(0)) / activation.std(0).clamp_min(1e-12)
        targets = mentions.double()
        targets = (targets - targets.mean(0)) / targets.std(0).clamp_min(1e-12)
        self.alignment_ = (activation.T @ targets / max(len(codes) - 1, 1)).float()  # (K, G)
        self.concept_names_ = list(concept_names)
        self.atom_alignment_ = self.alignment_.gather(1, concept[:, None]).squeeze(1)
        keep = self.atom_alignment_ >= self.min_alignment
        self.atom_concept_ = torch.where(keep, concept, torch.full_like(concept, -1))
        return self

    def summary(self) -> dict:
        """Per concept: atoms labelled with it and their best alignment; share of atoms labelled."""
        per_concept = {}
        for index, name in enumerate(self.concept_names_):
            atoms = (self.atom_concept_ == index).nonzero().squeeze(1)
            per_concept[name] = {"atoms": len(atoms),
                                 "best_alignment": float(self.alignment_[:, index].max())}
        return {"labelled_share": float((self.atom_concept_ >= 0).float().mean()),
                "mean_alignment_labelled": float(self.atom_alignment_[self.atom_concept_ >= 0].mean())
                if (self.atom_concept_ >= 0).any() else None,
                "concepts": per_concept}
