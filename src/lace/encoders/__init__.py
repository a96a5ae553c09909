"""Dual encoders: one interface (`DualEncoder`), adapters for open_clip, Hugging Face and `lace-towers`.

Importing this package imports none of the adapters: `load_encoder` imports the one a model name needs.
"""

from lace.encoders.base import DualEncoder
from lace.encoders.registry import load_encoder, register_encoder

__all__ = ["DualEncoder", "load_encoder", "register_encoder"]
