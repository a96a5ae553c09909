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


def test_nested_edit_config_from_flags_and_yaml(tmp_path):

    from lace.edits import EditConfig
    from lace.train.config import TrainConfig

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TrainConfig)
    help_text = parser.format_help()
    for knob in ("kinds", "gamma", "strength", "target", "tau-align", "tau-use", "effect-check", "atom-level",
                 "swap-min-gap", "attenuate-margin"):
        assert f"--edit-{knob}" in help_text
    args = parser.parse_args(["--edit-strength", "2", "--no-edit-effect-check", "--steps", "3"])
    config = config_from_args(TrainConfig, args)
    assert config.steps == 3 and config.edit == EditConfig(strength=2.0, effect_check=False)
    assert config.edit.kinds == ("attenuate", "swap", "transplant")  # one default for the kinds: rebind opt-in
    path = tmp_path / "train.yaml"
    path.write_text("edit: {strength: 3.0, kinds: [swap, rebind]}\nsteps: 5\n")
    config = config_from_args(TrainConfig, parser.parse_args(["--edit-gamma", "0.5"]), yaml_path=path)
    assert config.edit == EditConfig(kinds=("swap", "rebind"), strength=3.0, gamma=0.5) and config.steps == 5
    path.write_text("edit: {strenght: 3.0}\n")
    with pytest.raises(LaceInputError, match="strenght"):
        load_config(TrainConfig, path)
