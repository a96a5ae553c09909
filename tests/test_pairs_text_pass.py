"""The pairs layout's text pass made cheaper without changing what it computes: each distinct described caption is
encoded once and gathered (`lace.train.pairs.encode_distinct`), and the rule editor finds a caption's mentions once
(`RuleNegatives.mentions`)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from lace.concepts.vocabulary import vocabulary_from_dict
from lace.distributed import DistributedContext
from lace.edits.captions import RuleNegatives
from lace.train.pairs import (
    EditedImages,
    PairRows,
    describe_slots,
    encode_distinct,
    pair_rows,
    pair_term,
)

VOCABULARY = {"objects": ["cube", "ball", "cone"], "attributes": {"colour": ["red", "blue", "green"]},
              "relations": ["left of"]}
ONE_PROCESS = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_encoding_each_distinct_text_once_gives_every_copy_its_embedding_and_gradient(resnet):
    texts = ["a red cube", "a blue ball", "a red cube", "a green cone", "a blue ball", "a red cube"]
    every, once = copy.deepcopy(resnet), copy.deepcopy(resnet)
    asked = []

    def encode(texts):
        asked.append(list(texts))
        return once.encode_texts(texts)

    weights = torch.randn(len(texts), resnet.embed_dim)
    reference = every.encode_texts(texts)
    gathered = encode_distinct(encode, texts)
    assert asked == [["a red cube", "a blue ball", "a green cone"]]  # one pass, each text once, in first-seen order
    torch.testing.assert_close(gathered, reference)
    (reference * weights).sum().backward()
    (gathered * weights).sum().backward()
    for (name, a), b in zip(every.named_parameters(), once.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-4, msg=name)  # summed over copies: to float tolerance


def test_distinct_texts_take_the_plain_pass_untouched():
    texts = ["a red cube", "a blue ball"]
    out = torch.randn(2, 4)
    assert encode_distinct(lambda given: out if given == texts else None, texts) is out


def test_the_pairs_term_with_repeated_described_captions_is_the_term_with_every_caption_encoded(resnet):
    rules = RuleNegatives(vocabulary_from_dict(VOCABULARY))
    captions = ["a red cube left of a blue ball", "a red cube left of a blue ball", "a green cone left of a red ball"]
    changes = [[{"red": "blue", "blue": "red"}, {"red": "green"}], [{"red": "blue", "blue": "red"}, {"blue": "green"}],
               [{"green": "blue"}, {"red": "blue"}]]
    described = describe_slots(rules, captions, changes)
    assert described[0][0] == described[1][0]  # the same caption, the same swap: one text, two rows
    valid = torch.ones(3, 2, dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(3, 2, resnet.embed_dim, generator=generator), dim=-1)
    U = F.normalize(torch.randn(3, resnet.embed_dim, generator=generator), dim=-1)
    terms, grads = [], []
    for each_copy in (True, False):
        model = copy.deepcopy(resnet)
        V = model.encode_texts(captions)
        if each_copy:  # as before: every valid row's caption through the text tower
            texts = [text for row in described for text in row]
            rows = PairRows(images, images.new_zeros(images.shape).index_put((valid,), model.encode_texts(texts)), valid)
        else:
            rows = pair_rows([EditedImages(images, valid, described)], model.encode_texts)
        term = pair_term(rows, U, V, torch.tensor(10.0), None, ONE_PROCESS, real_image_negative=True)
        term.backward()
        terms.append(term.detach())
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(terms[1], terms[0])
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-4, msg=name)


def test_mentions_found_once_are_the_mentions_found_afresh_and_callers_cannot_change_them():
    vocabulary = vocabulary_from_dict(VOCABULARY)
    kept, fresh = RuleNegatives(vocabulary), RuleNegatives(vocabulary)
    caption = "A red cube left of a blue ball"
    first = kept.mentions(caption)
    first.clear()  # a caller's list is its own
    assert kept.mentions(caption) == fresh.mentions(caption) != []
    assert kept.describe(caption, {"red": "blue", "blue": "red"}) == "A blue cube left of a red ball"
