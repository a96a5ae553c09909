"""The trainer: ablations share data and seeds, resumption is exact, checkpoints are safe, export is plain."""

from pathlib import Path
from types import SimpleNamespace

import open_clip
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from lace.cli import main
from lace.config import with_changes
from lace.errors import LaceInputError
from lace.io import read_json
from lace.row_random import normal
from lace.train import TensorPairs, TrainConfig, export_run, train
from lace.train.checkpoints import complete_checkpoints, latest_checkpoint
from lace.train.config import train_config
from tests.conftest import make_images

WORLD_VOCABULARY = str(Path(__file__).resolve().parents[1] / "src/lace/data/world/vocabulary.yaml")
COLOURS = ["red", "green", "blue", "yellow"]


@pytest.fixture
def pairs_csv(tmp_path: Path) -> Path:
    """24 small images, one caption each (two for every third image), as a CSV."""
    names = make_images(tmp_path / "data" / "images", 24)
    rows = []
    for i, name in enumerate(names):
        rows.append(f"images/{name},a {COLOURS[i % 4]} square left of a circle")
        if i % 3 == 0:
            rows.append(f"images/{name},a small {COLOURS[i % 4]} square above a star")
    path = tmp_path / "data" / "pairs.csv"
    path.write_text("filepath,caption\n" + "\n".join(rows) + "\n")
    return path


def config_for(path: Path, out: Path, **changes) -> TrainConfig:
    base = train_config(model="lace-micro-32", data=str(path), output=str(out), steps=4, batch_size=8, lr=2e-3,
                       warmup_steps=1, log_every=1, checkpoint_every=2, device="cpu", seed=3)
    return with_changes(base, {**changes})


class NudgeEditor:
    """Stand-in with the `CounterfactualEditor` interface: M nudged copies of each embedding."""

    def __init__(self, dim: int):
        self.dictionary = SimpleNamespace(atoms_=torch.zeros(8, dim))
        self.calls = []

    def counterfactuals(self, z, modality, n_edits, generator=None):
        self.calls.append((modality, tuple(z.shape), z.requires_grad))
        noise = normal((z.shape[0], n_edits, z.shape[1]), generator, z.device)
        valid = torch.ones(z.shape[0], n_edits, dtype=torch.bool)
        valid[0] = False  # one row with no valid edit
        return SimpleNamespace(embeddings=F.normalize(z.unsqueeze(1) + 0.1 * noise, dim=-1), valid=valid, records=None)

    concept_arithmetic = counterfactuals


def weights_of(result) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in result.model.state_dict().items()}


