"""Hugging Face `transformers.CLIPModel` and `SiglipModel` as `DualEncoder`s (extra `lace[hf]`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torchvision import transforms

from lace.encoders.base import DualEncoder
from lace.encoders.names import HF_PREFIX, HF_SIGLIP_PREFIX
from lace.errors import LaceInputError
from lace.progress import dependency_bars, shows_bars


def _features(output) -> torch.Tensor:
    """`get_*_features` returns a tensor in transformers 4 and a pooled output record in 5."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def _transform(steps: list, mean, std) -> transforms.Compose:
    """`steps` on a PIL image, then its (3, H, W) float tensor normalised by `mean` and `std`."""
    return transforms.Compose([*steps, transforms.ToTensor(), transforms.Normalize(mean=mean, std=std)])


def _to_rgb() -> transforms.Lambda:
    return transforms.Lambda(lambda image: image.convert("RGB"))


class HuggingFaceClipEncoder(DualEncoder):
    """Wraps `transformers.CLIPModel` and its tokenizer; `self.model` is the trainable module."""

    def __init__(self, model, tokenizer, name: str, preprocess, preprocess_train):
        super().__init__()
        self.model = model
        self.name = name
        self._tokenizer = tokenizer
        self.preprocess = preprocess
        self.preprocess_train = preprocess_train

    @property
    def embed_dim(self) -> int:
        return int(self.model.config.projection_dim)

    @property
    def logit_scale(self) -> torch.nn.Parameter:
        return self.model.logit_scale

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        # CLIP's text tower is causal and pools at the end-of-text token, so padding after it
        # needs no attention mask (SigLIP pads to its full context: see its class).
        batch = self._tokenizer(
            texts, padding="max_length", truncation=True,
            max_length=self.model.config.text_config.max_position_embeddings, return_tensors="pt",
        )
        return batch["input_ids"]

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        return _features(self.model.get_image_features(pixel_values=pixels))

    def text_features(self, tokens: torch.Tensor) -> torch.Tensor:
        return _features(self.model.get_text_features(input_ids=tokens))

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        return {key: value.detach().clone() for key, value in self.model.state_dict().items()}


class HuggingFaceSiglipEncoder(HuggingFaceClipEncoder):
    """Wraps `transformers.SiglipModel` and its tokenizer; `self.model` is the trainable module.

    SigLIP's text tower attends to every position and pools the last one, and was trained on captions
    padded to its full context (`max_position_embeddings`, 64) without an attention mask: `tokenize` pads
    every caption to that length (the processor's `padding="max_length"`), so a caption's embedding does
    not depend on the others in its batch. Images are resized to the square input, without a crop, as
    `SiglipImageProcessor` does.
    """

    @property
    def embed_dim(self) -> int:
        return int(self.model.config.vision_config.hidden_size)

    @property
    def logit_bias(self) -> torch.nn.Parameter:
        return self.model.logit_bias


def _model_source(source: str, prefix: str) -> str:
    """`source` without its `prefix`: a hub id, or a local folder, refused unless it holds a config.json."""
    source = source.removeprefix(prefix)
    local = Path(source)
    if local.exists() and not (local / "config.json").is_file():
        raise LaceInputError(f"{local}: expected a Hugging Face model folder with config.json")
    return source


def load_hf_clip(source: str, device: str | torch.device = "cpu") -> HuggingFaceClipEncoder:
    """Load `CLIPModel` + tokenizer from a local directory or a hub id (`hf-clip:<source>`)."""
    try:
        from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel
    except ImportError as error:  # pragma: no cover - depends on the install
        raise LaceInputError("hf-clip models need transformers: pip install 'lace[hf]'") from error
    source = _model_source(source, HF_PREFIX)
    try:
        with dependency_bars(shows_bars()):  # transformers' "Loading weights" bar only on a terminal
            model = CLIPModel.from_pretrained(source)
            tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as error:
        raise LaceInputError(f"{source}: could not load a CLIPModel and tokenizer ({error})") from error
    size = model.config.vision_config.image_size
    # no preprocessor_config.json: CLIP's own normalisation
    mean, std = _normalisation(CLIPImageProcessor, source, (0.48145466, 0.4578275, 0.40821073),
                               (0.26862954, 0.26130258, 0.27577711))
    preprocess = _transform([transforms.Resize(size, interpolation=transforms.InterpolationMode.BICUBIC),
                             transforms.CenterCrop(size), _to_rgb()], mean, std)
    preprocess_train = _transform([transforms.RandomResizedCrop(size, scale=(0.9, 1.0)), _to_rgb()], mean, std)
    return HuggingFaceClipEncoder(model.to(device), tokenizer, f"{HF_PREFIX}{source}", preprocess, preprocess_train)


def _normalisation(processor_class, source: str, mean, std) -> tuple:
    """The image mean and std of `source`'s preprocessor_config.json, else `mean` and `std`."""
    try:
        processor = processor_class.from_pretrained(source)
    except OSError:
        return mean, std
    return processor.image_mean, processor.image_std


def load_hf_siglip(source: str, device: str | torch.device = "cpu") -> HuggingFaceSiglipEncoder:
    """Load `SiglipModel` + tokenizer from a local directory or a hub id (`hf-siglip:<source>`)."""
    try:
        from transformers import AutoTokenizer, SiglipImageProcessor, SiglipModel
    except ImportError as error:  # pragma: no cover - depends on the install
        raise LaceInputError("hf-siglip models need transformers: pip install 'lace[hf]'") from error
    source = _model_source(source, HF_SIGLIP_PREFIX)
    try:
        with dependency_bars(shows_bars()):  # transformers' "Loading weights" bar only on a terminal
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = SiglipModel.from_pretrained(source)
    except (OSError, ValueError, ImportError) as error:
        raise LaceInputError(
            f"{source}: could not load a SiglipModel and its tokenizer ({type(error).__name__}: "
            f"{(str(error).strip().splitlines() or [''])[0]}); pass hf-siglip:<folder> with config.json, the "
            f"weights and the tokenizer files (tokenizer.json or spiece.model, tokenizer_config.json), e.g. a "
            f"`save_pretrained` copy"
        ) from error
    size, resample = model.config.vision_config.image_size, transforms.InterpolationMode.BICUBIC
    # no preprocessor_config.json: SigLIP's own normalisation
    mean, std = _normalisation(SiglipImageProcessor, source, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    preprocess = _transform([_to_rgb(), transforms.Resize((size, size), interpolation=resample)], mean, std)
    preprocess_train = _transform(
        [_to_rgb(), transforms.RandomResizedCrop(size, scale=(0.9, 1.0), interpolation=resample)], mean, std)
    return HuggingFaceSiglipEncoder(model.to(device), tokenizer, f"{HF_SIGLIP_PREFIX}{source}", preprocess,
                                    preprocess_train)
