"""`DemoConfig`: every knob of `lace demo`, one docstring each (they become the CLI help)."""

from __future__ import annotations

from dataclasses import dataclass

VARIANTS = {
    # name: (counterfactual_captions, counterfactual_images, caption_negatives)
    "plain": (False, False, False),
    "caption negatives": (False, False, True),
    "LACE": (True, True, False),
    "LACE + caption negatives": (True, True, True),
    "LACE captions only": (True, False, False),
    "LACE images only": (False, True, False),
}
CORE_VARIANTS = ("plain", "caption negatives", "LACE", "LACE + caption negatives")
ONE_SIDED_VARIANTS = ("LACE captions only", "LACE images only")

# CLIP ViT-B/32 on SugarCrepe (Hsieh et al., 2023, table 2): the failure the base should match.
CLIP_SUGARCREPE = {
    "swap_attribute": 0.64,
    "swap_object": 0.61,
    "replace_attribute": 0.80,
    "replace_relation": 0.69,
}
CALIBRATION_TOLERANCE = 0.10


@dataclass
class DemoConfig:
    """The whole LACE story on the shapes world, sized for a 2-core CPU."""

    seed: int = 0
    """Seed of the world, the base model and the first fine-tuning seed."""
    seeds: int = 1
    """Fine-tuning seeds per variant; tables report mean ± std when more than one."""
    full: bool = False
    """Also run the two one-sided LACE ablations (captions only, images only)."""
    world_images: int = 8000
    """Images in the world over all splits (80% train, 10% val, 5% test, 5% compositional test)."""
    image_size: int = 32
    """Canvas side in pixels."""
    model: str = "lace-micro-32"
    """lace-tiny architecture trained from scratch (its image size must match image_size)."""
    batch_size: int = 128
    """Pairs per contrastive batch."""
    base_steps: int = 800
    """Steps of plain pretraining on web-like captions (the base that does not bind)."""
    base_lr: float = 2e-3
    """Peak learning rate of pretraining."""
    finetune_steps: int = 300
    """Steps of each fine-tune on COCO-like captions."""
    finetune_lr: float = 5e-4
    """Peak learning rate of fine-tuning."""
    atoms: int = 128
    """Dictionary atoms K."""
    sparsity: int = 6
    """Non-zero codes per embedding s."""
    n_edits: int = 4
    """Counterfactual edits M per embedding and side."""
    counterfactual_weight: float = 1.0
    """Weight of the counterfactual part of the LACE loss."""
    edit_kinds: tuple[str, ...] = ("attenuate", "swap", "transplant")
    """Counterfactual edit kinds used in fine-tuning."""
    transplant_strength: float = 1.0
    """Transplant strength used in fine-tuning."""
    refresh_dictionary_every: int = 0
    """Refit the dictionary on recent embeddings every this many fine-tuning steps (0: never)."""
    progress: bool = True
    """Show progress bars."""

    @property
    def variants(self) -> tuple[str, ...]:
        return CORE_VARIANTS + (ONE_SIDED_VARIANTS if self.full else ())