def test_ablations_differ_only_in_their_switch(pairs_csv, tmp_path):
    seen = {}
    runs = {
        "plain": ({}, None),
        "rule_negatives": ({"caption_negatives": True, "vocabulary": WORLD_VOCABULARY}, None),
        "lace": ({"counterfactual_captions": True, "counterfactual_images": True}, NudgeEditor(64)),
    }
    results = {}
    for name, (switches, editor) in runs.items():
        order = []
        config = config_for(pairs_csv, tmp_path / name, steps=3, checkpoint_every=0, **switches)
        results[name] = train(config, editor=editor, progress=False, on_batch=lambda n, idx, order=order: order.append((n, idx)))
        seen[name] = order
        saved = read_json(tmp_path / name / "config.json")
        differing = {k for k, v in saved.items() if v != read_json(tmp_path / "plain" / "config.json")[k]}
        assert differing <= set(switches) | {"output"}
    assert seen["plain"] == seen["rule_negatives"] == seen["lace"]
    assert len(seen["plain"]) == 3 and all(len(idx) == 8 for _, idx in seen["plain"])
    metrics = {name: [read_json_line(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
               for name in runs}
    # The same first batch and initial weights: the plain parts of the first losses agree exactly.
    assert metrics["plain"][0]["plain_loss"] == pytest.approx(metrics["lace"][0]["plain_loss"], abs=1e-6)
    assert metrics["lace"][0]["loss"] > metrics["lace"][0]["plain_loss"]
    assert metrics["rule_negatives"][0]["caption_negatives_valid_rows"] == 1.0
    assert metrics["lace"][0]["image_negatives_valid_rows"] == pytest.approx(7 / 8)
    editor = runs["lace"][1]
    assert {c[0] for c in editor.calls} == {"text", "image"} and all(c[2] for c in editor.calls)
    assert not torch.equal(results["plain"].model.model.visual.conv1.weight,
                           results["lace"].model.model.visual.conv1.weight)


def read_json_line(line: str) -> dict:
    import json

    return json.loads(line)


@pytest.mark.slow
def test_kill_and_resume_reaches_the_same_weights(pairs_csv, tmp_path):
    config = config_for(pairs_csv, tmp_path / "whole", grad_accumulation=2, caption_negatives=True,
                        vocabulary=WORLD_VOCABULARY)
    whole = weights_of(train(config, progress=False))

    def kill_after_two_steps(number, indices):
        if number == 4:  # first micro-batch of step 3, after the step-2 checkpoint
            raise KeyboardInterrupt

    interrupted = with_changes(config, {"output": str(tmp_path / "killed")})
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, progress=False, on_batch=kill_after_two_steps)
    assert latest_checkpoint(tmp_path / "killed").stem == "step_0000002"
    resumed = train(with_changes(interrupted, {"resume": "latest"}), progress=False)
    assert resumed.steps == 4
    for key, value in weights_of(resumed).items():
        torch.testing.assert_close(value, whole[key], rtol=0, atol=1e-6, msg=key)
    steps = [read_json_line(line)["step"] for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_export_loads_in_open_clip_with_the_same_embeddings(pairs_csv, tmp_path):
    result = train(config_for(pairs_csv, tmp_path / "run", steps=2), progress=False)
    out = tmp_path / "model.pt"
    assert main(["export", "--run", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert read_json(str(out) + ".json")["model"] == "lace-micro-32"
    state = torch.load(out, weights_only=True)
    assert all(not k.startswith("model.") for k in state)
    clip = open_clip.create_model("lace-micro-32", pretrained=str(out))
    clip.eval()
    result.model.eval()
    pixels = torch.randn(3, 3, 32, 32)
    tokens = result.model.tokenize(["a red square", "a blue circle", "two stars"])
    with torch.no_grad():
        torch.testing.assert_close(F.normalize(clip.encode_image(pixels), dim=-1), result.model.encode_images(pixels))
        torch.testing.assert_close(F.normalize(clip.encode_text(tokens), dim=-1), result.model.encode_tokens(tokens))
    with pytest.raises(LaceInputError, match="exists"):
        export_run(tmp_path / "run", out)


@pytest.mark.slow
def test_corrupted_checkpoint_gives_a_clear_error_and_keeps_the_previous(pairs_csv, tmp_path):
    run = tmp_path / "run"
    train(config_for(pairs_csv, run), progress=False)
    assert [m.stem for m in complete_checkpoints(run)] == ["step_0000002", "step_0000004"]
    # A write killed half-way leaves files without a manifest: never the latest, never listed.
    (run / "checkpoints" / "step_0000006.safetensors").write_bytes(b"half")
    assert latest_checkpoint(run).stem == "step_0000004"
    weights = run / "checkpoints" / "step_0000004.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(LaceInputError, match=r"step_0000004.safetensors: checkpoint is damaged.*step_0000002"):
        train(config_for(pairs_csv, run, steps=6, resume="latest"), progress=False)
    assert (run / "checkpoints" / "step_0000002.safetensors").is_file()
    assert load_file(str(run / "checkpoints" / "step_0000002.safetensors"))
    resumed = train(config_for(pairs_csv, run, steps=6, resume=str(run / "checkpoints" / "step_0000002")),
                    progress=False)
    assert resumed.steps == 6


def test_wrong_dimension_dictionary_is_refused_before_the_first_step(pairs_csv, tmp_path):
    seen = []
    config = config_for(pairs_csv, tmp_path / "run", counterfactual_captions=True)
    with pytest.raises(LaceInputError, match="dimension 32.*dimension 64"):
        train(config, editor=NudgeEditor(32), progress=False, on_batch=lambda n, i: seen.append(n))
    assert seen == []

    from lace.dictionary.concept_dictionary import ConceptDictionary

    folder = tmp_path / "dictionary"
    pool = F.normalize(torch.randn(64, 32), dim=-1)
    ConceptDictionary(n_atoms=8, sparsity=2, batch_size=32).fit(pool, pool).save(folder)
    with pytest.raises(LaceInputError, match="dimension 32"):
        train(with_changes(config, {"output": str(tmp_path / "run2"), "dictionary": str(folder), "vocabulary": WORLD_VOCABULARY}),
              progress=False, on_batch=lambda n, i: seen.append(n))
    assert seen == []


def test_missing_images_are_skipped_and_counted_or_fatal(pairs_csv, tmp_path):
    with open(pairs_csv, "a") as f:
        f.write("images/not_there.png,a ghost\n")
        f.write("images/broken.png,a broken image\n")
    (pairs_csv.parent / "images" / "broken.png").write_bytes(b"not a png")
    result = train(config_for(pairs_csv, tmp_path / "skip", steps=6, checkpoint_every=0), progress=False)
    # The missing file is dropped up front; the unreadable one each time its batch comes round.
    assert result.skipped_images >= 2
    assert result.last_metrics["skipped_images"] == result.skipped_images
    with pytest.raises(LaceInputError, match="not_there.png"):
        train(config_for(pairs_csv, tmp_path / "fatal", on_missing_image="error"), progress=False)


def test_in_memory_tensors_and_cli(pairs_csv, tmp_path):
    pixels = torch.randn(16, 3, 32, 32)
    captions = [[f"a {COLOURS[i % 4]} square", "a shape"] for i in range(16)]
    result = train(config_for(None, tmp_path / "memory", steps=2, data=None), dataset=TensorPairs(pixels, captions),
                   progress=False)
    assert result.steps == 2 and result.checkpoint_path.is_file()
    code = main(["train", "--model", "lace-micro-32", "--data", str(pairs_csv), "--output", str(tmp_path / "cli"),
                 "--steps", "2", "--batch-size", "8", "--device", "cpu", "--no-progress",
                 "--caption-negatives", "--vocabulary", WORLD_VOCABULARY])
    assert code == 0
    assert read_json(tmp_path / "cli" / "config.json")["caption_negatives"] is True
    assert main(["train", "--model", "lace-micro-32", "--data", str(pairs_csv), "--output", str(tmp_path / "cli"),
                 "--steps", "2", "--batch-size", "8", "--no-progress"]) == 2  # non-empty folder refused


def vocabulary_dictionary(seed: int, captions: list[str], n_images: int):
    """A vocabulary dictionary (atoms = concept directions) of a fresh lace-micro-32, fitted on its embeddings
    of `captions` and `n_images` random images: (dictionary, directions, images (n_images, d), texts (N, d))."""
    from lace.concepts.directions import directions_from_templates
    from lace.concepts.vocabulary import load_vocabulary
    from lace.dictionary.concept_dictionary import ConceptDictionary
    from lace.encoders import load_encoder

    torch.manual_seed(seed)
    encoder = load_encoder("lace-micro-32", None)
    with torch.no_grad():
        texts, images = encoder.encode_texts(captions), encoder.encode_images(torch.rand(n_images, 3, 32, 32))
        directions = directions_from_templates(load_vocabulary(WORLD_VOCABULARY), encoder.encode_texts, texts.mean(0))
    dictionary = ConceptDictionary(mode="vocabulary", sparsity=4, directions=directions, batch_size=64).fit(images, texts)
    return dictionary, directions, images, texts


@pytest.mark.slow
def test_real_editor_from_a_dictionary_folder_with_refresh_and_resume(pairs_csv, tmp_path):
    # The run's initial model (seed 3, as config_for trains) gives the dictionary, so edits pass their checks.
    captions = [f"a {c} {s} left of a {c2} star" for c in COLOURS for s in ("circle", "square") for c2 in ("pink", "cyan")]
    dictionary, directions, _, _ = vocabulary_dictionary(3, captions, 16)
    folder = tmp_path / "dictionary"
    dictionary.save(folder)
    directions.save(folder)
    config = config_for(pairs_csv, tmp_path / "run", counterfactual_captions=True, counterfactual_images=True,
                        dictionary=str(folder), vocabulary=WORLD_VOCABULARY, refresh_dictionary_every=2,
                        refresh_pool_size=16)
    whole = train(config, progress=False)
    metrics = [read_json_line(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["caption_negatives_valid_rows"] > 0.25 and metrics[0]["image_negatives_valid_rows"] > 0.25
    assert all(m["loss"] > m["plain_loss"] for m in metrics)
    interrupted = with_changes(config, {"output": str(tmp_path / "killed")})

    def kill(number, indices):
        if number == 3:  # after the step-2 checkpoint and dictionary refresh
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(interrupted, progress=False, on_batch=kill)
    resumed = train(with_changes(interrupted, {"resume": "latest"}), progress=False)
    for key, value in weights_of(resumed).items():
        torch.testing.assert_close(value, weights_of(whole)[key], rtol=0, atol=1e-6, msg=key)


def test_refreshed_editor_keeps_the_alignment_threshold_it_was_given():
    from lace.concepts.labelling import label_atoms
    from lace.edits import CounterfactualEditor
    from lace.train.editor import refresh_editor

    captions = [f"a {c} {s}" for c in COLOURS for s in ("circle", "square", "star")]
    dictionary, directions, images, texts = vocabulary_dictionary(4, captions, 24)
    calibrated = label_atoms(dictionary, directions, images, texts).tau_align
    threshold = round(calibrated / 2, 3)  # as if calibrated another way (the demo uses isotropic directions)
    editor = CounterfactualEditor(dictionary, label_atoms(dictionary, directions, tau_align=threshold), directions)
    refreshed = refresh_editor(editor, images.flip(0), texts.flip(0))
    assert refreshed.tau_align == pytest.approx(threshold) != pytest.approx(calibrated)
    assert refreshed.dictionary is not dictionary and refreshed.config == editor.config


def test_duplicate_pairs_are_masked_only_when_asked(pairs_csv, tmp_path):
    from lace.train.data import Batch, pair_keys

    images, captions = pair_keys(Batch(torch.zeros(3, 3, 2, 2), ["a red square", "a blue circle", "a red square"],
                                       [5, 7, 5], 0))
    assert images.tolist() == [5, 7, 5]
    assert captions[0] == captions[2] and captions[0] != captions[1]
    first = {}
    for masked in (False, True):
        out = tmp_path / f"masked-{masked}"
        train(config_for(pairs_csv, out, steps=1, checkpoint_every=0, mask_duplicate_pairs=masked), progress=False)
        first[masked] = read_json_line((out / "metrics.jsonl").read_text().splitlines()[0])
    # The fixture repeats each caption every fourth image: 8-pair batches hold copies, and taking
    # identical captions out of the softmax can only lower the loss of the same first batch.
    assert first[True]["plain_loss"] < first[False]["plain_loss"] - 1e-4


def test_fused_adamw_moves_the_parameters_as_the_per_tensor_loop():
    """`build_optimizer` asks for PyTorch's fused AdamW on CPU, which is faster; the figures a run
    records must not depend on it beyond float rounding. Fed the same gradients for three steps of
    lr 1e-3, its parameters must equal the per-tensor loop's to 1e-6, a thousandth of one step (a wrong
    bias correction, decay or eps would move them by about the learning rate). The gradients are drawn,
    not back-propagated, so that rounding cannot feed back through the model."""
    from lace.train.optim import build_optimizer

    torch.manual_seed(0)
    model = open_clip.create_model("lace-micro-rn-32")
    twin = open_clip.create_model("lace-micro-rn-32")
    twin.load_state_dict(model.state_dict())
    fast = build_optimizer(model, 1e-3, 0.1, (0.9, 0.98), 1e-6)
    slow = build_optimizer(twin, 1e-3, 0.1, (0.9, 0.98), 1e-6)
    for group in slow.param_groups:
        group["fused"], group["foreach"] = False, False
    assert all(group["fused"] for group in fast.param_groups)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        for a, b in zip(model.parameters(), twin.parameters()):
            a.grad = torch.randn_like(a) * 1e-2
            b.grad = a.grad.clone()
        fast.step()
        slow.step()
    for (name, a), b, start in zip(model.named_parameters(), twin.parameters(), before):
        assert not torch.equal(a, start), name
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
