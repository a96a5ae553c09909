"""`WordCachedTokenizer` gives open_clip's token ids, id for id, on every kind of text."""

import random

import open_clip
import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.data import read_dataset
from lace.edits.captions import RuleNegatives
from lace.encoders.clip_tokens import WordCachedTokenizer
from tests.conftest import tiny_world

TRICKY = [
    "A red cube  to the LEFT of a blue ball.", "  leading and trailing  ", "it's the dog's ball, isn't it?",
    "tom &amp; jerry", "fish & chips", "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u201ccurly quotes\u201d",
    "tab\tseparated", "two\nlines", "carriage\r\nreturn", "emoji \U0001F600 here", "\u00c3\u00a9 mojibake",
    "digits 1234 and 3.14", "<b>html</b> tags", "", " ", "UPPER lower MiXeD", "e-mail: a.b@c.de",
    "x" * 300, " ".join(["word"] * 100), "\x1b[31mred\x1b[0m", "fullwidth \uff21\uff22", "ligature \ufb01ne",
]


def _corpus() -> list[str]:
    rules = RuleNegatives(load_vocabulary("natural"))
    rng = random.Random(0)
    made = []
    for colour, thing, other in [("red", "dog", "cat"), ("blue", "car", "bus"), ("green", "apple", "pear")]:
        caption = f"a {colour} {thing} next to a white {other}"
        made += [caption] + [rules.make(caption, None, rng) or caption for _ in range(5)]
    return made + TRICKY


def test_word_cached_tokens_equal_open_clips_on_every_kind_of_text(tmp_path):
    world = tiny_world(tmp_path / "world", 40, (1.0, 0.0, 0.0, 0.0))
    world_captions = read_dataset(world / "karpathy_web.json").captions + read_dataset(world / "karpathy_coco.json").captions
    texts = _corpus() + world_captions
    for model in ("lace-micro-rn-32", "ViT-B-32"):
        reference = open_clip.get_tokenizer(model)
        fast = WordCachedTokenizer(open_clip.get_tokenizer(model))
        assert fast.fast
        expected = reference(texts)
        assert torch.equal(fast(texts), expected)
        assert torch.equal(fast(texts), expected)  # again, from the word cache
        assert (expected[:, 0] == reference.sot_token_id).all()


def test_other_tokenizers_are_called_as_they_are():
    calls = []

    def tokenizer(texts):
        calls.append(list(texts))
        return torch.zeros(len(texts), 3, dtype=torch.long)

    wrapped = WordCachedTokenizer(tokenizer)
    assert not wrapped.fast
    assert wrapped(["a", "b"]).shape == (2, 3) and calls == [["a", "b"]]
