"""LACE: Latent Alignment via Counterfactual Embeddings.

Fine-tunes CLIP-style dual encoders with counterfactual hard negatives made in
embedding space, for both modalities, and measures the geometry of the shared space.
"""

__version__ = "0.1.0"
