"""CLIP's BPE tokenizer with a word cache: the same token ids as open_clip's `SimpleTokenizer`, faster.

open_clip's tokenizer costs about 100 us a caption on CPU: `ftfy.fix_text` (about half), then for every
word a UTF-8 byte map, the BPE merge (cached) and a vocabulary lookup. Training and evaluation tokenize
tens of thousands of short captions made of a few hundred distinct words, so here:
- a word's token ids are computed once (by the tokenizer's own byte map, BPE and vocabulary) and kept;
- printable ASCII text with no `&` skips ftfy and HTML unescaping, which leave such text unchanged, and is
  cleaned as the tokenizer's `lower` cleaning does (whitespace collapsed, lower case). Any other text goes
  through the tokenizer's own cleaning.
The result is the tokenizer's own, id for id (tests/test_clip_tokens.py); tokenizers other than a
`SimpleTokenizer` with `lower` cleaning and no reduction are called as they are.
"""

from __future__ import annotations

import torch
from open_clip.tokenizer import SimpleTokenizer, _clean_lower

WORD_CACHE_SIZE = 1_000_000
"""Words kept by one `WordCachedTokenizer`; the cache starts again when full."""


class WordCachedTokenizer:
    """`tokenizer(texts)` -> (N, context length) token ids, equal to `tokenizer`'s own."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.fast = (isinstance(tokenizer, SimpleTokenizer) and tokenizer.clean_fn is _clean_lower
                     and tokenizer.reduction_fn is None)
        self._word_ids: dict[str, list[int]] = {}

    def __call__(self, texts: list[str]) -> torch.Tensor:
        if not self.fast:
            return self.tokenizer(texts)
        tokenizer = self.tokenizer
        length, start, end = tokenizer.context_length, tokenizer.sot_token_id, tokenizer.eot_token_id
        rows = []
        for text in texts:
            ids = [start, *self.encode(text), end]
            if len(ids) > length:  # truncated as open_clip truncates: the last kept id becomes end-of-text
                ids = ids[:length]
                ids[-1] = end
            rows.append(ids + [0] * (length - len(ids)))
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), length)

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`, without start and end of text."""
        tokenizer = self.tokenizer
        if text.isascii() and text.isprintable() and "&" not in text:
            cleaned = " ".join(text.split()).lower()
        else:
            cleaned = _clean_lower(text)
        if len(self._word_ids) > WORD_CACHE_SIZE:
            self._word_ids.clear()
        ids: list[int] = []
        for word in tokenizer.pat.findall(cleaned):
            known = self._word_ids.get(word)
            if known is None:
                mapped = "".join(tokenizer.byte_encoder[byte] for byte in word.encode("utf-8"))
                known = self._word_ids[word] = [tokenizer.encoder[piece] for piece in tokenizer.bpe(mapped).split(" ")]
            ids.extend(known)
        return ids
