"""A convolutional image tower in channels_last memory: the same model as open_clip's, only faster on CPU."""

import open_clip
import torch
import torch.nn.functional as F

from lace.encoders import load_encoder
from lace.train import TensorPairs, export_run, train
from lace.train.config import train_config

MODEL = "lace-micro-rn-32"  # open_clip's ModifiedResNet image tower


def _twins():
    """The lace encoder (channels_last) and a plain open_clip model holding the same weights."""
    torch.manual_seed(0)
    encoder = load_encoder(MODEL)
    plain = open_clip.create_model(MODEL)
    plain.load_state_dict(encoder.export_state_dict())
    return encoder, plain


def test_resnet_tower_and_its_pixels_are_channels_last_and_vits_are_not():
    encoder, _ = _twins()
    assert encoder.channels_last
    assert encoder.model.visual.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert not encoder.model.visual.conv1.weight.is_contiguous()
    assert not load_encoder("lace-micro-32").channels_last


def test_outputs_and_gradients_match_plain_open_clip():
    encoder, plain = _twins()
    pixels = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ours = encoder.image_features(pixels)
    theirs = plain.encode_image(pixels)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(F.normalize(ours, dim=-1), F.normalize(theirs, dim=-1), rtol=1e-4, atol=1e-5)
    ours.square().sum().backward()
    theirs.square().sum().backward()
    named = dict(plain.visual.named_parameters())
    compared = 0
    for name, parameter in encoder.model.visual.named_parameters():
        theirs_grad = named[name].grad
        # float sums in another order: within 0.1% of the gradient's size (plus 1e-4 absolute for the key
        # bias, whose gradient is zero up to rounding: softmax ignores a shift shared by every key)
        assert (parameter.grad - theirs_grad).norm() <= 1e-3 * theirs_grad.norm() + 1e-4, name
        compared += 1
    assert compared == len(named) > 10  # every weight of the tower, the attention pool's included


def test_checkpoint_of_a_channels_last_training_loads_in_plain_open_clip(tmp_path):
    torch.manual_seed(0)
    images = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    pairs = TensorPairs(images, [[f"a shape number {i}"] for i in range(16)])
    config = train_config(model=MODEL, output=str(tmp_path / "run"), batch_size=8, steps=2, lr=1e-3, warmup_steps=1,
                         checkpoint_every=0, device="cpu", log_every=1)
    result = train(config, dataset=pairs, progress=False)
    export_run(result.run_dir, tmp_path / "model.pt", overwrite=True)
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(tensor.is_contiguous() for tensor in state.values())
    plain = open_clip.create_model(MODEL)
    plain.load_state_dict(state, strict=True)
    trained = load_encoder(MODEL, str(tmp_path / "model.pt"))
    assert trained.channels_last
    with torch.no_grad():
        torch.testing.assert_close(trained.encode_images(images), F.normalize(plain.encode_image(images), dim=-1),
                                   rtol=1e-4, atol=1e-5)
