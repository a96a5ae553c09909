"""Two processes of a data-parallel job train the weights one process trains on the same global batch.

Plain SGD without clipping keeps every error of the gradient's scale in the weights (AdamW divides it
out, clipping caps it); LACE's counterfactual edits are drawn per sample, and the dictionary refresh
pools the global batch, so the edits and the refit are those of one process. The two processes are forked
from the tests' fork server in the environment torchrun gives its workers (tests/robustness/test_preemption.py
runs lace under torchrun itself).
"""

import json
from pathlib import Path

import pytest
import torch

import lace.train.loop
from lace.config import with_changes
from lace.train import TrainConfig, train
from lace.train.config import train_config
from tests.conftest import make_images
from tests.distributed_support import TOLERANCE, plain_sgd, train_in_two_processes
from tests.test_train import COLOURS, WORLD_VOCABULARY, vocabulary_dictionary


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, TrainConfig]:
    """A plain run and a LACE run (dictionary edits of both modalities, rule-made captions, a refresh)."""
    folder = tmp_path_factory.mktemp("distributed")
    names = make_images(folder / "images", 16)
    (folder / "pairs.csv").write_text("filepath,caption\n" + "".join(
        f"images/{n},a {COLOURS[i % 4]} square left of a {'circle' if i % 2 else 'star'}\n" for i, n in enumerate(names)))
    captions = [f"a {c} {s} left of a {c2} star" for c in COLOURS for s in ("circle", "square") for c2 in ("pink", "cyan")]
    dictionary, directions, _, _ = vocabulary_dictionary(3, captions, 16)
    dictionary.save(folder / "dictionary")
    directions.save(folder / "dictionary")
    plain = train_config(model="lace-micro-32", data=str(folder / "pairs.csv"), output="", steps=3, batch_size=8,
                        lr=0.5, warmup_steps=1, grad_clip_norm=None, checkpoint_every=0, device="cpu", seed=3)
    lace_run = with_changes(plain, {"counterfactual_captions": True, "counterfactual_images": True, "dictionary": str(folder / "dictionary"), "vocabulary": WORLD_VOCABULARY, "caption_negatives": True, "refresh_dictionary_every": 1, "refresh_pool_size": 16, "grad_accumulation": 2})
    return {name: with_changes(config, {"output": str(folder / f"{name}-two")})
            for name, config in (("plain", plain), ("lace", lace_run))}


def one_process(config: TrainConfig, monkeypatch, **changes) -> dict[str, torch.Tensor]:
    monkeypatch.setattr(lace.train.loop, "build_optimizer", plain_sgd)
    output = str(Path(config.run.output).with_name(Path(config.run.output).name.replace("-two", "-one")))
    changes.setdefault("output", output)
    result = train(with_changes(config, {"overwrite": True, **changes}), progress=False)
    return {k: v.detach().clone() for k, v in result.model.state_dict().items()}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
def test_two_processes_match_one_with_plain_sgd_and_lace_edits(configs, tmp_path, monkeypatch):
    ones = {}
    for name, config in configs.items():
        two = train_in_two_processes(config, Path(config.run.output), build_optimizer=plain_sgd)
        one = ones[name] = one_process(config, monkeypatch)
        difference = largest_difference(two, one)
        print(f"{name}: largest difference between 2 processes and 1: {difference:.2e}")
        assert difference <= TOLERANCE, f"{name}: 2 processes differ from 1 by {difference:.2e}"
        if name == "lace":
            metrics = [json.loads(line) for line in (Path(config.run.output) / "metrics.jsonl").read_text().splitlines()]
            assert all(m["caption_negatives_valid_rows"] > 0 and m["image_negatives_valid_rows"] > 0 for m in metrics)
    # the check can fail: a gradient twice too large (as from summing instead of averaging over two
    # processes) is, under plain SGD, a doubled learning rate, and moves the weights far beyond the tolerance
    doubled = one_process(configs["plain"], monkeypatch, lr=2 * configs["plain"].optim.lr,
                          output=str(tmp_path / "doubled"))
    moved = largest_difference(doubled, ones["plain"])
    print(f"a doubled gradient moves the weights by up to {moved:.2e}")
    assert moved > 100 * TOLERANCE


def test_a_rows_edits_do_not_depend_on_the_rows_beside_it():
    """Per-row generators: a batch edited whole and edited as two shards (two processes) agree row by row."""
    from lace.concepts.labelled import LabelledDictionary
    from lace.concepts.labelling import label_atoms
    from lace.edits import EditConfig, build_editor
    from lace.row_random import RowGenerators

    captions = [f"a {c} {s} left of a {c2} star" for c in COLOURS for s in ("circle", "square") for c2 in ("pink", "cyan")]
    dictionary, directions, _, texts = vocabulary_dictionary(3, captions, 16)
    editor = build_editor(LabelledDictionary(dictionary, directions, label_atoms(dictionary, directions)), EditConfig())
    seeds = list(range(100, 100 + len(texts)))
    whole = editor.counterfactuals(texts, "text", 3, RowGenerators(seeds))
    half = len(texts) // 2
    shards = [editor.counterfactuals(texts[a:b], "text", 3, RowGenerators(seeds[a:b]))
              for a, b in ((0, half), (half, len(texts)))]
    assert whole.valid.any(), "no valid edit: the comparison would prove nothing"
    assert torch.equal(whole.valid, torch.cat([s.valid for s in shards]))
    assert torch.equal(whole.records.kind, torch.cat([s.records.kind for s in shards]))
    torch.testing.assert_close(whole.embeddings, torch.cat([s.embeddings for s in shards]), rtol=0, atol=1e-6)
    # one generator for the batch, as before: the second shard's rows get other edits than in the whole batch
    single = editor.counterfactuals(texts, "text", 3, torch.Generator().manual_seed(0))
    second = editor.counterfactuals(texts[half:], "text", 3, torch.Generator().manual_seed(0))
    assert not torch.equal(single.records.kind[half:], second.records.kind)
