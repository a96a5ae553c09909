"""What an embed path is, and what one run and one micro-batch hand the negative sources.

An embed path (`PixelPath`, `FeaturePath`, `TopPath`) turns a micro-batch of its dataset into U, V (B, d) unit
embeddings and the logit scale; the sources (`lace.train.sources`) make their negatives from what it left in the
`MicroBatch`. The trainer sees only this interface, never which path it is on.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from lace.distributed import DistributedContext
from lace.encoders import DualEncoder
from lace.train.config import TrainConfig
from lace.train.data import row_seeds
from lace.train.pairs import Describe


@dataclass
class Run:
    """What the embed path and the sources of one run share: its config (loss resolved), process context, the
    encoder being trained (and `model`, the same wrapped for data parallelism once the optimiser exists), the
    training pairs, the logit bias (None without one) and whether steps run in bf16."""

    config: TrainConfig
    context: DistributedContext
    encoder: DualEncoder
    pairs: Any
    logit_bias: Tensor | None = None
    bf16: bool = False
    model: torch.nn.Module | None = None

    @property
    def device(self) -> torch.device:
        return self.context.device

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()


@dataclass
class MicroBatch:
    """One micro-batch on its way through a step: the path's batch, its number and epoch, and whether it is the
    last micro-batch of a logged step (`logged`: its provenance figures are written).

    The path sets U, V (B, d), scale (a scalar tensor), `captions` (the B caption texts where the path knows them)
    on tower tops the `maps` (B, C, H, W) entering the image top, on pixels the `tokens` of its one text pass with `pass_texts` (source name -> the embeddings of the texts
    that source added to the pass). `describe` (set by the pairs rows source) writes the captions of image edits;
    `rule_captions` / `rule_strings` (set by the rule-captions source) are the rule-made captions, (B, R, d) with
    their (B, R) validity, and their texts.
    """

    batch: Any
    number: int
    epoch: int
    logged: bool = False
    U: Tensor | None = None
    V: Tensor | None = None
    scale: Tensor | None = None
    captions: list[str] | None = None
    tokens: Tensor | None = None
    maps: Tensor | None = None
    pass_texts: dict[str, Tensor] = field(default_factory=dict)
    describe: Describe | None = None
    rule_captions: tuple[Tensor, Tensor] | None = None
    rule_strings: list[list[str]] | None = None

    def row_seeds(self, seed: int, stream: int) -> list[int]:
        """One seed per row from (seed, epoch, image) in seed stream `stream` (`lace.train.data.row_seeds`)."""
        return row_seeds(seed, [(self.epoch, index) for index in self.batch.indices], stream)


class EmbedPath:
    """One way through the model. Subclasses set `name` (what sources list in their `paths`) and implement
    `collate`, `embed` and `encode_texts`; `check` refuses a run this path cannot make."""

    name: ClassVar[str]
    where: ClassVar[str] = "train config"
    """How errors name the run (the cached paths say which cache)."""

    def __init__(self, run: Run):
        self.run = run

    def check(self, given: dict[str, Any]) -> None:
        """Refuse what this path cannot do with the run's config and the objects passed in (`given`)."""

    def describable(self) -> bool:
        """Whether the captions of image edits can be written and encoded on this path."""
        return False

    def collate(self, samples: list) -> Any:
        raise NotImplementedError

    def embed(self, micro: MicroBatch, sources: list) -> None:
        """Set micro.U, micro.V, micro.scale (and what else the path knows) from micro.batch."""
        raise NotImplementedError

    def encode_texts(self, texts: list[str]) -> Tensor:
        """(n,) texts outside the joint pass -> (n, d) unit embeddings, with gradient when it is on."""
        raise NotImplementedError(f"the {self.name} path encodes no new texts")


def source_image_pass(sources: list, micro: MicroBatch):
    """The image pass the first source that runs the image side makes for `micro` (`NegativeSource.image_pass`),
    or None: the path's own pass."""
    return next((made for source in sources if (made := source.image_pass(micro)) is not None), None)

