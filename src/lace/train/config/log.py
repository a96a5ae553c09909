"""`LogConfig`: what a run writes about itself as it trains."""

from __future__ import annotations

from dataclasses import dataclass

from lace.errors import input_error


@dataclass
class LogConfig:
    """The run's metrics.jsonl lines and TensorBoard scalars (the progress line is `train(progress=...)`'s)."""

    log_every: int = 10
    """Append a metrics.jsonl line every this many steps."""
    tensorboard: bool = False
    """Also write TensorBoard scalars to the run folder (when tensorboard is installed)."""

    def validate(self, where: str = "train config") -> LogConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        if self.log_every < 1:
            raise input_error(where, "log_every", "a positive integer", self.log_every)
        return self
