"""One way to fit a labelled concept dictionary: fit, quality, tau_align calibration, labels, bindings.

`lace dict fit`, the demo and the study all call `fit_labelled_dictionary`; they differ only
by their `DictionaryConfig` (the calibration among them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lace.concepts.directions import ConceptDirections
from lace.concepts.labelled import LabelledDictionary, binding_directions_for_store
from lace.concepts.labelling import calibrate_tau_align, label_atoms
from lace.dictionary.concept_dictionary import ConceptDictionary
from lace.experiment.dictionary_config import CALIBRATIONS, DictionaryConfig  # noqa: F401  (its home before)

ISOTROPIC_SAMPLES = 5000


def calibrated_tau_align(dictionary: ConceptDictionary, directions: ConceptDirections, image_embeddings,
                         text_embeddings, calibration: str, seed: int) -> float:
    """tau_align of `dictionary` under one of `CALIBRATIONS` (embeddings (N, d) per modality)."""
    if calibration == "isotropic":
        dim = dictionary.atoms_.shape[1]
        isotropic = torch.randn(ISOTROPIC_SAMPLES, dim, generator=torch.Generator().manual_seed(seed))
        return calibrate_tau_align(dictionary.atoms_, isotropic, len(directions), seed=seed)
    return label_atoms(dictionary, directions, image_embeddings, text_embeddings, seed=seed).tau_align


def fit_labelled_dictionary(
    image_embeddings,
    text_embeddings,
    directions: ConceptDirections,
    config: DictionaryConfig,
    captions: list[str] | None = None,
    device: str = "cpu",
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> LabelledDictionary:
    """Fit the dictionary on (N_img, d) and (N_txt, d) embeddings, measure its quality, label its
    atoms against `directions` at a calibrated (or given) tau_align and, with `config.bindings` and
    the texts' `captions`, derive binding directions."""
    config.validate()
    dictionary = ConceptDictionary(
        n_atoms=config.atoms, sparsity=config.sparsity, mode=config.mode,
        directions=directions if config.mode == "vocabulary" else None, method=config.method,
        batch_size=config.batch_size, n_epochs=config.epochs, max_seconds=config.max_seconds,
        random_state=config.seed, device=device, progress=progress,
    )
    dictionary.fit(image_embeddings, text_embeddings)
    dictionary.quality(image_embeddings, text_embeddings)
    tau_align = config.tau_align
    if tau_align is None and config.calibration != "covariance":
        tau_align = calibrated_tau_align(dictionary, directions, image_embeddings, text_embeddings,
                                         config.calibration, config.seed)
    labelling = label_atoms(dictionary, directions, image_embeddings, text_embeddings, tau_align, seed=config.seed)
    bindings = None
    if config.bindings and captions is not None:
        bindings = binding_directions_for_store(config.vocabulary, captions, text_embeddings, config.min_mentions, log)
    return LabelledDictionary(dictionary, directions, labelling, bindings)
