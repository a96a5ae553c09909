"""Fuzzing the config loader (`lace.config`): YAML files and command-line flags of every command config.

YAML files are dumps of config-shaped values (each field kept, dropped, replaced by any value, or
given as text), arbitrary text and bytes. Flags are every field given any text. Loading and the
config's own `validate` either give a config whose every field holds its declared type, or raise
`LaceInputError` naming the file or the field; a flag the parser cannot read is argparse's usage
error (exit status 2) naming the flag.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import re
import tempfile
import types
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from lace.config import add_config_arguments, config_from_args, config_to_dict, load_config
from lace.data.world.config import WorldConfig
from lace.demo.config import DemoConfig
from lace.edits.config import EditConfig
from lace.errors import LaceInputError
from lace.eval.runner import EvalConfig
from lace.experiment.dictionary import DictionaryConfig
from lace.study.config import StudyConfig
from lace.train.config import TrainConfig
from tests.robustness.fuzz_support import JSON_VALUES, expect_input_error, fuzz, near_few

CONFIGS = (TrainConfig, EditConfig, WorldConfig, EvalConfig, DemoConfig, DictionaryConfig, StudyConfig)
REQUIRED = {StudyConfig: {"data": "flickr8k", "out": "runs/study"}}


def template(cls: type) -> dict:
    return {**config_to_dict(cls(**REQUIRED.get(cls, {}))), **REQUIRED.get(cls, {})}


def holds(annotation, value) -> bool:
    """True when `value` is of the (resolved) type `annotation`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(holds(arg, value) for arg in args)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, float)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(holds(args[0], item) for item in value)
        return len(value) == len(args) and all(holds(a, item) for a, item in zip(args, value))
    if origin is list:
        return isinstance(value, list) and all(holds(args[0], item) for item in value)
    if dataclasses.is_dataclass(annotation):
        return isinstance(value, annotation) and well_typed(value)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def well_typed(config) -> bool:
    hints = typing.get_type_hints(type(config))
    wrong = [f.name for f in dataclasses.fields(config) if not holds(hints[f.name], getattr(config, f.name))]
    assert not wrong, f"{type(config).__name__} loaded fields of the wrong type: {wrong}"
    return True


def field_names(cls: type) -> list[str]:
    names = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        names.append(field.name)
        nested = typing.get_args(hints[field.name]) or (hints[field.name],)
        for inner in nested:
            if dataclasses.is_dataclass(inner):
                names += field_names(inner)
    return names


def validated(config):
    validate = getattr(config, "validate", None)
    return validate() if validate is not None else config


def load_yaml_text(cls: type, content: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        config = expect_input_error(lambda: validated(load_config(cls, path)), path, *field_names(cls))
    if config is not None:
        well_typed(config)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.__name__)
@fuzz(40)
@given(data=st.data())
def test_config_shaped_yaml(cls, data):
    shaped = near_few(template(cls))
    value = data.draw(shaped | st.builds(lambda d: {k: str(v) for k, v in d.items()}, shaped))
    load_yaml_text(cls, yaml.safe_dump(value, allow_unicode=True))


@fuzz(60)
@given(JSON_VALUES | st.text(max_size=40) | st.binary(max_size=40), st.sampled_from(CONFIGS))
def test_any_yaml_file(value, cls):
    load_yaml_text(cls, value if isinstance(value, (str, bytes)) else yaml.safe_dump(value))


@functools.cache
def flag_parser(cls: type) -> tuple[argparse.ArgumentParser, list[argparse.Action]]:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, cls)
    return parser, [action for action in parser._actions if action.option_strings and action.dest != "help"]


@pytest.mark.parametrize("cls", [c for c in CONFIGS if c not in REQUIRED], ids=lambda cls: cls.__name__)
@fuzz(30)
@given(data=st.data())
def test_any_flag_value(cls, data):  # `lace study` builds StudyConfig from its own positional arguments
    parser, flags = flag_parser(cls)
    action = data.draw(st.sampled_from(flags))
    text = data.draw(st.text(max_size=12) | st.sampled_from(["1", "0.5", "-3", "none", "true", "a,b"]))
    flag = action.option_strings[0]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args([flag] if action.nargs == 0 else [f"{flag}={text}"])
    except SystemExit as exit:
        assert exit.code == 2 and flag in errors.getvalue(), errors.getvalue()
        return
    config = expect_input_error(lambda: validated(config_from_args(cls, args)), *field_names(cls))
    if config is not None:
        well_typed(config)


@pytest.mark.parametrize(("cls", "content", "named"), [
    (TrainConfig, "steps: [1, 2]\n", "field 'steps'"),
    (TrainConfig, "steps: 1.5\n", "field 'steps'"),
    (TrainConfig, "steps: true\n", "field 'steps'"),
    (TrainConfig, "model: {a: 1}\n", "field 'model'"),
    (EvalConfig, "edit: fast\n", "field 'edit'"),
    (TrainConfig, "edit: {gamma: [0]}\n", "field 'gamma'"),
    (TrainConfig, "1: 2\nsteps: 3\n", "unknown field(s) ['1']"),
    (TrainConfig, "steps: [\n", "not valid YAML"),
    (TrainConfig, b"steps: \xff\n", "not UTF-8"),
    (StudyConfig, "out: runs\n", "missing required field(s) ['data']"),
], ids=lambda value: str(value)[:20])
def test_failures_found_by_fuzzing_are_input_errors(cls, content, named, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(LaceInputError, match=re.escape(named)) as error:
        validated(load_config(cls, path))
    assert str(path) in str(error.value)
