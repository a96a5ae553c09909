"""Atom labels, alignment, concept weights and which concepts an embedding lets us edit.

- Label of atom k: c*(k) = argmax_c cos(D_k, e_c); alignment alpha_k is that cosine.
- Atom k is aligned when alpha_k >= tau_align. A concept owns its aligned atoms only:
  an atom below tau_align is no better matched to its label than to a random
  direction, so it is never edited as if it meant that concept.
- Concept weight in an embedding: the sum of its owned atoms' codes a_k.
- A concept is strongly used when its weight >= tau_use x the embedding's largest
  concept weight; editable = strongly used (it owns an aligned atom by construction).

Default thresholds, and how they were chosen:
- tau_align: measured per dictionary by `calibrate_tau_align`: the 95th percentile,
  over atoms, of the best cosine an atom reaches with as many random directions as
  there are concepts, the random directions drawn from the data's covariance
  (random combinations of centred embeddings). An atom above it is matched better
  than 95% of atoms are matched by chance. Without data, `DEFAULT_TAU_ALIGN` = 0.3,
  the cut used in the shapes-world study (127 of 128 atoms passed it); on real
  photos random covariance-shaped directions already reach a mean best cosine of
  0.51 (K = 512), so 0.3 is only a floor: calibrate whenever embeddings are at hand.
- tau_use: `DEFAULT_TAU_USE` = 0.25 is a starting value, not yet a measured optimum:
  it drops concepts carrying under a quarter of the strongest concept's weight, whose
  edits move c_hat least. `usage_profile` measures, per candidate threshold, the share
  of embeddings with one and with two editable concepts (swaps need two); run it on
  the pool at hand before changing the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

from lace.concepts.directions import ConceptDirections
from lace.concepts.thresholds import DEFAULT_TAU_ALIGN, DEFAULT_TAU_USE
from lace.dictionary.concept_dictionary import ConceptDictionary
from lace.dictionary.streaming import Rows, RowSource
from lace.errors import LaceInputError
from lace.io import atomic_path, atomic_write_json, read_json, read_safetensors
from lace.manifest import add_to_manifest, verify


@dataclass
class AtomLabelling:
    """Labels of the K atoms against C concept directions.

    atom_concept: (K,) long, c*(k).
    atom_alignment: (K,) float, alpha_k = cos(D_k, e_{c*(k)}).
    atom_typical_code: (K,) float, mean a_k over embeddings whose concept c*(k) is in
        use (weight > 0); gives each concept's typical pattern over its atoms.
    tau_align: the alignment threshold measured (or defaulted) for this dictionary.
    """

    atom_concept: Tensor
    atom_alignment: Tensor
    atom_typical_code: Tensor
    tau_align: float = DEFAULT_TAU_ALIGN

    def aligned(self, tau_align: float | None = None) -> Tensor:
        """(K,) bool: atoms with alpha_k >= tau_align."""
        return self.atom_alignment >= (self.tau_align if tau_align is None else tau_align)

    def ownership(self, n_concepts: int, tau_align: float | None = None) -> Tensor:
        """(K, C) float one-hot: entry (k, c) is 1 when aligned atom k is labelled c."""
        owned = torch.zeros(self.atom_concept.shape[0], n_concepts)
        owned[torch.arange(self.atom_concept.shape[0]), self.atom_concept] = 1.0
        return owned * self.aligned(tau_align).unsqueeze(1)

    def patterns(self, n_concepts: int, tau_align: float | None = None) -> Tensor:
        """(K,) float: each owned atom's share of its concept's typical code (sums to 1 per
        concept over its owned atoms; uniform where a concept was never seen in use)."""
        owned = self.ownership(n_concepts, tau_align)  # (K, C)
        typical = self.atom_typical_code.clamp_min(0) * owned.sum(1)
        totals = typical @ owned  # (C,)
        sizes = owned.sum(0)  # (C,)
        per_atom_total = owned @ totals
        per_atom_size = owned @ sizes
        uniform = torch.where(per_atom_size > 0, 1.0 / per_atom_size.clamp_min(1), torch.zeros_like(per_atom_size))
        return torch.where(per_atom_total > 0, typical / per_atom_total.clamp_min(1e-12), uniform)

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        with atomic_path(directory / "labelling.safetensors") as tmp:
            save_file(
                {
                    "atom_concept": self.atom_concept.contiguous(),
                    "atom_alignment": self.atom_alignment.contiguous(),
                    "atom_typical_code": self.atom_typical_code.contiguous(),
                },
                str(tmp),
            )
        atomic_write_json(directory / "labelling.json", {"tau_align": self.tau_align})
        add_to_manifest(directory, ("labelling.json", "labelling.safetensors"))

    @classmethod
    def load(cls, directory: str | Path) -> AtomLabelling:
        directory = Path(directory)
        verify(directory, ("labelling.json", "labelling.safetensors"))
        meta = read_json(directory / "labelling.json", dict)
        tensors = read_safetensors(directory / "labelling.safetensors")
        try:
            tau_align = float(meta["tau_align"])
        except (KeyError, TypeError, ValueError) as error:
            raise LaceInputError(f"{directory / 'labelling.json'}: field 'tau_align': expected a number") from error
        try:
            return cls(tensors["atom_concept"], tensors["atom_alignment"], tensors["atom_typical_code"], tau_align)
        except KeyError as error:
            raise LaceInputError(f"{directory / 'labelling.safetensors'}: tensor {error} missing") from error


def concept_weights(codes: Tensor, ownership: Tensor) -> Tensor:
    """(N, C) concept weights from dense codes (N, K) and ownership (K, C)."""
    return codes @ ownership.to(codes.dtype)


def editable_concepts(weights: Tensor, tau_use: float = DEFAULT_TAU_USE) -> Tensor:
    """(N, C) bool: weight > 0 and >= tau_use x the row's largest concept weight."""
    largest = weights.max(dim=1, keepdim=True).values
    return (weights > 0) & (weights >= tau_use * largest)


