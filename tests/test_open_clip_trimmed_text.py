"""An inference text pass leaves out the padding past a batch's longest caption and keeps every bit of the features."""

import open_clip
import torch

from lace.encoders import load_encoder
from lace.encoders.open_clip_encoder import SHORTEST_TRIMMED_CONTEXT

MODEL = "lace-micro-rn-32"  # context of 24 positions
CAPTIONS = [
    "a red square",
    "a small blue circle left of a big green triangle",
    "two yellow stars and a purple hexagon above a cyan cross on the right of an orange ring",
    "a pink diamond",
    "a striped red square to the left of a dotted blue circle below a plain green triangle near a star",
]


def _encoder():
    torch.manual_seed(0)
    return load_encoder(MODEL)


def test_inference_features_equal_the_full_context_pass_bit_for_bit():
    encoder = _encoder()
    plain = open_clip.create_model(MODEL)
    plain.load_state_dict(encoder.export_state_dict())
    plain.eval(), encoder.eval()
    for captions in (CAPTIONS, CAPTIONS[:1], CAPTIONS[2:3], CAPTIONS * 40):
        tokens = encoder.tokenize(captions)
        with torch.no_grad():
            assert torch.equal(encoder.text_features(tokens), plain.encode_text(tokens))
            assert torch.equal(encoder.encode_texts(captions), plain.encode_text(tokens, normalize=True))


def test_the_pass_is_trimmed_only_without_gradient_and_never_below_the_floor():
    encoder = _encoder()
    short = encoder.tokenize(["a red square", "a blue circle"])
    longest = encoder.tokenize(["a small blue circle left of a big green triangle"])
    with torch.no_grad():
        assert encoder._trimmed_length(short) == SHORTEST_TRIMMED_CONTEXT
        assert SHORTEST_TRIMMED_CONTEXT <= encoder._trimmed_length(longest) < short.shape[1]
        assert encoder._trimmed_length(longest) == int(longest.argmax(dim=-1)) + 1 or (
            encoder._trimmed_length(longest) == SHORTEST_TRIMMED_CONTEXT)
    assert encoder._trimmed_length(short) is None  # a training pass keeps the whole context
    with torch.no_grad():
        full = encoder.tokenize([" ".join(["red"] * 40)])  # truncated: no padding to leave out
        assert encoder._trimmed_length(full) is None
