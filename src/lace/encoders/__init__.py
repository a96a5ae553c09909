"""Dual encoders: one interface (`DualEncoder`), adapters for open_clip and Hugging Face."""

from lace.encoders.base import DualEncoder
from lace.encoders.registry import load_encoder, register_encoder

__all__ = ["DualEncoder", "load_encoder", "register_encoder"]
