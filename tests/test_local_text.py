import torch

from lace.encoders.open_clip_encoder import load_open_clip
from lace.local.text import caption_swap_negatives, find_concept_tokens, single_token_ids

COLOURS = ["red", "blue", "green", "cyan"]


def test_swap_at_the_first_block_is_the_caption_with_the_words_exchanged():
    torch.manual_seed(0)
    encoder = load_open_clip("lace-micro-rn-32").eval()
    ids = single_token_ids(encoder.tokenize, COLOURS)
    assert ids[3] == -1 and (ids[:3] >= 0).all()  # "cyan" is two tokens: never swapped
    captions = ["a red square left of a blue circle", "a green star above a red heart", "a cyan star and a red heart"]
    swapped = ["a blue square left of a red circle", "a red star above a green heart", "a cyan star and a red heart"]
    tokens = encoder.tokenize(captions)
    found = find_concept_tokens(tokens, ids)
    assert found.valid.tolist() == [True, True, False]
    with torch.no_grad():
        negatives, valid = caption_swap_negatives(encoder.model, tokens, ids, "block0")
        truth = encoder.encode_texts(swapped)
        original = encoder.encode_texts(captions)
    assert negatives.shape == (3, 1, encoder.embed_dim) and valid[:, 0].tolist() == [True, True, False]
    torch.testing.assert_close(negatives[:, 0], truth, atol=1e-5, rtol=0)
    assert not torch.allclose(original[:2], truth[:2], atol=1e-3)
    torch.testing.assert_close(negatives[2, 0], original[2], atol=1e-5, rtol=0)  # no valid swap: unchanged


def test_caption_swap_keeps_gradient_through_the_text_tower():
    torch.manual_seed(0)
    encoder = load_open_clip("lace-micro-rn-32")
    tokens = encoder.tokenize(["a red square left of a blue circle"])
    negatives, _ = caption_swap_negatives(encoder.model, tokens, single_token_ids(encoder.tokenize, COLOURS), "block1")
    negatives.sum().backward()
    assert encoder.model.token_embedding.weight.grad.abs().sum() > 0
    assert encoder.model.transformer.resblocks[1].mlp.c_fc.weight.grad.abs().sum() > 0
