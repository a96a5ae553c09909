"""One training step of each arm family through `lace.train.train`, on a fixed batch of a tiny shapes world:
its loss and every parameter's gradient (read by gradient hooks before the optimiser moves anything)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from lace.concepts.directions import directions_from_templates
from lace.concepts.labelling import label_atoms
from lace.concepts.vocabulary import load_vocabulary
from lace.config import with_changes
from lace.data import read_dataset
from lace.dictionary.concept_dictionary import ConceptDictionary
from lace.edits import CounterfactualEditor
from lace.encoders import load_encoder
from lace.experiment.variants import variant_config
from lace.local import LocalEditConfig, build_local_editor
from lace.train import TrainConfig, train
from lace.train.config import train_config

SEED = 3
# arm family -> (the variant of `lace.experiment.variants`, the model it trains)
ARMS = {
    "plain": ("plain", "lace-micro-32"),
    "LACE": ("LACE", "lace-micro-32"),
    "caption negatives": ("caption negatives", "lace-micro-32"),
    "paired directions": ("paired-caption directions", "lace-micro-32"),
    "LACE-local": ("LACE-local", "lace-micro-32"),
    "pairs layout": ("LACE-local pairs + real-image negative", "lace-micro-32"),
    "sigmoid loss": ("caption negatives", "lace-micro-sigmoid-32"),  # a logit bias: the sigmoid loss is chosen
    "rendered ceiling": ("ceiling (rendered swaps)", "lace-micro-32"),
}
LOCAL = LocalEditConfig(layer="block1", locate_layer="block0", fit_images=24)


@dataclass
class Step:
    loss: float
    plain_loss: float
    gradients: dict[str, torch.Tensor]  # parameter name -> gradient, fp32 on the CPU
    metrics: dict


def arm_config(arm: str, world: Path, out: Path, device: str, precision: str, steps: int = 1, **changes) -> TrainConfig:
    variant, model = ARMS[arm]
    base = train_config(model=model, data=str(world / "karpathy_coco.json"), output=str(out), steps=steps,
                       batch_size=8, lr=1e-3, warmup_steps=1, checkpoint_every=0, log_every=1, device=device,
                       precision=precision, seed=SEED, vocabulary=str(world / "vocabulary.yaml"), local=LOCAL)
    return variant_config(with_changes(base, {**changes}), variant)


def initial_encoder(model: str):
    """The run's initial model, as `train` makes it (seeded, on the CPU)."""
    torch.manual_seed(SEED)
    return load_encoder(model, None, device="cpu")


def lace_editor_for(world: Path) -> CounterfactualEditor:
    """A vocabulary dictionary of the runs' initial lace-micro-32, fitted on its embeddings of the world's training
    captions and images, so that edits pass their checks."""
    encoder = initial_encoder("lace-micro-32").eval()
    dataset = read_dataset(str(world / "karpathy_coco.json"), split="train")
    captions = [caption for record in dataset.records for caption in record.captions]
    with torch.no_grad():
        texts = encoder.encode_texts(captions)
        images = encoder.encode_images(torch.stack([encoder.preprocess(dataset.load_image(i))
                                                    for i in range(len(dataset))]))
        directions = directions_from_templates(load_vocabulary(str(world / "vocabulary.yaml")), encoder.encode_texts,
                                               texts.mean(0))
    dictionary = ConceptDictionary(mode="vocabulary", sparsity=4, directions=directions, batch_size=64).fit(images,
                                                                                                            texts)
    return CounterfactualEditor(dictionary, label_atoms(dictionary, directions, images, texts), directions)


@lru_cache(maxsize=2)
def cpu_local_editor(world: Path, model: str):
    """The local editor `train` fits before its first step, fitted on the CPU (so that runs on two devices edit
    with the same one)."""
    encoder = initial_encoder(model)
    dataset = read_dataset(str(world / "karpathy_coco.json"), split="train")
    count = LOCAL.fit_images
    pixels = torch.stack([encoder.preprocess(dataset.load_image(i)) for i in range(count)])
    captions = [list(dataset.records[i].captions) for i in range(count)]
    return build_local_editor(LOCAL, encoder.model, pixels, captions, encoder.preprocess.transforms[-1],
                              load_vocabulary(str(world / "vocabulary.yaml")), seed=SEED)


def one_step(arm: str, world: Path, out: Path, device: str, precision: str, editor=None, local_editor=None,
             gradients: bool = True, on_batch=None, **changes) -> Step:
    """Train arm `arm` one step on `device` (`changes`: other `TrainConfig` fields); its loss, plain loss and the
    gradients of that step (of the last step, with `steps` > 1)."""
    config = arm_config(arm, world, out, device, precision, **changes)
    encoder = initial_encoder(config.run.model)
    seen: dict[str, torch.Tensor] = {}
    if gradients:
        for name, parameter in encoder.named_parameters():
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(
                    lambda p, name=name: seen.__setitem__(name, p.grad.detach().float().cpu().clone()))
    result = train(config, editor=editor, progress=False, encoder=encoder, local_editor=local_editor,
                   on_batch=on_batch)
    metrics = result.last_metrics
    return Step(metrics["loss"], metrics["plain_loss"], seen, metrics)
