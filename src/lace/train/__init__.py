"""Training: the contrastive loop with LACE negatives and its ablations, checkpoints, export."""

from lace.train.config import TrainConfig
from lace.train.data import TensorPairs
from lace.train.export import export_run
from lace.train.loop import TrainResult, train

__all__ = ["TensorPairs", "TrainConfig", "TrainResult", "export_run", "train"]
