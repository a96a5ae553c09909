"""open_clip models as `DualEncoder`s: any architecture, pretrained tag or local checkpoint.

Activation: OpenAI's CLIP weights were trained with QuickGELU, but open_clip builds
`ViT-B-32` and the other plain names with GELU and only warns when given those weights,
a silent change of every embedding. `load_open_clip` builds QuickGELU whenever the
weights were trained with it (`quick_gelu_for`): the pretrained tag says so in open_clip's
registry, or a checkpoint's side JSON (`<checkpoint>.json`, written by `lace export`)
records it.

SigLIP: open_clip's SigLIP and SigLIP 2 configs (`ViT-B-16-SigLIP2`, ...) build a model with a learned
`logit_bias` (`init_logit_bias` in the config), timm image towers and Hugging Face tokenizers. The
tokenizer is loaded before the model, so one that cannot be had (offline, no local copy) is a
`LaceInputError` naming it and how to point at a local copy, not a hub traceback after the build.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import open_clip
import torch
from open_clip.model import QuickGELU
from open_clip.modified_resnet import ModifiedResNet
from safetensors import SafetensorError

from lace.encoders.base import DualEncoder
from lace.encoders.clip_tokens import WordCachedTokenizer
from lace.encoders.weights import TRAINED, resolve_pretrained
from lace.errors import LaceInputError
from lace.io import read_json

MODEL_CONFIG_DIR = Path(__file__).parent / "model_configs"
open_clip.add_model_config(MODEL_CONFIG_DIR)  # registers the lace-tiny family by name
TOKEN_CACHE_SIZE = 500_000
SCHEMA_PREFIXES = ("hf-hub:", "local-dir:")
_TOKEN_CACHES: dict[str, dict[str, torch.Tensor]] = {}  # per model name: the tokenizer is fixed by the name
_TOKENIZERS: dict[str, WordCachedTokenizer] = {}


def tiny_model_names() -> list[str]:
    """Names of the small architectures lace registers with open_clip."""
    return sorted(path.stem for path in MODEL_CONFIG_DIR.glob("*.json"))


class OpenClipEncoder(DualEncoder):
    """Wraps an `open_clip.CLIP`; `self.model` is the trainable module.

    A convolutional image tower (open_clip's `ModifiedResNet`) keeps its weights, and takes its
    pixels, in `torch.channels_last` memory: the same values, laid out as the CPU's convolution
    kernels read them (about a quarter faster for `lace-micro-rn-32`). Only strides change:
    `state_dict()` holds the same tensors, and `export_state_dict()` returns them contiguous.
    """

    def __init__(self, model: torch.nn.Module, name: str, preprocess_train, preprocess, tokenizer,
                 quick_gelu: bool = False):
        super().__init__()
        self.model = model
        self.name = name
        self.quick_gelu = quick_gelu
        """Whether the towers use QuickGELU (as OpenAI's weights were trained) rather than GELU."""
        self.preprocess_train = preprocess_train
        self.preprocess = preprocess
        self._tokenizer = tokenizer
        self._token_cache = _TOKEN_CACHES.setdefault(name, {})
        self.channels_last = isinstance(getattr(model, "visual", None), ModifiedResNet)
        """Whether the image tower and its pixels use `torch.channels_last` memory."""
        if self.channels_last:
            model.visual.to(memory_format=torch.channels_last)

    @property
    def embed_dim(self) -> int:
        return int(self.model.text_projection.shape[-1]) if hasattr(self.model, "text_projection") else int(
            self.model.visual.output_dim
        )

    @property
    def logit_scale(self) -> torch.nn.Parameter:
        return self.model.logit_scale

    @property
    def logit_bias(self) -> torch.nn.Parameter | None:
        return getattr(self.model, "logit_bias", None)

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        # Training and evaluation see the same captions again and again, so each distinct caption
        # is tokenised once per process (by `WordCachedTokenizer`, itself faster than open_clip's).
        missing = [text for text in dict.fromkeys(texts) if text not in self._token_cache]
        if missing:
            if len(self._token_cache) + len(missing) > TOKEN_CACHE_SIZE:
                self._token_cache.clear()
            self._token_cache.update(zip(missing, self._tokenizer(missing)))
        return torch.stack([self._token_cache[text] for text in texts])

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        return self.model.encode_image(pixels)

    def text_features(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(tokens)

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        return {key: value.detach().clone(memory_format=torch.contiguous_format)
                for key, value in self.model.state_dict().items()}


def quick_gelu_for(model: str, pretrained: str | None, _depth: int = 0) -> bool:
    """Whether architecture `model` with weights `pretrained` needs QuickGELU.

    True when the architecture's config asks for it (the `-quickgelu` names), when
    `pretrained` is a tag open_clip's registry marks as trained with it (`openai`, ...), or
    when `pretrained` is a checkpoint whose side JSON `<checkpoint>.json` says so: its
    `quick_gelu` field, or for exports older than that field, the tag it was trained from.
    Names with a schema (`hf-hub:`, `local-dir:`) bring their own config, activation included,
    and are left to it.
    """
    if model.startswith(SCHEMA_PREFIXES):
        return False
    if (open_clip.get_model_config(model) or {}).get("quick_gelu"):
        return True
    if pretrained is None or pretrained.lower() == "none" or _depth > 4:
        return False
    path = Path(pretrained)
    if not path.exists():
        return bool(open_clip.get_pretrained_cfg(model, pretrained).get("quick_gelu", False))
    weights = resolve_pretrained(pretrained)
    if weights.kind in TRAINED:  # a run's checkpoint: the activation of the weights the run started from
        return isinstance(weights.origin, str) and quick_gelu_for(weights.model or model, weights.origin, _depth + 1)
    side = path.with_name(path.name + ".json")
    record = read_json(side) if side.is_file() else None
    if not isinstance(record, dict):
        return False
    if "quick_gelu" in record:
        return bool(record["quick_gelu"])
    origin = record.get("pretrained")
    return isinstance(origin, str) and quick_gelu_for(str(record.get("model", model)), origin, _depth + 1)


def load_open_clip(model: str, pretrained: str | None = None, device: str | torch.device = "cpu",
                   quick_gelu: bool | None = None) -> OpenClipEncoder:
    """Build an open_clip model by name (with QuickGELU when `quick_gelu`; None: as `quick_gelu_for` says).

    `pretrained` is an open_clip tag (`openai`, `laion2b_s34b_b79k`, ...), a path to a
    local checkpoint (an open_clip state dict, e.g. written by `lace export`), or
    None / "none" for random initialisation.
    """
    known = open_clip.list_models()
    if model not in known and not model.startswith(SCHEMA_PREFIXES):
        close = [name for name in known if model.lower()[:4] in name.lower()][:8]
        raise LaceInputError(
            f"unknown model name {model!r}: expected an open_clip architecture "
            f"(e.g. ViT-B-32, {', '.join(tiny_model_names())}), 'hf-clip:<dir or hub id>', 'hf-siglip:<dir or hub id>' or "
            f"'lace-towers'" + (f"; close names: {close}" if close else "")
        )
    if pretrained is not None and pretrained.lower() == "none":
        pretrained = None
    if pretrained is not None and not Path(pretrained).exists():
        tags = open_clip.list_pretrained_tags_by_model(model) if model in known else []
        if pretrained not in tags and ("/" in pretrained or pretrained.endswith((".pt", ".bin", ".safetensors"))):
            raise LaceInputError(f"{pretrained}: checkpoint file not found (--pretrained)")
        if tags and pretrained not in tags:
            raise LaceInputError(
                f"unknown pretrained tag {pretrained!r} for {model}: expected one of {tags} or a checkpoint path"
            )
    tokenizer = _load_tokenizer(model)
    quick_gelu = quick_gelu_for(model, pretrained) if quick_gelu is None else quick_gelu
    # open_clip warns that random initialisation loaded no weights; here that was asked for.
    logging.disable(logging.WARNING if pretrained is None else logging.NOTSET)
    try:
        clip, preprocess_train, preprocess = open_clip.create_model_and_transforms(
            model, pretrained=pretrained, device=device, force_quick_gelu=quick_gelu, weights_only=True
        )
    except (pickle.UnpicklingError, SafetensorError, EOFError) as error:
        # weights_only refuses a pickle that would build anything but tensors (it could run code)
        raise LaceInputError(f"{pretrained}: refused or unreadable checkpoint (--pretrained): expected a "
                             f"safetensors file or a state dict of tensors ({error})") from error
    except (RuntimeError, OSError) as error:
        if pretrained is None:
            raise
        if Path(pretrained).exists():
            raise LaceInputError(f"{pretrained}: not a checkpoint of {model} (--pretrained): {error}") from error
        # a pretrained tag whose weights are neither in the Hugging Face cache nor downloadable
        raise LaceInputError(
            f"{model}: the weights of pretrained tag {pretrained!r} are not in the Hugging Face cache and could not "
            f"be downloaded ({type(error).__name__}); download them where there is a network and copy the cache "
            f"(HF_HOME) here, or pass --pretrained <checkpoint file>") from error
    finally:
        logging.disable(logging.NOTSET)
    return OpenClipEncoder(clip, model, preprocess_train, preprocess, tokenizer, quick_gelu=uses_quick_gelu(clip))


def _load_tokenizer(model: str) -> WordCachedTokenizer:
    """open_clip's tokenizer for `model`, once per name and process (building the BPE tables costs 0.1 s)."""
    if model not in _TOKENIZERS:
        try:
            _TOKENIZERS[model] = WordCachedTokenizer(open_clip.get_tokenizer(model))
        except (OSError, ImportError, ValueError) as error:
            raise LaceInputError(_tokenizer_unavailable(model, error)) from error
    return _TOKENIZERS[model]


def _tokenizer_unavailable(model: str, error: Exception) -> str:
    hub_id = (open_clip.get_model_config(model) or {}).get("text_cfg", {}).get("hf_tokenizer_name")
    what = f"Hugging Face tokenizer {hub_id!r}" if hub_id else "SigLIP sentencepiece vocabulary (open_clip downloads it)"
    first_line = (str(error).strip().splitlines() or [""])[0]
    return (
        f"{model}: its {what} could not be loaded: it is not in the Hugging Face cache and cannot be downloaded "
        f"here ({type(error).__name__}: {first_line}). Download it where there is a network "
        f"(`hf download {hub_id or '<repo>'}`) and copy the Hugging Face cache (HF_HOME) here, or put the model "
        f"in a folder (open_clip_config.json, the weights and the tokenizer files tokenizer.json and "
        f"tokenizer_config.json) and pass --model local-dir:<folder>"
    )


def uses_quick_gelu(model: torch.nn.Module) -> bool:
    """Whether any layer of `model` is open_clip's QuickGELU."""
    return any(isinstance(module, QuickGELU) for module in model.modules())
