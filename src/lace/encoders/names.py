"""The model-name prefixes of the Hugging Face adapter, in a module of their own: the front door
(`lace.encoders.registry`) tells a Hugging Face model by its name without importing the adapter."""

HF_PREFIX = "hf-clip:"
"""`hf-clip:<folder or hub id>`: a transformers `CLIPModel`."""
HF_SIGLIP_PREFIX = "hf-siglip:"
"""`hf-siglip:<folder or hub id>`: a transformers `SiglipModel`."""
