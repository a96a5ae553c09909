"""`ArmConfig`: which negatives a training arm makes and how its edits enter the loss; a row of
`lace.experiment.variants.VARIANTS` sets these fields (and nothing else but an editor knob)."""

from __future__ import annotations

from dataclasses import dataclass

from lace.errors import input_error

COUNTERFACTUAL_SOURCES = ("dictionary", "concept_arithmetic")


@dataclass
class ArmConfig:
    """The arm's switches: every kind of negative it makes, and the layout of its image-side edits."""

    counterfactual_captions: bool = False
    """LACE: M edits of each caption embedding are extra negatives of its image's image->text row."""
    counterfactual_images: bool = False
    """LACE: M edits of each image embedding are extra negatives of its caption's text->image row."""
    counterfactual_source: str = "dictionary"
    """How counterfactuals are made: dictionary (sparse-code edits) or concept_arithmetic (ablation)."""
    caption_negatives: bool = False
    """Text-only baseline: rule-made captions (NegCLIP style), encoded as text, are image->text negatives."""
    paired_caption_directions: bool = False
    """AHNPL-style baseline: each rule-made caption t' of caption t gives the image-side negative
    normalise(u + v(t') - v(t)) of the text->image row (rule_negative_kinds, rule_negatives_per_caption)."""
    local_image_negatives: bool = False
    """LACE-local: binding swaps and transplants made inside the image tower at local_layer (lace.local)
    are text->image negatives; the editor is fitted on the training images before the first step (and again every
    local_refresh_every steps). The
    edited maps run through the upper layers in the images' own pass, with BatchNorm statistics from the
    real images alone (lace.local.batch_norm)."""
    local_caption_swaps: bool = False
    """LACE-local, caption side: two concept words' token states swapped at local_text_layer are
    image->text negatives."""
    rendered_negatives: bool = False
    """Ceiling (shapes world only): each training scene re-rendered with two objects' colours swapped,
    encoded by the image tower, is a text->image negative."""
    sources: tuple[str, ...] = ()
    """Further negative sources switched on by their name in `lace.train.sources.SOURCES` (a source without a
    switch of its own here: one module and one `lace.experiment.variants.VARIANTS` entry)."""
    edited_image_rows: bool = False
    """Pairs layout (TripletCLIP's): every image-side edit the arm makes (LACE's image edits, concept arithmetic,
    paired-caption directions, LACE-local, the rendered ceiling) is also a row of its own, whose positive is the
    caption its edit describes (the real caption rewritten by the rule editor from the changed concepts) and whose
    hard negative is the real caption; edits whose caption cannot be written are skipped."""
    edited_image_columns: bool = True
    """Each image-side edit is a text->image negative of its real caption (today's layout); off with
    edited_image_rows gives the pairs layout alone."""
    edited_rows_real_image_negative: bool = False
    """The described caption of each edited row also takes the real image as a hard negative (its text->image row
    gets one more column), so it is taught to prefer the edit over the image the edit was made from."""
    edited_rows_train_text: bool = True
    """The edited rows' term also trains the text tower. Off, the described and the real captions enter it as
    constants (the described captions are encoded without gradient): only the image side learns from the edits,
    so an edit that stays close to its image cannot pull the text of its swap toward the real image."""

    @property
    def uses_counterfactuals(self) -> bool:
        return self.counterfactual_captions or self.counterfactual_images

    @property
    def uses_image_edits(self) -> bool:
        """Whether the arm makes image-side edits (columns of the real caption, rows of their own, or both)."""
        return (self.counterfactual_images or self.paired_caption_directions or self.local_image_negatives
                or self.rendered_negatives)

    @property
    def uses_rule_captions(self) -> bool:
        """Whether rule-made captions are encoded each step (as negatives or as paired directions)."""
        return self.caption_negatives or self.paired_caption_directions

    def validate(self, where: str = "train config") -> ArmConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        if self.counterfactual_source not in COUNTERFACTUAL_SOURCES:
            raise input_error(where, "counterfactual_source", f"one of {COUNTERFACTUAL_SOURCES}",
                              self.counterfactual_source)
        if not (self.edited_image_columns or self.edited_image_rows):
            raise input_error(where, "edited_image_columns", "on unless edited_image_rows is on (the arm's image "
                              "edits would be made and not used)", self.edited_image_columns)
        if self.edited_image_rows and not self.uses_image_edits:
            raise input_error(where, "edited_image_rows", "an arm with image-side edits (counterfactual_images, "
                              "paired_caption_directions, local_image_negatives or rendered_negatives)", True)
        return self
