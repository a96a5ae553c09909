"""`DictionaryConfig`: how a labelled concept dictionary is fitted, apart from the fitting (`lace.experiment.dictionary`)
so that the commands' flags are read without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from lace.errors import input_error

CALIBRATIONS = ("covariance", "isotropic")


@dataclass
class DictionaryConfig:
    """How a labelled concept dictionary is fitted (`lace dict fit`, the demo, the study)."""

    atoms: int = 512
    """Number of dictionary atoms K (learned mode; vocabulary mode has one per concept)."""
    sparsity: int = 8
    """Most non-zero codes per embedding (s)."""
    mode: str = "learned"
    """'learned' (online dictionary learning) or 'vocabulary' (atoms = concept directions)."""
    vocabulary: str = "natural"
    """Typed vocabulary YAML, or the name of a shipped one ('natural')."""
    method: str = "omp"
    """Sparse coder: 'omp' (non-negative batch OMP) or 'topk'."""
    epochs: int = 1
    """Passes over the embedding pool when learning."""
    batch_size: int = 4096
    """Embeddings per learning mini-batch (both modalities together)."""
    max_seconds: float | None = None
    """Stop learning after this many seconds (none: no limit)."""
    min_mentions: int = 5
    """Captions that must mention a concept for a caption-mean direction (or state a binding)."""
    tau_align: float | None = None
    """Atom alignment threshold (none: calibrated as `calibration` says)."""
    calibration: str = "covariance"
    """How tau_align is calibrated when unset: against random directions shaped by the data's covariance
    (covariance), or against isotropic random directions (isotropic; the demo's choice: on a tiny model
    covariance-shaped directions are mixtures of the few concepts that span its space, which leaves most
    concepts without an atom)."""
    seed: int = 0
    """Seed for initial atoms, batch order and calibration."""
    bindings: bool = True
    """Also derive compound ('red square') binding directions from the captions, for the rebind edit."""

    def validate(self, where: str = "dictionary config") -> DictionaryConfig:
        if self.calibration not in CALIBRATIONS:
            raise input_error(where, "calibration", f"one of {CALIBRATIONS}", self.calibration)
        if self.atoms < 1 or self.sparsity < 1:
            raise input_error(where, "atoms / sparsity", "positive integers", (self.atoms, self.sparsity))
        return self