def best_alignment(atoms: Tensor, directions: Tensor) -> tuple[Tensor, Tensor]:
    """For atoms (K, d) and unit directions (C, d): best concept (K,) long and its cosine (K,)."""
    cosine = F.normalize(atoms, dim=1) @ directions.T  # (K, C)
    alignment, concept = cosine.max(dim=1)
    return concept, alignment


def calibrate_tau_align(
    atoms: Tensor,
    centred_directions: Tensor,
    n_concepts: int,
    quantile: float = 0.95,
    n_trials: int = 5,
    seed: int = 0,
    max_rows: int = 5000,
) -> float:
    """tau_align = `quantile` of the best cosine atoms reach with `n_concepts` random directions.

    atoms: (K, d); centred_directions: (N, d) centred, normalised embeddings whose
    covariance shapes the random directions (each a Gaussian combination of the rows,
    at most `max_rows` of them). Pooled over `n_trials` draws.
    """
    generator = torch.Generator().manual_seed(seed)
    data = centred_directions.float().cpu()
    if data.shape[0] > max_rows:  # the covariance is well estimated from a few thousand rows
        data = data[torch.randperm(data.shape[0], generator=generator)[:max_rows]]
    data = data - data.mean(0)
    best = []
    for _ in range(n_trials):
        weights = torch.randn(n_concepts, data.shape[0], generator=generator) / data.shape[0] ** 0.5
        random_directions = F.normalize(weights @ data, dim=1)  # (C, d), covariance proportional to the data's
        best.append(best_alignment(atoms.float().cpu(), random_directions)[1])
    return float(torch.quantile(torch.cat(best), quantile))


def label_atoms(
    dictionary: ConceptDictionary,
    directions: ConceptDirections,
    image_embeddings: RowSource | None = None,
    text_embeddings: RowSource | None = None,
    tau_align: float | None = None,
    max_rows: int = 50000,
    seed: int = 0,
) -> AtomLabelling:
    """Label every atom with its best concept; measure tau_align and typical codes on data.

    With embeddings given (up to `max_rows` per modality, evenly spaced rows), tau_align
    is calibrated unless passed in, and each atom's typical code is measured. Without
    them tau_align falls back to `DEFAULT_TAU_ALIGN` and typical codes are uniform.
    """
    atoms = dictionary.atoms_.float()
    unit_directions = directions.directions.float()
    if unit_directions.shape[1] != atoms.shape[1]:
        raise LaceInputError(
            f"concept directions: expected dimension {atoms.shape[1]} (the dictionary's), got {unit_directions.shape[1]}"
        )
    concept, alignment = best_alignment(atoms, unit_directions)
    samples = []
    for modality, source in (("image", image_embeddings), ("text", text_embeddings)):
        if source is None:
            continue
        rows = Rows(source, f"{modality}_embeddings")
        picked = torch.linspace(0, rows.n_rows - 1, min(max_rows, rows.n_rows)).long().unique().numpy()
        block = rows.take(picked)
        samples.append((modality, dictionary.centre(block, modality)[0]))
    if tau_align is None:
        tau_align = (
            calibrate_tau_align(atoms, torch.cat([s for _, s in samples]), len(directions), seed=seed)
            if samples
            else DEFAULT_TAU_ALIGN
        )
    labelling = AtomLabelling(concept, alignment, torch.ones(atoms.shape[0]), float(tau_align))
    if samples:
        labelling.atom_typical_code = typical_codes(dictionary, labelling, len(directions), [s for _, s in samples])
    return labelling


def typical_codes(
    dictionary: ConceptDictionary, labelling: AtomLabelling, n_concepts: int, centred_samples: list[Tensor],
    chunk_size: int = 4096,
) -> Tensor:
    """(K,) mean a_k over embeddings where atom k's label concept has weight > 0 (all atoms
    with that label count here, aligned or not, so a later tau_align still finds values)."""
    labels = torch.zeros(labelling.atom_concept.shape[0], n_concepts)
    labels[torch.arange(labels.shape[0]), labelling.atom_concept] = 1.0
    sums = torch.zeros(labels.shape[0])
    uses = torch.zeros(labels.shape[0])
    for directions in centred_samples:
        for start in range(0, directions.shape[0], chunk_size):
            codes = dictionary.code_directions(directions[start : start + chunk_size], dense=True).cpu()  # (n, K)
            in_use = (codes @ labels > 0).float()  # (n, C)
            atom_in_use = in_use @ labels.T  # (n, K): 1 where the atom's concept is in use
            sums += (codes * atom_in_use).sum(0)
            uses += atom_in_use.sum(0)
    return torch.where(uses > 0, sums / uses.clamp_min(1), torch.zeros_like(sums))


def usage_profile(
    weights: Tensor, thresholds: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75)
) -> dict[float, dict[str, float]]:
    """For concept weights (N, C): per tau_use, share of rows with >= 1 and >= 2 editable
    concepts and the mean number; the measurement behind `DEFAULT_TAU_USE`."""
    profile = {}
    for threshold in thresholds:
        count = editable_concepts(weights, threshold).sum(1).float()
        profile[threshold] = {
            "share_one_or_more": float((count >= 1).float().mean()),
            "share_two_or_more": float((count >= 2).float().mean()),
            "mean_editable": float(count.mean()),
        }
    return profile
