"""Dual encoders: one interface (`DualEncoder`), adapters for open_clip, Hugging Face and `lace-towers`."""

from lace.encoders import towers as _towers  # noqa: F401  registers `lace-towers`
from lace.encoders.base import DualEncoder
from lace.encoders.registry import load_encoder, register_encoder

__all__ = ["DualEncoder", "load_encoder", "register_encoder"]
