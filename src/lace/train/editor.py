"""The counterfactual editor of a run: built from a dictionary folder, refitted on recent embeddings.

Concept directions are computed once, at the start, from the encoder being trained
(or read from the dictionary folder when it holds them); a refresh refits the dictionary
and relabels its atoms against those same directions and threshold, so that a refit from the same
embeddings always gives the same editor (which makes resumption exact).
"""

from __future__ import annotations

from pathlib import Path

import torch

from lace.concepts.bindings import load_bindings
from lace.concepts.directions import ConceptDirections, directions_from_templates
from lace.concepts.labelled import LabelledDictionary
from lace.concepts.labelling import AtomLabelling, label_atoms
from lace.concepts.vocabulary import load_vocabulary
from lace.dictionary.concept_dictionary import ConceptDictionary
from lace.edits import CounterfactualEditor, build_editor
from lace.encoders import DualEncoder
from lace.errors import LaceInputError
from lace.train.config import TrainConfig


def run_editor(config: TrainConfig, encoder: DualEncoder) -> CounterfactualEditor:
    """Editor from `config.run.dictionary` (a `ConceptDictionary` folder) and `config.run.vocabulary`.

    The dictionary's dimension is checked against the encoder before anything else.
    """
    if config.run.dictionary is None:
        raise LaceInputError(
            "train config: field 'dictionary': expected a fitted dictionary folder when counterfactual_captions "
            "or counterfactual_images is on (`lace dict fit` writes one)"
        )
    folder = Path(config.run.dictionary)
    dictionary = ConceptDictionary.load(folder)
    if dictionary.atoms_.shape[1] != encoder.embed_dim:
        raise LaceInputError(
            f"{folder}: dictionary atoms have dimension {dictionary.atoms_.shape[1]}, but {config.run.model} embeds in "
            f"dimension {encoder.embed_dim}; fit the dictionary on embeddings of this model"
        )
    if (folder / "concept_directions.safetensors").is_file():
        directions = ConceptDirections.load(folder)
    else:
        if config.run.vocabulary is None:
            raise LaceInputError(
                f"train config: field 'vocabulary': expected a vocabulary ({folder} holds no concept directions)"
            )
        with torch.no_grad():
            directions = directions_from_templates(
                load_vocabulary(config.run.vocabulary), lambda texts: encoder.encode_texts(texts).cpu(),
                dictionary.mean_text_)
    if (folder / "labelling.safetensors").is_file():
        labelling = AtomLabelling.load(folder)
    else:
        labelling = label_atoms(dictionary, directions)
    # compound directions, when the folder has them, let the editor rebind
    return build_editor(LabelledDictionary(dictionary, directions, labelling, load_bindings(folder)), config.negatives.edit)


def refresh_editor(editor: CounterfactualEditor, image_embeddings: torch.Tensor,
                   text_embeddings: torch.Tensor) -> CounterfactualEditor:
    """A new editor whose dictionary is refitted on (N, d) recent image and text embeddings.

    Same dictionary parameters, concept directions, bindings, alignment threshold and `EditConfig`.
    """
    old = editor.dictionary
    extra = {"directions": editor.directions} if old.mode == "vocabulary" else {}
    dictionary = ConceptDictionary(**old.get_params(), **extra)
    images, texts = image_embeddings.detach().float().cpu(), text_embeddings.detach().float().cpu()
    dictionary.fit(images, texts)
    # the alignment threshold is the replaced editor's, however it was calibrated: a refit changes the
    # atoms, not what counts as aligned
    labelling = label_atoms(dictionary, editor.directions, images, texts, tau_align=editor.tau_align)
    return build_editor(LabelledDictionary(dictionary, editor.directions, labelling, editor.bindings), editor.config)
