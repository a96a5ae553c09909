"""LACE: Latent Alignment via Counterfactual Embeddings.

Fine-tunes CLIP-style dual encoders with counterfactual hard negatives made in
embedding space, for both modalities, and measures the geometry of the shared space.

The front door, for adding LACE negatives to your own open_clip training loop
(README, "Use LACE in your own training loop"):

    labelled = lace.load_labelled_dictionary("dict/")     # a folder written by `lace dict fit`
    config = lace.EditConfig(n_edits=2)
    editor = lace.build_editor(labelled, config)
    negatives = lace.counterfactual_negatives(editor, U, V, config.n_edits)
    loss = lace.lace_loss(U, V, scale, negatives.caption_negatives, negatives.caption_valid,
                          negatives.image_negatives, negatives.image_valid)

Names resolve on first use (PEP 562), so `import lace` itself imports neither torch nor open_clip.
"""

from __future__ import annotations

from lace.lazy import lazy_exports

__version__ = "0.1.0"

# name -> the module that defines it; the one place each name lives
_EXPORTS = {
    # models: lace's tiny open_clip configs (`open_clip.add_model_config(lace.MODEL_CONFIG_DIR)`) and any model
    # as a DualEncoder (unit vectors, always)
    "MODEL_CONFIG_DIR": "lace.encoders.open_clip_encoder",
    "load_encoder": "lace.encoders.registry",
    # a fitted, labelled concept dictionary and its vocabulary
    "LabelledDictionary": "lace.concepts.labelled",
    "load_labelled_dictionary": "lace.concepts.labelled",
    "load_vocabulary": "lace.concepts.vocabulary",
    "DictionaryConfig": "lace.experiment.dictionary",
    "fit_labelled_dictionary": "lace.experiment.dictionary",
    # editors: pooled embeddings (dictionary codes), rule-made captions, inside the image tower
    "EditConfig": "lace.edits.config",
    "build_editor": "lace.edits.build",
    "CounterfactualEditor": "lace.edits.editor",
    "RuleNegatives": "lace.edits.captions",
    "LocalEditConfig": "lace.local.config",
    "build_local_editor": "lace.local.build",
    "LocalImageEditor": "lace.local.editor",
    # a batch's negatives and the losses
    "Negatives": "lace.train.negatives",
    "counterfactual_negatives": "lace.train.negatives",
    "lace_loss": "lace.losses",
    "clip_loss": "lace.losses",
}

__all__ = ["__version__"] + list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
