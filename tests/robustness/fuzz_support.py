"""Shared pieces of the fuzz tests: settings, JSON-like value strategies, and the one allowed failure.

Every fuzz test runs with `FUZZ` (or `fuzz(n)`): derandomised (the same examples on every run), no
deadline (a busy machine must not fail a test), and no example database, so nothing is written into
the repository. A reader may fail only with `LaceInputError`, and its message must name the file
(or the field) it refuses; `expect_input_error` checks both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from lace.errors import LaceInputError


def fuzz(max_examples: int) -> settings:
    """Deterministic settings for a fuzz test of `max_examples` examples."""
    return settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


SCALARS = (st.none() | st.booleans() | st.integers(-(2**40), 2**40)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
"""Any value a JSON file (or a YAML file) can hold, NaN and infinity included."""

_DROP = object()


def near(template: Any) -> st.SearchStrategy:
    """Values shaped like `template`, each part kept, replaced by any JSON value, or (in a dict) dropped.

    Most draws are structurally valid but wrong in one or a few places: the inputs a reader must refuse
    with a clear message rather than crash on.
    """
    if isinstance(template, dict):
        parts = {key: st.one_of(near(value), JSON_VALUES, st.just(_DROP)) for key, value in template.items()}
        extra = st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=1)
        return st.builds(lambda kept, more: {**more, **{k: v for k, v in kept.items() if v is not _DROP}},
                         st.fixed_dictionaries(parts), extra)
    if isinstance(template, list):
        items = st.one_of(*(near(item) for item in template)) if template else JSON_VALUES
        return st.lists(items, max_size=max(3, len(template)))
    if isinstance(template, str):
        return st.one_of(st.just(template), st.text(max_size=12))
    return st.one_of(st.just(template), JSON_VALUES)


def near_few(template: dict, max_changes: int = 3) -> st.SearchStrategy:
    """`template` with up to `max_changes` of its fields each made `near` its value, replaced or dropped:
    cheaper than `near` on a mapping of many fields, and wrong in few places at a time."""
    def changed(keys: list[str]) -> st.SearchStrategy:
        parts = {key: st.one_of(near(template[key]), JSON_VALUES, st.just(_DROP)) for key in keys}
        return st.fixed_dictionaries(parts).map(
            lambda new: {k: new.get(k, v) for k, v in template.items() if new.get(k, v) is not _DROP})

    return st.lists(st.sampled_from(sorted(template)), max_size=max_changes, unique=True).flatmap(changed)


def expect_input_error(call: Callable[[], Any], *names: object) -> Any:
    """Run `call`: return its result, or None when it raised `LaceInputError` naming one of `names`.

    Any other exception propagates and fails the test: it is a bug in the reader.
    """
    try:
        return call()
    except LaceInputError as error:
        message = str(error)
        assert any(str(name) in message for name in names), f"message names none of {names}: {message}"
        return None
