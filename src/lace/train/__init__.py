"""Training: the contrastive loop with LACE negatives and its ablations, checkpoints, export.

Names load on first use: `lace.train.config` (the flags of `lace train`) imports no training stack.
"""

from lace.lazy import lazy_exports

_EXPORTS = {
    "TrainConfig": "lace.train.config",
    "TensorPairs": "lace.train.data",
    "export_run": "lace.train.export",
    "TrainResult": "lace.train.loop",
    "train": "lace.train.loop",
}
__all__ = [
    "TensorPairs",
    "TrainConfig",
    "TrainResult",
    "export_run",
    "train",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
