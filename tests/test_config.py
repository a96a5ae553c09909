import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from lace.config import (
    add_config_arguments,
    config_from_args,
    config_from_dict,
    config_to_dict,
    field_docs,
    load_config,
    with_changes,
)
from lace.errors import LaceInputError
from lace.experiment.dictionary import DictionaryConfig


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
    assert config.run.steps == 3 and config.negatives.edit == EditConfig(strength=2.0, effect_check=False)
    assert config.negatives.edit.kinds == ("attenuate", "swap", "transplant")  # one default for the kinds: rebind opt-in
    path = tmp_path / "train.yaml"
    path.write_text("edit: {strength: 3.0, kinds: [swap, rebind]}\nsteps: 5\n")
    config = config_from_args(TrainConfig, parser.parse_args(["--edit-gamma", "0.5"]), yaml_path=path)
    assert config.negatives.edit == EditConfig(kinds=("swap", "rebind"), strength=3.0, gamma=0.5) and config.run.steps == 5
    path.write_text("edit: {strenght: 3.0}\n")
    with pytest.raises(LaceInputError, match="strenght"):
        load_config(TrainConfig, path)


def test_eval_config_nests_the_search_and_the_fixes_under_the_flags_and_yaml_names_it_had(tmp_path):
    from lace.eval.neighbours import KnnOptions
    from lace.eval.rerank import RerankOptions
    from lace.eval.runner import EvalConfig

    expected = (KnnOptions(backend="faiss", index="ivf", nprobe=3, seed=None),
                RerankOptions(fixes=("csls", "qbnorm"), csls_k=5, qbnorm_beta=10.0, dn_weight=0.25))
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, EvalConfig)
    args = parser.parse_args(["--knn", "faiss", "--knn-index", "ivf", "--knn-nprobe", "3", "--rerank", "csls,qbnorm",
                              "--csls-k", "5", "--qbnorm-beta", "10", "--dn-weight", "0.25"])
    from_flags = config_from_args(EvalConfig, args)
    assert (from_flags.knn, from_flags.rerank) == expected
    flat = tmp_path / "flat.yaml"  # a config file written before the search and the fixes were nested
    flat.write_text("knn: faiss\nknn_index: ivf\nknn_nprobe: 3\nrerank: [csls, qbnorm]\ncsls_k: 5\n"
                    "qbnorm_beta: 10\ndn_weight: 0.25\n")
    nested = tmp_path / "nested.yaml"
    nested.write_text("knn: {backend: faiss, index: ivf, nprobe: 3}\n"
                      "rerank: {fixes: [csls, qbnorm], csls_k: 5, qbnorm_beta: 10, dn_weight: 0.25}\n")
    for path in (flat, nested):
        config = load_config(EvalConfig, path)
        assert (config.knn, config.rerank) == expected, path
    assert load_config(EvalConfig, flat) == from_flags
    twice = tmp_path / "twice.yaml"
    twice.write_text("knn: {index: flat}\nknn_index: ivf\n")
    with pytest.raises(LaceInputError, match="'knn_index' sets 'knn.index', which is also given"):
        load_config(EvalConfig, twice)
    bad = tmp_path / "bad.yaml"
    bad.write_text("csls_k: 0\n")
    with pytest.raises(LaceInputError, match=f"{bad}.*csls_k"):
        load_config(EvalConfig, bad)


def test_demo_config_nests_its_dictionary_and_keeps_atoms_and_sparsity(tmp_path):
    from lace.demo.config import DEMO_DICTIONARY, DemoConfig

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, DemoConfig)
    flags = {name for action in parser._actions for name in action.option_strings}
    assert {"--atoms", "--sparsity", "--dictionary-epochs", "--dictionary-calibration"} <= flags
    assert not flags & {"--dictionary-atoms", "--dictionary-seed", "--dictionary-vocabulary"}  # the demo sets these
    config = config_from_args(DemoConfig, parser.parse_args(["--atoms", "32", "--sparsity", "4",
                                                             "--dictionary-epochs", "2"]))
    assert config.dictionary == DictionaryConfig(**{**config_to_dict(DEMO_DICTIONARY), "atoms": 32, "sparsity": 4,
                                                    "epochs": 2})
    flat = tmp_path / "flat.yaml"
    flat.write_text("atoms: 64\nsparsity: 5\nseed: 2\n")
    assert load_config(DemoConfig, flat).dictionary == DictionaryConfig(
        **{**config_to_dict(DEMO_DICTIONARY), "atoms": 64, "sparsity": 5})
    seeded = tmp_path / "seeded.yaml"
    seeded.write_text("dictionary: {seed: 3}\n")
    with pytest.raises(LaceInputError, match=r"field 'dictionary.seed'.*the demo sets it"):
        load_config(DemoConfig, seeded)


