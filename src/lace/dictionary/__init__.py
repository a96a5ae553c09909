"""Sparse concept dictionary: batched sparse-coding kernels and the `ConceptDictionary` estimator."""

from lace.dictionary.concept_dictionary import ConceptDictionary, EncodedEmbeddings
from lace.dictionary.sparse_coding import SparseCodes, decode, encode

__all__ = ["ConceptDictionary", "EncodedEmbeddings", "SparseCodes", "decode", "encode"]
