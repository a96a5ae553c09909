"""Hugging Face `transformers.CLIPModel` and `SiglipModel` as `DualEncoder`s (extra `lace[hf]`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torchvision import transforms

from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.progress import dependency_bars, shows_bars

HF_PREFIX = "hf-clip:"


def _features(output) -> torch.Tensor:
    """`get_*_features` returns a tensor in transformers 4 and a pooled output record in 5."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class HuggingFaceClipEncoder(DualEncoder):
    """Wraps `transformers.CLIPModel` and its tokenizer; `self.model` is the trainable module."""

    def __init__(self, model, tokenizer, name: str, image_size: int, mean, std):
        super().__init__()
        self.model = model
        self.name = name
        self._tokenizer = tokenizer
        normalize = transforms.Normalize(mean=mean, std=std)
        self.preprocess = transforms.Compose([
            transforms.Resize(image_size, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(image_size),
            transforms.Lambda(lambda image: image.convert("RGB")),
            transforms.ToTensor(),
            normalize,
        ])
        self.preprocess_train = transforms.Compose([
            transforms.RandomResizedCrop(image_size, scale=(0.9, 1.0)),
            transforms.Lambda(lambda image: image.convert("RGB")),
            transforms.ToTensor(),
            normalize,
        ])

    @property
    def embed_dim(self) -> int:
        return int(self.model.config.projection_dim)

    @property
    def logit_scale(self) -> torch.nn.Parameter:
        return self.model.logit_scale

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        # CLIP's text tower is causal and pools at the end-of-text token, so padding after it
        # needs no attention mask.
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
    image_size = model.config.vision_config.image_size
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    try:
        processor = CLIPImageProcessor.from_pretrained(source)
        mean, std = processor.image_mean, processor.image_std
    except OSError:
        pass  # no preprocessor_config.json: CLIP's own normalisation
    return HuggingFaceClipEncoder(model.to(device), tokenizer, f"{HF_PREFIX}{source}", image_size, mean, std)


HF_SIGLIP_PREFIX = "hf-siglip:"


class HuggingFaceSiglipEncoder(HuggingFaceClipEncoder):
    """Wraps `transformers.SiglipModel` and its tokenizer; `self.model` is the trainable module.

    SigLIP's text tower attends to every position and pools the last one, and was trained on captions
    padded to its full context (`max_position_embeddings`, 64) without an attention mask: `tokenize` pads
    every caption to that length (the processor's `padding="max_length"`), so a caption's embedding does
    not depend on the others in its batch. Images are resized to the square input, without a crop, as
    `SiglipImageProcessor` does.
    """

    def __init__(self, model, tokenizer, name: str, image_size: int, mean, std, resample):
        super().__init__(model, tokenizer, name, image_size, mean, std)
        normalize = transforms.Normalize(mean=mean, std=std)
        self.preprocess = transforms.Compose([
            transforms.Lambda(lambda image: image.convert("RGB")),
            transforms.Resize((image_size, image_size), interpolation=resample),
            transforms.ToTensor(),
            normalize,
        ])
        self.preprocess_train = transforms.Compose([
            transforms.Lambda(lambda image: image.convert("RGB")),
            transforms.RandomResizedCrop(image_size, scale=(0.9, 1.0), interpolation=resample),
            transforms.ToTensor(),
            normalize,
        ])

    @property
    def embed_dim(self) -> int:
        return int(self.model.config.vision_config.hidden_size)

    @property
    def logit_scale(self) -> torch.nn.Parameter:
        return self.model.logit_scale

    @property
    def logit_bias(self) -> torch.nn.Parameter:
        return self.model.logit_bias

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        batch = self._tokenizer(
            texts, padding="max_length", truncation=True,
            max_length=self.model.config.text_config.max_position_embeddings, return_tensors="pt",
        )
        return batch["input_ids"]


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
    image_size = model.config.vision_config.image_size
    mean, std, resample = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), transforms.InterpolationMode.BICUBIC
    try:
        processor = SiglipImageProcessor.from_pretrained(source)
        mean, std = processor.image_mean, processor.image_std
    except OSError:
        pass  # no preprocessor_config.json: SigLIP's own normalisation
    return HuggingFaceSiglipEncoder(model.to(device), tokenizer, f"{HF_SIGLIP_PREFIX}{source}", image_size, mean,
                                    std, resample)