def test_demo_config_fine_tunes_a_train_config_delta_under_the_flags_and_yaml_names_it_had(tmp_path):

    from lace.demo.config import DEMO_FINETUNE, DemoConfig

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, DemoConfig)
    flags = {name for action in parser._actions for name in action.option_strings}
    assert {"--finetune-steps", "--finetune-lr", "--n-edits", "--edit-n-edits", "--counterfactual-weight",
            "--edit-strength", "--local-layer", "--local-n-edits", "--refresh-dictionary-every",
            "--finetune-weight-decay"} <= flags
    assert not flags & {"--finetune-model", "--finetune-seed", "--finetune-local-image-negatives",
                        "--finetune-edit-strength", "--finetune-batch-size"}  # the demo and its variants set these
    expected = with_changes(DEMO_FINETUNE, {"steps": 40, "lr": 1e-3, "counterfactual_weight": 0.5, "weight_decay": 0.0,
                                            "edit": {"n_edits": 8, "strength": 2.0}, "local": {"layer": "layer2"}})
    args = parser.parse_args(["--finetune-steps", "40", "--finetune-lr", "1e-3", "--n-edits", "8",
                              "--edit-strength", "2", "--local-layer", "layer2", "--counterfactual-weight", "0.5",
                              "--finetune-weight-decay", "0"])
    assert config_from_args(DemoConfig, args).finetune == expected
    flat = tmp_path / "flat.yaml"  # a demo config written before the fine-tune was nested
    flat.write_text("finetune_steps: 40\nfinetune_lr: 0.001\nn_edits: 8\nedit: {strength: 2}\nlocal_layer: layer2\n"
                    "counterfactual_weight: 0.5\n")
    assert load_config(DemoConfig, flat).finetune == with_changes(
        expected, {"weight_decay": DEMO_FINETUNE.optim.weight_decay})
    model = tmp_path / "model.yaml"
    model.write_text("finetune: {model: ViT-B-32}\n")
    with pytest.raises(LaceInputError, match=r"field 'finetune.model'"):
        load_config(DemoConfig, model)


def test_train_keeps_the_flag_and_yaml_key_of_m_after_it_moved_into_the_editor(tmp_path):
    from lace.train.config import TrainConfig

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TrainConfig)
    assert config_from_args(TrainConfig, parser.parse_args(["--n-edits", "2"])).negatives.edit.n_edits == 2
    assert config_from_args(TrainConfig, parser.parse_args(["--edit-n-edits", "3"])).negatives.edit.n_edits == 3
    path = tmp_path / "train.yaml"
    path.write_text("n_edits: 5\n")
    assert config_from_args(TrainConfig, parser.parse_args([]), yaml_path=path).negatives.edit.n_edits == 5


def test_train_config_reads_flat_and_nested_keys_alike_and_writes_the_flat_form_old_run_folders_have(tmp_path):
    from lace.train.config import TrainConfig, train_config

    flat = tmp_path / "flat.yaml"  # a YAML file, or a run folder's config.json, from before the split
    flat.write_text("lr: 0.0001\ncaption_negatives: true\nsteps: 7\nedit: {n_edits: 2}\nlocal_layer: layer2\n"
                    "log_every: 3\nvocabulary: v.yaml\n")
    nested = tmp_path / "nested.yaml"
    nested.write_text("optim: {lr: 0.0001}\narm: {caption_negatives: true}\nrun: {steps: 7, vocabulary: v.yaml}\n"
                      "negatives: {edit: {n_edits: 2}, local: {layer: layer2}}\nlog: {log_every: 3}\n")
    config = load_config(TrainConfig, flat)
    assert config == load_config(TrainConfig, nested) == train_config(
        lr=1e-4, caption_negatives=True, steps=7, n_edits=2, local_layer="layer2", log_every=3, vocabulary="v.yaml")
    assert (config.optim.lr, config.arm.caption_negatives, config.run.steps, config.negatives.edit.n_edits,
            config.negatives.local.layer, config.log.log_every) == (1e-4, True, 7, 2, "layer2", 3)
    written = config_to_dict(config)  # what config.json holds: every key at the top, as before the split
    assert written["lr"] == 1e-4 and written["edit"]["n_edits"] == 2 and "optim" not in written
    assert config_from_dict(TrainConfig, written) == config
    both = tmp_path / "both.yaml"
    both.write_text("n_edits: 3\nedit: {n_edits: 2}\n")
    with pytest.raises(LaceInputError, match="also given"):
        load_config(TrainConfig, both)
