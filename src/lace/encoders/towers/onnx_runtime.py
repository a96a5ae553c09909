"""The locked towers run by ONNX Runtime: the same features as the PyTorch modules, for feature extraction.

`TowerSession` exports a tower (its current weights) to ONNX in memory once and runs it on
CPU with ONNX Runtime, which fuses each convolution with its BatchNorm and activation and
has faster depthwise kernels than PyTorch's eager CPU path. Inference only: a session is a
copy of the weights at export, so `sessions_for` keys it by the tower's weight fingerprint.

The image session maps (N, 3, 224, 224) float32 pixels to (N, 1280) features; the text
session maps (N, L) int64 token ids and their (N, L) 0/1 mask to (N, 384) mean-pooled
features. Both equal the PyTorch towers to float32 rounding (tests/test_towers_onnx.py:
cosine >= 1 - 1e-4 on random tiny towers).
"""

from __future__ import annotations

import importlib.util
import io
import warnings

import numpy as np
import torch

from lace.encoders.towers.text_tower import mean_pool
from lace.errors import LaceInputError

RUNTIMES = {"image": ("onnxruntime", "torch"), "text": ("onnxruntime", "torch", "torch-bf16")}
"""The runtimes of each tower. `torch-bf16` is PyTorch under bfloat16 autocast (float32 pooling): on a
CPU with AMX or AVX-512 BF16 its matrix products run in bfloat16 hardware. The text tower's features
agree with float32 to cosine >= 1 - 1e-4 (0.99997 at worst over Flickr8k's captions); the image tower's do not (0.998), so it has no
bf16 runtime."""
OPSET = 17


def has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware: AMX tiles, or AVX-512 BF16 dot products
    (where bfloat16 matrix products run several times faster than float32)."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    return any(bool(probe()) for probe in probes if probe is not None)


def default_runtime(tower: str) -> str:
    """The runtime `tower` ("image" or "text") runs in by default, as measured on 2 CPU cores
    (docs/results.md, Speed):
    - image: ONNX Runtime where it is installed (`lace[scale]`), about twice PyTorch's rate;
    - text: PyTorch in bfloat16 on a CPU with bfloat16 matrix instructions (AMX or AVX-512 BF16: about
      2.5-3x float32, cosine >= 1 - 1e-4 to it), else PyTorch in float32 (ONNX Runtime was not faster on a quiet machine: its attention fusion
      does not match this export).
    All of them give the same features within 1e-4 cosine."""
    if tower == "image":
        return "onnxruntime" if importlib.util.find_spec("onnxruntime") is not None else "torch"
    return "torch-bf16" if has_bf16_matmul() else "torch"


class _PooledText(torch.nn.Module):
    """A Hugging Face BERT with mean pooling: (N, L) ids, (N, L) mask -> (N, h)."""

    def __init__(self, bert: torch.nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden_states = self.bert(input_ids=tokens, attention_mask=attention_mask).last_hidden_state
        return mean_pool(hidden_states, attention_mask)


class TowerSession:
    """One module exported to ONNX and run by ONNX Runtime on `threads` intra-op threads."""

    def __init__(self, module: torch.nn.Module, example: tuple[torch.Tensor, ...], input_names: list[str],
                 dynamic_axes: dict[str, dict[int, str]], threads: int):
        try:
            import onnxruntime
        except ImportError as error:  # pragma: no cover - depends on the install
            raise LaceInputError("the onnxruntime tower runtime needs onnxruntime: pip install 'lace[scale]'") from error
        modes = [(submodule, submodule.training) for submodule in module.modules()]
        module.eval()  # the exporter restores the wrapper's own mode afterwards, children included
        buffer = io.BytesIO()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's notes on tracing; the tests check the result
                torch.onnx.export(module, example, buffer, input_names=input_names, output_names=["features"],
                                  dynamic_axes={**dynamic_axes, "features": {0: "n"}}, opset_version=OPSET,
                                  dynamo=False)
        finally:
            for submodule, training in modes:
                submodule.training = training
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.input_names = input_names
        self.session = onnxruntime.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        return self.session.run(None, dict(zip(self.input_names, arrays)))[0]


def image_session(tower: torch.nn.Module, threads: int) -> TowerSession:
    """(N, 3, 224, 224) float32 pixels -> (N, 1280) float32 features of an `ImageTower`."""
    return TowerSession(tower, (torch.zeros(2, 3, 224, 224),), ["pixels"], {"pixels": {0: "n"}}, threads)


def text_session(tower: torch.nn.Module, threads: int) -> TowerSession:
    """(N, L) int64 token ids and (N, L) int64 mask -> (N, 384) float32 features of a `TextTower`."""
    tokens = torch.full((2, 8), tower.pad_token_id + 1, dtype=torch.long)
    mask = torch.ones_like(tokens)
    mask[0, 5:] = 0
    axes = {"n": 0, "length": 1}
    dynamic = {name: {index: axis for axis, index in axes.items()} for name in ("tokens", "attention_mask")}
    return TowerSession(_PooledText(tower.model), (tokens, mask), ["tokens", "attention_mask"], dynamic, threads)


def text_inputs(tokens: torch.Tensor, pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, L) padded ids -> the text session's (N, L') ids and mask, all-padding columns dropped
    as `TextTower.forward` drops them."""
    mask = (tokens != pad_token_id).long()
    longest = int(mask.sum(1).max()) if len(tokens) else 0
    return tokens[:, :longest].numpy(), mask[:, :longest].numpy()
