"""Fuzzing the vocabulary loader (`lace.concepts.vocabulary.load_vocabulary`).

Files are YAML dumps of vocabulary-shaped values (fields kept, dropped or replaced by any value),
arbitrary text and arbitrary bytes. The loader either returns a vocabulary with unique, typed,
non-empty names, or raises `LaceInputError` naming the file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from lace.concepts.vocabulary import KINDS, load_vocabulary
from tests.robustness.fuzz_support import JSON_VALUES, expect_input_error, fuzz, near

TEMPLATE = {"name": "toy", "objects": ["cube", "ball"], "attributes": {"colour": ["red", "blue"]},
            "relations": ["left of", "on"]}


def load_text(content: str | bytes):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "vocabulary.yaml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        vocabulary = expect_input_error(lambda: load_vocabulary(path), path)
    if vocabulary is not None:
        assert len(vocabulary) > 0 and len(set(vocabulary.names)) == len(vocabulary.names)
        for concept in vocabulary.concepts:
            assert concept.kind in KINDS and concept.name.strip() == concept.name and concept.name
            assert vocabulary.same_type(concept.name, concept.name)
    return vocabulary


@fuzz(150)
@given(near(TEMPLATE))
def test_vocabulary_shaped_yaml(value):
    load_text(yaml.safe_dump(value, allow_unicode=True))


@fuzz(60)
@given(JSON_VALUES)
def test_any_yaml_value(value):
    load_text(yaml.safe_dump(value, allow_unicode=True))


@fuzz(100)
@given(st.text(max_size=60) | st.binary(max_size=60))
@example(b"\x80")  # once a UnicodeDecodeError
def test_any_text_or_bytes(content):
    load_text(content)


@fuzz(40)
@given(st.dictionaries(st.integers(0, 3) | st.booleans() | st.sampled_from(["objects", "x"]),
                       st.lists(st.text(max_size=5), max_size=2), max_size=3))
@example({0: [], "x": []})  # once a TypeError sorting the unknown keys
def test_non_string_keys(value):
    load_text(yaml.safe_dump(value))
