import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from lace.config import (
    add_config_arguments,
    config_from_args,
    config_to_dict,
    field_docs,
    load_config,
)
from lace.errors import LaceInputError


@dataclass
class ExampleConfig:
    steps: int = 10
    """Optimiser steps to run."""
    lr: float = 1e-3
    """Peak learning rate."""
    kinds: tuple[str, ...] = ("swap", "transplant")
    """Edit kinds, comma separated."""
    images: bool = True
    """Make counterfactual images."""
    out: Path | None = None
    """Output folder."""


def test_field_docstrings_become_help():
    assert field_docs(ExampleConfig)["lr"] == "Peak learning rate."
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, ExampleConfig)
    assert "Peak learning rate." in parser.format_help()


def test_defaults_then_yaml_then_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 50\nlr: 0.1\nkinds: [swap]\n")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, ExampleConfig)
    args = parser.parse_args(["--lr", "0.5", "--no-images", "--kinds", "attenuate,swap", "--out", "x"])
    config = config_from_args(ExampleConfig, args, path)
    assert config == ExampleConfig(steps=50, lr=0.5, kinds=("attenuate", "swap"), images=False, out=Path("x"))
    assert config_to_dict(config)["out"] == "x"


def test_unknown_yaml_field_names_file_and_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("stpes: 5\n")
    with pytest.raises(LaceInputError, match=r"c.yaml.*stpes"):
        load_config(ExampleConfig, path)
